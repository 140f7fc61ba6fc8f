"""Global-to-local InfoNCE between a sentence and the text teacher's token states
(:class:`GlobalLocalInfoNCELoss`, DALR's released code only)."""

from __future__ import annotations

import torch
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Heads, Loss, LossInputs, l2_normalize
from mmcse.registry import register_loss


@register_loss("global_local_info_nce")
class GlobalLocalInfoNCELoss(Loss):
    """Global-to-local InfoNCE: a sentence against the text teacher's token states (DALR code only).

    Not in the DALR paper; the authors' code (``Hekang001/DALR``, ``in_batch_g2l_loss``) adds it
    to ℓ_rank inside ℓ_IML with weight 1. Each valid teacher token ``(i, t)`` is a query whose
    positive is its own sentence's student embedding and whose negatives are every valid token of
    every other sentence in the batch:

        ℓ_i = (1/|T_i|) Σ_{t∈T_i} −log  e^{g_i·l_{i,t}/τ} / ( e^{g_i·l_{i,t}/τ} + Σ_{j≠i} Σ_{t'∈T_j} e^{g_i·l_{j,t'}/τ} )

    averaged over anchors ``i``; ``g = norm(MLP(view 1 [CLS]))``, ``l_{j,t}`` the L2-normalised
    cached teacher state of token ``t`` of sentence ``j``, ``T_j`` its valid tokens, τ = 0.05.

    Cached input (role ``text_teacher_tokens``): a feature set whose rows have shape ``[L, D]`` —
    the teacher's last-layer states of tokens 1…L (``[CLS]`` excluded, as the code's
    ``attention_mask[:, 1:]``), zero-padded; all-zero rows are padding. For DALR's two teachers
    the cache holds the 0.33/0.67 mix of their states (what the code mixes). Size per 1M
    sentences at the usual ``max_seq_length`` 32 (L = 31), D = 768: 1e6 × 31 × 768 × 2 B ≈
    47.6 GB in float16 (95 GB in float32), against 1.5 GB for a pooled 768-d float16 teacher —
    which is why this term is off by default.

    Code vs mmcse: the code normalises the teacher tokens over the *sequence* axis
    (``norm(dim=1)``) and leaves the student's pooler output unnormalised, so its logits depend
    on sentence length and activation scale; mmcse uses cosines. The code computes the term for
    both views but against view 1's embedding each time, and its teacher has no dropout, so both
    copies are equal: mmcse computes it once. The code uses ``10000`` as "minus infinity" for
    masked logits; mmcse uses ``-inf``.

    Heads: ``student`` — H→D on [CLS], D = the token width. The code's sentence is the shared
    SimCSE pooler output ``z1`` (DALR's ``dalr`` method wires that head, whose width must then
    equal the tokens', as 768 = 768 in the code); otherwise a Linear H→D + Tanh of its own.

    Inputs: ``view1`` ``[B, H]``, ``features[token_role]`` ``[B, L, D]``.
    Returns ``{"global_local_loss": scalar}``.

    Args:
        token_role: the cached teacher token-state role.
        temperature: τ.
    """

    requires = ("text_teacher_tokens",)
    terms = ("global_local_loss",)
    slots = {"student": "mlp"}

    def __init__(self, token_role: str = "text_teacher_tokens", temperature: float = 0.05) -> None:
        super().__init__()
        self.token_role = token_role
        self.requires = (token_role,)
        self.temperature = temperature

    @staticmethod
    def compute_loss_from_embeddings(
        sentences: Tensor, tokens: Tensor, temperature: float = 0.05
    ) -> Tensor:
        """``sentences`` ``[N, D]`` against ``tokens`` ``[N, L, D]`` (all-zero rows = padding)."""
        if tokens.dim() != 3 or tokens.shape[-1] != sentences.shape[-1]:
            raise ValueError(
                f"token states must be [N, L, {sentences.shape[-1]}], got {list(tokens.shape)}"
            )
        valid = tokens.abs().sum(-1) > 0  # [N, L]
        scores = torch.einsum("id,jld->ijl", l2_normalize(sentences.float()), l2_normalize(tokens))
        scores = scores / temperature  # [i, j, t]: sentence i against token t of sentence j
        n = len(sentences)
        diagonal = torch.arange(n, device=scores.device)  # on the device: no CPU op in a graph
        positives = scores[diagonal, diagonal]  # [N, L]
        other = ~torch.eye(n, dtype=torch.bool, device=scores.device)[:, :, None] & valid[None]
        negatives = scores.masked_fill(~other, float("-inf")).flatten(1).logsumexp(-1)  # [N]
        nll = torch.logaddexp(positives, negatives[:, None]) - positives
        per_sentence = (nll * valid).sum(-1) / valid.sum(-1).clamp(min=1)
        return per_sentence.mean()

    def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
        sentences = gather_across_ranks(heads["student"](inputs.view1))
        tokens = gather_across_ranks(inputs.feature(self.token_role).float())
        loss = self.compute_loss_from_embeddings(sentences, tokens, self.temperature)
        return {"global_local_loss": loss}
