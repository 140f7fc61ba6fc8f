"""Kinds of sets in the cache contract, and the row layouts Stage 1 and Stage 2 share.

Stage 1 (``pipeline/``) writes these and Stage 2 reads them, so they live here, in the contract,
rather than in either stage (:mod:`mmcse.methods.phrases` and :mod:`mmcse.nonling` re-export them).
"""

from __future__ import annotations

#: a corpus table (see :mod:`mmcse.cache.corpus`)
CORPUS_KIND = "corpus"
#: the columns of a corpus table's shards, in order
CORPUS_COLUMNS = ("id", "text", "image_id", "source")

#: a corpus's token ids for one tokenizer and max length (see :mod:`mmcse.cache.tokens`); ids are
#: the corpus's sentence ids, rows are :data:`TOKEN_ROW`
TOKENS_KIND = "tokens"
#: one int32 row of a tokens set: the sentence's token count, then its ids right-padded with the
#: tokenizer's pad id to the max length (``[length, id_0, …, id_{L-1}]``, ``L + 1`` values)
TOKEN_ROW = ("length", "input_ids")

#: MCSEO's objects table: one row per object–phrase pair (numeric row + text columns)
OBJECTS_KIND = "objects"
#: one teacher embedding per object of an objects table (ids = object ids)
OBJECT_KIND = "object"
#: the numeric row of the objects table, in column order
OBJECT_ROW = (
    "char_start",
    "char_end",
    "x0",
    "y0",
    "x1",
    "y1",
    "grounding_score",
    "mask_score",
)
#: the text columns an objects-table shard carries beside ``id`` and ``features``
OBJECT_TEXT_COLUMNS = ("image_id", "image_path", "caption_id", "phrase", "span_text", "mask_rle")

#: VisualCSE's unpaired labelled images, cached as uint8 tensors (ids ``CLASS/NAME``)
IMAGE_TENSOR_KIND = "image_tensor"
#: AudioCSE's unpaired labelled clips, cached as log-mel filterbanks (ids ``CLASS/NAME``)
AUDIO_FBANK_KIND = "audio_fbank"

#: kinds whose rows may hold NaN on purpose (an objects row has NaN for an unknown score)
NAN_ALLOWED_KINDS = frozenset({OBJECTS_KIND})


def class_of(item_id: str) -> str:
    """Class of a cached example: its id's first path component (``n01440764/n01440764_10026``)."""
    return item_id.split("/", 1)[0]
