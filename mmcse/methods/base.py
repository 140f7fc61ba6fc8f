"""A method is a named composition of registered losses, with its weights in a dataclass.

Each method is a dataclass registered with :func:`mmcse.registry.register_method`; its fields are
the hyperparameters a researcher tunes or ablates (weights, temperatures, margins) and
:meth:`Method.terms` turns them into :class:`Term` s. A term whose weight is zero is not computed,
so an ablation is the same method with some weights set to zero.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmcse.registry import METHODS

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
        options: keyword arguments for the loss constructor (temperature, margins, dims, ...).
    """

    name: str
    loss: str
    weight: float = 1.0
    on: str = "all"
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.on not in BATCH_KINDS:
            raise ValueError(
                f"term {self.name!r}: on must be one of {BATCH_KINDS}, not {self.on!r}"
            )

    def applies_to(self, batch_kind: str) -> bool:
        return self.weight != 0 and self.on in ("all", batch_kind)


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
        """The composition, one term a line (``mmcse methods``, ``train --dry-run``)."""
        lines = [f"  {t.weight:g} × {t.name} ({t.loss}, on {t.on} batches)" for t in self.terms()]
        return "\n".join([f"{self.name}:", *lines])

    # -- optional hooks the trainer calls; the defaults do nothing ---------------------------
    def batch_extras(self, data: Any, batch: Any) -> dict[str, Any]:
        """Extra per-batch inputs for ``LossInputs.extras`` (e.g. MCSEO's phrase spans)."""
        return {}

    def auxiliary_task(self, encoder: Any, cfg: Any, device: Any) -> Any:
        """A second task stepped before each text step (VisualCSE's image step), or None."""
        return None


def build_method(name: str, **overrides: Any) -> Method:
    """Instantiate a registered method, refusing unknown hyperparameter names clearly."""
    cls = METHODS.get(name)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"method {name!r} has no setting {', '.join(unknown)}; it has: {', '.join(sorted(known))}"
        )
    from mmcse.training.config import (
        check_settings,  # types from the annotations, ranges from metadata
    )

    return cls(**check_settings(cls, overrides, f"method {name!r} setting"))
