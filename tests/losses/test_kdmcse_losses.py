"""KDMCSE's losses against loop re-computations."""

from __future__ import annotations

import math

import pytest
import torch

import mmcse.methods  # noqa: F401  (registers every loss and method)
from mmcse.losses.adaptive_angular_margin import AdaptiveAngularMarginLoss, false_negative_mask
from mmcse.losses.arc_margin_info_nce import ArcMarginInfoNCELoss
from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.losses.info_nce import SimCSELoss

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
    heads = {"student": MLPHead(H, H, "bert")}  # one head: the two losses read the same h
    inputs = LossInputs(*views)
    arc = ArcMarginInfoNCELoss(margin=0.0)(inputs, heads)["arc_margin_loss"]
    simcse = SimCSELoss()(inputs, heads)["simcse_loss"]
    assert arc.item() == pytest.approx(simcse.item(), rel=1e-6)


def caption_inputs(views, dims=(10, 12)):
    torch.manual_seed(1)
    features = {"clip_image": torch.randn(B, dims[0]), "clip_text": torch.randn(B, dims[1])}
    return LossInputs(*views, features=features, batch_kind="caption")


def grounding_heads(dims=(10, 12), proj=8):
    """AdapACSE's three heads: the grounding head on [CLS] and one per CLIP target."""
    return {
        "student": MLPHead(H, proj),
        "image": MLPHead(dims[0], proj),
        "text": MLPHead(dims[1], proj),
    }


def projected(heads, inputs):
    """The projected views and targets the loss will contrast (recomputed outside it)."""
    views = [heads["student"](v) for v in (inputs.view1, inputs.view2)]
    image = heads["image"](inputs.features["clip_image"])
    text = heads["text"](inputs.features["clip_text"])
    return views, image, text


def test_adaptive_margin_matches_loop(views):
    inputs = caption_inputs(views)
    loss, heads = AdaptiveAngularMarginLoss(margin=0.4), grounding_heads()
    out = loss(inputs, heads)
    views_p, image, text = projected(heads, inputs)
    img_t, txt_t = inputs.features["clip_image"], inputs.features["clip_text"]
    expected_image = sum(margin_nll_loop(v, image, 0.4, 0.05, teacher=img_t) for v in views_p) / 2
    expected_text = sum(margin_nll_loop(v, text, 0.4, 0.05, teacher=txt_t) for v in views_p) / 2
    assert out["image_margin_loss"].item() == pytest.approx(expected_image, rel=1e-4)
    assert out["text_margin_loss"].item() == pytest.approx(expected_text, rel=1e-4)


def test_zero_margin_without_filter_is_plain_info_nce(views):
    inputs = caption_inputs(views)
    loss, heads = AdaptiveAngularMarginLoss(margin=0.0), grounding_heads()
    out = loss(inputs, heads)
    views_p, image, text = projected(heads, inputs)
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

    loss = AdaptiveAngularMarginLoss(margin=0.2, false_negative_threshold=threshold)
    heads = grounding_heads(dims=(8, 8))
    out = loss(inputs, heads)
    views_p, image, _ = projected(heads, inputs)
    loop = sum(
        margin_nll_loop(v, image, 0.2, 0.05, teacher=img_t, dropped=expected) for v in views_p
    )
    assert out["image_margin_loss"].item() == pytest.approx(loop / 2, rel=1e-4)


def test_filter_needs_both_teachers():
    with pytest.raises(ValueError, match="false-negative"):
        AdaptiveAngularMarginLoss("image", None, false_negative_threshold=0.5)


def test_gradients_reach_views_and_heads(views):
    v1, v2 = (v.clone().requires_grad_() for v in views)
    inputs = caption_inputs((v1, v2))
    losses = [
        (ArcMarginInfoNCELoss(), {"student": MLPHead(H, H, "bert")}),
        (AdaptiveAngularMarginLoss(), grounding_heads()),
    ]
    total = sum(sum(loss(inputs, heads).values()) for loss, heads in losses)
    total.backward()
    assert v1.grad.abs().sum() > 0 and v2.grad.abs().sum() > 0
    for _, heads in losses:
        for head in heads.values():
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
