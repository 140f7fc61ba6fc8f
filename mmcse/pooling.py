"""Sentence poolers, named as in SimCSE's evaluation script.

``cls``: the backbone's pooler output ([CLS] through its dense+tanh, when it has one);
``cls_before_pooler``: last-layer [CLS] (SimCSE/MCSE's unsupervised setting); ``avg``: masked mean
of the last layer; ``avg_first_last``: masked mean of (first transformer layer + last layer)/2
(``hidden_states[1]``: index 0 is the embedding output); ``avg_top2``: the same for the last two.
"""

from __future__ import annotations

from torch import Tensor

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2")


def masked_mean(states: Tensor, mask: Tensor) -> Tensor:
    mask = mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1)


def needs_hidden_states(pooler: str) -> bool:
    return pooler in ("avg_first_last", "avg_top2")


def pool(outputs, attention_mask: Tensor, pooler: str) -> Tensor:
    """Pool a HF ``BaseModelOutput`` into ``[B, H]`` sentence embeddings."""
    if pooler not in POOLERS:
        raise ValueError(f"unknown pooler {pooler!r}; choose one of {', '.join(POOLERS)}")
    last = outputs.last_hidden_state
    if pooler == "cls":
        pooled = getattr(outputs, "pooler_output", None)
        return pooled if pooled is not None else last[:, 0]
    if pooler == "cls_before_pooler":
        return last[:, 0]
    if pooler == "avg":
        return masked_mean(last, attention_mask)
    hidden = outputs.hidden_states
    pair = (hidden[1], hidden[-1]) if pooler == "avg_first_last" else (hidden[-2], hidden[-1])
    return masked_mean((pair[0] + pair[1]) / 2.0, attention_mask)
