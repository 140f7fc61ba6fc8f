"""SimCLR's InfoNCE between two views of unpaired non-linguistic examples (VisualCSE/AudioCSE).

Jian et al., *Non-Linguistic Supervision for Contrastive Learning of Sentence Embeddings*
(NeurIPS 2022), eq. 5 (images) and eq. 7 (audio):

    ℓ = Σ_i −log  exp(sim(f'_i, f''_i)/τ) / Σ_j exp(sim(f'_i, f''_j)/τ)

with ``f = MLP([CLS])`` of an image (audio clip) encoded by the *sentence encoder* after a patch
embedding; ``f'`` and ``f''`` come from two augmentations of the same image (two dropout passes
for audio). τ = 0.07 (the SupCon default the paper keeps for both objectives). The MLP is the
non-linguistic task's own Linear H→H + Tanh (the authors' ``image_mlp``), trained only by this
loss and never part of the sentence embedding.

Paper vs code: the paper sums over the batch; the released code (``new_SimCLR_forward``, the path
all published runs take via ``--new_supcon``) averages, as does this loss (the weight ω absorbs
the scale). Negatives are the local batch: the authors' image step is single-process; under
several processes :class:`mmcse.nonling.step.NonLinguisticTask` averages gradients instead.

Inputs: ``view1``, ``view2`` ``[B, H]`` ([CLS] of the two views). Returns
``{"simclr_loss": scalar}``. Siblings: :mod:`info_nce` (SimCSE: the same maths on dropout views
of sentences, τ = 0.05) and :mod:`supcon` (the label-aware variant, VisualCSE's default).
"""

from __future__ import annotations

from torch import Tensor

from mmcse.losses.base import Loss, LossInputs
from mmcse.losses.info_nce import MLPHead, info_nce
from mmcse.registry import register_loss


@register_loss("simclr")
class SimCLRLoss(Loss):
    terms = ("simclr_loss",)

    def __init__(
        self, hidden_size: int, temperature: float = 0.07, head_init: str = "bert", **_: object
    ) -> None:
        super().__init__()
        self.temperature = temperature
        # BERT init: the authors' image_mlp is built in cl_init, before init_weights()
        self.mlp = MLPHead(hidden_size, hidden_size, head_init)

    @staticmethod
    def compute_loss_from_embeddings(f1: Tensor, f2: Tensor, temperature: float = 0.07) -> Tensor:
        """Mean over ``i`` of −log softmax_j(cos(f1_i, f2_j)/τ) at ``j = i``."""
        return info_nce(f1, f2, temperature)

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        f1, f2 = self.mlp(inputs.view1), self.mlp(inputs.view2)
        return {"simclr_loss": self.compute_loss_from_embeddings(f1, f2, self.temperature)}
