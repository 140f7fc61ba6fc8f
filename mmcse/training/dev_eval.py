"""The run's STS-B dev evaluator: the model-selection metric, prepared once per run.

Scoring STS-B dev through :func:`~mmcse.evaluation.encode.encode_sentences` would re-tokenise
the 2,909 distinct dev sentences, re-sort and re-pad them on every call (every 125 steps), and
encode them in 23 batches of 128 (51,560 padded tokens, BERT's WordPiece). :class:`DevEvaluator`
does the preparation once, when the run builds it: the sentences are tokenised, sorted longest
first and padded into batches of at most :func:`dev_tokens_per_batch` padded tokens, kept on the
device; a call runs the forwards, pools, and scores, with one device→host copy. The budget is
the device's: on a GPU a forward costs its host dispatch until it is large, so STS-B dev is 4
forwards of ≤ 16,384 tokens (62,701 padded); on a CPU a forward costs its arithmetic, so
batches of ≤ 3,072 tokens pad least (17 forwards, 50,780 padded). Batching changes no number
beyond float rounding: padded positions are masked out (tested against encoding and scoring
from scratch). The trainer (:class:`mmcse.training.loop.Trainer`) owns one; nothing is cached
between runs.

An evaluation takes 40-110 s on a CPU (the whole dev set through the encoder), so it says when
it starts, how far it is every :data:`PROGRESS_INTERVAL` seconds, and its score and time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from mmcse.devices import to_device
from mmcse.evaluation.encode import (
    eval_autocast,
    forward_pooled,
    model_max_length,
    pack_or_pad,
    token_budget_batches,
)
from mmcse.evaluation.sts import dev_set_name, load_stsb_dev, resolve_downstream, score_task
from mmcse.model import backbone_packs
from mmcse.training.stop import EvaluationStopped

logger = logging.getLogger(__name__)

#: seconds between the progress lines of one evaluation
PROGRESS_INTERVAL = 10.0
#: padded tokens per dev batch, by device type: a GPU runs a few big forwards (BERT-base: ~2.8
#: TFLOP each, one layer's activations at a time); a CPU, batches that pad little
DEV_TOKENS_PER_BATCH = {"cuda": 16384, "cpu": 3072}


def dev_tokens_per_batch(device: torch.device) -> int:
    return DEV_TOKENS_PER_BATCH.get(device.type, DEV_TOKENS_PER_BATCH["cpu"])


class DevEvaluator:
    """STS-B dev Spearman × 100 of a live encoder; the data prepared at construction."""

    def __init__(
        self,
        encoder,
        tokenizer,
        data_dir: str | Path | None,
        max_tokens: int | None = None,
        packing: bool = True,
    ):
        """``max_tokens``: padded tokens per batch (default: :func:`dev_tokens_per_batch` of
        the device ``encoder`` is on); ``packing``: each batch's sentences packed end to end
        (:mod:`mmcse.packing`) where packing is proven for the student, else padded."""
        packing = packing and backbone_packs(encoder.backbone)
        self.name = dev_set_name(data_dir)
        self.task, sentences = load_stsb_dev(resolve_downstream(data_dir))
        self.rows = {sentence: row for row, sentence in enumerate(sentences)}
        limit = model_max_length(tokenizer, encoder.backbone)
        token_ids = tokenizer(list(sentences), truncation=True, max_length=limit)["input_ids"]
        if max_tokens is None:
            max_tokens = dev_tokens_per_batch(next(encoder.backbone.parameters()).device)
        rows = token_budget_batches([len(ids) for ids in token_ids], max_tokens)
        self.order = np.concatenate(rows)  # the sentence of each encoded row
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.batches = [
            pack_or_pad([token_ids[i] for i in batch], pad_id, packing) for batch in rows
        ]
        self._device: torch.device | None = None

    def _on(self, device: torch.device) -> list:
        if self._device != device:
            self.batches = [to_device(batch, device) for batch in self.batches]
            self._device = device
        return self.batches

    def __call__(self, encoder, stop: Callable[[], bool] | None = None) -> float:
        """``stop``: asked between batches; when it says so the evaluation ends there
        (:class:`~mmcse.training.stop.EvaluationStopped`)."""
        backbone = encoder.backbone
        device = next(backbone.parameters()).device
        was_training = backbone.training
        backbone.eval()
        chunks = []
        started = last_line = time.monotonic()
        batches = self._on(device)
        logger.info(
            "dev eval: encoding %d %s sentences (%d batches)",
            len(self.order),
            self.name,
            len(batches),
        )
        try:
            with torch.inference_mode(), eval_autocast(device):
                for done, batch in enumerate(batches, start=1):
                    if stop is not None and stop():
                        raise EvaluationStopped(f"dev eval stopped at batch {done}")
                    chunks.append(forward_pooled(backbone, batch, encoder.pooler).float())
                    if time.monotonic() - last_line >= PROGRESS_INTERVAL and done < len(batches):
                        last_line = time.monotonic()
                        logger.info(
                            "dev eval: %d/%d batches, %.0f s",
                            done,
                            len(batches),
                            last_line - started,
                        )
        finally:
            backbone.train(was_training)
        vectors = np.empty((len(self.order), chunks[0].shape[1]), dtype=np.float32)
        vectors[self.order] = torch.cat(chunks).cpu().numpy()  # one device→host copy
        score = score_task(self.task, vectors, self.rows)["all"]
        logger.info("dev eval: %s %.2f in %.1f s", self.name, score, time.monotonic() - started)
        return score
