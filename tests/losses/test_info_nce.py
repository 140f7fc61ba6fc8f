"""SimCSE and MCSE losses against explicit-loop computations (written independently)."""

import math

import pytest
import torch

from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.losses.image_text_info_nce import ImageTextInfoNCELoss
from mmcse.losses.info_nce import SimCSELoss


def cos(a, b):
    return float(
        sum(x * y for x, y in zip(a, b, strict=True))
        / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    )


def loop_info_nce(queries, keys, tau):
    total = 0.0
    for i, q in enumerate(queries):
        logits = [cos(q, k) / tau for k in keys]
        total += -(logits[i] - math.log(sum(math.exp(v) for v in logits)))
    return total / len(queries)


@pytest.fixture
def views():
    torch.manual_seed(0)
    return torch.randn(5, 8), torch.randn(5, 8)


def test_simcse_matches_loop(views):
    loss, heads = SimCSELoss(temperature=0.05), {"student": MLPHead(8, 8, "bert")}
    h1, h2 = (heads["student"](v).tolist() for v in views)
    got = loss(LossInputs(*views), heads)["simcse_loss"].item()
    assert got == pytest.approx(loop_info_nce(h1, h2, 0.05), rel=1e-4)


def test_mcse_term_sums_views(views):
    torch.manual_seed(1)
    image = torch.randn(5, 12)
    loss = ImageTextInfoNCELoss(views="sum")
    heads = {"student": MLPHead(8, 4), "image": MLPHead(12, 4)}
    v = heads["image"](image).tolist()
    expected = sum(loop_info_nce(heads["student"](x).tolist(), v, 0.05) for x in views)
    got = loss(LossInputs(*views, features={"image": image}, batch_kind="caption"), heads)
    assert got["image_text_loss"].item() == pytest.approx(expected, rel=1e-4)


def test_missing_role_is_a_clear_error(views):
    heads = {"student": MLPHead(8, 4), "image": MLPHead(12, 4)}
    with pytest.raises(ValueError, match="needs the cached feature role 'image'"):
        ImageTextInfoNCELoss()(LossInputs(*views), heads)


def test_gradients_reach_views_and_heads(views):
    v1, v2 = (v.clone().requires_grad_() for v in views)
    head = MLPHead(8, 8, "bert")
    SimCSELoss()(LossInputs(v1, v2), {"student": head})["simcse_loss"].backward()
    assert v1.grad.abs().sum() > 0 and v2.grad.abs().sum() > 0
    assert head[0].weight.grad.abs().sum() > 0
