"""Global-to-local InfoNCE: a sentence against the text teacher's token states (DALR code only).

Not in the DALR paper; the authors' code (``Hekang001/DALR``, ``in_batch_g2l_loss``) adds it to
ℓ_rank inside ℓ_IML with weight 1. Each valid teacher token ``(i, t)`` is a query whose positive
is its own sentence's student embedding and whose negatives are every valid token of every other
sentence in the batch:

    ℓ_i = (1/|T_i|) Σ_{t∈T_i} −log  e^{g_i·l_{i,t}/τ} / ( e^{g_i·l_{i,t}/τ} + Σ_{j≠i} Σ_{t'∈T_j} e^{g_i·l_{j,t'}/τ} )

averaged over anchors ``i``; ``g = norm(MLP(view 1 [CLS]))`` (Linear H→D + Tanh, this loss's own
head), ``l_{j,t}`` the L2-normalised cached teacher state of token ``t`` of sentence ``j``, ``T_j``
its valid tokens, τ = 0.05.

Cached input (role ``text_teacher_tokens``): a feature set whose rows have shape ``[L, D]`` — the
teacher's last-layer states of tokens 1…L (``[CLS]`` excluded, as the code's
``attention_mask[:, 1:]``), zero-padded; all-zero rows are padding. For DALR's two teachers the
cache holds the 0.33/0.67 mix of their states (what the code mixes). Size per 1M sentences at
the usual ``max_seq_length`` 32 (L = 31), D = 768: 1e6 × 31 × 768 × 2 B ≈ 47.6 GB in float16
(95 GB in float32), against 1.5 GB for a pooled 768-d float16 teacher — which is why this term is
off by default.

Code vs mmcse: the code normalises the teacher tokens over the *sequence* axis (``norm(dim=1)``)
and leaves the student's pooler output unnormalised, so its logits depend on sentence length and
activation scale; mmcse uses cosines. The code computes the term for both views but against view
1's embedding each time, and its teacher has no dropout, so both copies are equal: mmcse computes
it once. The code uses ``10000`` as "minus infinity" for masked logits; mmcse uses ``-inf``.
The code's sentence is the shared SimCSE pooler output ``z1``: ``student_head`` names that shared
head (then the token width must equal the head's, as 768 = 768 in the code); without it this
loss has its own Linear H→D + Tanh head.

Inputs: ``view1`` ``[B, H]``, ``features[token_role]`` ``[B, L, D]``.
Returns ``{"global_local_loss": scalar}``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmcse.distributed import gather_across_ranks
from mmcse.losses.base import Loss, LossInputs, l2_normalize
from mmcse.losses.heads import resolve_head
from mmcse.registry import register_loss


@register_loss("global_local_info_nce")
class GlobalLocalInfoNCELoss(Loss):
    requires = ("text_teacher_tokens",)
    terms = ("global_local_loss",)

    def __init__(
        self,
        hidden_size: int,
        feature_dims: dict[str, int],
        token_role: str = "text_teacher_tokens",
        temperature: float = 0.05,
        student_head: str | None = None,
        student_head_dim: int | None = None,
        head_init: str = "torch",
        shared_heads: dict | None = None,
        **_: object,
    ) -> None:
        super().__init__()
        self.token_role = token_role
        self.requires = (token_role,)
        self.temperature = temperature
        width = feature_dims[token_role]
        shared = student_head is not None and shared_heads is not None
        out = student_head_dim if shared else width
        self.head = resolve_head(shared_heads, student_head, hidden_size, out, head_init)
        if self.head[0].out_features != width:
            raise ValueError(
                f"global_local_info_nce: the shared student head {student_head!r} is "
                f"{self.head[0].out_features}-d but the teacher tokens ({token_role!r}) are "
                f"{width}-d; the code compares them directly, so they must match"
            )

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
        positives = scores[torch.arange(n), torch.arange(n)]  # [N, L]
        other = ~torch.eye(n, dtype=torch.bool, device=scores.device)[:, :, None] & valid[None]
        negatives = scores.masked_fill(~other, float("-inf")).flatten(1).logsumexp(-1)  # [N]
        nll = torch.logaddexp(positives, negatives[:, None]) - positives
        per_sentence = (nll * valid).sum(-1) / valid.sum(-1).clamp(min=1)
        return per_sentence.mean()

    def forward(self, inputs: LossInputs) -> dict[str, Tensor]:
        sentences = gather_across_ranks(self.head(inputs.view1))
        tokens = gather_across_ranks(inputs.feature(self.token_role).float())
        loss = self.compute_loss_from_embeddings(sentences, tokens, self.temperature)
        return {"global_local_loss": loss}
