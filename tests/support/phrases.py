"""MCSEO's object–phrase pairs collated batch by batch: the reference the trainer's
once-per-corpus :class:`mmcse.methods.phrases.PhraseIndex` is held to."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mmcse.methods.phrases import ObjectsTable, PhraseBatch, phrase_pairs


def build_phrase_batch(
    caption_ids: list[str], texts: list[str], offsets: Tensor, objects: ObjectsTable, features
) -> PhraseBatch:
    """Collate the object–phrase pairs of a batch of captions.

    ``texts``: the caption texts as tokenised (checked against the table's spans); ``offsets``:
    the ``[B, L, 2]`` offset mapping of the batch, tokenised exactly as the student sees it;
    ``features``: the object feature set (``.gather`` by object id; ``.dim``). ``P`` is the
    most surviving pairs of any caption.
    """
    kept = phrase_pairs(caption_ids, texts, offsets, objects)
    width = max((len(p) for p in kept), default=0)
    spans = torch.full((len(kept), width, 2), -1, dtype=torch.long)
    mask = torch.zeros(len(kept), width, dtype=torch.bool)
    flat_ids = [object_id for pairs in kept for _, _, object_id in pairs]
    gathered = np.asarray(features.gather(flat_ids)) if flat_ids else np.zeros((0, 1))
    dim = gathered.shape[1] if flat_ids else int(getattr(features, "dim", 1))
    objects_out = torch.zeros(len(kept), width, dim, dtype=torch.float32)
    row = 0
    for b, pairs in enumerate(kept):
        for p, (start, end, _) in enumerate(pairs):
            spans[b, p] = torch.tensor([start, end])
            mask[b, p] = True
            objects_out[b, p] = torch.from_numpy(np.asarray(gathered[row], dtype=np.float32))
            row += 1
    return PhraseBatch(spans, mask, objects_out)
