"""Token ids of a corpus, cached once per (corpus, tokenizer, max length) and shared by every run.

Stage 2 used to tokenise its corpora at every start (most of a 1-step run on a 1M-sentence corpus:
5x the same run on 10k sentences, BENCHMARKS.md); a paper table of 9 ablation rows x 5 seeds paid
that 45 times. Now the first run writes the ids into the cache and every later run, seed, recipe
and ablation maps them.

Entry
-----
A feature set of kind ``tokens`` (:data:`~mmcse.cache.kinds.TOKENS_KIND`): int32 rows
``[length, id_0, …, id_{L-1}]`` (:data:`~mmcse.cache.kinds.TOKEN_ROW`) in the corpus's row order,
keyed by the corpus's sentence ids. The manifest's producer records the key — the corpus
fingerprint, the tokenizer fingerprint (:func:`mmcse.cache.tokenizer.tokenizer_fingerprint`) and
the max length — and the row format. Like every set it is memory-mapped (a step reads the rows of
its batch only) and verified on open (:mod:`mmcse.cache.integrity`: a full check once, then a few
``stat`` calls), and ``mmcse cache ls/verify/rm`` handle it.

Where
-----
``<folder>/<corpus name>-<corpus fp[:12]>-<tokenizer fp[:12]>-L<max length>/``. ``folder`` is
the training setting ``token_cache`` when it names one; by default (``auto``) it is ``tokens/``
beside a corpus table, itself a cache set (``cache/flickr30k/train/captions`` →
``cache/flickr30k/train/tokens/``), and ``cache/tokens/`` under the working directory — the
Stage-1 cache root — for any other corpus (the user's own sentence file ``data/wiki1m.txt``,
a ``datasets`` folder: nothing is written beside the user's data unless ``token_cache`` names
that folder) and for a corpus table whose folder is read-only (shared data; a folder without
write permission bits counts even for root). ``off`` tokenises in memory
and writes nothing; an entry that cannot be written (disk full) is used from memory with a warning.
Another corpus, tokenizer or max length gives another name, so an entry never changes once
written. A corpus's fingerprint sees what it holds: a corpus table's manifest, a sentence file's
bytes, a Parquet file's, a ``datasets`` dataset's files too (an arrow file rewritten in place
keeps ``datasets``' own fingerprint: :func:`mmcse.corpusfiles.dataset_fingerprint`), so an
edited corpus is never trained from the entry of its old tokens; entries of older corpora stay until removed (``mmcse cache ls`` lists them, ``mmcse
cache rm`` removes one).

Writers
-------
The first use builds the entry in a hidden temp folder beside it and renames the folder into
place in one step, so a reader finds either no entry or a whole one. Processes starting together
(seeds, DDP ranks) take a lock file (``.<name>.lock``, ``fcntl.flock``) first: one builds, the
others wait and open its entry. Without working locks they build side by side and the first
rename wins; the others discard theirs — never a mixed entry.

Stale or damaged
----------------
An entry that fails verification (a shard edited, truncated or replaced) or whose recorded key
differs from the one asked is moved aside and rebuilt, with a warning naming the problem; it is
never used.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmcse.cache.featureset import FeatureSet
from mmcse.cache.integrity import record_verified, shard_state
from mmcse.cache.kinds import TOKENS_KIND
from mmcse.cache.layout import (
    MANIFEST_NAME,
    os_errors,
    remove_stale_temp_files,
)
from mmcse.cache.manifest import Manifest
from mmcse.cache.writer import write_feature_set
from mmcse.errors import CacheError
from mmcse.files import temp_path

log = logging.getLogger(__name__)

#: version of the row layout; an entry of another format is rebuilt
TOKENS_FORMAT = 1
#: the folder beside a corpus that holds its token entries
FOLDER = "tokens"
#: where entries go when the corpus's own folder is read-only: the Stage-1 cache root
FALLBACK_ROOT = Path("cache")
SHARD_ROWS = 1_000_000
_PREFIX = 12  # hex digits of each fingerprint in an entry's name


@dataclass(frozen=True)
class TokenKey:
    """What the ids of a corpus depend on; ``num_rows`` and ``ids_sha256``, when known, are
    checked against the entry too (a corpus table's manifest has both).

    ``corpus_reader`` names how sentences are read from the corpus when its fingerprint does not
    fix them by itself (a sentence file's fingerprint hashes its bytes, not how lines are decoded
    and stripped): a reader that changes gives other sentences, so its entries are rebuilt.
    """

    corpus_fingerprint: str
    tokenizer_fingerprint: str
    max_length: int
    tokenizer: str = ""  # the tokenizer's name: recorded, not compared
    num_rows: int | None = None
    ids_sha256: str | None = None
    corpus_reader: str = ""

    def producer(self) -> dict:
        return {
            "format": TOKENS_FORMAT,
            "corpus_fingerprint": self.corpus_fingerprint,
            "corpus_reader": self.corpus_reader,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer,
        }

    def mismatch(self, manifest: Manifest) -> str | None:
        """How ``manifest`` differs from this key (None: it is this key's entry)."""
        if manifest.kind != TOKENS_KIND:
            return f"it is a {manifest.kind!r} set, not a tokens set"
        wanted = {k: v for k, v in self.producer().items() if k != "tokenizer"}
        for name, value in wanted.items():
            if manifest.producer.get(name) != value:
                return f"producer.{name} is {manifest.producer.get(name)!r}, not {value!r}"
        if manifest.shape != [self.max_length + 1] or manifest.dtype != "int32":
            return f"rows are {manifest.dtype} {manifest.shape}, not int32 [{self.max_length + 1}]"
        if self.num_rows is not None and manifest.num_rows != self.num_rows:
            return f"it has {manifest.num_rows} rows, the corpus {self.num_rows}"
        if self.ids_sha256 is not None and manifest.ids_sha256 != self.ids_sha256:
            return "its ids are not the corpus's"
        return None


def entry_path(corpus: str | Path, key: TokenKey, folder: str | Path | None = None) -> Path:
    """Where the entry of ``corpus`` under ``key`` lives: in ``folder`` if given; else in
    ``tokens/`` beside a corpus table (a cache set), or — where that is read-only and holds no
    such entry — and for any other corpus (the user's own files: never written beside), in
    ``cache/tokens/`` under the working directory (see the module docstring)."""
    stem = _corpus_name(corpus)
    name = (
        f"{stem}-{key.corpus_fingerprint[:_PREFIX]}-{key.tokenizer_fingerprint[:_PREFIX]}"
        f"-L{key.max_length}"
    )
    if folder is not None:
        return Path(folder) / name
    if (Path(corpus) / MANIFEST_NAME).is_file():  # a corpus table: the cache's own folder
        beside = Path(corpus).parent / FOLDER / name
        if (beside / MANIFEST_NAME).is_file() or writable(beside.parent):
            return beside
    return FALLBACK_ROOT / FOLDER / name


def _corpus_name(corpus: str | Path) -> str:
    """A corpus table's folder name, a file's stem, an ``hf:NAME``'s last part."""
    text = str(corpus)
    if text.startswith("hf:"):
        return re.sub(r"[^\w.-]+", "_", text[3:]).strip("_") or "hf"
    corpus = Path(corpus)
    return corpus.stem if corpus.is_file() else corpus.name


def writable(folder: Path) -> bool:
    """Whether ``folder`` (or, if absent, its nearest existing parent) may be written: the
    process can, and the folder is not marked read-only (no write bit; root ignores those)."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    try:
        marked = existing.stat().st_mode & 0o222
    except OSError:
        return False
    return bool(marked) and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def check_writable_folder(folder: Path) -> None:
    """:class:`CacheError` unless ``folder`` is, or can be created as, a folder :func:`writable`
    says may be written. Creates nothing: preflight asks it of a named ``token_cache`` before any
    work, and writing an entry asks it first, so both refuse the same folders."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise CacheError(f"{folder}: cannot create the folder: {existing} is a file, not a folder")
    if not writable(existing):
        raise CacheError(
            f"{folder}: cannot create the folder or write in it: {existing} is read-only "
            "(no write permission); name a writable folder"
        )


class TokenTable:
    """Token rows of a corpus by row number: a cache entry (memory-mapped) or rows in memory."""

    def __init__(self, rows: FeatureSet | np.ndarray, path: Path | None = None) -> None:
        self._rows = rows
        self.path = path
        self.num_rows = len(rows)
        self.max_length = (rows.dim if isinstance(rows, FeatureSet) else rows.shape[1]) - 1

    @classmethod
    def open(cls, path: str | Path, key: TokenKey) -> TokenTable:
        """The entry at ``path``; :class:`CacheError` if it fails verification or has another key."""
        path = Path(path)
        rows = FeatureSet.open(path)
        problem = key.mismatch(rows.manifest)
        if problem:
            raise CacheError(f"{path} is not the entry asked for: {problem}")
        return cls(rows, path)

    def __len__(self) -> int:
        return self.num_rows

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids [n, max_length], lengths [n])`` int32 of ``rows``."""
        taken = self._rows.take(rows) if isinstance(self._rows, FeatureSet) else self._rows[rows]
        return taken[:, 1:], taken[:, 0]


def cached_tokens(
    path: str | Path,
    key: TokenKey,
    build: Callable[[], tuple[Sequence[str], np.ndarray]],
    *,
    dataset: str = "",
    split: str = "",
    must_write: bool = False,
) -> TokenTable:
    """The entry at ``path`` for ``key``, built first if it is absent, stale or damaged.

    ``build()`` returns ``(ids, rows)``: the corpus's sentence ids and its token rows. When the
    entry cannot be written (read-only folder, disk full) the rows are used from memory with a
    warning, or, with ``must_write`` (a folder the user named), the :class:`CacheError` is raised.
    """
    path = Path(path)
    table = _open_valid(path, key, discard=False)
    if table is not None:
        return table
    if must_write:  # refused before the lock creates it and a whole corpus is tokenised
        check_writable_folder(path.parent)
    with _build_lock(path):
        table = _open_valid(path, key, discard=True)  # built meanwhile by the lock's holder?
        if table is not None:
            return table
        log.info("token cache: writing %s", path)
        ids, rows = build()
        try:
            return _write(path, key, ids, rows, dataset, split)
        except CacheError as exc:
            if must_write:
                raise
            log.warning("%s; using the token ids from memory this run", exc)
            return TokenTable(rows)


def _open_valid(path: Path, key: TokenKey, discard: bool) -> TokenTable | None:
    if not (path / MANIFEST_NAME).is_file():
        return None
    try:
        return TokenTable.open(path, key)
    except CacheError as exc:
        if discard:
            log.warning("token cache %s cannot be used (%s); rebuilding it", path, exc)
            _move_aside(path)
        return None


def _move_aside(path: Path) -> None:
    """Take a bad entry out of the way in one rename (readers that mapped it keep their maps)."""
    aside = temp_path(path)
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another process moved it first
        return
    except OSError as exc:
        raise CacheError(
            f"{path}: cannot replace a bad token cache entry ({exc.strerror})"
        ) from None
    shutil.rmtree(aside, ignore_errors=True)


def _write(
    path: Path, key: TokenKey, ids: Sequence[str], rows: np.ndarray, dataset: str, split: str
) -> TokenTable:
    check_writable_folder(path.parent)
    with os_errors(path.parent, "create the folder"):
        path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path.parent)
    temp = temp_path(path)
    try:
        manifest = write_feature_set(
            temp,
            ids,
            rows,
            shard_rows=SHARD_ROWS,
            kind=TOKENS_KIND,
            dim=rows.shape[1],
            dtype="int32",
            dataset=dataset,
            split=split,
            producer=key.producer(),
        )
        # finalize has just hashed the shards on disk and checked the ids: the full check
        record_verified(temp, manifest, shard_state(temp, manifest))
        if not _publish_folder(temp, path):
            log.info("token cache: %s was written by another process first; using it", path)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return TokenTable.open(path, key)


def _publish_folder(temp: Path, final: Path) -> bool:
    """Rename the finished ``temp`` folder to ``final`` (atomic); False when ``final`` exists."""
    try:
        os.rename(temp, final)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        raise CacheError(f"{final}: cannot publish the token cache ({exc.strerror})") from None
    with contextlib.suppress(OSError):  # make the rename durable where the platform allows
        directory = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return True


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside the entry while building it (a no-op where it cannot be
    taken: the atomic rename alone keeps the entry whole)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        fcntl = None
    handle = None
    if fcntl is not None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path.with_name(f".{path.name}.lock"), "a")  # noqa: SIM115
    try:
        if handle is not None:
            _lock(fcntl, handle, path)
        yield
    finally:
        if handle is not None:
            handle.close()  # releases the lock


def _lock(fcntl, handle, path: Path) -> None:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("token cache: waiting for another process writing %s", path)
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError:  # a file system without locks: build side by side
        pass
