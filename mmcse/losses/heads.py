"""Projection heads: declared by a method, built once by the trainer, applied by the losses.

A loss owns no parameters. It names the heads it applies (its ``slots``, e.g. ``"student"`` for
the head on the sentence embedding, ``"image"`` for the one on the cached image feature) and
receives them in ``forward``. A method declares, per term, which :class:`Head` fills each slot;
the trainer builds every head *name* once (:func:`mmcse.methods.build_heads`), so two terms
naming the same head train the same parameters. DALR's released code feeds its one SimCSE pooler
(``z1``, ``z2``) to ℓ_SimCSE, ℓ_rank, ℓ_IMA, ℓ_CMA, ℓ_cons and ℓ_g2l; DALR's paper writes one
student score ``s^z`` for eqs. 4, 6, 10 and 11 — both are one head named by several terms.

Widths are given as an int, :data:`HIDDEN` (the student's hidden size) or a feature role (that
cached feature's width, e.g. ``"image"``), and resolved when the run's encoder and cache are
known. In a unit test a head is simply ``MLPHead(16, 8)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from mmcse.errors import MmcseError

#: a head width that means "the student encoder's hidden size"
HIDDEN = "hidden"
HEAD_INITS = ("bert", "torch")
HEAD_KINDS = ("mlp", "aligner")


class MLPHead(nn.Sequential):
    """One Linear + Tanh, the projection head SimCSE and MCSE put on [CLS].

    ``init="bert"``: weights normal(0, 0.02), bias zero — BERT's ``_init_weights``, which the
    released code applies to every head built inside its ``BertForCL``/``RobertaForCL``
    (SimCSE's and MCSE's ``cl_init`` → ``init_weights()``: the [CLS] ``mlp``/``pooler``,
    VisualCSE's ``image_mlp``). ``init="torch"``: PyTorch's default Linear init (Kaiming-uniform),
    what the released code's heads *outside* the BERT module get (MCSE's ``grounding`` and
    image ``MLPLayer``, KDMCSE/DALR's grounding heads).
    """

    def __init__(self, in_dim: int, out_dim: int, init: str = "torch") -> None:
        super().__init__(nn.Linear(in_dim, out_dim), nn.Tanh())
        if init not in HEAD_INITS:
            raise ValueError(f"head init must be one of {HEAD_INITS}, not {init!r}")
        if init == "bert":
            nn.init.normal_(self[0].weight, mean=0.0, std=0.02)
            nn.init.zeros_(self[0].bias)


class AlignerHead(nn.Sequential):
    """DALR's ``ConsistencySimilarityModule`` aligner: two Linear + BatchNorm + ReLU blocks into
    the shared space (PyTorch's default init, as the code's)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__(
            nn.Linear(in_dim, in_dim),
            nn.BatchNorm1d(in_dim),
            nn.ReLU(),
            nn.Linear(in_dim, out_dim),
            nn.BatchNorm1d(out_dim),
            nn.ReLU(),
        )


@dataclass(frozen=True)
class Head:
    """A trainable head a method declares for one slot of a term.

    Attributes:
        input, output: widths — an int, :data:`HIDDEN` or a feature role (see the module).
        init: ``"bert"`` (normal(0, 0.02), zero bias) or ``"torch"`` (PyTorch's default);
            :class:`MLPHead` only.
        kind: ``"mlp"`` (:class:`MLPHead`) or ``"aligner"`` (:class:`AlignerHead`).
        name: the name it is built and saved under; terms naming the same head share it.
            ``None``: private to its term, named ``{term}_{slot}``.
    """

    input: int | str
    output: int | str
    init: str = "torch"
    kind: str = "mlp"
    name: str | None = None

    def __post_init__(self) -> None:
        if self.init not in HEAD_INITS:
            raise ValueError(f"head init must be one of {HEAD_INITS}, not {self.init!r}")
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"head kind must be one of {HEAD_KINDS}, not {self.kind!r}")
        if self.kind == "aligner" and self.init != "torch":
            raise ValueError("an aligner head has PyTorch's default init only")

    def widths(self, hidden_size: int, feature_dims: Mapping[str, int]) -> tuple[int, int]:
        """``(in, out)`` in numbers, for a student of ``hidden_size`` and these cached roles."""
        return (
            resolve_width(self.input, hidden_size, feature_dims),
            resolve_width(self.output, hidden_size, feature_dims),
        )

    def build(self, hidden_size: int, feature_dims: Mapping[str, int]) -> nn.Module:
        in_dim, out_dim = self.widths(hidden_size, feature_dims)
        if self.kind == "aligner":
            return AlignerHead(in_dim, out_dim)
        return MLPHead(in_dim, out_dim, self.init)


def resolve_width(width: int | str, hidden_size: int, feature_dims: Mapping[str, int]) -> int:
    if isinstance(width, int):
        return width
    if width == HIDDEN:
        return hidden_size
    if width not in feature_dims:
        have = ", ".join(sorted(feature_dims)) or "none"
        raise MmcseError(
            f"a head reads the cached feature role {width!r}, which this run does not load "
            f"(it has: {have}); give --feature {width}=DIR"
        )
    return int(feature_dims[width])
