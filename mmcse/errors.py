"""User-facing errors, and OS errors turned into one line that names the path.

A user error is an :class:`MmcseError`: the CLI prints its message on one line and exits 2. Any
other exception is a bug and keeps its traceback.

Python attaches a file name only to errors raised when a file is opened; a full disk shows at
``write``/``close`` with no name, and Rust writers (safetensors, tokenizers) or torch's zip writer
wrap the OS error in their own exception type. :func:`naming_os_errors` turns all of these into
an :class:`MmcseError` naming the file, or the folder being written, and the fix; any other
exception passes through untouched.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class MmcseError(Exception):
    """Bad input or state a user can fix; the message says what and where, on one line."""


class BadValueError(MmcseError, ValueError):
    """A value the user gave is not one allowed (a ValueError too, for callers that catch that)."""


class CacheError(MmcseError):
    """A feature set or corpus is missing, invalid, corrupted or does not match a run."""


class MissingIdsError(CacheError):
    """Ids asked for are not in a feature set (the message names the set and some ids)."""


HINTS = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
    errno.EACCES: "check the permissions or write elsewhere",
    errno.EPERM: "check the permissions or write elsewhere",
}
#: how wrapped OS errors spell their errno: Rust's io::Error, torch's PytorchStreamWriter
WRAPPED_ERRNO = re.compile(r"\(os error (\d+)\)|No space left on device|Read-only file system")
TORCH_WRITE_FAILED = "PytorchStreamWriter failed writing file"
WRAPPED_WORDS = {"No space left on device": errno.ENOSPC, "Read-only file system": errno.EROFS}


def os_error_message(exc: OSError, where: str | Path | None = None) -> str:
    """``PATH: reason (fix)`` for an OSError; ``where`` names the folder when the error has none."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = exc.strerror or first_line
    # a hand-raised OSError (no errno) carries its own message; only real ones get ``where``
    path = exc.filename if exc.filename is not None or exc.errno is None else where
    if exc.filename2 is not None:
        path = f"{exc.filename} -> {exc.filename2}"
    hint = HINTS.get(exc.errno or -1)
    text = f"{path}: {reason}" if path is not None else reason
    return f"{text} ({hint})" if hint else text


def wrapped_os_error(exc: BaseException) -> OSError | None:
    """The OS error a non-OSError exception only wraps (Rust io errors, torch's writer), else None."""
    text = str(exc)
    match = WRAPPED_ERRNO.search(text)
    if match is not None:
        code = int(match.group(1)) if match.group(1) else WRAPPED_WORDS[match.group(0)]
        return OSError(code, os.strerror(code))
    if TORCH_WRITE_FAILED in text:
        return OSError(errno.EIO, "writing a file failed (is the disk full or read-only?)")
    return None


@contextmanager
def naming_os_errors(where: str | Path) -> Iterator[None]:
    """OS errors inside become one MmcseError line naming the file or ``where``."""
    try:
        yield
    except MmcseError:
        raise
    except OSError as exc:
        raise MmcseError(os_error_message(exc, where)) from exc
    except Exception as exc:  # e.g. safetensors' SafetensorError, torch's zip writer
        wrapped = wrapped_os_error(exc)
        if wrapped is None:
            raise  # not an OS error: a bug keeps its traceback
        raise MmcseError(os_error_message(wrapped, where)) from exc
