"""Opening a corpus: a corpus table folder (read column by column, when something needs it) or a
file of one sentence per line in any format :mod:`mmcse.corpusfiles` reads, and its token rows
from the token cache (:mod:`mmcse.cache.tokens`: written by the first run, memory-mapped by every
later one), or encoded in memory with ``token_cache = "off"``."""

from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from mmcse import corpusfiles
from mmcse.cache import Corpus
from mmcse.cache.layout import MANIFEST_NAME
from mmcse.cache.tokenizer import encode_rows, tokenizer_fingerprint
from mmcse.cache.tokens import TokenKey, TokenTable, cached_tokens, entry_path
from mmcse.errors import MmcseError
from mmcse.files import write_text_atomically
from mmcse.training.config import TOKEN_CACHE_AUTO, TOKEN_CACHE_OFF

logger = logging.getLogger(__name__)

#: how :class:`TextFileCorpus` turns a sentence file's bytes into sentences; change it whenever that
#: changes (decoding, stripping, skipping): token-cache entries of sentence files are keyed by it
SENTENCE_FILE_READER = "corpusfiles-2/strip/max10000/cr/tsv-unquoted"
#: what a corpus may be, for errors
CORPUS_FORMS = f"give a corpus table folder or a sentence file: {corpusfiles.FORMATS}"


class CorpusView(Protocol):
    """What training reads of a corpus; every column is read on first use only."""

    path: Path
    fingerprint: str

    def __len__(self) -> int: ...
    @property
    def ids(self) -> np.ndarray: ...
    @property
    def texts(self) -> list[str]: ...
    @property
    def image_ids(self) -> np.ndarray | None: ...


class TableCorpus:
    """A corpus table, memory-mapped: its manifest gives the size, ids hash and fingerprint."""

    reader = ""  # the fingerprint fixes every sentence

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = Corpus.open(path)
        self.fingerprint = self.table.fingerprint
        self.num_rows: int | None = len(self.table)
        self.ids_sha256: str | None = self.table.manifest.ids_sha256
        self.dataset, self.split = self.table.manifest.dataset, self.table.manifest.split

    def __len__(self) -> int:
        return len(self.table)

    @cached_property
    def ids(self) -> np.ndarray:
        return self.table.ids

    @cached_property
    def texts(self) -> list[str]:
        return self.table.texts

    @cached_property
    def image_ids(self) -> np.ndarray | None:
        """Object array (None where a row has none); None when the first 1000 rows have none."""
        image_ids = self.table.column("image_id")
        return image_ids if any(i not in (None, "") for i in image_ids[:1000]) else None


class TextFileCorpus:
    """A sentence file in any format :mod:`mmcse.corpusfiles` reads (plain text, JSON lines,
    CSV/TSV, Parquet, a ``datasets`` dataset), read once under the read policy; its id is
    ``<stem>:<row>`` (the 0-based line of a text file), fingerprinted by its bytes."""

    def __init__(self, path: Path | str, text_field: str | None = None, bad_lines: str = "skip"):
        self.path = Path(path) if not corpusfiles.is_hf_name(path) else path
        self.text_field, self.bad_lines = text_field, bad_lines
        self.ids_sha256: str | None = None
        self.dataset, self.split = corpus_stem(path), "train"
        self.image_ids = None

    @cached_property
    def read(self) -> corpusfiles.Sentences:
        read = corpusfiles.read_sentences(self.path, self.text_field, self.bad_lines, split=None)
        if not read.texts:
            raise MmcseError(f"corpus {self.path} has no sentences ({read.summary() or 'empty'})")
        if read.dropped:
            row, reason = read.dropped[0]
            logger.warning(
                f"corpus {self.path}: {read.summary()} of {read.records.num_rows} rows, "
                f"e.g. {read.records.where(row)}: {reason} (--bad-lines refuse to refuse such "
                "a file; a run lists every one in its left_out.jsonl)"
            )
        return read

    @property
    def fingerprint(self) -> str:
        return self.read.records.fingerprint

    @property
    def num_rows(self) -> int:
        return len(self.read.texts)

    @property
    def reader(self) -> str:
        """What turned the file into sentences (token-cache entries are keyed by it)."""
        read = self.read
        return f"{SENTENCE_FILE_READER}/{read.records.format}/{read.text_field}/{self.bad_lines}"

    def __len__(self) -> int:
        return len(self.read.texts)

    @cached_property
    def ids(self) -> np.ndarray:
        stem = self.dataset  # once, not per line (1.7 s of a 1M-line file)
        return np.asarray([f"{stem}:{row}" for row in self.read.rows], dtype=object)

    @property
    def texts(self) -> list[str]:
        return self.read.texts


def left_out_summary(sources: dict) -> dict[str, dict]:
    """Per corpus kind whose read left rows out: its file, rows, how many were left out and why
    (``plan.json``'s ``left_out``; every row is in the run's ``left_out.jsonl``). ``sources``:
    the run's corpora by kind (:class:`mmcse.training.data.Source` or the corpus itself)."""
    summary = {}
    for kind, source in sources.items():
        read = _sentence_file_read(source)
        if read is not None and read.dropped:
            summary[kind] = {
                "source": str(read.records.source),
                "rows": read.records.num_rows,
                "left_out": len(read.dropped),
                "by_reason": read.dropped_by_reason(),
            }
    return summary


def write_left_out(path: Path, sources: dict) -> None:
    """Every row the reads of ``sources`` left out, one JSON object a line (corpus kind, file,
    where in it, why) at ``path``; no file when none was left out."""
    lines = []
    for kind, source in sources.items():
        read = _sentence_file_read(source)
        for row, reason in read.dropped if read is not None else ():
            where, file = read.records.where(row), str(read.records.source)
            record = {"corpus": kind, "source": file, "where": where, "why": reason}
            lines.append(json.dumps(record, ensure_ascii=False))
    if lines:
        write_text_atomically(path, "\n".join(lines) + "\n")
    else:
        path.unlink(missing_ok=True)


def _sentence_file_read(source) -> corpusfiles.Sentences | None:
    """The read of a sentence file; None for a corpus table (extract-text recorded what it left
    out in its own errors.jsonl) or one in memory."""
    corpus = getattr(source, "corpus", source)
    return corpus.read if isinstance(corpus, TextFileCorpus) else None


def corpus_stem(path: Path | str) -> str:
    """The name a file's sentence ids start with: its stem (an ``hf:`` name's last part)."""
    if corpusfiles.is_hf_name(path):
        return str(path)[len(corpusfiles.HF_PREFIX) :].split(":")[0].split("/")[-1]
    return Path(path).stem


def open_corpus(
    path: str, text_field: str | None = None, bad_lines: str = "skip"
) -> TableCorpus | TextFileCorpus:
    """A corpus table folder (opened without reading its texts) or a sentence file in any
    format :mod:`mmcse.corpusfiles` reads (read once, when first asked)."""
    if corpusfiles.is_hf_name(path):
        return TextFileCorpus(path, text_field, bad_lines)
    p = Path(path)
    if (p / MANIFEST_NAME).is_file():
        return TableCorpus(p)
    if not p.exists():
        raise MmcseError(f"corpus {p} does not exist ({CORPUS_FORMS})")
    return TextFileCorpus(p, text_field, bad_lines)


def corpus_tokens(
    corpus: TableCorpus | TextFileCorpus | str,
    tokenizer,
    max_length: int,
    token_cache: str = TOKEN_CACHE_AUTO,
    tokenizer_fp: str | None = None,
    desc: str = "tokenise",
) -> TokenTable:
    """The token rows of ``corpus`` (a corpus or its path): from the token cache, written first
    if needed (``token_cache``: ``auto``, a folder, or ``off`` to encode in memory). Training calls
    it per corpus; calling it ahead (e.g. before launching a table of runs) warms the cache."""
    if isinstance(corpus, str | Path):
        corpus = open_corpus(str(corpus))

    def encode() -> np.ndarray:
        return encode_rows(tokenizer, corpus.texts, max_length, desc)

    if token_cache == TOKEN_CACHE_OFF:
        return TokenTable(encode())
    key = TokenKey(
        corpus.fingerprint,
        tokenizer_fp or tokenizer_fingerprint(tokenizer),
        max_length,
        tokenizer=Path(str(getattr(tokenizer, "name_or_path", ""))).name,
        num_rows=corpus.num_rows,
        ids_sha256=corpus.ids_sha256,
        corpus_reader=corpus.reader,
    )
    named = token_cache != TOKEN_CACHE_AUTO
    desc = f"{desc} into the token cache (once)"
    return cached_tokens(
        entry_path(corpus.path, key, token_cache if named else None),
        key,
        lambda: (corpus.ids, encode()),
        dataset=corpus.dataset,
        split=corpus.split,
        must_write=named,
    )
