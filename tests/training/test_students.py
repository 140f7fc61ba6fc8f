"""Every registered student architecture (mmcse/students.py, issue 39), each a tiny model built
from its own transformers config (hidden 32, 2 layers) with the kind of tokenizer it ships with:

* the registry says what transformers has: attention implementations, positions counted after
  the pad id, a pooler layer, its dropout fields;
* packing proven: a packed step equals the padded one with dropout off (embeddings, every loss
  term, gradients; tolerances of test_packed_training.py) for each attention it packs with;
  refused where it cannot hold (DeBERTa), and the refusal is one line before the model loads;
* the goal's matrix, registry x {padded, packed} x {sdpa, eager}: each cell trains 2 steps or is
  one ``error:`` line (no traceback) before the model loads;
* dropout set on each architecture's own fields (ModernBERT's are all 0), recorded in the plan;
* tokenizers through the token cache (fast path equal to the tokenizer's own call; the key
  names the tokenizer);
* the round trip: ``mmcse eval``'s vectors of the trained run equal
  ``SentenceTransformer(export).encode``'s.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
import torch
from methods.test_every_method import fake_feature, feature_dims, role_width, roles_of
from support.cli import assert_one_error, run_main
from support.students import build_tiny_student, students_table
from training.test_packed_training import assert_same_step

from mmcse.cache.tokenizer import encode_rows, tokenizer_fingerprint
from mmcse.errors import MmcseError
from mmcse.hub import load_tokenizer
from mmcse.methods import build_method
from mmcse.model import SentenceEncoder, student_architecture, transformers_attention
from mmcse.packing import pack_tokens, position_offset
from mmcse.students import (
    STUDENTS,
    architecture,
    choose_student,
    default_attention,
    unregistered,
)
from mmcse.training.data import Batch
from mmcse.training.student import Student

TYPES = STUDENTS.names()
TEXTS = [
    "a man sits in the park with a red ball",
    "dog",
    "the small cat runs on the street near the old station at night",
    "a big blue car",
    "Woman walks; the dog barks at a bird flying over the river!",
    "two children play football on a green field behind their school",
]


@pytest.fixture(scope="session")
def tiny_student(tmp_path_factory, tiny_world):
    """``tiny_student(model_type)``: the tiny student's folder, built once per session."""
    built = {}
    with open(tiny_world["text"], encoding="utf-8") as handle:
        corpus = TEXTS + handle.read().splitlines()

    def build(model_type: str):
        if model_type not in built:
            folder = tmp_path_factory.mktemp(f"student-{model_type}")
            built[model_type] = build_tiny_student(model_type, folder, corpus)
        return built[model_type]

    return build


@pytest.fixture(scope="session")
def trained(tiny_student, tiny_world, tmp_path_factory):
    """``trained(model_type, packing, attention)``: a 2-step SimCSE run of the tiny student
    (``mmcse train``'s settings below), trained once per session for the tests that read it."""
    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import train

    runs = {}

    def run(model_type: str, packing: bool, attention: str):
        key = (model_type, packing, attention)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"run-{model_type}") / "run"
            train(TrainConfig(**run_settings(tiny_student(model_type), tiny_world, out),
                              packing=packing, attn_implementation=attention))  # fmt: skip
            runs[key] = out
        return runs[key]

    return run


def run_settings(folder, tiny_world, out) -> dict:
    """A 2-step SimCSE run on the tiny text corpus, CPU, no dev evaluation."""
    return dict(model=str(folder), method="simcse", text_corpus=tiny_world["text"], batch_size=8,
                max_steps=2, eval_steps=2, eval_data="", final_eval=False, device="cpu",
                output_dir=str(out))  # fmt: skip


def encoder_of(folder, attention: str, pooler: str = "cls_before_pooler") -> SentenceEncoder:
    encoder = SentenceEncoder.from_pretrained(str(folder), pooler, 0.0, attention)
    return encoder


# ---- the registry against transformers ---------------------------------------------------------


@pytest.mark.parametrize("model_type", TYPES)
def test_the_registry_says_what_transformers_has(model_type, tiny_student):
    entry = STUDENTS.get(model_type)
    assert set(entry.attention) == set(transformers_attention(model_type))
    backbone = encoder_of(tiny_student(model_type), "eager").backbone
    assert entry.positions_after_padding == (position_offset(backbone) > 0)
    assert entry.pooler_layer == (getattr(backbone, "pooler", None) is not None)
    config = backbone.config.to_dict()
    assert entry.dropout_fields and all(
        f in config and "dropout" in f for f in entry.dropout_fields
    )
    assert student_architecture(config) is entry


# ---- packing proven (packed = padded, dropout off) or refused ----------------------------------


def packs_cells():
    for model_type in TYPES:
        entry = STUDENTS.get(model_type)
        for attention in ("sdpa", "eager"):
            if entry.packs_with(attention):
                yield model_type, attention


def token_batch(tokenizer, method, kind: str) -> tuple[Batch, Batch]:
    """The same batch of :data:`TEXTS` padded (to a static 36) and packed in rows of 32."""
    encoded = tokenizer(TEXTS, truncation=True, max_length=32, padding="max_length")
    ids = torch.tensor(encoded["input_ids"])
    mask = torch.tensor(encoded["attention_mask"])
    ids = torch.cat([ids, torch.full((len(TEXTS), 4), tokenizer.pad_token_id)], 1)
    mask = torch.cat([mask, torch.zeros(len(TEXTS), 4, dtype=mask.dtype)], 1)
    torch.manual_seed(2)
    n = len(TEXTS)
    features = {r: fake_feature(r, n, role_width(method, r)) for r in roles_of(method, kind)}
    padded = Batch(kind, np.arange(n), ids, mask, features, {})
    packed = pack_tokens(ids, mask, 32, tokenizer.pad_token_id, copies=2)
    return padded, dataclasses.replace(padded, packed=packed)


@pytest.mark.parametrize(("model_type", "attention"), list(packs_cells()))
def test_a_packed_step_equals_the_padded_one(model_type, attention, tiny_student):
    """MCSE on caption batches: SimCSE's term and the image term, every parameter's gradient;
    the first token's state (sdpa) or the first and last layers' (eager: MPNet's only one)."""
    pooler = "cls_before_pooler" if attention == "sdpa" else "avg_first_last"
    folder = tiny_student(model_type)
    method = build_method("mcse")
    encoder = encoder_of(folder, attention, pooler)
    student = Student(encoder, method, feature_dims(method)).train()  # dropout 0: no noise
    padded, packed = token_batch(load_tokenizer(str(folder)), method, "caption")
    assert padded.attention_mask.sum(1).max() > 8  # longer than ModernBERT's tiny window
    assert_same_step(student, padded, packed)


GPU_PACKED = [
    (t, a) for t in TYPES for a in ("flex_attention", "varlen") if STUDENTS.get(t).packs_with(a)
]


@pytest.mark.cuda
@pytest.mark.parametrize(("model_type", "attention"), GPU_PACKED)
def test_a_packed_forward_equals_the_padded_one_on_cuda(model_type, attention, tiny_student):
    """The GPU attentions the registry says a student packs with (FlexAttention has no backward
    on CPU; varlen is CUDA only, bf16/fp16 only: under bf16 autocast), against its padded sdpa
    forward (tests/test_packing.py's tolerances)."""
    folder = tiny_student(model_type)
    reference = encoder_of(folder, "sdpa", "avg").cuda().eval()
    encoder = encoder_of(folder, attention, "avg").cuda().eval()
    padded, packed = token_batch(load_tokenizer(str(folder)), build_method("simcse"), "text")
    bf16 = attention == "varlen"  # FlashAttention: bf16/fp16 only
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        want = reference(
            input_ids=padded.input_ids.cuda(), attention_mask=padded.attention_mask.cuda()
        ).sentence.float()
        got = encoder(packed=packed.packed.map(lambda t: t.cuda())).sentence[: len(TEXTS)].float()
    torch.testing.assert_close(got, want, atol=2e-2 if bf16 else 1e-4, rtol=0)


@pytest.mark.parametrize("model_type", [t for t in TYPES if not STUDENTS.get(t).packs])
def test_packing_is_refused_where_it_cannot_hold(model_type, tiny_student):
    """The refusal is earned: the packed forward fails or differs from the padded one."""
    folder = tiny_student(model_type)
    encoder = encoder_of(folder, "eager").eval()
    padded, packed = token_batch(load_tokenizer(str(folder)), build_method("simcse"), "text")
    assert not encoder.packs
    try:
        with torch.no_grad():
            same = torch.allclose(
                encoder(packed=packed.packed).sentence[: len(TEXTS)],
                encoder(input_ids=padded.input_ids, attention_mask=padded.attention_mask).sentence,
                atol=1e-5,
            )
    except RuntimeError:
        same = False
    assert not same
    entry = STUDENTS.get(model_type)
    with pytest.raises(MmcseError, match="--packing is refused for"):
        choose_student(entry, {}, "auto", True, 0.1)


# ---- the goal's matrix: every cell trains or is one error line ---------------------------------


def train_args(folder, tiny_world, out, *flags: str) -> list[str]:
    """``mmcse train`` with :func:`run_settings`."""
    return [
        "train", "--model", str(folder), "--method", "simcse",
        "--text-corpus", tiny_world["text"], "--batch-size", "8", "--max-steps", "2",
        "--eval-steps", "2", "--eval-data", "", "--no-final-eval", "--device", "cpu",
        "--output-dir", str(out), *flags,
    ]  # fmt: skip


CELLS = [(t, p, a) for t in TYPES for p in (False, True) for a in ("sdpa", "eager")]


@pytest.mark.parametrize(
    ("model_type", "packing", "attention"),
    CELLS,
    ids=[f"{t}-{'packed' if p else 'padded'}-{a}" for t, p, a in CELLS],
)
def test_every_cell_trains_or_is_one_error_line(
    model_type, packing, attention, tiny_student, tiny_world, trained, tmp_path, monkeypatch,
    capsys,
):  # fmt: skip
    """A refused cell: ``mmcse train`` exits 2 with one error line, the model never loaded; a
    cell that trains: its run records the attention and packing it trained with."""
    entry = STUDENTS.get(model_type)
    refused = attention not in entry.attention or (packing and not entry.packs_with(attention))
    if not refused:
        run = trained(model_type, packing, attention)
        plan = json.loads((run / "plan.json").read_text())
        assert plan["student"]["attention"] == attention
        assert plan["student"]["packing_proven"] == entry.packs_with(attention)
        config = json.loads((run / "config.json").read_text())
        assert config["attn_implementation"] == attention and config["packing"] == packing
        assert (run / "best" / "model.safetensors").is_file()
        return
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", pytest.fail)  # never loads
    flags = ["--attn-implementation", attention, *(["--packing"] if packing else [])]
    args = train_args(tiny_student(model_type), tiny_world, tmp_path / "run", *flags)
    line = assert_one_error(*run_main(args, monkeypatch, capsys))
    assert ("--packing" in line) if attention in entry.attention else (attention in line)


def test_the_default_attention_trains_through_the_cli(tiny_student, tiny_world, tmp_path,
                                                      monkeypatch, capsys):  # fmt: skip
    """MPNet (no sdpa in transformers) with every default: eager, said in the plan."""
    args = train_args(tiny_student("mpnet"), tiny_world, tmp_path / "run")
    code, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0 and not any("Traceback" in line for line in stderr), stderr
    student = json.loads((tmp_path / "run" / "plan.json").read_text())["student"]
    assert student["attention"] == "eager" and "auto" in student["attention_source"]
    assert "attention eager (auto: the fastest MPNet has (no sdpa))" in student["summary"]


def test_an_attention_the_student_lacks_names_what_it_has():
    with pytest.raises(MmcseError, match="MPNet .* has eager in transformers"):
        choose_student(STUDENTS.get("mpnet"), {}, "sdpa", False, 0.1)
    assert choose_student(STUDENTS.get("mpnet"), {}, "auto", False, 0.1).attention == "eager"
    assert choose_student(STUDENTS.get("roberta"), {}, "auto", False, 0.1).attention == "sdpa"
    with pytest.raises(MmcseError, match="packs with sdpa, eager only"):
        choose_student(STUDENTS.get("modernbert"), {}, "flex_attention", True, 0.1)


# ---- dropout on each architecture's own fields -------------------------------------------------


@pytest.mark.parametrize("model_type", TYPES)
def test_dropout_lands_on_the_architectures_own_fields(model_type, tiny_student):
    encoder = SentenceEncoder.from_pretrained(str(tiny_student(model_type)), dropout=0.25)
    config = encoder.backbone.config
    assert all(getattr(config, f) == 0.25 for f in STUDENTS.get(model_type).dropout_fields)
    dropouts = [m.p for m in encoder.backbone.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(p == 0.25 for p in dropouts)  # every dropout module the student has


def test_modernbert_trains_with_dropout_its_config_lacks(tiny_student, trained):
    own = json.loads((tiny_student("modernbert") / "config.json").read_text())
    assert own["attention_dropout"] == own["embedding_dropout"] == own["mlp_dropout"] == 0
    run = trained("modernbert", True, "sdpa")
    student = json.loads((run / "plan.json").read_text())["student"]
    assert student["dropout"] == 0.1 and student["config_dropout"]["mlp_dropout"] == 0
    fields = {"embedding_dropout", "attention_dropout", "mlp_dropout"}
    assert set(student["dropout_fields"]) == fields
    saved = json.loads((run / "best" / "config.json").read_text())
    assert all(saved[f] == 0.1 for f in fields)  # the trained model says what it trained with


def test_dropout_zero_warns_and_an_unknown_dropout_free_student_is_refused(caplog):
    choice = choose_student(STUDENTS.get("modernbert"), {}, "auto", False, 0.0)
    assert any("same vector" in w for w in choice.warnings)
    config = {"model_type": "novel", "layer_dropout": 0.0}
    entry = unregistered("novel", ("eager",), config)
    with pytest.raises(MmcseError, match="no active dropout"):
        choose_student(entry, config, "auto", False, 0.1)
    bert_like = {"model_type": "novel", "hidden_dropout_prob": 0.0}
    choice = choose_student(unregistered("novel", ("sdpa", "eager"), bert_like), bert_like,
                            "auto", False, 0.1)  # fmt: skip
    assert choice.dropout_fields == ("hidden_dropout_prob",) and choice.attention == "sdpa"
    assert len(choice.warnings) == 1 and "not in mmcse's registry" in choice.warnings[0]
    with pytest.raises(MmcseError, match="not proven"):
        choose_student(choice.architecture, bert_like, "auto", True, 0.1)


# ---- tokenizers through the token cache --------------------------------------------------------


def test_every_students_tokenizer_goes_through_the_token_cache(tiny_student, caplog):
    """WordPiece, byte-level BPE and Unigram tokenizers take the fast path with the ids of the
    tokenizer's own call; the cache key (the fingerprint) tells them apart, and two students
    share an entry only when their tokenizers give the same ids (BERT, DistilBERT, ELECTRA
    built on one vocabulary)."""
    rows_by_fingerprint = {}
    for model_type in TYPES:
        folder = tiny_student(model_type)
        tokenizer = load_tokenizer(str(folder))
        with caplog.at_level(logging.WARNING, logger="mmcse"):
            rows = encode_rows(tokenizer, TEXTS, 16)
        assert "fast backend gives other ids" not in caplog.text, model_type
        expected = tokenizer(TEXTS, max_length=16, truncation=True)["input_ids"]
        assert [list(r[1 : 1 + r[0]]) for r in rows] == expected, model_type
        fingerprint = tokenizer_fingerprint(tokenizer)
        assert fingerprint == tokenizer_fingerprint(load_tokenizer(str(folder)))
        same = rows_by_fingerprint.setdefault(fingerprint, rows)
        np.testing.assert_array_equal(same, rows)
    kinds = ("bert", "roberta", "xlm-roberta", "mpnet", "deberta-v2", "modernbert")
    assert len({tokenizer_fingerprint(load_tokenizer(str(tiny_student(t)))) for t in kinds}) == 6


# ---- the round trip: mmcse eval = SentenceTransformer(export).encode ---------------------------


@pytest.mark.parametrize("model_type", TYPES)
def test_the_trained_student_exports_and_encodes_alike(model_type, trained, tmp_path):
    """The default cell's run (its fastest attention, packed where proven)."""
    st = pytest.importorskip("sentence_transformers")
    from mmcse.evaluation import encode_sentences
    from mmcse.evaluation.sts import load_encoder
    from mmcse.reports.export import export_run

    entry = STUDENTS.get(model_type)
    run = trained(model_type, entry.packs, default_attention(entry))
    encoder, tokenizer, _, _ = load_encoder(run, None, "cpu")
    ours = encode_sentences(encoder, tokenizer, TEXTS, batch_size=2)
    out, _ = export_run(run, tmp_path / "st")
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, batch_size=3)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_unregistered_architecture_is_none():
    assert architecture("albert") is None


def test_the_readme_lists_every_student():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Students\n", 1)[1].split("\n## ", 1)[0]
    assert students_table() in section
