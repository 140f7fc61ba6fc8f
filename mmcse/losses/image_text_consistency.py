"""DALR's cross-modal consistency task ℓ_cons (:class:`ImageTextConsistencyLoss`) and its
mismatches (:func:`random_derangement`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.losses.base import Heads, Loss, LossInputs
from mmcse.registry import register_loss

MISMATCHES = ("random", "roll5")


def random_derangement(n: int, device: torch.device | None = None) -> Tensor:
    """A uniformly random single-cycle permutation of ``range(n)`` (no fixed point for n ≥ 2).

    The random order is the argsort of ``n`` uniform draws on ``device``, not ``torch.randperm``
    (which draws on the CPU): so it stays inside a captured step's graph on the GPU."""
    cycle = torch.rand(n, device=device).argsort()
    mismatched = torch.empty_like(cycle)
    mismatched[cycle] = cycle.roll(-1)  # each element of the cycle points to the next one
    return mismatched


@register_loss("image_text_consistency")
class ImageTextConsistencyLoss(Loss):
    """DALR's cross-modal consistency task ℓ_cons: matched vs shuffled image–caption pairs.

    He et al., *DALR* (2025), §3.2, eq. 5; authors' code ``Hekang001/DALR``
    (``ConsistencySimilarityModule``, ``prepare_data``, ``CosineEmbeddingLoss(margin=0.2)``):

        ℓ_cons = mean over 2B pairs of   1 − cos(a(s_i), b(v_i))            (matched, y = 1)
                                          max(0, cos(a(s_i), b(v_π(i))) − m)   (mismatched, y = 0)

    ``s_i`` is dropout view 1's [CLS], ``v`` the cached image feature (role ``image``), ``a``/``b``
    the modality-specific aligners of the code (Linear D→D, BatchNorm, ReLU, Linear D→256,
    BatchNorm, ReLU — the paper only says "modality-specific MLPs"), m = 0.2. The loss trains
    only the student and the aligners; it is DALR's auxiliary task, and weighs 1 in
    ℓ_CML = ℓ_cons + ℓ_CMA (eq. 9).

    Mismatched pairs (``mismatch``): the paper "shuffles images"; the code rolls the batch by 5
    (``prepare_data``: ``image.roll(shifts=5)``, so row ``i`` gets image ``i − 5``; no mismatch
    at all when 5 is a multiple of B) — ``mismatch="roll5"``. With ``"random"`` mmcse draws a
    uniformly random *cyclic* permutation from the global RNG of the batch's device
    (deterministic under ``torch.manual_seed``; no private generator, so a resumed run that
    restores the RNG state resumes the same draws): every row gets another row's image, never
    its own. Captions of the *same* image in one batch can still form a "mismatched" pair; like
    the code, no image ids are consulted.

    Paper vs code: the code weighs ℓ_cons by 0.01 inside ℓ_CML (the method's
    ``consistency_weight``); the paper by 1. The code applies the text aligner to the SimCSE
    pooler output of view 1 (``z1``); the image aligner reads the raw cached image feature in
    both.

    Heads: ``text_aligner`` and ``image_aligner`` (aligner kind: the code's architecture,
    PyTorch-default init), and optionally ``student`` — a head applied to [CLS] before the text
    aligner (DALR's method puts its shared pooler there, as the code's ``z1``; left empty, the
    aligner reads [CLS]).

    Inputs: ``view1`` ``[B, H]``, ``features[image_role]`` ``[B, D]`` (B ≥ 2: BatchNorm needs a
    batch). Returns ``{"consistency_loss": scalar}``. Local to each rank (pairs need no
    negatives). Sibling: :class:`~mmcse.losses.cross_modal_alignment.CrossModalAlignmentLoss`
    (ℓ_CMA, the other half of ℓ_CML).

    Args:
        image_role: the cached image feature role.
        margin: m.
        mismatch: ``"random"`` or ``"roll5"`` (above).
    """

    requires = ("image",)
    terms = ("consistency_loss",)
    slots = {"student": "mlp", "text_aligner": "aligner", "image_aligner": "aligner"}
    optional_slots = ("student",)

    def __init__(
        self, image_role: str = "image", margin: float = 0.2, mismatch: str = "random"
    ) -> None:
        super().__init__()
        if mismatch not in MISMATCHES:
            raise ValueError(f"mismatch must be one of {MISMATCHES}, not {mismatch!r}")
        self.image_role = image_role
        self.requires = (image_role,)
        self.margin = margin
        self.mismatch = mismatch

    @staticmethod
    def compute_loss_from_embeddings(
        text: Tensor, image: Tensor, shuffled_image: Tensor, margin: float = 0.2
    ) -> Tensor:
        """Cosine-embedding loss over (text, image) with y = 1 and (text, shuffled) with y = −1."""
        targets = torch.cat([text.new_ones(len(text)), -text.new_ones(len(text))])
        return F.cosine_embedding_loss(
            torch.cat([text, text]).float(),
            torch.cat([image, shuffled_image]).float(),
            targets.float(),
            margin=margin,
        )

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        image_aligner = heads["image_aligner"]
        image = inputs.feature(self.image_role)
        image = image.to(next(image_aligner.parameters()).dtype)
        if self.mismatch == "roll5":
            mismatched = torch.arange(len(image), device=image.device).roll(5)
        else:
            mismatched = random_derangement(len(image), image.device)
        # aligned separately, as the code does, so BatchNorm sees each set of pairs on its own
        view1 = heads["student"](inputs.view1) if "student" in heads else inputs.view1
        text = heads["text_aligner"](view1)
        loss = self.compute_loss_from_embeddings(
            text, image_aligner(image), image_aligner(image[mismatched]), self.margin
        )
        return {"consistency_loss": loss}
