"""What every loss receives and returns.

A loss is an ``nn.Module`` registered with :func:`mmcse.registry.register_loss`. It may own
projection heads (they train with the student and are saved with the checkpoint, but are not part
of the sentence embedding). Its ``forward`` takes one :class:`LossInputs` and returns a dict of
named ``*_loss`` terms (open_clip style); the step's total is the weighted sum the method defines.
The maths lives in a pure ``compute_loss_from_embeddings`` (sentence-transformers style) so cached
teacher tensors and test tensors plug straight in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn


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
    """Base class: declares the feature roles it reads and the term names it returns."""

    #: feature roles (keys of ``LossInputs.features``) this loss reads
    requires: ClassVar[tuple[str, ...]] = ()
    #: names of the terms ``forward`` returns (each ends in ``_loss``)
    terms: ClassVar[tuple[str, ...]] = ()
    #: whether forward needs ``LossInputs.token_states``
    needs_token_states: ClassVar[bool] = False

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError


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
