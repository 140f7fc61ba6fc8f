"""DALR (He et al., 2025) as a composition of registered losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from mmcse.losses.intra_modal_alignment import DEFAULT_TEXT_TEACHERS, normalize_teachers
from mmcse.methods.base import Method, Term
from mmcse.registry import register_method

#: Term options that name cached feature roles (what the method must declare it reads)
ROLE_OPTIONS = ("feature_role", "image_role", "text_role", "token_role")


@register_method("dalr")
@dataclass
class DALR(Method):
    """DALR: ℓ = ℓ_SimCSE + ℓ_Info + λ·(ℓ_cons + ℓ_CMA) + μ·(ℓ_rank + ℓ_IMA), eq. 14 + App. B.

    * ℓ_SimCSE (every batch, eq. 1) and ℓ_Info (caption batches, eq. 4: MCSE's text→image
      InfoNCE, :mod:`~mmcse.losses.image_text_info_nce`). MCSE's term *sums* the two dropout
      views; eq. 4 has one, so its weight is halved (the mean over views, the code's scale too).
    * ℓ_CML (caption batches): ℓ_cons (:mod:`~mmcse.losses.image_text_consistency`) and ℓ_CMA
      (:mod:`~mmcse.losses.cross_modal_alignment`), λ = ``cross_modal_weight`` = 0.1.
    * ℓ_IML: ℓ_rank (:mod:`~mmcse.losses.list_mle_distillation`) and ℓ_IMA
      (:mod:`~mmcse.losses.intra_modal_alignment`), μ = ``intra_modal_weight`` = 0.2; on every
      batch (``teachers_on="all"``: the text teachers are cached for both corpora) or, as in the
      released code, on caption batches only (``teachers_on="caption"``).

    Every sub-term has its own ``*_weight`` (1 by default) so each row of the paper's ablation
    (Table 3) is one ``--drop``. Teachers: ``text_teachers`` = ``(role, weight)`` pairs, default
    DiffCSE 0.33 + SimCSE 0.67 (RankCSE's release, which DALR follows); the image teacher is the
    role ``image`` (CLIP ViT-B/32 in the paper, ResNet-50 in App. E.2 — any cached image feature
    set mapped to the role). τ = 0.05; the KL terms use the code's temperatures (see
    :mod:`~mmcse.losses.intra_modal_alignment`). Paper recipe: BERT lr 2e-5 (RoBERTa 1e-5),
    batch 128, evaluate every 125 steps.

    The released code's variants, as named switches:

    * ``text_objective="arc_margin"``: the SimCSE term with an angular margin on negatives,
      ``text_margin`` = 0.18 (:mod:`~mmcse.losses.arc_margin_info_nce`).
    * ``image_objective="adapacse"``: ℓ_Info replaced by KDMCSE's AdapACSE against the image
      teacher, margins scaled by its image–image cosines (``image_margin``; 0.15, KDMCSE's value —
      the DALR release does not fix it).
    * ``consistency_weight=0.01``: the code's weight on ℓ_cons inside ℓ_CML.
    * ``teachers_on="caption"``: distillation only on caption batches.
    * ``global_local_weight=1.0``: the code's extra global-to-local token term inside ℓ_IML
      (:mod:`~mmcse.losses.global_local_info_nce`; needs cached teacher token states).
    """

    name: ClassVar[str] = "dalr"
    simcse_weight: float = 1.0
    image_text_weight: float = 1.0
    cross_modal_weight: float = 0.1
    consistency_weight: float = 1.0
    cma_weight: float = 1.0
    intra_modal_weight: float = 0.2
    rank_weight: float = 1.0
    ima_weight: float = 1.0
    global_local_weight: float = 0.0
    temperature: float = 0.05
    kl_temperature: float = 0.0225
    teacher_temperature: float = 0.5
    consistency_margin: float = 0.2
    proj_dim: int = 256
    text_objective: Literal["infonce", "arc_margin"] = "infonce"
    text_margin: float = 0.18
    image_objective: Literal["infonce", "adapacse"] = "infonce"
    image_margin: float = 0.15
    teachers_on: Literal["all", "caption"] = "all"
    text_teachers: tuple[tuple[str, float], ...] = DEFAULT_TEXT_TEACHERS
    image_role: str = "image"
    token_role: str = "text_teacher_tokens"

    def __post_init__(self) -> None:
        self.text_teachers = normalize_teachers(self.text_teachers)
        for field, value, allowed in (
            ("text_objective", self.text_objective, ("infonce", "arc_margin")),
            ("image_objective", self.image_objective, ("infonce", "adapacse")),
            ("teachers_on", self.teachers_on, ("all", "caption")),
        ):
            if value not in allowed:
                raise ValueError(f"dalr: {field} must be one of {allowed}, not {value!r}")

    # roles follow the active terms, so a switched-off teacher need not be cached
    @property
    def text_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return self._roles_read_on("all")

    @property
    def caption_roles(self) -> tuple[str, ...]:  # type: ignore[override]
        return self._roles_read_on("caption")

    def _roles_read_on(self, on: str) -> tuple[str, ...]:
        roles: list[str] = []
        for term in self.active_terms():
            if term.on == on:
                roles += [role for role, _ in term.options.get("text_teachers", ())]
                roles += [term.options[k] for k in ROLE_OPTIONS if term.options.get(k)]
        return tuple(dict.fromkeys(roles))

    def terms(self) -> list[Term]:
        return [
            self._text_term(),
            self._image_text_term(),
            *self._cross_modal_terms(),
            *self._intra_modal_terms(),
        ]

    def _text_term(self) -> Term:
        if self.text_objective == "arc_margin":
            options = {"margin": self.text_margin, "temperature": self.temperature}
            return Term("simcse", "arc_margin_info_nce", self.simcse_weight, "all", options)
        return Term(
            "simcse", "simcse", self.simcse_weight, "all", {"temperature": self.temperature}
        )

    def _image_text_term(self) -> Term:
        grounding = {"temperature": self.temperature, "proj_dim": self.proj_dim}
        if self.image_objective == "adapacse":
            options = {**grounding, "image_role": self.image_role, "text_role": None}
            options["margin"] = self.image_margin
            loss, weight = "adaptive_angular_margin", self.image_text_weight
        else:
            options = {**grounding, "feature_role": self.image_role}
            # MCSE's term sums the two views; half of it is eq. 4's single-view scale
            loss, weight = "image_text_info_nce", self.image_text_weight / 2
        return Term("image_text", loss, weight, "caption", options)

    def _cross_modal_terms(self) -> list[Term]:
        lam = self.cross_modal_weight
        consistency = {
            "image_role": self.image_role,
            "proj_dim": self.proj_dim,
            "margin": self.consistency_margin,
        }
        alignment = {
            "image_role": self.image_role,
            "text_teachers": self.text_teachers,
            "proj_dim": self.proj_dim,
            **self._kl_options(),
        }
        return [
            Term(
                "consistency",
                "image_text_consistency",
                lam * self.consistency_weight,
                "caption",
                consistency,
            ),
            Term("cma", "cross_modal_alignment", lam * self.cma_weight, "caption", alignment),
        ]

    def _intra_modal_terms(self) -> list[Term]:
        mu, on = self.intra_modal_weight, self.teachers_on
        teachers = {"text_teachers": self.text_teachers}
        rank = {**teachers, "temperature": self.temperature}
        ima = {**teachers, **self._kl_options()}
        tokens = {"token_role": self.token_role, "temperature": self.temperature}
        return [
            Term("rank", "list_mle_distillation", mu * self.rank_weight, on, rank),
            Term("ima", "intra_modal_alignment", mu * self.ima_weight, on, ima),
            Term(
                "global_local", "global_local_info_nce", mu * self.global_local_weight, on, tokens
            ),
        ]

    def _kl_options(self) -> dict[str, Any]:
        return {"temperature": self.kl_temperature, "teacher_temperature": self.teacher_temperature}
