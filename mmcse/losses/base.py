"""What every loss receives and returns.

A loss is an ``nn.Module`` registered with :func:`mmcse.registry.register_loss`. Its constructor
takes exactly its hyperparameters (temperature, margins, which feature roles it reads, ...);
it owns no parameters. The projection heads it applies are declared by the method and passed to
``forward`` by slot (:mod:`mmcse.losses.heads`). ``forward(inputs, heads)`` takes one
:class:`LossInputs` and returns a dict of named ``*_loss`` terms (open_clip style); the step's
total is the weighted sum the method defines. The maths lives in a pure
``compute_loss_from_embeddings`` (sentence-transformers style) so cached teacher tensors and test
tensors plug straight in. The spec of each loss — equation, paper, shapes, paper-vs-code
switches — is its class docstring.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.registry import LOSSES

#: the heads a loss's forward receives, by slot
Heads = Mapping[str, nn.Module]


class MissingInputError(ValueError):
    """A loss needs a teacher feature role or student output the step did not provide."""


@dataclass
class LossInputs:
    """Everything one training step hands to its losses.

    Student tensors carry gradients; teacher tensors come from the cache (no grad).

    Attributes:
        view1, view2: ``[B, H]`` sentence embeddings ([CLS] before any head) of the two dropout
            views of the same ``B`` sentences.
        features: cached teacher features of the batch, keyed by role (``"image"``,
            ``"clip_image"``, ``"clip_text"``, ``"text_teacher"``, ...), each ``[B, D_role]``.
        batch_kind: ``"text"`` (a text-only corpus batch) or ``"caption"`` (image–caption pairs).
        token_states: optional ``([B, L, H], [B, L, H])`` last-layer states of both views.
        attention_mask: optional ``[B, L]`` mask matching ``token_states``.
        extras: anything else a loss declares it needs (e.g. phrase spans, image ids).
    """

    view1: Tensor
    view2: Tensor
    features: dict[str, Tensor] = field(default_factory=dict)
    batch_kind: str = "text"
    token_states: tuple[Tensor, Tensor] | None = None
    attention_mask: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def feature(self, role: str) -> Tensor:
        try:
            return self.features[role]
        except KeyError:
            have = ", ".join(sorted(self.features)) or "none"
            raise MissingInputError(
                f"this loss needs the cached feature role {role!r}; the batch has: {have}"
            ) from None


class Loss(nn.Module):
    """Base class: declares the feature roles it reads, the heads it applies, the terms it returns.

    ``requires``, ``slots`` and ``terms`` are class defaults; a loss whose options change them
    (another feature role, a term switched off) sets them on the instance.
    """

    #: feature roles (keys of ``LossInputs.features``) this loss reads
    requires: ClassVar[tuple[str, ...]] = ()
    #: names of the terms ``forward`` returns (each ends in ``_loss``)
    terms: ClassVar[tuple[str, ...]] = ()
    #: the heads ``forward`` applies: slot → kind (``"mlp"`` or ``"aligner"``, see heads.py)
    slots: ClassVar[Mapping[str, str]] = {}
    #: slots a method may leave empty (the loss then reads that input unprojected)
    optional_slots: ClassVar[tuple[str, ...]] = ()
    #: whether forward needs ``LossInputs.token_states``
    needs_token_states: ClassVar[bool] = False

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:  # pragma: no cover
        raise NotImplementedError


def loss_options(name: str) -> list[str]:
    """The options the registered loss ``name`` takes (its constructor's parameters)."""
    return list(inspect.signature(LOSSES.get(name)).parameters)


def build_loss(name: str, options: Mapping[str, Any], where: str) -> Loss:
    """The registered loss ``name`` built from ``options``. An option it does not take is a
    one-line :class:`~mmcse.errors.MmcseError` starting with ``where`` (e.g. the method's term)."""
    accepted = loss_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise MmcseError(
            f"{where}: loss {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(accepted) or 'none'}"
        )
    return LOSSES.get(name)(**options)


def check_slots(loss: Loss, kinds: Mapping[str, str], where: str) -> None:
    """``kinds`` (slot → kind of the head a method put there) fit ``loss``: no unknown slot, every
    slot it needs filled, each with a head of its kind."""
    unknown = sorted(set(kinds) - set(loss.slots))
    missing = sorted(set(loss.slots) - set(kinds) - set(loss.optional_slots))
    if unknown or missing:
        problem = f"no head slot {unknown[0]!r}" if unknown else f"needs a head in {missing[0]!r}"
        raise MmcseError(
            f"{where}: loss {type(loss).__name__} has {problem}; its slots: "
            f"{', '.join(loss.slots) or 'none'}"
        )
    for slot, kind in kinds.items():
        if kind != loss.slots[slot]:
            raise MmcseError(f"{where}: slot {slot!r} takes an {loss.slots[slot]} head, not {kind}")


def l2_normalize(x: Tensor) -> Tensor:
    return torch.nn.functional.normalize(x, dim=-1)


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """``[N, M]`` cosine similarities between the rows of ``a`` and ``b``."""
    return l2_normalize(a) @ l2_normalize(b).T


def project_views(head: nn.Module, view1: Tensor, view2: Tensor) -> tuple[Tensor, Tensor]:
    """``head(view1), head(view2)`` in one call: a row-wise head (Linear, activation; no
    BatchNorm) gives the same rows, with one matmul instead of two (fewer kernels per step)."""
    both = head(torch.cat([view1, view2]))
    return both[: len(view1)], both[len(view1) :]


def project_features(head: nn.Module, features: Tensor) -> Tensor:
    """A cached teacher feature through ``head``, cast to the head's dtype first (the cache may
    hold float16 while the head trains in float32)."""
    return head(features.to(next(head.parameters()).dtype))
