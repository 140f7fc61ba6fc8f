"""MCSEO's object–phrase pairs at training time: the objects table, and the phrase index whose
batches :meth:`mmcse.methods.mcseo.MCSEO.batch_inputs` takes for every caption batch.

Stage 1 (``mmcse extract-objects``) writes two cache sets:

* the **objects table** (``kind='objects'``): one row per object–phrase pair. Its ``features``
  column holds the numeric part of the row (:data:`OBJECT_ROW`: the phrase's character span in
  its caption, the box and the detector scores, float32) and its shards carry the text columns
  :data:`OBJECT_TEXT_COLUMNS` beside it (image and caption id, the phrase as detected, the caption
  text of the span, the mask as COCO RLE JSON, and the image path so objects can be re-encoded
  without rerunning detection). Only *character* spans are stored: token spans
  depend on the student's tokenizer and are computed here, at train time.
* the **object feature set** (``kind='object'``, ids = object ids): one teacher embedding per
  object. Its manifest's ``extra['objects_table']`` names the table (relative to the set), so a
  re-encoding with another teacher points to the same table.

:class:`PhraseIndex` finds every caption's pairs once per corpus; its :meth:`~PhraseIndex.batch`
slices them into the padded tensors the object–phrase loss reads (contract in
:class:`mmcse.losses.object_phrase.ObjectPhraseInfoNCELoss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmcse.cache.kinds import OBJECT_KIND, OBJECT_ROW, OBJECT_TEXT_COLUMNS, OBJECTS_KIND
from mmcse.cache.objects import ObjectsColumns
from mmcse.errors import MmcseError

__all__ = ["OBJECT_KIND", "OBJECT_ROW", "OBJECT_TEXT_COLUMNS", "OBJECTS_KIND", "ObjectsTable"]


@dataclass(frozen=True)
class ObjectPhrase:
    """One object–phrase pair as the collate needs it."""

    object_id: str
    char_start: int
    char_end: int
    span_text: str


class ObjectsTable(ObjectsColumns):
    """The objects table, indexed by caption id (pairs in the order they were extracted)."""

    def __init__(self, path: Path, manifest, columns: dict[str, np.ndarray]) -> None:
        super().__init__(path, manifest, columns)
        self._by_caption: dict[str, list[int]] = {}
        for row, caption_id in enumerate(columns["caption_id"]):
            self._by_caption.setdefault(caption_id, []).append(row)

    def pairs_for(self, caption_id: str) -> list[ObjectPhrase]:
        start, end = OBJECT_ROW.index("char_start"), OBJECT_ROW.index("char_end")
        return [
            ObjectPhrase(
                str(self.columns["id"][r]),
                int(self.columns["row"][r, start]),
                int(self.columns["row"][r, end]),
                str(self.columns["span_text"][r]),
            )
            for r in self._by_caption.get(str(caption_id), [])
        ]


@lru_cache(maxsize=4)
def open_objects_table(path: str, fingerprint: str) -> ObjectsTable:
    """Cached :meth:`ObjectsTable.open` (keyed by fingerprint, so a rewritten table reloads)."""
    table = ObjectsTable.open(path)
    if table.fingerprint != fingerprint:
        raise MmcseError(
            f"objects table {path} changed since its object features were written "
            f"(fingerprint {table.fingerprint[:12]}, expected {fingerprint[:12]}); re-run "
            "`mmcse extract-objects --from-objects`"
        )
    return table


def table_of(object_features_path: Path, extra: dict) -> ObjectsTable:
    """The objects table an object feature set was encoded from (its manifest ``extra``)."""
    try:
        relative, fingerprint = extra["objects_table"], extra["objects_fingerprint"]
    except KeyError:
        raise MmcseError(
            f"{object_features_path} does not name its objects table: not an "
            "`mmcse extract-objects` object feature set"
        ) from None
    return open_objects_table(str((object_features_path / relative).resolve()), fingerprint)


def char_span_to_tokens(offsets: Tensor, start: int, end: int) -> tuple[int, int] | None:
    """Token ``(first, last + 1)`` covering characters ``[start, end)``, or ``None`` when the
    span is not wholly inside the tokenised text (cut off by ``max_length``).

    ``offsets`` is one sentence's ``[L, 2]`` offset mapping from a fast tokenizer; special and
    padding tokens have empty offsets and are never part of a span. Works for WordPiece (BERT) and
    byte-level BPE (RoBERTa, whose offsets exclude the leading space).
    """
    content = offsets[:, 1] > offsets[:, 0]
    if not content.any() or end > int(offsets[content, 1].max()):
        return None
    hits = torch.nonzero(content & (offsets[:, 0] < end) & (offsets[:, 1] > start)).flatten()
    if hits.numel() == 0:
        return None
    return int(hits[0]), int(hits[-1]) + 1


@dataclass
class PhraseBatch:
    """Padded per-caption object–phrase pairs (see :mod:`mmcse.losses.object_phrase`)."""

    spans: Tensor  # [B, P, 2] long, token (start, end), -1 where padded
    mask: Tensor  # [B, P] bool
    objects: Tensor  # [B, P, D] float32, zeros where padded

    def to(self, device: torch.device) -> PhraseBatch:
        return PhraseBatch(self.spans.to(device), self.mask.to(device), self.objects.to(device))


def phrase_pairs(
    caption_ids: list[str], texts: list[str], offsets: Tensor, objects: ObjectsTable
) -> list[list[tuple[int, int, str]]]:
    """Per caption, its surviving ``(token_start, token_end, object_id)`` pairs.

    Each stored span is checked against ``texts``, so a corpus that differs from the extracted
    captions fails loudly instead of misaligning. Pairs whose phrase was cut off by
    ``max_length`` are dropped with their object (MCSEO §4.1: truncated phrases are excluded).
    """
    offsets = torch.as_tensor(offsets)
    kept: list[list[tuple[int, int, str]]] = []
    for b, (caption_id, text) in enumerate(zip(caption_ids, texts, strict=True)):
        pairs = []
        for pair in objects.pairs_for(caption_id):
            if text[pair.char_start : pair.char_end] != pair.span_text:
                raise MmcseError(
                    f"caption {caption_id!r}: characters {pair.char_start}-{pair.char_end} are "
                    f"{text[pair.char_start : pair.char_end]!r} in the corpus but "
                    f"{pair.span_text!r} in {objects.path}; the corpus and the objects table "
                    "were built from different captions"
                )
            span = char_span_to_tokens(offsets[b], pair.char_start, pair.char_end)
            if span is not None:
                pairs.append((*span, pair.object_id))
        kept.append(pairs)
    return kept


@dataclass
class PhraseIndex:
    """Every caption's phrase token spans and object rows, computed once per corpus, so a
    training step only slices arrays and gathers object features (no tokenising, no loops)."""

    spans: np.ndarray  # [N, P, 2] int64, -1 where padded
    object_rows: np.ndarray  # [N, P] int64 rows of the object feature set, -1 where padded
    object_features: object  # a FeatureSet (``.rows_for``, ``.take``, ``.dim``)

    @classmethod
    def build(cls, caption_ids, texts, tokenizer, max_length, objects, object_features, chunk=4096):
        pairs: list[list[tuple[int, int, str]]] = []
        for i in range(0, len(texts), chunk):
            encoded = tokenizer(
                texts[i : i + chunk],
                max_length=max_length,
                truncation=True,
                padding=True,
                return_offsets_mapping=True,
                return_tensors="pt",
            )
            ids = caption_ids[i : i + chunk]
            pairs += phrase_pairs(ids, texts[i : i + chunk], encoded["offset_mapping"], objects)
        width = max((len(p) for p in pairs), default=0)
        spans = np.full((len(pairs), width, 2), -1, dtype=np.int64)
        object_rows = np.full((len(pairs), width), -1, dtype=np.int64)
        flat = [object_id for caption in pairs for *_, object_id in caption]
        rows = iter(object_features.rows_for(flat) if flat else [])
        for b, caption in enumerate(pairs):
            for p, (start, end, _) in enumerate(caption):
                spans[b, p] = (start, end)
                object_rows[b, p] = next(rows)
        return cls(spans, object_rows, object_features)

    def batch(self, rows: np.ndarray, static: bool = False) -> PhraseBatch:
        """The pairs of captions ``rows``, padded to the batch's most pairs, or (``static``)
        to the corpus's, so every batch has one shape (a captured step compiles once)."""
        object_rows = self.object_rows[rows]
        mask = object_rows >= 0
        width = int(mask.sum(1).max()) if len(rows) else 0  # pairs are packed to the left
        width = object_rows.shape[1] if static else width
        object_rows, mask = object_rows[:, :width], mask[:, :width]
        features = np.zeros((*mask.shape, int(self.object_features.dim)), dtype=np.float32)
        if mask.any():
            features[mask] = self.object_features.take(object_rows[mask])
        return PhraseBatch(
            torch.from_numpy(self.spans[rows][:, :width].copy()),
            torch.from_numpy(mask),
            torch.from_numpy(features),
        )
