"""What a student tokenizer does to a corpus, as the token cache needs it.

* :func:`tokenizer_fingerprint` hashes everything that decides the ids of a sentence — the
  tokenizer's serialized state (vocabulary, normalizer, pre-tokenizer, post-processor with its
  special tokens, added tokens), its class, truncation side, padding id and whether special tokens
  in the text are split — and nothing else (not its folder, not ``model_max_length``): the same
  model folder loaded twice gives the same fingerprint, another vocabulary another one.
* :func:`encode_rows` encodes a corpus into token rows (:data:`~mmcse.cache.kinds.TOKEN_ROW`)
  whose ids equal ``tokenizer(text, max_length=L, truncation=True)["input_ids"]``. A fast
  tokenizer is driven through its ``tokenizers`` backend in large batches (no padding, no
  offsets, no per-sentence dicts), the id lists are flattened into the padded matrix in one
  vectorised step. A slow (Python) tokenizer goes through its own ``__call__``. The first batch
  is compared with ``__call__`` so a tokenizer whose Python side changes the text cannot make
  the fast path silently differ: it falls back to ``__call__`` instead.

Tokenizers are duck-typed here (nothing imports ``transformers``).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from mmcse.files import sha256_file

log = logging.getLogger(__name__)

#: sentences per call into the tokenizer (keeps memory flat and shows progress)
CHUNK = 32_768
#: sentences of the first chunk compared with the tokenizer's own ``__call__``
CHECKED = 256
#: init settings of a slow tokenizer that name files or folders, not behaviour
_PATH_SETTINGS = ("name_or_path", "tokenizer_file", "special_tokens_map_file")


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of what decides the tokenizer's ids (see the module docstring)."""
    state = {
        "class": type(tokenizer).__name__,
        "truncation_side": getattr(tokenizer, "truncation_side", "right"),
        "pad_token_id": pad_id(tokenizer),
        "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
    }
    backend = _backend(tokenizer)
    if backend is not None:
        serialized = json.loads(backend.to_str())
        # HF sets these per call; they are the run's max length, which the cache keys separately
        serialized["truncation"] = serialized["padding"] = None
        state["backend"] = serialized
    else:
        state.update(_slow_state(tokenizer))
    text = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _slow_state(tokenizer) -> dict:
    """A slow tokenizer's vocabulary, added tokens, settings and the bytes of its vocab files."""
    settings = {
        key: value
        for key, value in getattr(tokenizer, "init_kwargs", {}).items()
        if key not in _PATH_SETTINGS and not key.endswith("_file")
    }
    files = {
        key: sha256_file(Path(value))
        for key, value in getattr(tokenizer, "init_kwargs", {}).items()
        if key.endswith("_file") and isinstance(value, str) and Path(value).is_file()
    }
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {
        "vocab": sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]),
        "added_tokens": {str(index): repr(token) for index, token in sorted(added.items())},
        "settings": settings,
        "files": files,
    }


def pad_id(tokenizer) -> int:
    """The id a padded row is filled with (0 when the tokenizer has no pad token)."""
    return int(getattr(tokenizer, "pad_token_id", None) or 0)


def _backend(tokenizer):
    if not getattr(tokenizer, "is_fast", False):
        return None
    return getattr(tokenizer, "backend_tokenizer", None)


def encode_rows(
    tokenizer, texts: Sequence[str], max_length: int, desc: str = "tokenise"
) -> np.ndarray:
    """Token rows ``[N, 1 + max_length]`` int32 of ``texts``: the length, then the ids
    right-padded with the pad id (see :data:`~mmcse.cache.kinds.TOKEN_ROW`).

    Chunks are pipelined: the ``tokenizers`` backend encodes chunk k+1 on a worker thread (it
    releases the GIL) while this thread reads chunk k's ids into the rows."""
    rows = np.full((len(texts), 1 + max_length), pad_id(tokenizer), dtype=np.int32)
    stages = _fast_stages(tokenizer, max_length)
    if stages is not None and len(texts):
        head = list(texts[:CHECKED])
        encode, to_ids = stages
        if to_ids(encode(head)) != _call(tokenizer, head, max_length):
            log.warning(
                "%s: its fast backend gives other ids than the tokenizer itself on this corpus; "
                "tokenising through the tokenizer (slower)",
                type(tokenizer).__name__,
            )
            stages = None
    # the tokenizer's own call already returns id lists
    encode, to_ids = stages or ((lambda chunk: _call(tokenizer, chunk, max_length)), _as_is)
    starts = range(0, len(texts), CHUNK)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(encode, list(texts[:CHUNK]))
        for start in tqdm(starts, desc=desc, unit="chunk", leave=False, disable=len(starts) < 4):
            encoded = pending.result()
            if start + CHUNK < len(texts):
                pending = pool.submit(encode, list(texts[start + CHUNK : start + 2 * CHUNK]))
            fill_rows(rows[start : start + CHUNK], to_ids(encoded))
    return rows


def _as_is(ids: list[list[int]]) -> list[list[int]]:
    return ids


def _call(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """The reference: the tokenizer's own ``__call__``, as training always tokenised."""
    if not texts:
        return []
    return tokenizer(texts, max_length=max_length, truncation=True)["input_ids"]


def _fast_stages(tokenizer, max_length: int):
    """``(texts → encodings, encodings → id lists)`` through a private copy of the
    ``tokenizers`` backend configured as ``__call__`` configures it (truncation side and
    strategy, special-token splitting), without padding; None for a slow tokenizer."""
    backend = _backend(tokenizer)
    if backend is None:
        return None
    backend = copy.deepcopy(backend)  # never change the caller's tokenizer
    backend.no_padding()
    backend.enable_truncation(
        max_length,
        stride=0,
        strategy="longest_first",
        direction=getattr(tokenizer, "truncation_side", "right"),
    )
    backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # fast: no offsets

    def encodings(texts: list[str]) -> list:
        return encode(texts, add_special_tokens=True)

    def ids(encoded: list) -> list[list[int]]:
        return [encoding.ids for encoding in encoded]

    return encodings, ids


def fill_rows(rows: np.ndarray, ids: list[list[int]]) -> None:
    """Write id lists into padded token rows in one vectorised step (no per-row Python copy)."""
    width = rows.shape[1] - 1
    lengths = np.fromiter(map(len, ids), np.int32, len(ids))
    if len(ids) and lengths.max(initial=0) > width:
        raise ValueError(f"a sentence has {lengths.max()} tokens, more than max_length={width}")
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
    rows[:, 0] = lengths
    rows[:, 1:][np.arange(width) < lengths[:, None]] = flat
