"""Every registered method, by construction (timm style): it builds, describes itself, names
registered losses and heads that fit them, and a tiny training step runs.

The maths of each composition is checked against its equations in ``test_switches.py``.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import mmcse.methods  # noqa: F401  (registers every loss and method)
from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs
from mmcse.losses.heads import HIDDEN, Head
from mmcse.methods import build_heads, build_losses, build_method
from mmcse.registry import LOSSES, METHODS
from mmcse.training.adamw import adamw_groups
from mmcse.training.student import Student

B, H, L, DIM = 6, 16, 5, 12
VARIANTS = [(name, {}) for name in METHODS.names()] + [
    ("kdmcse", {"false_negative_filter": True, "false_negative_threshold": 0.2}),
    ("dalr", {"text_objective": "arc_margin", "image_objective": "adapacse"}),
    ("dalr", {"teachers_on": "caption", "global_local_weight": 1.0, "consistency_weight": 0.01}),
    ("dalr", {"shared_student_head": False, "global_local_weight": 1.0}),
    ("dalr", {"image_objective": "infonce", "share_image_head": True, "student_head_dim": 8}),
    ("dalr", {"image_objective": "infonce", "cma_image_head": True, "share_image_head": True}),
    ("dalr", {"cma_image_head": True, "rank_log_eps": 0.0}),
    ("dalr-paper", {"shared_student_head": False, "share_image_head": False}),
]
PHRASE_SPANS = [[1, 2], [2, 4], [-1, -1]]  # token (start, end); the last one padded


def variant_id(value):
    return ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else value


def fake_feature(role: str, batch: int, width: int = DIM) -> torch.Tensor:
    """Random cached features; roles ending in ``_tokens`` hold ``[L, D]`` rows (padding included)."""
    if role == "object":  # MCSEO: P objects per caption, paired with phrase_spans
        return torch.randn(batch, len(PHRASE_SPANS), width)
    if role.endswith("_tokens"):
        tokens = torch.randn(batch, L, width)
        tokens[0, -2:] = 0  # padding
        return tokens
    return torch.randn(batch, width)


def role_width(method, role: str) -> int:
    """DIM, except for the features a method compares raw with its shared sentence head's
    output, which have that head's width: DALR's ℓ_g2l teacher tokens and, without an image
    head, its ℓ_CMA image (the released code's CLIP ViT-L/14 768 = BERT's 768)."""
    if not getattr(method, "shared_student_head", False):
        return H if role.endswith("_tokens") else DIM
    raw_image = role == method.image_role and not method.cma_image_head
    if role.endswith("_tokens") or raw_image:
        return method.student_head_dim or H
    return DIM


def roles_of(method, kind: str) -> set[str]:
    return set(method.text_roles) | (set(method.caption_roles) if kind == "caption" else set())


def feature_dims(method) -> dict[str, int]:
    return {role: role_width(method, role) for role in roles_of(method, "caption")}


def extras(kind: str) -> dict:
    if kind != "caption":
        return {}
    spans = torch.tensor([PHRASE_SPANS] * B)
    return {"phrase_spans": spans, "phrase_mask": spans[..., 0] >= 0}


class TinyEncoder(nn.Module):
    """A trainable stand-in for the student: token embeddings → dropout; [CLS] is position 0."""

    hidden_size = H

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, H)
        self.dropout = nn.Dropout(0.1)

    def forward(self, input_ids, attention_mask):
        states = self.dropout(self.embed(input_ids))
        return SimpleNamespace(sentence=states[:, 0], token_states=states)


def tiny_batch(method, kind: str) -> SimpleNamespace:
    return SimpleNamespace(
        size=B,
        kind=kind,
        input_ids=torch.randint(0, 30, (B, L)),
        attention_mask=torch.ones(B, L, dtype=torch.long),
        features={r: fake_feature(r, B, role_width(method, r)) for r in roles_of(method, kind)},
        packed=None,  # padded views (packing: tests/training/test_packed_training.py)
    )


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=variant_id)
def test_builds_and_describes_itself(name, overrides):
    method = build_method(name, **overrides)
    description = method.describe()
    assert description.startswith(f"{method.name}:")
    for term in method.terms():
        assert f"× {term.name} ({term.loss}" in description
    assert build_method(name, **{k: v for k, v in method.to_dict().items() if k != "name"})


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_names_registered_losses_with_unique_terms(name):
    method = build_method(name)
    terms = method.terms()
    assert len({t.name for t in terms}) == len(terms)
    for t in terms:
        assert t.loss in LOSSES
        assert all(k.endswith("_loss") for k in LOSSES.get(t.loss).terms)


@pytest.mark.parametrize("name", METHODS.names())
def test_weight_fields_switch_every_term_off(name):
    """Every term is controlled by a ``*_weight`` field, so any term can be ablated."""
    method = build_method(name)
    zeroed = build_method(name, **{f: 0.0 for f in method.weight_fields()})
    assert zeroed.active_terms() == []


def test_unknown_method_setting_is_refused():
    with pytest.raises(ValueError, match="has no setting"):
        build_method("mcse", lambda_=0.1)


@pytest.mark.parametrize("kind", ["text", "caption"])
@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=variant_id)
def test_every_term_runs_with_the_heads_its_method_declares(name, overrides, kind):
    torch.manual_seed(0)
    method = build_method(name, **overrides)
    roles = roles_of(method, kind)
    losses, heads = build_losses(method), build_heads(method, H, feature_dims(method))
    inputs = LossInputs(
        torch.randn(B, H, requires_grad=True),
        torch.randn(B, H, requires_grad=True),
        features={role: fake_feature(role, B, role_width(method, role)) for role in roles},
        batch_kind=kind,
        token_states=(torch.randn(B, L, H), torch.randn(B, L, H)),
        attention_mask=torch.ones(B, L, dtype=torch.long),
        extras=extras("caption"),
    )
    for term in method.active_terms():
        if not term.applies_to(kind):
            continue
        loss = losses[term.name]
        out = loss(inputs, {slot: heads[n] for slot, n in term.head_names().items()})
        assert set(out) == set(loss.terms), term.name
        assert set(loss.requires) <= roles, term.name
        for value in out.values():
            assert value.dim() == 0 and torch.isfinite(value), term.name


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=variant_id)
def test_a_tiny_training_step_runs(name, overrides):
    """Steps on caption and text batches train the encoder and every head, and the AdamW groups
    step together (ε's scaling reads one step count per group)."""
    torch.manual_seed(0)
    method = build_method(name, **overrides)
    student = Student(TinyEncoder(), method, feature_dims(method))
    groups = adamw_groups(student.trained_modules())
    optimizer = torch.optim.AdamW([{"params": g} for g in groups], lr=1e-2)
    before = {k: v.clone() for k, v in student.state_dict().items()}
    kinds = ["caption", "text", "text"] if method.caption_roles else ["text", "text"]
    for kind in kinds:
        out = student(tiny_batch(method, kind), extras(kind))
        assert torch.isfinite(out["loss"]), kind
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()
    for key, value in student.state_dict().items():
        if not key.endswith(("running_mean", "running_var", "num_batches_tracked")):
            assert not torch.equal(before[key], value), f"{key} did not train"
    for group in optimizer.param_groups:
        assert len({int(optimizer.state[p]["step"]) for p in group["params"]}) == 1


# ---- the errors a method's author meets ------------------------------------------------------


def with_terms(method, change):
    """``method`` whose terms are ``change(terms)`` (as a method's author might write them)."""
    terms = change(method.terms())
    method.terms = lambda: terms  # an instance attribute shadows the dataclass's method
    return method


def test_a_misspelt_term_option_names_the_term_and_what_the_loss_accepts():
    method = with_terms(
        build_method("mcse"),
        lambda terms: [terms[0], dataclasses.replace(terms[1], options={"temprature": 0.05})],
    )
    with pytest.raises(MmcseError) as info:
        build_losses(method)
    message = str(info.value)
    assert message.startswith("method 'mcse' term 'image_text': ")
    assert "'temprature'" in message and "feature_role, temperature, views" in message


def test_a_head_in_a_slot_the_loss_lacks_is_refused():
    method = with_terms(
        build_method("simcse"),
        lambda terms: [dataclasses.replace(terms[0], heads={"sentence": Head(HIDDEN, HIDDEN)})],
    )
    with pytest.raises(
        MmcseError, match="term 'simcse': .* no head slot 'sentence'; its slots: student"
    ):
        build_losses(method)


def test_a_shared_head_declared_twice_differently_is_refused():
    """DALR's shared pooler is H→H; teacher tokens of another width cannot share it (ℓ_g2l)."""
    method = build_method("dalr", teachers_on="all", global_local_weight=1.0)
    dims = {"image": H, "text_teacher_tokens": H + 1}
    with pytest.raises(
        MmcseError,
        match=r"'simcse' and 'global_local' declare head 'dalr_student' differently: mlp 16→16 \(bert init\) vs mlp 16→17",
    ):
        build_heads(method, H, dims)
    assert build_heads(method, H, {"image": H, "text_teacher_tokens": H})  # equal widths fit


def test_a_raw_image_of_another_width_than_the_shared_pooler_is_refused():
    """The released ℓ_CMA compares the pooler's z1 with the raw image feature: 768 = 768 for
    CLIP ViT-L/14 and BERT-base; a 512-d ViT-B/32 needs ``cma_image_head=True``."""
    method = build_method("dalr")
    with pytest.raises(MmcseError) as info:
        build_heads(method, H, {"image": DIM})
    message = str(info.value)
    assert "terms 'simcse' and 'cma' declare head 'dalr_student' differently" in message
    assert "16→12" in message and "cached feature 'image'" in message and "\n" not in message
    assert build_heads(build_method("dalr", cma_image_head=True), H, {"image": DIM})


def test_terms_naming_one_head_share_it():
    method = build_method("dalr")
    student = Student(TinyEncoder(), method, feature_dims(method))
    users = {t: slots["student"] for t, slots in student.term_heads.items() if "student" in slots}
    assert {t for t, name in users.items() if name == "dalr_student"} == {
        "simcse", "consistency", "cma", "rank", "ima"
    }  # fmt: skip
    assert users["image_text"] == "image_text_student"  # AdapACSE keeps its own heads
    assert "head dalr_student shared by simcse, consistency, cma, rank, ima" in method.describe()
