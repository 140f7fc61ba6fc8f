"""DALR (He et al., 2025) as two compositions of registered losses: the released code and eq. 14.

``dalr`` (:class:`DALR`) is what the authors' code trains with their scripts
``scripts/run_wiki_{flickr,coco}.sh`` (``src/train_mix.py``, which imports
``src/model_modified.py``; ``kangverse/DALR`` at 849ece9, the continued history of
``Hekang001/DALR`` that the paper links), i.e. the setting behind the published tables;
``dalr-paper`` (:class:`DALRPaper`) is eq. 14 as printed. Every difference is a field of the
dataclass, so either variant can be moved towards the other. ``src/model_dalr.py`` (added
2025-11) is not imported by any script and is not what this module follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from mmcse.losses.heads import HIDDEN, Head
from mmcse.losses.intra_modal_alignment import DEFAULT_TEXT_TEACHERS, normalize_teachers
from mmcse.losses.list_mle_distillation import RELEASED_LOG_EPS
from mmcse.methods.base import Method, Term
from mmcse.registry import register_method

#: Term options that name cached feature roles (what the method must declare it reads)
ROLE_OPTIONS = ("feature_role", "image_role", "text_role", "token_role")
#: names of the heads shared between terms (:class:`~mmcse.losses.heads.Head`)
STUDENT_HEAD, IMAGE_HEAD = "dalr_student", "dalr_image"

CHOICES = {
    "text_objective": ("infonce", "arc_margin"),
    "image_objective": ("infonce", "adapacse"),
    "image_views": ("mean", "sum", "first"),
    "teachers_on": ("all", "caption"),
    "teacher_mix": ("embeddings", "similarities"),
    "rank_teacher_mix": ("embeddings", "similarities"),
    "cma_pairing": ("released", "paper"),
    "consistency_mismatch": ("random", "roll5"),
    "head_init": ("bert", "torch"),
}


@register_method("dalr")
@dataclass
class DALR(Method):
    """DALR as the released code trains it (``src/train_mix.py`` + ``src/model_modified.py``,
    ``kangverse/DALR`` at 849ece9; line numbers below are of ``model_modified.py``).

    Per caption batch the code's loss is ``loss + 0.1·cross_modal + 0.2·intra_modal``
    (``train_mix.py`` line 540) with

    * ``loss`` = ℓ_SimCSE with ``ArcSimilarity`` (angle of the negatives reduced by
      ``--margin1`` = 0.18; :mod:`~mmcse.losses.arc_margin_info_nce`), on every batch (628–632);
    * ``cross_modal`` = ``0.01·ℓ_cons + ℓ_CMA + cross_loss`` (765), where ``cross_loss`` is
      KDMCSE's AdapACSE of both views against the image (``--margin2`` = 0.18, margins scaled by
      the image–image cosines; :mod:`~mmcse.losses.adaptive_angular_margin`, image half only;
      756–764) — the code's stand-in for ℓ_Info, *inside* the λ = 0.1 bracket;
    * ``intra_modal`` = ``ℓ_IMA + ℓ_rank + ℓ_g2l`` (767–769; ℓ_g2l:
      :mod:`~mmcse.losses.global_local_info_nce`, added to ``rank_loss`` in 739);

    on text batches only ℓ_SimCSE (``cal_inter=False``, 635). λ = 0.1 and μ = 0.2 are
    hard-coded in ``train_mix.py`` (``--lbd`` is parsed but unused). Teachers (scripts): first
    SimCSE, second DiffCSE, ``--alpha_ 0.33`` → SimCSE 0.33 + DiffCSE 0.67; the KL targets mix
    the teachers' *embeddings* (720), the ranking target their similarities (719). ℓ_SimCSE,
    ℓ_rank, ℓ_IMA, ℓ_CMA, ℓ_cons and ℓ_g2l all read one student head, the SimCSE pooler
    (``z1``, ``z2``; Linear H→H + Tanh, BERT-initialised), and ℓ_rank, ℓ_IMA, ℓ_CMA use the
    arc-margin scores of ``self.sim`` (``student_margin`` = 0.18). KL temperatures: student
    0.05 × 0.45 = 0.0225, teacher 0.5. ℓ_cons: cosine-embedding loss, margin 0.2, mismatches by
    rolling the batch 5. ℓ_rank is the code's ``ListMLE`` with ε = 1e-7 inside its log
    (``rank_log_eps``; 0 = eq. 10 exactly). ℓ_CMA compares the pooler's ``z1`` with the *raw*
    image feature (745; ``cma_image_head=False``), which needs an image teacher of the
    pooler's width: the scripts' CLIP ViT-L/14 (768-d, ``flickr30k_ViT_L14.json``), which the
    ``dalr`` recipes read. ``cma_image_head=True`` puts a Linear + Tanh image head into the
    pooler's width instead (any teacher fits; the ``…/clip-vit-b32`` recipes, App. B's
    teacher), and ``share_image_head=True`` makes that head ℓ_Info's (eq. 6's ``h^v``).

    Not reproduced by default:

    * ``global_local_weight`` = 0: the code's ℓ_g2l (weight 1 inside the μ bracket) needs the
      teachers' *token* states; Stage 1 does not cache them (≈ 48 GB per 1M sentences, see
      the loss). Set it to 1 with a ``text_teacher_tokens`` feature set.
    * the teachers' float16 cast under the scripts' ``--fp16`` (709–713): mmcse reads the
      cached teacher features as stored and computes their similarities in float32.

    Each sub-term has its own ``*_weight`` so every row of the paper's ablation (Table 3) is
    one ``--drop``. See ``docs/fidelity.md`` for the full paper / code / mmcse table.
    """

    name: ClassVar[str] = "dalr"
    #: ℓ_SimCSE (eq. 1); the code always has it, eq. 14 does not
    simcse_weight: float = 1.0
    #: the image–text term (ℓ_Info in the paper, AdapACSE in the code)
    image_text_weight: float = 1.0
    #: code: the image–text term sits inside λ·(…) (weight λ·1); paper: outside (weight 1)
    image_text_in_cross_modal: bool = True
    cross_modal_weight: float = 0.1
    consistency_weight: float = 0.01
    cma_weight: float = 1.0
    intra_modal_weight: float = 0.2
    rank_weight: float = 1.0
    ima_weight: float = 1.0
    global_local_weight: float = 0.0
    temperature: float = 0.05
    kl_temperature: float = 0.0225
    teacher_temperature: float = 0.5
    consistency_margin: float = 0.2
    consistency_mismatch: Literal["random", "roll5"] = "roll5"
    proj_dim: int = 256
    text_objective: Literal["infonce", "arc_margin"] = "arc_margin"
    text_margin: float = 0.18
    image_objective: Literal["infonce", "adapacse"] = "adapacse"
    image_margin: float = 0.18
    #: views of ℓ_Info when ``image_objective="infonce"`` (AdapACSE always averages them)
    image_views: Literal["mean", "sum", "first"] = "mean"
    #: arc margin on the student scores of ℓ_rank, ℓ_IMA and ℓ_CMA (code: ``self.sim``)
    student_margin: float = 0.18
    teachers_on: Literal["all", "caption"] = "caption"
    text_teachers: tuple[tuple[str, float], ...] = DEFAULT_TEXT_TEACHERS
    #: what the KL targets mix: teacher embeddings (paper and code) or similarities
    teacher_mix: Literal["embeddings", "similarities"] = "embeddings"
    #: what ℓ_rank's teacher order comes from (code: similarities; paper: embeddings)
    rank_teacher_mix: Literal["embeddings", "similarities"] = "similarities"
    #: ε inside ListMLE's log after the max shift (code: 1e-7; 0: eq. 10 exactly)
    rank_log_eps: float = field(default=RELEASED_LOG_EPS, metadata={"min": 0.0})
    cma_pairing: Literal["released", "paper"] = "released"
    #: one student head for every term (code: the SimCSE pooler; paper: s^z) or one per term
    shared_student_head: bool = True
    #: width of the shared student head: None = the encoder's (the code's H→H pooler)
    student_head_dim: int | None = None
    #: ℓ_CMA projects the image through a head (paper: h^v) instead of reading the raw feature
    #: (code: needs an image feature of the student head's width, CLIP ViT-L/14's 768 = BERT's)
    cma_image_head: bool = False
    #: that head is ℓ_Info's (paper: eq. 6's h^v is eq. 3's) instead of ℓ_CMA's own
    share_image_head: bool = False
    head_init: Literal["bert", "torch"] = "bert"
    image_role: str = "image"
    token_role: str = "text_teacher_tokens"

    def __post_init__(self) -> None:
        self.text_teachers = normalize_teachers(self.text_teachers)
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{self.name}: {name} must be one of {allowed}, not {value!r}")

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

    # -- heads -------------------------------------------------------------------------------
    @property
    def _student_width(self) -> int | str:
        """The shared student head's width: ``student_head_dim``, or the encoder's (H→H)."""
        return HIDDEN if self.student_head_dim is None else self.student_head_dim

    def _student_head(self, own_width: int | str, own_init: str | None = None) -> Head:
        """A term's student head: the shared one (the code's pooler, the paper's ``s^z``), or,
        with ``shared_student_head=False``, the term's own H→``own_width`` head."""
        if self.shared_student_head:
            return Head(HIDDEN, self._student_width, self.head_init, name=STUDENT_HEAD)
        return Head(HIDDEN, own_width, own_init or self.head_init)

    def _student_head_into(self, role: str, own_init: str = "torch") -> Head:
        """A student head whose output is compared with the raw feature ``role``: it outputs
        that feature's width (the shared pooler must then have it too, or the heads' builder
        names both terms); without a shared head, the term's own (``own_init``)."""
        if self.shared_student_head:
            return Head(HIDDEN, role, self.head_init, name=STUDENT_HEAD)
        return Head(HIDDEN, role, own_init)

    def _image_head(self, width: int | str) -> Head:
        """A term's image head into ``width`` (shared with ℓ_Info when ``share_image_head``)."""
        return Head(self.image_role, width, name=IMAGE_HEAD if self.share_image_head else None)

    # -- terms ---------------------------------------------------------------------------------
    def _text_term(self) -> Term:
        options = {"temperature": self.temperature}
        heads = {"student": self._student_head(HIDDEN)}
        if self.text_objective == "arc_margin":
            options["margin"] = self.text_margin
            return Term("simcse", "arc_margin_info_nce", self.simcse_weight, "all", options, heads)
        return Term("simcse", "simcse", self.simcse_weight, "all", options, heads)

    def _image_text_term(self) -> Term:
        weight = self.image_text_weight
        if self.image_text_in_cross_modal:
            weight *= self.cross_modal_weight
        if self.image_objective == "adapacse":  # own grounding heads, as the code's
            options = {
                "image_role": self.image_role,
                "text_role": None,
                "margin": self.image_margin,
                "temperature": self.temperature,
            }
            heads = {
                "student": Head(HIDDEN, self.proj_dim),
                "image": Head(self.image_role, self.proj_dim),
            }
            return Term("image_text", "adaptive_angular_margin", weight, "caption", options, heads)
        options = {
            "temperature": self.temperature,
            "feature_role": self.image_role,
            "views": self.image_views,
        }
        student = self._student_head(self.proj_dim, own_init="torch")  # MCSE's grounding
        heads = {"student": student, "image": self._image_head(student.output)}
        return Term("image_text", "image_text_info_nce", weight, "caption", options, heads)

    def _cross_modal_terms(self) -> list[Term]:
        lam = self.cross_modal_weight
        consistency = {
            "image_role": self.image_role,
            "margin": self.consistency_margin,
            "mismatch": self.consistency_mismatch,
        }
        aligned: dict[str, Head] = {}
        aligner_input: int | str = HIDDEN  # without a shared student head: [CLS]
        if self.shared_student_head:  # the code's aligners read the pooler's z1
            aligned["student"] = self._student_head(HIDDEN)
            aligner_input = self._student_width
        aligned["text_aligner"] = Head(aligner_input, self.proj_dim, kind="aligner")
        aligned["image_aligner"] = Head(self.image_role, self.proj_dim, kind="aligner")
        alignment = {
            "image_role": self.image_role,
            "text_teachers": self.text_teachers,
            "margin": self.student_margin,
            "pairing": self.cma_pairing,
            "teacher_mix": self.teacher_mix,
            **self._kl_options(),
        }
        if self.cma_image_head:
            student = self._student_head(self.proj_dim)
            cma_heads = {"student": student, "image": self._image_head(student.output)}
        else:  # the raw image feature: the student head must output its width (768 = 768)
            cma_heads = {"student": self._student_head_into(self.image_role, self.head_init)}
        return [
            Term(
                "consistency",
                "image_text_consistency",
                lam * self.consistency_weight,
                "caption",
                consistency,
                aligned,
            ),
            Term(
                "cma",
                "cross_modal_alignment",
                lam * self.cma_weight,
                "caption",
                alignment,
                cma_heads,
            ),
        ]

    def _intra_modal_terms(self) -> list[Term]:
        mu, on = self.intra_modal_weight, self.teachers_on
        shared = {"text_teachers": self.text_teachers, "margin": self.student_margin}
        rank = {
            **shared,
            "temperature": self.temperature,
            "teacher_mix": self.rank_teacher_mix,
            "log_eps": self.rank_log_eps,
        }
        ima = {**shared, "teacher_mix": self.teacher_mix, **self._kl_options()}
        heads = {"student": self._student_head(HIDDEN)}
        tokens = {"token_role": self.token_role, "temperature": self.temperature}
        # ℓ_g2l compares the sentence with the teacher's tokens directly: its head outputs their
        # width (the shared pooler must then have it too, as 768 = 768 in the code)
        token_head = self._student_head_into(self.token_role)
        return [
            Term("rank", "list_mle_distillation", mu * self.rank_weight, on, rank, heads),
            Term("ima", "intra_modal_alignment", mu * self.ima_weight, on, ima, heads),
            Term(
                "global_local",
                "global_local_info_nce",
                mu * self.global_local_weight,
                on,
                tokens,
                {"student": token_head},
            ),
        ]

    def _kl_options(self) -> dict[str, Any]:
        return {"temperature": self.kl_temperature, "teacher_temperature": self.teacher_temperature}


@register_method("dalr-paper")
@dataclass
class DALRPaper(DALR):
    """DALR's eq. 14 as printed: ℓ = ℓ_Info + λ·ℓ_CML + μ·ℓ_IML, λ = 0.1, μ = 0.2 (App. B).

    * ℓ_Info (eq. 4, caption batches): MCSE's text→image InfoNCE on the single view ``s^z``
      (``image_views="first"``), weight 1, *outside* the λ bracket; no ℓ_text (eq. 1 is defined
      in §3.1 but not in eq. 14: ``simcse_weight=0``).
    * ℓ_CML = ℓ_cons + ℓ_CMA (eq. 9; ℓ_cons weight 1, margin 0.2, images shuffled randomly);
      ℓ_CMA paired as eqs. 6/8 print it (``cma_pairing="paper"``).
    * ℓ_IML = ℓ_rank + ℓ_IMA (eq. 13), on every batch (``teachers_on="all"``: the teachers
      are text models, and without ℓ_text a text batch has no other term).
    * One student score ``s^z = g(f(x, z))`` (eq. 2) for eqs. 4, 6, 10, 11: a shared Linear
      H→256 + Tanh head (App. B: "the feature representations are projected into a shared
      256-dimensional space"), and eq. 3's image head ``h^v`` shared by ℓ_Info and ℓ_CMA
      (``cma_image_head = share_image_head = True``), so App. B's CLIP ViT-B/32 (512-d) fits.
      ℓ_cons's "modality-specific MLPs" read ``s^z`` (eq. 5 cites eqs. 2–3) and the raw image.
    * ℓ_rank is eq. 10 exactly (``rank_log_eps=0``; the code's ListMLE adds 1e-7 in its log).
    * Plain cosines (``student_margin=0``); eqs. 6, 7 and 11 print no temperature, so the KL
      terms use τ = 1 (``kl_temperature = teacher_temperature = 1``; near-uniform
      distributions — the code's 0.0225 / 0.5 are one switch away). Eq. 10 has τ = 0.05.
    * Teachers: SimCSE + DiffCSE, "a weighted combination of [CLS] token embeddings" (§3.3) for
      every target (``teacher_mix = rank_teacher_mix = "embeddings"``); the paper gives no
      weights, so the scripts' 0.33 / 0.67 are kept (an mmcse choice).

    Not stated by the paper, chosen here: head inits (BERT for ``s^z``), which features build
    the teacher targets (the frozen cached ones; eq. 7's ``h^t``/``h^v`` would be trainable),
    the batch reduction (means, where eqs. 4, 8, 10, 12 sum over the batch).
    """

    name: ClassVar[str] = "dalr-paper"
    simcse_weight: float = 0.0
    image_text_in_cross_modal: bool = False
    consistency_weight: float = 1.0
    consistency_mismatch: Literal["random", "roll5"] = "random"
    text_objective: Literal["infonce", "arc_margin"] = "infonce"
    image_objective: Literal["infonce", "adapacse"] = "infonce"
    image_views: Literal["mean", "sum", "first"] = "first"
    student_margin: float = 0.0
    kl_temperature: float = 1.0
    teacher_temperature: float = 1.0
    teachers_on: Literal["all", "caption"] = "all"
    rank_teacher_mix: Literal["embeddings", "similarities"] = "embeddings"
    rank_log_eps: float = field(default=0.0, metadata={"min": 0.0})
    cma_pairing: Literal["released", "paper"] = "paper"
    student_head_dim: int | None = 256
    cma_image_head: bool = True
    share_image_head: bool = True
