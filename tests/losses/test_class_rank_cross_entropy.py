"""VisualCSE/AudioCSE's released ``--new_supcon`` objective against a loop written from the code's
description: N×N cross-view cosines over τ, cross-entropy per first view, target = the rank of
the example's class among the batch's distinct classes, mean over the N rows."""

from __future__ import annotations

import math

import pytest
import torch

import mmcse.losses  # noqa: F401  (registers every loss)
from mmcse.losses.base import LossInputs
from mmcse.losses.class_rank_cross_entropy import ClassRankCrossEntropyLoss, class_rank_targets
from mmcse.losses.heads import MLPHead
from mmcse.losses.simclr import SimCLRLoss
from mmcse.losses.supcon import SupConLoss


def loop_class_rank_ce(f1, f2, labels, tau):
    a, b = f1.double().tolist(), f2.double().tolist()

    def cos(x, y):
        dot = sum(p * q for p, q in zip(x, y, strict=True))
        return dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))

    distinct = set(labels)
    total = 0.0
    for i in range(len(a)):
        target = sum(1 for y in distinct if y < labels[i])  # the class rank, from 0
        logits = [cos(a[i], b[j]) / tau for j in range(len(b))]  # no mask: j = i is a candidate
        total -= logits[target] - math.log(sum(math.exp(v) for v in logits))
    return total / len(a)


def test_targets_are_class_ranks_among_the_batch():
    assert class_rank_targets(torch.tensor([7, 2, 7, 5])).tolist() == [2, 0, 2, 1]
    assert class_rank_targets(torch.tensor([40, 3, 11])).tolist() == [2, 0, 1]
    g = torch.Generator().manual_seed(0)
    for _ in range(50):  # the released construction, torch.unique's inverse, on random batches
        labels = torch.randint(0, 9, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g)
        want = torch.unique(labels, sorted=True, return_inverse=True)[1]
        assert torch.equal(class_rank_targets(labels), want)


@pytest.mark.parametrize(
    "labels",
    [[5, 1, 5, 3, 1, 9], [2, 2, 2, 2, 2, 2], [9, 8, 7, 6, 5, 4], [0, 1, 2, 3, 4, 5]],
    ids=["repeats", "one-class", "distinct-descending", "distinct-in-order"],
)
def test_matches_loop(labels):
    torch.manual_seed(0)
    f1, f2 = torch.randn(6, 5), torch.randn(6, 5)
    got = ClassRankCrossEntropyLoss.compute_loss_from_embeddings(f1, f2, torch.tensor(labels), 0.07)
    assert got.item() == pytest.approx(loop_class_rank_ce(f1, f2, labels, 0.07), rel=1e-5)


def test_forward_applies_the_head_and_reads_the_labels():
    torch.manual_seed(1)
    loss, head = ClassRankCrossEntropyLoss(temperature=0.5), MLPHead(8, 8, "bert")
    view1, view2 = torch.randn(5, 8, requires_grad=True), torch.randn(5, 8)
    labels = [3, 0, 3, 7, 0]
    out = loss(LossInputs(view1, view2, extras={"labels": torch.tensor(labels)}), {"student": head})
    expected = loop_class_rank_ce(head(view1), head(view2), labels, 0.5)
    assert list(out) == ["class_rank_ce_loss"]
    assert out["class_rank_ce_loss"].item() == pytest.approx(expected, rel=1e-5)
    out["class_rank_ce_loss"].backward()
    assert view1.grad.abs().sum() > 0 and head[0].weight.grad is not None


def test_is_simclr_only_when_targets_are_the_diagonal():
    """Unlabelled, or distinct labels in batch order: c_i = i, the code's new_SimCLR_forward;
    shuffled distinct labels point at other examples, and it is neither SimCLR nor SupCon."""
    torch.manual_seed(2)
    f1, f2 = torch.randn(6, 5), torch.randn(6, 5)
    simclr = SimCLRLoss.compute_loss_from_embeddings(f1, f2, 0.07).item()
    ours = ClassRankCrossEntropyLoss.compute_loss_from_embeddings
    assert ours(f1, f2, None, 0.07).item() == pytest.approx(simclr, rel=1e-6)
    assert ours(f1, f2, torch.arange(6) * 3, 0.07).item() == pytest.approx(simclr, rel=1e-6)
    shuffled = torch.tensor([4, 0, 5, 1, 3, 2])
    assert abs(ours(f1, f2, shuffled, 0.07).item() - simclr) > 0.1
    supcon = SupConLoss.compute_loss_from_embeddings(f1, f2, shuffled, 0.07).item()
    assert abs(ours(f1, f2, shuffled, 0.07).item() - supcon) > 0.1
