"""VisualCSE/AudioCSE's released supervised objective, ``--new_supcon``
(:class:`ClassRankCrossEntropyLoss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mmcse.losses.base import Heads, Loss, LossInputs, cosine_matrix
from mmcse.registry import register_loss


def class_rank_targets(labels: Tensor) -> Tensor:
    """``[N]`` the rank of each example's label among the batch's distinct labels, ascending,
    from 0 — ``torch.unique(labels, return_inverse=True)[1]``, as the released code builds it:
    labels ``[7, 2, 7, 5]`` → ``[2, 0, 2, 1]``.

    Computed shape-statically (``c_i`` = how many distinct labels are smaller than ``y_i``,
    counting each label at its first occurrence), because ``torch.unique``'s output size depends
    on the data and would break the captured image/audio step into several graphs."""
    same = labels[:, None] == labels[None, :]  # [N, N]
    before = torch.ones_like(same).tril(diagonal=-1)  # [j, k]: k < j
    first = ~(same & before).any(dim=1)  # j is the first example of its label
    return ((labels[None, :] < labels[:, None]) & first[None, :]).sum(dim=1)


@register_loss("class_rank_cross_entropy")
class ClassRankCrossEntropyLoss(Loss):
    """Cross-entropy over cross-view cosines with a class-rank target: the objective behind
    VisualCSE's and AudioCSE's published numbers.

    Jian et al., *Non-Linguistic Supervision for Contrastive Learning of Sentence Embeddings*
    (NeurIPS 2022). The paper names SupCon (§3.3, eq. 4); the released code
    (``yiren-jian/NonLing-CSE`` at 3e1e01c) runs, for every published number, the
    ``--new_supcon`` path with ``--image_contrastive_method SupCon``: the README commands
    (``run_unsup_example.sh 48 0.07 1e-6 0.05 SupCon 0.0`` and the RoBERTa / AudioCSE ones), the
    run scripts (``{Visual,Audio}CSE/run_unsup_example.sh`` line 57: ``--new_supcon``) and the
    training logs (``VisualCSE/training_logs/*.txt``: ``image_contrastive_method='SupCon'``,
    ``new_supcon=True``). That path is ``new_SupCon_forward`` (``VisualCSE/src/trainers.py``
    lines 753–769, called at 588/632; ``AudioCSE/src/trainers.py`` 769–785, called at 602/648).
    With ``f'``, ``f''`` the ``image_mlp`` outputs of the two views of the ``N`` examples and
    ``y`` their class labels:

        S_ij = cos(f'_i, f''_j) / τ                              (i, j = 1..N)
        c_i  = |{ distinct labels y of the batch : y < y_i }|    (the class rank, from 0)
        ℓ    = −(1/N) Σ_i log( exp(S_{i c_i}) / Σ_j exp(S_ij) )

    — ``nn.CrossEntropyLoss()`` (mean over the ``N`` rows) on the ``N × N`` cosine matrix with
    target ``c_i``; τ = ``--supcon_temperature`` 0.07; the weight ω multiplies it outside.

    * The target ``c_i`` is built as the code builds it: the index of ``y_i`` in
      ``torch.unique(labels)`` (sorted distinct labels), i.e. the rank of ``i``'s class among the
      classes present in the batch. It is a *column index*: the target of row ``i`` is the second
      view of whichever example sits at batch position ``c_i`` — not ``i``'s own other view and,
      in general, not an example of ``i``'s class (the loader shuffles). Examples of one class
      share a target column. This is not SupCon; it is reproduced because it produced the
      published numbers.
    * No masking: every ``S_ij`` is in the softmax, the diagonal ``S_ii`` (``i``'s own second
      view) included, as an ordinary candidate — neither a positive nor excluded (it is the target
      only when ``c_i = i``).
    * Anchors are the ``N`` first views only (no symmetric ``f'' → f'`` term, no ``2N`` views).
    * Cosines as ``nn.CosineSimilarity`` (no separate normalisation); mean over rows.
    * Without labels (``extras["labels"]`` absent) every example is its own class: ``c_i`` is
      ``i``'s rank among the batch positions, ``c_i = i``, and this is SimCLR as the code's
      ``new_SimCLR_forward`` (:class:`~mmcse.losses.simclr.SimCLRLoss`). With all-distinct labels
      it is SimCLR only when the batch happens to be in label order.
    * VisualCSE's labels are ImageFolder class indices; AudioCSE's the speaker index (the argmax
      of its one-hot labels, ``AudioCSE/src/trainers.py`` lines 575/619).

    Siblings (the method's ``image_objective`` / ``audio_objective`` switch): ``supcon``
    (:class:`~mmcse.losses.supcon.SupConLoss`, Khosla et al. — what the paper names and the
    code's path without ``--new_supcon``) and ``simclr``.

    Heads: ``student`` — the task's image MLP (Linear H→H + Tanh, BERT-initialised as the
    authors' ``image_mlp``).

    Inputs: ``view1``, ``view2`` ``[B, H]`` ([CLS] of the two views); ``extras["labels"]``
    ``[B]`` integer class ids (optional, see above). Returns ``{"class_rank_ce_loss": scalar}``.

    Args:
        temperature: τ.
    """

    terms = ("class_rank_ce_loss",)
    slots = {"student": "mlp"}

    def __init__(self, temperature: float = 0.07) -> None:
        super().__init__()
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(
        f1: Tensor, f2: Tensor, labels: Tensor | None = None, temperature: float = 0.07
    ) -> Tensor:
        """Mean over ``i`` of −log softmax_j(cos(f1_i, f2_j)/τ) at ``j`` = the class rank of
        ``labels[i]`` (labels ``None``: ``j = i``)."""
        if labels is None:
            labels = torch.arange(len(f1), device=f1.device)
        scores = cosine_matrix(f1.float(), f2.float()) / temperature
        return F.cross_entropy(scores, class_rank_targets(labels.to(f1.device)))

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        head = heads["student"]
        f1, f2 = head(inputs.view1), head(inputs.view2)
        labels = inputs.extras.get("labels")
        loss = self.compute_loss_from_embeddings(f1, f2, labels, self.temperature)
        return {"class_rank_ce_loss": loss}
