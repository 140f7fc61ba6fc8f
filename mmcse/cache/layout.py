"""The on-disk layout shared by feature sets and corpora: file names, litter, hashing of ids
(atomic writes and file hashes: :mod:`mmcse.files`).

A set directory holds ``manifest.json`` plus shards named ``shard-00000.arrow`` (or ``.h5``) by
their index. Everything a writer has not finished lives under a hidden name (``.shard-*.tmp-*``,
``.pending.json``) that readers never look at, so a crash can leave litter but never a set that
reads as valid.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm.auto import tqdm

from mmcse import files
from mmcse.errors import CacheError

MANIFEST_NAME = "manifest.json"
PENDING_NAME = ".pending.json"
#: the verified state of a set's shards (see :mod:`mmcse.cache.integrity`)
VERIFIED_NAME = ".verified.json"
_SHARD_PATTERN = re.compile(r"shard-(\d{5,})\.(arrow|h5)")
_TEMP_PATTERN = re.compile(r"\..+\.tmp-.+")  # temp_path(): ".<final name>.tmp-<host>-<pid>-<hex>"


def progress(shards: Iterable, desc: str) -> Iterable:
    """A per-shard progress bar on stderr, shown only on a terminal (logs and pipes stay clean)."""
    return tqdm(shards, desc=desc, unit="shard", leave=False, disable=None)


def shard_name(index: int, suffix: str) -> str:
    return f"shard-{index:05d}{suffix}"


def shard_files(directory: Path) -> dict[int, Path]:
    """Finished shard files in ``directory`` by index (any backend)."""
    found: dict[int, Path] = {}
    for path in directory.iterdir():
        match = _SHARD_PATTERN.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(1)), path)
    return dict(sorted(found.items()))


def is_temp_file(path: Path) -> bool:
    return _TEMP_PATTERN.fullmatch(path.name) is not None


def is_shard_name(name: str) -> bool:
    return _SHARD_PATTERN.fullmatch(name) is not None


def is_layout_file(path: Path) -> bool:
    """True for every file a writer may create: manifest, pending metadata, shards, temp files."""
    name = path.name
    return name in (MANIFEST_NAME, PENDING_NAME, VERIFIED_NAME) or bool(
        _SHARD_PATTERN.fullmatch(name) or _TEMP_PATTERN.fullmatch(name)
    )


def remove_stale_temp_files(directory: Path) -> list[Path]:
    """Delete temp files (and temp folders: unpublished token-cache entries) left by killed
    writers on this host (their pid is gone); those of live writers and of other hosts are left
    alone (``finalize`` removes those)."""
    removed = []
    if not directory.is_dir():
        return removed
    for path in filter(is_temp_file, directory.iterdir()):
        owner = path.name.split(".tmp-", 1)[1].split("-")
        if len(owner) >= 3 and owner[0] == files.HOST and owner[1].isdigit():
            if not _process_alive(int(owner[1])):
                _remove(path)
                removed.append(path)
        elif len(owner) < 3 or not owner[1].isdigit():  # an older name format: pid unknown
            _remove(path)
            removed.append(path)
    return removed


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def os_errors(path: Path | str, action: str = "write") -> Iterator[None]:
    """Turn an OS error (disk full, read-only, permission) into one :class:`CacheError` line
    naming ``path`` instead of a traceback."""
    try:
        yield
    except CacheError:
        raise
    except OSError as exc:
        raise CacheError(describe_os_error(exc, path, action)) from None


def describe_os_error(exc: OSError, path: Path | str, action: str = "write") -> str:
    hints = {
        errno.ENOSPC: "the disk is full; free space or choose another folder",
        errno.EDQUOT: "the disk quota is exceeded; free space or choose another folder",
        errno.EROFS: "the file system is read-only; choose a writable folder",
        errno.EACCES: "permission denied; choose a folder you can write to",
        errno.EPERM: "operation not permitted; choose a folder you can write to",
    }
    where = getattr(exc, "filename", None) or path
    reason = hints.get(exc.errno, exc.strerror or type(exc).__name__)
    return f"{where}: cannot {action}: {reason}"


def publish(temp: Path, final: Path) -> None:
    """:func:`mmcse.files.publish`, an OS error one line naming ``final``."""
    with os_errors(final):
        files.publish(temp, final)


def write_json_atomically(path: Path, payload: dict) -> None:
    with os_errors(path):
        files.write_text_atomically(path, canonical_json(payload, indent=2) + "\n")


def canonical_json(payload: object, indent: int | None = None) -> str:
    """Sorted keys and fixed separators: equal content gives equal bytes (and hashes)."""
    separators = (",", ": ") if indent else (",", ":")
    return json.dumps(payload, sort_keys=True, indent=indent, separators=separators)


def sha256_ids(ids: Iterable[str]) -> str:
    """sha256 over the sorted ids, each UTF-8 encoded and NUL-terminated (order-independent)."""
    digest = hashlib.sha256()
    for identifier in sorted(ids):
        digest.update(identifier.encode("utf-8") + b"\0")
    return digest.hexdigest()


#: how many ids an error message names before ``(+N more)``
DESCRIBED_IDS = 5


def describe_ids(ids: Iterable[object]) -> str:
    """``'a', 'b', 'c' (+12 more)``: enough to find the rows, still one line."""
    ids = list(ids)
    shown = ", ".join(repr(str(identifier)) for identifier in ids[:DESCRIBED_IDS])
    more = len(ids) - DESCRIBED_IDS
    return shown + (f" (+{more} more)" if more > 0 else "")
