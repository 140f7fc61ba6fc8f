"""A packed training step equals the padded one (issue 29, item 3): for every registered method
(and the variants test_every_method.py builds), every pooler, tiny BERT and tiny RoBERTa, with
dropout off: each sentence's embedding, every loss term and one step's gradients.

Tolerance (fp32): embeddings and loss terms 1e-5 absolute; gradients 1e-5 absolute + 1e-4
relative (a gradient sums over the batch in another order when its sentences sit in other
rows). Then a run trains packed end to end, and a capture-shaped run fixes one budget per kind.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from methods.test_every_method import (
    PHRASE_SPANS,
    VARIANTS,
    fake_feature,
    feature_dims,
    role_width,
    roles_of,
    variant_id,
)
from test_packing import FAMILIES, padded_batch, tiny_backbone

from mmcse.methods import build_method
from mmcse.model import SentenceEncoder
from mmcse.packing import pack_tokens, rows_needed
from mmcse.pooling import POOLERS
from mmcse.training.data import Batch
from mmcse.training.student import Student

TOLERANCE = 1e-5
LENGTHS = [5, 12, 4, 9, 16, 7]  # a caption-like spread in rows of 16; phrase spans end by 4


def batches(method, kind: str, family: str) -> tuple[Batch, Batch]:
    """The same batch padded and packed (static width 18: padding past the longest)."""
    pad = FAMILIES[family][2]
    ids, mask = padded_batch(LENGTHS, pad, width=18, seed=1)
    torch.manual_seed(2)
    n = len(LENGTHS)
    features = {r: fake_feature(r, n, role_width(method, r)) for r in roles_of(method, kind)}
    extras = {}
    if kind == "caption":
        spans = torch.tensor([PHRASE_SPANS] * n)
        extras = {"phrase_spans": spans, "phrase_mask": spans[..., 0] >= 0}
    padded = Batch(kind, np.arange(n), ids, mask, features, extras)
    return padded, dataclasses.replace(padded, packed=pack_tokens(ids, mask, 16, pad, copies=2))


def step(student: Student, batch: Batch) -> tuple[dict, dict, torch.Tensor]:
    """(loss terms, gradients by parameter, both views' embeddings) of one step."""
    student.zero_grad(set_to_none=True)
    torch.manual_seed(3)  # any draw inside a loss draws the same in both layouts
    captured = {}
    hook = student.encoder.register_forward_hook(lambda m, a, out: captured.update(out=out))
    terms = student(batch)
    hook.remove()
    terms["loss"].backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, grads, captured["out"].sentence.detach()


def assert_same_step(student: Student, padded: Batch, packed: Batch) -> None:
    terms, grads, sentences = step(student, padded)
    packed_terms, packed_grads, packed_sentences = step(student, packed)
    torch.testing.assert_close(packed_sentences, sentences, atol=TOLERANCE, rtol=0)
    assert packed_terms.keys() == terms.keys() and len(terms) > 1
    for key, value in terms.items():
        torch.testing.assert_close(packed_terms[key], value, atol=TOLERANCE, rtol=0, msg=key)
    assert packed_grads.keys() == grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=TOLERANCE, rtol=1e-4, msg=name)


def student_for(method, family: str, pooler: str) -> Student:
    encoder = SentenceEncoder(tiny_backbone(family, hidden=16), pooler)
    return Student(encoder, method, feature_dims(method)).train()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("kind", ["text", "caption"])
@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=variant_id)
def test_every_method_packed_equals_padded(name, overrides, kind, family):
    method = build_method(name, **overrides)
    student = student_for(method, family, "cls_before_pooler")
    assert_same_step(student, *batches(method, kind, family))


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("pooler", POOLERS)
def test_every_pooler_packed_equals_padded(pooler, family):
    """MCSEO on caption batches: the pooler, MCSE's image term and the phrase spans at once."""
    method = build_method("mcseo")
    assert_same_step(student_for(method, family, pooler), *batches(method, "caption", family))


def test_a_static_run_packs_every_batch_into_one_budget_per_kind(tiny_model, tiny_world, tmp_path):
    """Static shapes (what capture uses): each kind's rows are the most any batch of the run's
    schedule needs, so every batch fits and has that one shape; the run records --packing."""
    from support.runs import tiny_mcse_settings

    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import Trainer
    from mmcse.training.prefetch import CPU

    settings = tiny_mcse_settings(tiny_model, tiny_world, tmp_path, max_seq_length=24,
                                  dynamic_padding=False, epochs=2, packing=True)  # fmt: skip
    trainer = Trainer(TrainConfig(**settings)).setup()
    data = trainer.data
    drawn = list(trainer.run_batches())
    assert len(drawn) == trainer.total and {kind for kind, _ in drawn} == {"text", "caption"}
    for kind, budget in data.pack_budgets.items():
        lengths = data.sources[kind].lengths
        needs = [rows_needed(lengths[rows], data.pack_width) for k, rows in drawn if k == kind]
        assert budget == max(needs)
    shapes = {}
    for kind, rows in drawn:
        packed = data.batch(kind, rows, CPU).packed
        shapes.setdefault(kind, set()).add(tuple(packed.input_ids.shape))
        assert packed.mask.sum() == 2 * data.sources[kind].lengths[rows].sum()
    assert all(len(s) == 1 for s in shapes.values())  # one shape per kind: one graph
    assert trainer.cfg.packing and trainer.cfg.to_dict()["packing"] is True


def test_an_eager_run_packs_each_batch_into_the_rows_it_needs(tiny_model, tiny_world, tmp_path):
    from support.runs import tiny_mcse_settings

    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import Trainer
    from mmcse.training.prefetch import CPU

    packed_run = tiny_mcse_settings(tiny_model, tiny_world, tmp_path, packing=True)
    trainer = Trainer(TrainConfig(**packed_run)).setup()
    assert trainer.data.pack_budgets == {}
    kind, rows = next(trainer.run_batches())
    packed = trainer.data.batch(kind, rows, CPU).packed
    lengths = trainer.data.sources[kind].lengths[rows]
    assert packed.rows == 2 * rows_needed(lengths, trainer.data.pack_width)
    off = TrainConfig(**tiny_mcse_settings(tiny_model, tiny_world, tmp_path / "off", packing=False))
    assert Trainer(off).setup().data.batch(kind, rows, CPU).packed is None
    auto = TrainConfig(**tiny_mcse_settings(tiny_model, tiny_world, tmp_path / "auto"))
    assert auto.packing is None  # not given: auto, packed on a CPU
    trainer = Trainer(auto).setup()
    assert trainer.cfg.packing is True and trainer.resolved.packing_source == "auto on cpu"
    assert trainer.data.batch(kind, rows, CPU).packed is not None


def test_varlen_attention_needs_packing():
    from mmcse.settings import SettingError
    from mmcse.training.config import TrainConfig

    assert TrainConfig(attn_implementation="varlen", packing=True).packing
    with pytest.raises(SettingError, match="varlen runs packed batches only: add --packing"):
        TrainConfig(attn_implementation="varlen", packing=False)


@pytest.mark.parametrize(
    "given, device, attention, want, source",
    [
        (None, "cpu", "sdpa", True, "auto on cpu"),  # measured faster: BENCHMARKS.md
        (None, "cuda", "sdpa", True, "auto on cuda"),  # the GPU check: 0.83 on an H200
        (None, "mps", "sdpa", False, "auto on mps"),
        (None, "cuda", "varlen", True, "varlen attention runs packed only"),
        ("on", "cuda", "sdpa", True, "given"),
        ("off", "cpu", "sdpa", False, "given"),
        (True, "cuda", "sdpa", True, "given"),
        ("auto", "cpu", "sdpa", True, "auto on cpu"),
    ],
)
def test_packing_auto_is_decided_per_device_in_one_resolver(given, device, attention, want, source):
    import torch

    from mmcse.training.config import TrainConfig
    from mmcse.training.resolved import resolve_packing

    cfg = TrainConfig(packing=given, attn_implementation=attention)
    assert resolve_packing(cfg, torch.device(device), None) == (want, source)


def test_a_student_that_cannot_pack_pads_under_auto():
    import torch

    from mmcse.students import StudentChoice, architecture
    from mmcse.training.config import TrainConfig
    from mmcse.training.resolved import resolve_packing

    def student(model_type, attention):
        return StudentChoice(architecture(model_type), attention, "given", 0.1, (), {})

    cpu = torch.device("cpu")
    deberta, bert = student("deberta-v2", "eager"), student("bert", "sdpa")
    assert resolve_packing(TrainConfig(), cpu, deberta) == (False, "auto: DeBERTa-v2/v3 pads")
    assert resolve_packing(TrainConfig(), cpu, bert) == (True, "auto on cpu")
    # given: the student check (mmcse.model.check_student) refused it before, if it cannot
    assert resolve_packing(TrainConfig(packing=True), cpu, bert) == (True, "given")
    modernbert_flex = student("modernbert", "flex_attention")  # packs with sdpa/eager only
    assert resolve_packing(TrainConfig(), cpu, modernbert_flex)[0] is False
