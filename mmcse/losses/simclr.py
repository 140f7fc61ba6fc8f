"""SimCLR's InfoNCE between two views of unpaired non-linguistic examples (:class:`SimCLRLoss`)."""

from __future__ import annotations

from torch import Tensor

from mmcse.losses.base import Heads, Loss, LossInputs
from mmcse.losses.info_nce import info_nce
from mmcse.registry import register_loss


@register_loss("simclr")
class SimCLRLoss(Loss):
    """SimCLR's InfoNCE between two views of unpaired non-linguistic examples (VisualCSE/AudioCSE).

    Jian et al., *Non-Linguistic Supervision for Contrastive Learning of Sentence Embeddings*
    (NeurIPS 2022), eq. 5 (images) and eq. 7 (audio):

        ℓ = Σ_i −log  exp(sim(f'_i, f''_i)/τ) / Σ_j exp(sim(f'_i, f''_j)/τ)

    with ``f = MLP([CLS])`` of an image (audio clip) encoded by the *sentence encoder* after a
    patch embedding; ``f'`` and ``f''`` come from two augmentations of the same image (two
    dropout passes for audio). τ = 0.07 (the SupCon default the paper keeps for both objectives).

    Heads: ``student`` — the non-linguistic task's own Linear H→H + Tanh (the authors'
    ``image_mlp``, BERT-initialised: it is built in ``cl_init``, before ``init_weights()``),
    trained only by this loss and never part of the sentence embedding
    (:class:`mmcse.nonling.task.NonLinguisticTask` owns it).

    Paper vs code: the paper sums over the batch; the released code (``new_SimCLR_forward``, the
    path all published runs take via ``--new_supcon``) averages, as does this loss (the weight ω
    absorbs the scale). Negatives are the local batch: the authors' image step is
    single-process; under several processes the task averages gradients instead.

    Inputs: ``view1``, ``view2`` ``[B, H]`` ([CLS] of the two views). Returns
    ``{"simclr_loss": scalar}``. Siblings: :class:`~mmcse.losses.info_nce.SimCSELoss` (the same
    maths on dropout views of sentences, τ = 0.05) and the label-aware variants
    :class:`~mmcse.losses.class_rank_cross_entropy.ClassRankCrossEntropyLoss` (the released
    ``--new_supcon`` objective, VisualCSE's and AudioCSE's default) and
    :class:`~mmcse.losses.supcon.SupConLoss`.

    Args:
        temperature: τ.
    """

    terms = ("simclr_loss",)
    slots = {"student": "mlp"}

    def __init__(self, temperature: float = 0.07) -> None:
        super().__init__()
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(f1: Tensor, f2: Tensor, temperature: float = 0.07) -> Tensor:
        """Mean over ``i`` of −log softmax_j(cos(f1_i, f2_j)/τ) at ``j = i``."""
        return info_nce(f1, f2, temperature)

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        head = heads["student"]
        f1, f2 = head(inputs.view1), head(inputs.view2)
        return {"simclr_loss": self.compute_loss_from_embeddings(f1, f2, self.temperature)}
