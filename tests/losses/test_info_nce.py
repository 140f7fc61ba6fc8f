"""SimCSE and MCSE losses against explicit-loop computations (written independently)."""

import math

import pytest
import torch

from mmcse.losses.base import LossInputs
from mmcse.losses.image_text_info_nce import ImageTextInfoNCELoss
from mmcse.losses.info_nce import SimCSELoss
from mmcse.methods import build_method
from mmcse.registry import LOSSES, METHODS


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
    loss = SimCSELoss(hidden_size=8, temperature=0.05)
    h1, h2 = (loss.mlp(v).tolist() for v in views)
    got = loss(LossInputs(*views))["simcse_loss"].item()
    assert got == pytest.approx(loop_info_nce(h1, h2, 0.05), rel=1e-4)


def test_mcse_term_sums_views(views):
    torch.manual_seed(1)
    image = torch.randn(5, 12)
    loss = ImageTextInfoNCELoss(
        hidden_size=8, feature_dims={"image": 12}, proj_dim=4, views="sum"
    )
    v = loss.image_head(image).tolist()
    expected = sum(loop_info_nce(loss.text_head(x).tolist(), v, 0.05) for x in views)
    got = loss(LossInputs(*views, features={"image": image}, batch_kind="caption"))
    assert got["image_text_loss"].item() == pytest.approx(expected, rel=1e-4)


def test_missing_role_is_a_clear_error(views):
    loss = ImageTextInfoNCELoss(hidden_size=8, feature_dims={"image": 12})
    with pytest.raises(ValueError, match="needs the cached feature role 'image'"):
        loss(LossInputs(*views))


def test_gradients_reach_views_and_heads(views):
    v1, v2 = (v.clone().requires_grad_() for v in views)
    loss = SimCSELoss(hidden_size=8)
    loss(LossInputs(v1, v2))["simcse_loss"].backward()
    assert v1.grad.abs().sum() > 0 and v2.grad.abs().sum() > 0
    assert loss.mlp[0].weight.grad.abs().sum() > 0


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
