"""KDMCSE's losses against loop re-computations, plus a smoke test over every registered method."""

from __future__ import annotations

import math

import pytest
import torch

import mmcse.methods  # noqa: F401  (registers every loss and method)
from mmcse.losses.adaptive_angular_margin import AdaptiveAngularMarginLoss, false_negative_mask
from mmcse.losses.arc_margin_info_nce import ArcMarginInfoNCELoss
from mmcse.losses.base import LossInputs
from mmcse.losses.info_nce import SimCSELoss
from mmcse.methods import build_method
from mmcse.registry import LOSSES, METHODS

H, B = 16, 6


def cos(a, b):
    a, b = a.detach().tolist(), b.detach().tolist()
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def margin_nll_loop(queries, keys, margin, tau, teacher=None, dropped=frozenset()):
    """Mean over anchors of −log softmax, each pair handled one at a time (no matrix code)."""
    total = 0.0
    for i in range(len(queries)):
        logits = []
        for j in range(len(keys)):
            if (i, j) in dropped:
                continue
            c = cos(queries[i], keys[j])
            theta = math.acos(max(-1.0, min(1.0, c)))
            if j != i and theta > margin:
                scale = 1.0 if teacher is None else 1.0 - cos(teacher[i], teacher[j])
                c = math.cos(theta - scale * margin)
            logits.append((j, c / tau))
        positive = dict(logits)[i]
        total += math.log(sum(math.exp(v) for _, v in logits)) - positive
    return total / len(queries)


@pytest.fixture
def views():
    torch.manual_seed(0)
    return torch.randn(B, H), torch.randn(B, H)


def test_arc_margin_matches_loop(views):
    h1, h2 = views
    got = ArcMarginInfoNCELoss.compute_loss_from_embeddings(h1, h2, margin=0.3, temperature=0.1)
    assert got.item() == pytest.approx(margin_nll_loop(h1, h2, 0.3, 0.1), rel=1e-5)


def test_arc_margin_with_zero_margin_is_simcse(views):
    simcse, arc = SimCSELoss(H), ArcMarginInfoNCELoss(H, margin=0.0)
    arc.mlp.load_state_dict(simcse.mlp.state_dict())
    inputs = LossInputs(*views)
    assert arc(inputs)["arc_margin_loss"].item() == pytest.approx(
        simcse(inputs)["simcse_loss"].item(), rel=1e-6
    )


def caption_inputs(views, dims=(10, 12)):
    torch.manual_seed(1)
    features = {"clip_image": torch.randn(B, dims[0]), "clip_text": torch.randn(B, dims[1])}
    return LossInputs(*views, features=features, batch_kind="caption")


def projected(loss, inputs):
    """The projected views and targets the loss will contrast (recomputed outside it)."""
    views = [loss.grounding(v) for v in (inputs.view1, inputs.view2)]
    image = loss.image_head(inputs.features["clip_image"])
    text = loss.text_head(inputs.features["clip_text"])
    return views, image, text


def test_adaptive_margin_matches_loop(views):
    inputs = caption_inputs(views)
    loss = AdaptiveAngularMarginLoss(H, {"clip_image": 10, "clip_text": 12}, margin=0.4)
    out = loss(inputs)
    views_p, image, text = projected(loss, inputs)
    img_t, txt_t = inputs.features["clip_image"], inputs.features["clip_text"]
    expected_image = sum(margin_nll_loop(v, image, 0.4, 0.05, teacher=img_t) for v in views_p) / 2
    expected_text = sum(margin_nll_loop(v, text, 0.4, 0.05, teacher=txt_t) for v in views_p) / 2
    assert out["image_margin_loss"].item() == pytest.approx(expected_image, rel=1e-4)
    assert out["text_margin_loss"].item() == pytest.approx(expected_text, rel=1e-4)


def test_zero_margin_without_filter_is_plain_info_nce(views):
    inputs = caption_inputs(views)
    loss = AdaptiveAngularMarginLoss(H, {"clip_image": 10, "clip_text": 12}, margin=0.0)
    out = loss(inputs)
    views_p, image, text = projected(loss, inputs)
    for key, targets in (("image_margin_loss", image), ("text_margin_loss", text)):
        plain = [torch.nn.functional.normalize(t, dim=-1) for t in (*views_p, targets)]
        ce = [
            torch.nn.functional.cross_entropy(v @ plain[2].T / 0.05, torch.arange(B))
            for v in plain[:2]
        ]
        assert out[key].item() == pytest.approx(((ce[0] + ce[1]) / 2).item(), rel=1e-5)


def test_false_negative_filter_removes_exactly_the_pairs_above_threshold(views):
    inputs = caption_inputs(views, dims=(8, 8))
    img_t, txt_t = inputs.features["clip_image"], inputs.features["clip_text"]
    threshold = 0.1
    expected = {
        (i, j) for i in range(B) for j in range(B) if i != j and cos(txt_t[i], img_t[j]) > threshold
    }
    mask = false_negative_mask(txt_t, img_t, threshold)
    assert {tuple(ij) for ij in mask.nonzero().tolist()} == expected
    assert 0 < len(expected) < B * (B - 1)  # the test data exercises both outcomes

    loss = AdaptiveAngularMarginLoss(
        H, {"clip_image": 8, "clip_text": 8}, margin=0.2, false_negative_threshold=threshold
    )
    out = loss(inputs)
    views_p, image, _ = projected(loss, inputs)
    loop = sum(
        margin_nll_loop(v, image, 0.2, 0.05, teacher=img_t, dropped=expected) for v in views_p
    )
    assert out["image_margin_loss"].item() == pytest.approx(loop / 2, rel=1e-4)


def test_filter_needs_both_teachers():
    with pytest.raises(ValueError, match="false-negative"):
        AdaptiveAngularMarginLoss(H, {"image": 4}, "image", None, false_negative_threshold=0.5)


def test_gradients_reach_views_and_heads(views):
    v1, v2 = (v.clone().requires_grad_() for v in views)
    inputs = caption_inputs((v1, v2))
    losses = [
        ArcMarginInfoNCELoss(H),
        AdaptiveAngularMarginLoss(H, {"clip_image": 10, "clip_text": 12}),
    ]
    total = sum(sum(loss(inputs).values()) for loss in losses)
    total.backward()
    assert v1.grad.abs().sum() > 0 and v2.grad.abs().sum() > 0
    for loss in losses:
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.parameters())


# --- every registered method: each term builds and returns finite declared terms -------------

VARIANTS = [(name, {}) for name in METHODS.names()] + [
    ("kdmcse", {"false_negative_filter": True, "false_negative_threshold": 0.2}),
    ("dalr", {"text_objective": "arc_margin", "image_objective": "adapacse"}),
    ("dalr", {"teachers_on": "caption", "global_local_weight": 1.0, "consistency_weight": 0.01}),
]
TOKENS, DIM = 5, 12
PHRASE_SPANS = [[1, 2], [2, 4], [-1, -1]]  # token (start, end); the last one padded


def fake_feature(role: str, batch: int) -> torch.Tensor:
    """Random cached features; roles ending in ``_tokens`` hold ``[L, D]`` rows (padding included)."""
    if role == "object":  # MCSEO: P objects per caption, paired with phrase_spans
        return torch.randn(batch, len(PHRASE_SPANS), DIM)
    if role.endswith("_tokens"):
        tokens = torch.randn(batch, TOKENS, DIM)
        tokens[0, -2:] = 0  # padding
        return tokens
    return torch.randn(batch, DIM)


@pytest.mark.parametrize(("name", "overrides"), VARIANTS, ids=lambda v: str(v) if v else "")
@pytest.mark.parametrize("kind", ["text", "caption"])
def test_every_method_term_runs(name, overrides, kind):
    torch.manual_seed(0)
    method = build_method(name, **overrides)
    roles = set(method.text_roles) | (set(method.caption_roles) if kind == "caption" else set())
    dims = {role: DIM for role in roles}
    inputs = LossInputs(
        torch.randn(B, H, requires_grad=True),
        torch.randn(B, H, requires_grad=True),
        features={role: fake_feature(role, B) for role in roles},
        batch_kind=kind,
        token_states=(torch.randn(B, TOKENS, H), torch.randn(B, TOKENS, H)),
        attention_mask=torch.ones(B, TOKENS, dtype=torch.long),
        extras={
            "phrase_spans": torch.tensor([PHRASE_SPANS] * B),
            "phrase_mask": torch.tensor([[s[0] >= 0 for s in PHRASE_SPANS]] * B),
        },
    )
    for term in method.active_terms():
        if not term.applies_to(kind):
            continue
        loss = LOSSES.get(term.loss)(hidden_size=H, feature_dims=dims, **term.options)
        out = loss(inputs)
        assert set(out) == set(loss.terms), term.name
        assert set(loss.requires) <= roles, term.name
        for value in out.values():
            assert value.dim() == 0 and torch.isfinite(value), term.name
