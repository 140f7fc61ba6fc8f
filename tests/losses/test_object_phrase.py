"""MCSEO's object–phrase loss against a loop re-computation of eq. 7."""

from __future__ import annotations

import math

import pytest
import torch

from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.losses.object_phrase import ObjectPhraseInfoNCELoss, mean_over_spans


def loop_loss(phrases, objects, mask, temperature):
    """Eq. 7 with explicit loops: per pair, Σ over phrases of −log softmax over the pair's objects."""
    phrases, objects = phrases.detach(), objects.detach()
    total = 0.0
    for b in range(phrases.shape[0]):
        valid = [p for p in range(phrases.shape[1]) if mask[b, p]]
        if len(valid) < 2:
            continue
        for k in valid:
            sims = []
            for j in valid:
                a, o = phrases[b, k], objects[b, j]
                sims.append(float(a @ o) / (float(a.norm()) * float(o.norm())) / temperature)
            top = max(sims)
            log_sum = top + math.log(sum(math.exp(s - top) for s in sims))
            total += log_sum - sims[valid.index(k)]
    return total / phrases.shape[0]


def test_loss_matches_loop_computation():
    torch.manual_seed(0)
    phrases, objects = torch.randn(3, 4, 8), torch.randn(3, 4, 8)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    got = ObjectPhraseInfoNCELoss.compute_loss_from_embeddings(phrases, objects, mask, 0.05)
    assert got.item() == pytest.approx(loop_loss(phrases, objects, mask, 0.05), rel=1e-5)


def test_pairs_with_fewer_than_two_objects_are_skipped_but_keep_the_graph():
    phrases = torch.randn(2, 2, 4, requires_grad=True)
    objects = torch.randn(2, 2, 4)
    mask = torch.tensor([[True, False], [False, False]])
    loss = ObjectPhraseInfoNCELoss.compute_loss_from_embeddings(phrases, objects, mask)
    assert loss.item() == 0.0
    loss.backward()
    assert phrases.grad is not None


def test_mean_over_spans_matches_loop():
    torch.manual_seed(1)
    states = torch.randn(2, 7, 5)
    spans = torch.tensor([[[1, 3], [4, 7]], [[0, 1], [-1, -1]]])
    got = mean_over_spans(states, spans)
    for b in range(2):
        for p in range(2):
            start, end = spans[b, p].tolist()
            expected = states[b, start:end].mean(0) if start >= 0 else torch.zeros(5)
            assert torch.allclose(got[b, p], expected, atol=1e-6)


def test_forward_uses_both_views_and_needs_token_states():
    torch.manual_seed(2)
    loss = ObjectPhraseInfoNCELoss(views="sum")
    heads = {"phrase": MLPHead(6, 4), "object": MLPHead(10, 4)}
    assert loss.needs_token_states
    states = (torch.randn(2, 5, 6), torch.randn(2, 5, 6))
    spans = torch.tensor([[[1, 2], [2, 4]], [[1, 3], [3, 4]]])
    extras = {"phrase_spans": spans, "phrase_mask": torch.ones(2, 2, dtype=torch.bool)}
    objects = torch.randn(2, 2, 10)
    inputs = LossInputs(
        torch.randn(2, 6),
        torch.randn(2, 6),
        features={"object": objects},
        batch_kind="caption",
        token_states=states,
        extras=extras,
    )
    got = loss(inputs, heads)["object_phrase_loss"]
    o = heads["object"](objects)
    expected = sum(
        loop_loss(heads["phrase"](mean_over_spans(s, spans)), o, extras["phrase_mask"], 0.05)
        for s in states
    )
    assert got.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="token states"):
        loss(LossInputs(torch.randn(2, 6), torch.randn(2, 6), extras=extras), heads)
