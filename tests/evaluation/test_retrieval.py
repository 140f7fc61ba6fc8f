"""Cross-modal retrieval: recall with several captions per image, heads, COCO-mini end to end."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.cli import assert_one_error, run_main

import cli
from mmcse.errors import MmcseError
from mmcse.evaluation.retrieval import (
    evaluate_retrieval,
    format_retrieval_table,
    load_heads,
    ranks,
    recall_table,
)

COCO_MINI = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "images" / "coco_mini"


def brute_force(similarity: np.ndarray, caption_image: np.ndarray) -> dict:
    """R@k and 1-based median rank by sorting every query's candidates explicitly."""
    t2i, i2t = [], []
    for caption in range(similarity.shape[1]):
        order = sorted(range(similarity.shape[0]), key=lambda i: -similarity[i, caption])
        t2i.append(order.index(caption_image[caption]))
    for image in range(similarity.shape[0]):
        order = sorted(range(similarity.shape[1]), key=lambda c: -similarity[image, c])
        i2t.append(min(order.index(c) for c in np.flatnonzero(caption_image == image)))
    out = {}
    for name, r in (("t2i", t2i), ("i2t", i2t)):
        out[name] = {f"R@{k}": 100 * sum(x < k for x in r) / len(r) for k in (1, 5, 10)}
        out[name]["medr"] = float(np.floor(np.median(r)) + 1)
    return out


def test_recall_and_median_rank_match_brute_force_with_five_captions_per_image():
    rng = np.random.default_rng(0)
    images, per_image = 23, 5
    caption_image = rng.permutation(np.repeat(np.arange(images), per_image))
    # signal so that the recalls are neither 0 nor 100
    similarity = rng.standard_normal((images, images * per_image))
    similarity[caption_image, np.arange(images * per_image)] += 1.5
    r = ranks(similarity, caption_image)
    expected = brute_force(similarity, caption_image)
    for direction in ("t2i", "i2t"):
        assert recall_table(r[direction]) == pytest.approx(expected[direction])
    assert 0 < expected["i2t"]["R@1"] < 100 and expected["i2t"]["R@1"] > expected["t2i"]["R@1"]


def test_i2t_counts_a_hit_when_any_caption_is_in_the_top_k():
    # image 0's captions are 0 and 1; only caption 1 is its best match
    similarity = np.array([[0.1, 0.9, 0.5], [0.2, 0.3, 0.8]])
    r = ranks(similarity, np.array([0, 0, 1]))
    assert r["i2t"].tolist() == [0, 0] and r["t2i"].tolist() == [1, 0, 0]


# ---- a run with heads, COCO-mini features ------------------------------------------------------


def fake_run(tiny_model: Path, root: Path, image_dim: int, with_heads: bool = True) -> Path:
    """A run directory whose best/ is the tiny student plus random grounding heads."""
    best = root / "best"
    shutil.copytree(tiny_model, best)
    term_heads = {  # as an MCSE run records them: which saved head each term's slot used
        "simcse": {"student": "simcse_student"},
        "image_text": {"student": "image_text_student", "image": "image_text_image"},
    }
    info = {"pooler": "avg", "step": 1, "term_heads": term_heads}
    (best / "mmcse_run.json").write_text(json.dumps(info))
    if with_heads:
        g = torch.Generator().manual_seed(0)
        heads = {
            "heads.simcse_student.0.weight": torch.randn(32, 32, generator=g),
            "heads.simcse_student.0.bias": torch.randn(32, generator=g),
            "heads.image_text_student.0.weight": torch.randn(8, 32, generator=g),
            "heads.image_text_student.0.bias": torch.randn(8, generator=g),
            "heads.image_text_image.0.weight": torch.randn(8, image_dim, generator=g),
            "heads.image_text_image.0.bias": torch.randn(8, generator=g),
        }
        save_file(heads, str(best / "mmcse_heads.safetensors"))
    return root


@pytest.fixture(scope="module")
def coco_features(tmp_path_factory) -> Path:
    """The 79 COCO-mini val images through a random tiny ResNet-50, every caption kept."""
    if not COCO_MINI.is_dir():
        pytest.skip("shared coco_mini not available")
    out = tmp_path_factory.mktemp("coco-val")
    from typer.testing import CliRunner

    result = CliRunner().invoke(
        cli.app,
        ["extract-images", "--dataset", "coco", "--split", "val", "--images", str(COCO_MINI),
         "--captions", str(COCO_MINI / "annotations"), "--teacher", "resnet50",
         "--weights", "random", "--teacher-size", "tiny", "--device", "cpu", "--workers", "1",
         "--caption-policy", "all", "--shard-size", "64", "--batch-size", "16", "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


def test_grounded_retrieval_on_coco_mini_matches_an_independent_computation(
    tiny_model, coco_features, tmp_path
):
    from mmcse.cache import Corpus, FeatureSet
    from mmcse.evaluation.encode import encode_sentences
    from mmcse.hub import load_tokenizer
    from mmcse.model import SentenceEncoder

    images = FeatureSet.open(coco_features / "image-resnet50")
    run = fake_run(tiny_model, tmp_path / "run", images.dim)
    results = evaluate_retrieval(
        run, coco_features / "image-resnet50", coco_features / "captions", device="cpu"
    )
    d = results["details"]
    assert d["images"] == 79 and d["captions"] >= 5 * 79 and d["head"] == "image_text"

    # independently: heads applied by hand, cosine, brute-force ranks
    corpus = Corpus.open(coco_features / "captions")
    image_ids = sorted(set(corpus.image_ids))
    caption_image = np.array([image_ids.index(i) for i in corpus.image_ids])
    encoder = SentenceEncoder.from_pretrained(str(run / "best"), pooler="avg")
    text = encode_sentences(encoder, load_tokenizer(str(run / "best")), corpus.texts)
    heads = load_heads(run / "best")
    t = np.tanh(text @ heads.text_weight.numpy().T + heads.text_bias.numpy())
    feats = images.gather(image_ids).astype(np.float32)
    v = np.tanh(feats @ heads.image_weight.numpy().T + heads.image_bias.numpy())
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    expected = brute_force(v @ t.T, caption_image)
    for direction in ("t2i", "i2t"):
        assert results["grounded"][direction] == pytest.approx(expected[direction], abs=1e-6)
    assert results["raw"].startswith("n/a")  # 32-d sentences vs the teacher's features
    table = format_retrieval_table(results)
    assert "grounded" in table and "t2i R@1" in table


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_retrieval_writes_into_the_run_and_refuses_runs_without_heads(
    tiny_model, coco_features, tmp_path, monkeypatch, capsys
):
    from mmcse.cache import FeatureSet

    dim = FeatureSet.open(coco_features / "image-resnet50").dim
    run = fake_run(tiny_model, tmp_path / "run", dim)
    flags = ["--images-features", str(coco_features / "image-resnet50"),
             "--captions", str(coco_features / "captions"), "--device", "cpu"]  # fmt: skip
    code, out, err = run_cli(
        monkeypatch, capsys, "eval", "--model", str(run), "--tasks", "retrieval", *flags
    )
    assert code == 0, err
    assert "i2t R@1" in out and (run / "retrieval.json").is_file()

    bare = fake_run(tiny_model, tmp_path / "bare", dim, with_heads=False)
    code, _, err = run_cli(
        monkeypatch, capsys, "eval", "--model", str(bare), "--tasks", "retrieval", *flags
    )
    assert code == 2 and err.startswith("error:") and "mmcse_heads" in err and err.count("\n") == 1

    code, _, err = run_cli(monkeypatch, capsys, "eval", "--model", str(run), "--tasks", "retrieval")
    assert code == 2 and "--images-features" in err and err.count("\n") == 1


def test_heads_without_an_image_side_are_refused(tmp_path):
    save_file(
        {"heads.simcse_student.0.weight": torch.zeros(2, 2)},
        str(tmp_path / "mmcse_heads.safetensors"),
    )
    info = {"term_heads": {"simcse": {"student": "simcse_student"}}}
    (tmp_path / "mmcse_run.json").write_text(json.dumps(info))
    with pytest.raises(MmcseError, match="no student \\+ image head pair"):
        load_heads(tmp_path)


def test_heads_are_those_the_chosen_term_used(tiny_model, tmp_path):
    run = fake_run(tiny_model, tmp_path / "run", 6) / "best"
    heads = load_heads(run)  # the only term with a student and an image head
    assert heads.term == "image_text" and list(heads.image_weight.shape) == [8, 6]
    assert load_heads(run, "image_text").text_weight.shape == heads.text_weight.shape
    with pytest.raises(MmcseError, match="no grounding heads for a term 'simcse'"):
        load_heads(run, "simcse")
    (run / "mmcse_run.json").write_text(json.dumps({"pooler": "avg"}))
    with pytest.raises(MmcseError, match="does not record which heads each loss term used"):
        load_heads(run)


# ---- held-out images only ----------------------------------------------------------------------


def captions_of(path: Path, images: list[int], word: str) -> Path:
    """A caption corpus with two captions per image ``img<i>``."""
    from mmcse.cache import write_corpus

    ids = [f"img{i}" for i in images for _ in range(2)]
    texts = [f"{word} {i} {k}" for i in images for k in range(2)]
    write_corpus(path, [f"{im}#{k % 2}" for k, im in enumerate(ids)], texts, image_ids=ids,
                 dataset="tiny", split="x")  # fmt: skip
    return path


@pytest.fixture
def trained_run(tiny_model, tmp_path):
    """A run that trained on the captions of img0..img5; image features of img0..img9."""
    from mmcse.cache import Manifest, write_feature_set

    rng = np.random.default_rng(0)
    ids = [f"img{i}" for i in range(10)]
    write_feature_set(tmp_path / "feats", ids, rng.standard_normal((10, 6)).astype(np.float32),
                      kind="image", dim=6, dtype="float32", dataset="tiny", split="all",
                      producer={"teacher": "test"})  # fmt: skip
    train = captions_of(tmp_path / "train-captions", list(range(6)), "seen")
    run = fake_run(tiny_model, tmp_path / "run", 6)
    info_path = run / "best" / "mmcse_run.json"
    info = json.loads(info_path.read_text())
    info["fingerprints"] = {
        "corpus:caption": {"path": str(train), "fingerprint": Manifest.read(train).fingerprint},
        "feature:image": {"path": str(tmp_path / "feats"),
                          "fingerprint": Manifest.read(tmp_path / "feats").fingerprint},
    }  # fmt: skip
    info_path.write_text(json.dumps(info))
    return run, tmp_path / "feats", train


def test_retrieval_on_the_runs_own_training_images_is_refused(
    trained_run, tmp_path, monkeypatch, capsys
):
    run, feats, train = trained_run
    same_images = captions_of(tmp_path / "recaptioned", [0, 1, 2, 3, 4, 5], "other")
    for captions, words in ((train, ["the corpus the run trained on", "corpus:caption"]),
                            (same_images, ["all 6 of its images", str(train)])):  # fmt: skip
        args = ["eval", "--model", str(run), "--tasks", "retrieval", "--images-features",
                str(feats), "--captions", str(captions), "--device", "cpu"]  # fmt: skip
        code, stderr = run_main(args, monkeypatch, capsys)
        assert_one_error(code, stderr, f"--captions {captions}", *words, "held-out")
    assert not (run / "retrieval.json").exists()


def test_retrieval_with_some_training_images_is_warned_with_the_count(
    trained_run, tmp_path, library_log
):
    run, feats, train = trained_run
    mixed = captions_of(tmp_path / "mixed", [4, 5, 6, 7, 8, 9], "mixed")
    results = evaluate_retrieval(run, feats, mixed, device="cpu")
    assert results["details"]["images"] == 6
    log = library_log()
    assert f"2 of the 6 retrieval images of {mixed} are in {train}" in log and "inflated" in log
    held_out = captions_of(tmp_path / "held-out", [6, 7, 8, 9], "new")
    evaluate_retrieval(run, feats, held_out, device="cpu")
    assert "trained on" not in library_log()
    shutil.rmtree(train)  # the training corpus moved away: nothing to compare with, said so
    evaluate_retrieval(run, feats, held_out, device="cpu")
    assert f"{train} (corpus:caption, which the run trained on) is gone" in library_log()
