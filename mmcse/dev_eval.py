"""The trainer's STS-B dev score, prepared once per run so each evaluation is only the forwards.

:func:`mmcse.evaluation.dev_score` re-tokenises the 2,909 distinct dev sentences, re-sorts and
re-pads them on every call (every 125 steps). :class:`DevEvaluator` does that once: the
sentences are tokenised, sorted longest first and padded into the *same* batches
:func:`~mmcse.evaluation.encode.encode_sentences` builds, and kept on the device; a call runs
the forwards, pools, and scores. Same batches, same ops: the score is identical to
``dev_score`` (tested), only the repeated host work is gone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from mmcse.evaluation.encode import _autocast, model_max_length, pad_batch
from mmcse.evaluation.sts import _stsb_dev, resolve_downstream, score_task
from mmcse.pooling import needs_hidden_states, pool


class DevEvaluator:
    """STS-B dev Spearman × 100 of a live encoder; the data prepared at construction."""

    def __init__(self, encoder, tokenizer, data_dir: str | Path | None, batch_size: int = 128):
        self.task, sentences = _stsb_dev(resolve_downstream(data_dir))
        self.rows = {sentence: row for row, sentence in enumerate(sentences)}
        limit = model_max_length(tokenizer, encoder.backbone)
        token_ids = tokenizer(list(sentences), truncation=True, max_length=limit)["input_ids"]
        # longest first and stable, exactly as encode_sentences orders them
        self.order = np.argsort([-len(ids) for ids in token_ids], kind="stable")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.batches = [
            pad_batch([token_ids[i] for i in self.order[s : s + batch_size]], pad_id, "cpu")
            for s in range(0, len(self.order), batch_size)
        ]
        self._device: torch.device | None = None

    def _on(self, device: torch.device) -> list:
        if self._device != device:
            self.batches = [(ids.to(device), mask.to(device)) for ids, mask in self.batches]
            self._device = device
        return self.batches

    def __call__(self, encoder) -> float:
        backbone = encoder.backbone
        device = next(backbone.parameters()).device
        was_training = backbone.training
        backbone.eval()
        chunks = []
        try:
            with torch.inference_mode(), _autocast(device):
                for input_ids, attention_mask in self._on(device):
                    out = backbone(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        output_hidden_states=needs_hidden_states(encoder.pooler),
                        return_dict=True,
                    )
                    chunks.append(pool(out, attention_mask, encoder.pooler).float())
        finally:
            backbone.train(was_training)
        vectors = np.empty((len(self.order), chunks[0].shape[1]), dtype=np.float32)
        vectors[self.order] = torch.cat(chunks).cpu().numpy()  # one device→host copy
        return score_task(self.task, vectors, self.rows)["all"]


_EVALUATORS: dict[tuple, DevEvaluator] = {}


def dev_score(encoder, tokenizer, data_dir: str | Path | None = None) -> float:
    """Drop-in for :func:`mmcse.evaluation.dev_score`: the first call for a (tokenizer, data
    folder) prepares a :class:`DevEvaluator`, later calls reuse it."""
    key = (id(tokenizer), str(resolve_downstream(data_dir)))
    if key not in _EVALUATORS:
        _EVALUATORS.clear()  # one run at a time: keep only the current one's batches
        _EVALUATORS[key] = DevEvaluator(encoder, tokenizer, data_dir)
    return _EVALUATORS[key](encoder)
