"""A method is a named composition of registered losses, with its weights in a dataclass.

Each method is a dataclass registered with :func:`mmcse.registry.register_method`; its fields are
the hyperparameters a researcher tunes or ablates (weights, temperatures, margins) and
:meth:`Method.terms` turns them into :class:`Term` s. A term whose weight is zero is not computed,
so an ablation is the same method with some weights set to zero.

A term also declares the projection heads its loss applies (:class:`~mmcse.losses.heads.Head`,
one per slot of the loss). The trainer builds each head name once (:func:`build_heads`): terms
naming the same head share its parameters. :func:`build_losses` builds the (parameter-free) loss
of every active term from its options, refusing an option the loss does not take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.losses.base import build_loss, check_slots
from mmcse.losses.heads import HIDDEN, Head
from mmcse.registry import METHODS
from mmcse.settings import check_settings

BATCH_KINDS = ("all", "text", "caption")


@dataclass(frozen=True)
class Term:
    """One weighted loss of a method.

    Attributes:
        name: the name this term's loss module is saved and logged under (unique per method).
        loss: the registered loss it instantiates.
        weight: multiplier in the total; 0 switches the term off (it is not computed).
        on: which batches it applies to: ``"all"``, ``"text"`` (text-only corpus) or
            ``"caption"`` (image–caption batches, where cached image features exist).
        options: keyword arguments for the loss constructor (temperature, margins, roles, ...).
        heads: the head in each of the loss's slots (e.g. ``{"student": Head(HIDDEN, 256)}``);
            heads named alike are one head, shared by every term naming it.
    """

    name: str
    loss: str
    weight: float = 1.0
    on: str = "all"
    options: dict[str, Any] = field(default_factory=dict)
    heads: dict[str, Head] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.on not in BATCH_KINDS:
            raise ValueError(
                f"term {self.name!r}: on must be one of {BATCH_KINDS}, not {self.on!r}"
            )

    def applies_to(self, batch_kind: str) -> bool:
        return self.weight != 0 and self.on in ("all", batch_kind)

    def head_names(self) -> dict[str, str]:
        """Slot → the name of the head in it (a head without a name is ``{term}_{slot}``)."""
        return {slot: head.name or f"{self.name}_{slot}" for slot, head in self.heads.items()}


class RunData(Protocol):
    """What a method's per-batch hook reads of the run's data
    (:class:`mmcse.training.data.TrainData` is one): the config (``max_seq_length``,
    ``dynamic_padding``), the corpora by batch kind (their ``ids`` and ``texts``), the feature
    sets by role, and the student's tokenizer."""

    cfg: Any
    sources: Mapping[str, Any]
    feature_sets: Mapping[str, Any]
    tokenizer: Any


class HostBatch(Protocol):
    """What a method's per-batch hook reads of a batch: its kind, its corpus rows, and its
    token ids (the device the hook's tensors go to)."""

    kind: str
    rows: np.ndarray
    input_ids: Tensor


@dataclass(frozen=True)
class BatchInputs:
    """A method's per-batch inputs beyond token ids and the features joined by id, returned by
    :meth:`Method.batch_inputs`; the trainer's gather puts them on the batch
    (:meth:`apply_to`): ``extras`` go to ``LossInputs.extras`` (MCSEO's phrase spans),
    ``features`` are teacher features by role that no id join gives (MCSEO's per-phrase
    objects), where the loss reads its teacher roles."""

    extras: dict[str, Tensor] = field(default_factory=dict)
    features: dict[str, Tensor] = field(default_factory=dict)

    def apply_to(self, batch: Any) -> dict[str, Tensor]:
        """Set them on ``batch`` (its ``features`` updated, its ``extras`` replaced); returns
        the extras."""
        batch.features.update(self.features)
        batch.extras = dict(self.extras)
        return batch.extras


@dataclass
class Method:
    """Base of every method dataclass."""

    name: ClassVar[str] = "method"
    #: feature roles the method reads on caption batches (``--features role=DIR`` must give them)
    caption_roles: ClassVar[tuple[str, ...]] = ()
    #: feature roles read on every batch (e.g. a text teacher cached for the text corpus too)
    text_roles: ClassVar[tuple[str, ...]] = ()

    def terms(self) -> list[Term]:  # pragma: no cover - abstract
        raise NotImplementedError

    def active_terms(self) -> list[Term]:
        return [t for t in self.terms() if t.weight != 0]

    def weight_fields(self) -> list[str]:
        """Names of fields that are term weights (what ``mmcse ablate --drop`` sets to zero)."""
        return [f.name for f in dataclasses.fields(self) if f.name.endswith("_weight")]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **dataclasses.asdict(self)}

    def describe(self) -> str:
        """The composition, one term a line, then the heads several terms share (``mmcse
        methods``, ``train --dry-run``)."""
        lines = [f"  {t.weight:g} × {t.name} ({t.loss}, on {t.on} batches)" for t in self.terms()]
        users: dict[str, list[str]] = {}
        for term in self.active_terms():
            for name in term.head_names().values():
                users.setdefault(name, []).append(term.name)
        shared = [f"  head {n} shared by {', '.join(t)}" for n, t in users.items() if len(t) > 1]
        return "\n".join([f"{self.name}:", *lines, *shared])

    # -- optional hooks the trainer calls; the defaults do nothing ---------------------------
    def batch_inputs(self, data: RunData, batch: HostBatch) -> BatchInputs:
        """Per-batch inputs beyond token ids and joined features (e.g. MCSEO's phrase spans);
        computed on the prefetch thread, so it reads ``data`` and ``batch`` and writes neither."""
        return BatchInputs()

    def auxiliary_task(self, encoder: Any, cfg: Any, device: Any) -> Any:
        """A second task whose update the trainer runs before each text update (VisualCSE's
        image task: its forward and inputs; :mod:`mmcse.training.updates` steps it), or None."""
        return None

    def auxiliary_roles(self) -> tuple[str, ...]:
        """Feature roles the auxiliary task reads (joined to no corpus), when it runs."""
        return ()


def build_method(name: str, **overrides: Any) -> Method:
    """Instantiate a registered method, refusing unknown hyperparameter names clearly."""
    cls = METHODS.get(name)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"method {name!r} has no setting {', '.join(unknown)}; it has: {', '.join(sorted(known))}"
        )
    # types from the annotations, ranges from the fields' metadata
    return cls(**check_settings(cls, overrides, f"method {name!r} setting"))


def build_losses(method: Method) -> nn.ModuleDict:
    """The loss of every active term, by term name, each checked against the heads it is given."""
    losses = {}
    for term in method.active_terms():
        where = f"method {method.name!r} term {term.name!r}"
        loss = build_loss(term.loss, term.options, where)
        check_slots(loss, {slot: head.kind for slot, head in term.heads.items()}, where)
        losses[term.name] = loss
    return nn.ModuleDict(losses)


def build_heads(method: Method, hidden_size: int, feature_dims: Mapping[str, int]) -> nn.ModuleDict:
    """Every head the active terms name, built once, by name.

    Heads are built in the order the terms first name them (term order, then slot order): the
    order the seed's draws follow, so keep it when editing a method, or a seed's initial heads
    change. Two terms naming one head must declare it alike (same kind, widths and init); a
    mismatch is a one-line error naming both terms.
    """
    heads: dict[str, nn.Module] = {}
    declared: dict[str, tuple[tuple, str, Head]] = {}  # name → (kind, widths, init), term, head
    for term in method.active_terms():
        for slot, name in term.head_names().items():
            head = term.heads[slot]
            shape = (head.kind, *head.widths(hidden_size, feature_dims), head.init)
            if name not in heads:
                heads[name] = head.build(hidden_size, feature_dims)
                declared[name] = (shape, term.name, head)
            elif declared[name][0] != shape:
                first_shape, first, first_head = declared[name]
                raise MmcseError(
                    f"method {method.name!r}: terms {first!r} and {term.name!r} declare head "
                    f"{name!r} differently: {_shape_text(first_shape, first_head)} vs "
                    f"{_shape_text(shape, head)}"
                )
    return nn.ModuleDict(heads)


def _shape_text(shape: tuple, head: Head) -> str:
    kind, in_dim, out_dim, init = shape
    text = f"{kind} {in_dim}→{out_dim} ({init} init)"
    if isinstance(head.output, str) and head.output != HIDDEN:  # the width of a cached feature
        text += f" [output = the width of cached feature {head.output!r}]"
    return text
