"""File helpers both stages share: atomic writes, strict JSON, sha256 (one owner each).

Every write here is all or nothing. A file is written to a hidden temp sibling
(:func:`temp_path`), fsynced, renamed over its target and the folder fsynced (:func:`publish`):
a kill or a power loss leaves the old content or the new, never part of either, and never a
renamed but empty file. A directory is built in a hidden temp folder and renamed into place
(:func:`atomic_dir`). Readers never look at hidden names.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError

#: in temp names, so a later run on the same host can tell a dead writer's litter
HOST = socket.gethostname().replace("-", "_")
_HASH_CHUNK = 8 << 20


# ---- files ------------------------------------------------------------------------------------


def temp_path(final: Path) -> Path:
    """A hidden sibling of ``final`` unique to this process (ranks never collide); the host and
    pid in the name let a later run on the same host tell a dead writer's litter."""
    return final.with_name(f".{final.name}.tmp-{HOST}-{os.getpid()}-{secrets.token_hex(4)}")


def publish(temp: Path, final: Path) -> None:
    """Make a fully written ``temp`` visible as ``final`` in one atomic step: fsync the file,
    rename it, fsync the folder (so the rename itself survives a power loss)."""
    with open(temp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temp, final)
    fsync_dir(final.parent)


def fsync_dir(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_text_atomically(path: str | Path, text: str) -> Path:
    """``text`` (UTF-8) at ``path``, all or nothing (:func:`publish`); parent folders are
    created. A failure removes the temp file and leaves ``path`` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = temp_path(path)
    try:
        temp.write_text(text, encoding="utf-8")
        publish(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return path


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---- JSON -------------------------------------------------------------------------------------


def read_json(path: str | Path) -> dict[str, Any] | None:
    """A JSON object file, or None when absent; invalid JSON is one error line naming the file."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MmcseError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise MmcseError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if not isinstance(data, dict):
        raise MmcseError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def write_json(path: str | Path, payload: Any, *, default=None) -> Path:
    """``payload`` as indented, strict JSON (NaN and infinities, which JSON lacks, become null),
    written atomically; parent folders are created. ``default``: as :func:`json.dumps`'s."""
    text = json.dumps(finite_or_none(payload), indent=2, allow_nan=False, default=default)
    return write_text_atomically(path, text + "\n")


def finite_or_none(value: Any) -> Any:
    """A correlation that is undefined (constant scores) is NaN, which JSON has no word for."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(item) for item in value]
    return value


def finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ---- directories ------------------------------------------------------------------------------


@contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a fresh hidden temp dir beside ``target``; when the block succeeds it replaces
    ``target`` (a failure removes it and leaves ``target`` as it was)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        yield tmp
        default_permissions(tmp)  # mkdtemp's 0700 and safetensors' 0600 would make it private
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = _old_dir(target)
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def default_permissions(root: str | Path) -> None:
    """Give ``root`` and everything in it the permissions a plain ``open``/``mkdir`` would
    (0666/0777 less the umask): safetensors writes its files 0600, readable by their owner only."""
    umask = os.umask(0)
    os.umask(umask)
    root = Path(root)
    root.chmod(0o777 & ~umask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o777 & ~umask)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~umask)


def recover_dir(target: str | Path) -> None:
    """Undo what a kill during :func:`atomic_dir` left: the previous save back, temps removed."""
    target = Path(target)
    old = _old_dir(target)
    if old.is_dir() and not target.exists():
        os.rename(old, target)
    for litter in atomic_dir_litter(target):
        shutil.rmtree(litter, ignore_errors=True)


def atomic_dir_litter(target: Path) -> list[Path]:
    """The previous save moved aside and the temp dirs of unfinished saves of ``target``."""
    if not target.parent.is_dir():
        return []
    return [_old_dir(target), *target.parent.glob(f".tmp-{target.name}-*")]


def _old_dir(target: Path) -> Path:
    return target.parent / f".old-{target.name}"
