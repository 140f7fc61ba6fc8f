"""Every registered loss, by construction (timm style): it builds standalone from its defaults,
returns exactly the terms it declares, passes gradients to the student, refuses unknown options.

The equations themselves are checked per loss against loop re-computations (the other files).
One width W for every tensor and head, so any head fits any slot without per-loss tables.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import mmcse.losses  # noqa: F401  (registers every loss)
from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs, build_loss, loss_options
from mmcse.losses.heads import HEAD_KINDS, AlignerHead, MLPHead
from mmcse.registry import LOSSES

B, L, P, W = 6, 5, 3, 8
PHRASE_SPANS = [[1, 2], [2, 4], [-1, -1]]  # token (start, end) per pair; the last one padded


def feature(role: str) -> torch.Tensor:
    """A cached feature of ``role``: ``[B, P, W]`` objects, ``[B, L, W]`` token states (with
    padding), else ``[B, W]``."""
    if role == "object":
        return torch.randn(B, P, W)
    if role.endswith("_tokens"):
        tokens = torch.randn(B, L, W)
        tokens[0, -2:] = 0
        return tokens
    return torch.randn(B, W)


def minimal_inputs(loss) -> LossInputs:
    spans = torch.tensor([PHRASE_SPANS] * B)
    return LossInputs(
        view1=torch.randn(B, W, requires_grad=True),
        view2=torch.randn(B, W, requires_grad=True),
        features={role: feature(role) for role in loss.requires},
        batch_kind="caption",
        token_states=(
            torch.randn(B, L, W, requires_grad=True),
            torch.randn(B, L, W, requires_grad=True),
        ),
        attention_mask=torch.ones(B, L, dtype=torch.long),
        extras={
            "phrase_spans": spans,
            "phrase_mask": spans[..., 0] >= 0,
            "labels": torch.tensor([0, 1, 0, 2, 1, 3]),
        },
    )


def minimal_heads(loss, optional: bool = False) -> dict[str, torch.nn.Module]:
    make = {"mlp": MLPHead, "aligner": AlignerHead}
    return {
        slot: make[kind](W, W)
        for slot, kind in loss.slots.items()
        if optional or slot not in loss.optional_slots
    }


def student_tensors(inputs: LossInputs) -> list[torch.Tensor]:
    return [inputs.view1, inputs.view2, *inputs.token_states]


@pytest.mark.parametrize("name", LOSSES.names())
def test_declares_its_contract(name):
    cls = LOSSES.get(name)
    loss = cls()
    assert loss.terms and all(t.endswith("_loss") for t in loss.terms)
    assert all(isinstance(role, str) for role in loss.requires)
    assert loss.slots and set(loss.slots.values()) <= set(HEAD_KINDS)
    assert set(loss.optional_slots) <= set(loss.slots)
    assert not list(loss.parameters())  # heads are the method's, passed to forward
    for section in ("Inputs", "Returns", "Heads"):  # the spec is the class docstring
        assert section in (cls.__doc__ or ""), section


@pytest.mark.parametrize("optional", [False, True], ids=["required-heads", "all-heads"])
@pytest.mark.parametrize("name", LOSSES.names())
def test_forward_returns_exactly_its_finite_scalar_terms(name, optional):
    torch.manual_seed(0)
    loss = LOSSES.get(name)()
    out = loss(minimal_inputs(loss), minimal_heads(loss, optional))
    assert list(out) == list(loss.terms)
    for key, value in out.items():
        assert value.dim() == 0 and torch.isfinite(value), key


@pytest.mark.parametrize("name", LOSSES.names())
def test_backward_reaches_the_student_and_every_head(name):
    torch.manual_seed(0)
    loss = LOSSES.get(name)()
    inputs, heads = minimal_inputs(loss), minimal_heads(loss, optional=True)
    sum(loss(inputs, heads).values()).backward()
    reached = [t.grad.abs().sum() for t in student_tensors(inputs) if t.grad is not None]
    assert reached and sum(reached) > 0
    for slot, head in heads.items():
        assert all(p.grad is not None for p in head.parameters()), slot


@pytest.mark.parametrize("name", LOSSES.names())
def test_an_unknown_option_is_refused(name):
    accepted = loss_options(name)
    assert not any(  # every option is declared: nothing is swallowed by **kwargs
        p.kind is inspect.Parameter.VAR_KEYWORD
        for p in inspect.signature(LOSSES.get(name)).parameters.values()
    )
    with pytest.raises(MmcseError) as info:
        build_loss(name, {"temprature": 0.1}, "method 'm' term 't'")
    message = str(info.value)
    assert message.startswith("method 'm' term 't': ") and "'temprature'" in message
    assert "\n" not in message and all(option in message for option in accepted)
    with pytest.raises(TypeError):
        LOSSES.get(name)(temprature=0.1)
