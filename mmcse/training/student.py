"""The module a text step trains: the encoder, the method's heads and its parameter-free losses."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mmcse.losses.base import LossInputs
from mmcse.methods import Method, build_heads, build_losses
from mmcse.model import SentenceEncoder
from mmcse.training.data import Batch


class Student(nn.Module):
    """The encoder, the heads the method declares (each built once, trained with it) and the
    method's parameter-free loss modules."""

    def __init__(self, encoder: SentenceEncoder, method: Method, feature_dims: dict[str, int]):
        super().__init__()
        self.encoder = encoder
        self.terms = method.active_terms()
        # the weights as a buffer (not saved): inputs of a captured step rather than constants
        # traced into it, so runs that differ only in a weight share one compiled graph
        weights = torch.tensor([t.weight for t in self.terms], dtype=torch.float32)
        self.register_buffer("term_weights", weights, persistent=False)
        self.heads = build_heads(method, encoder.hidden_size, feature_dims)
        self.losses = build_losses(method)
        #: term → slot → head name (saved with each checkpoint: which term trained which head)
        self.term_heads = {t.name: t.head_names() for t in self.terms}
        # term → slot → head module, resolved once (not at every step)
        self.term_modules = {
            term: {slot: self.heads[name] for slot, name in slots.items()}
            for term, slots in self.term_heads.items()
        }
        self.needs_token_states = any(m.needs_token_states for m in self.losses.values())

    def trained_modules(self) -> list[nn.Module]:
        """The modules whose parameters an optimizer steps, one AdamW group each (the losses
        hold none)."""
        return [self.encoder, *self.heads.values()]

    def forward(self, batch: Batch, extras: dict | None = None) -> dict[str, Tensor]:
        """Weighted total under ``"loss"`` plus every raw ``*_loss`` term of this batch
        (``extras``: the method's per-batch extras, by default the batch's own)."""
        if batch.packed is not None:  # both views packed end to end; outputs padded-shaped
            out = self.encoder(packed=batch.packed)
        else:  # both views as one batch: rows [:n] and [n:]
            ids, mask = batch.input_ids.repeat(2, 1), batch.attention_mask.repeat(2, 1)
            out = self.encoder(input_ids=ids, attention_mask=mask)
        view1, view2 = out.sentence.chunk(2)
        inputs = LossInputs(
            view1=view1,
            view2=view2,
            features=batch.features,
            batch_kind=batch.kind,
            token_states=out.token_states.chunk(2) if self.needs_token_states else None,
            attention_mask=batch.attention_mask,
            extras=batch.extras if extras is None else extras,
        )
        terms: dict[str, Tensor] = {}
        total = out.sentence.new_zeros(())
        for index, term in enumerate(self.terms):
            if not term.applies_to(batch.kind):
                continue
            for key, value in self.losses[term.name](inputs, self.term_modules[term.name]).items():
                terms[key] = value
                # in fp32 and rounded once, as a Python float weight multiplies
                total = total + (self.term_weights[index] * value.float()).to(value.dtype)
        return {"loss": total, **terms}
