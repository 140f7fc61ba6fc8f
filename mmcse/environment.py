"""Which environment made a result: the record every training run and evaluation keeps.

:func:`environment` returns a JSON-ready dict with these keys (stable: readers such as the model
card and ``mmcse compare`` rely on them; a value that cannot be known is ``null``)::

    mmcse     version, commit (the checkout's HEAD when mmcse runs from a git checkout),
              dirty (tracked files changed since that commit), path (the package's folder)
    python    version, implementation
    packages  {torch, transformers, tokenizers, numpy, scipy, scikit-learn, safetensors}: the
              installed version of each (null when not installed)
    cuda      available, version (the CUDA torch was built with), cudnn (cuDNN's version
              number), device_count
    device    name (``cpu``, ``cuda:0``, ...), model (the GPU's name, else the CPU's), count
              (devices of that type visible), world_size (processes of a distributed run)
    numerics  precision (``fp32``, ``bf16 autocast``, ...), deterministic_algorithms,
              deterministic_warn_only, cudnn_deterministic, cudnn_benchmark, tf32_matmul,
              tf32_cudnn, float32_matmul_precision, cublas_workspace_config
    system    os (``platform.platform()``), machine, cpu (model name), cpu_count

Everything is read, nothing is changed. The git state is asked of ``git`` once per process (a
missing ``git``, a package outside a checkout, a slow or failing call: ``null``, never an error).
:func:`summary` flattens the record into labelled facts, :func:`describe` makes one line of
them, and :func:`differences` says which facts differ between several records.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import mmcse
from mmcse.distributed import world_size

PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "scipy", "scikit-learn", "safetensors")
PACKAGE_ROOT = Path(mmcse.__file__).resolve().parent
_GIT_TIMEOUT_S = 10


def environment(device: Any = None, precision: str | None = None) -> dict[str, Any]:
    """The record (see the module docstring) for work on ``device`` (a name or
    ``torch.device``; None: the CPU) in ``precision`` (as the caller names it)."""
    import torch

    device = torch.device(device if device is not None else "cpu")
    return {
        "mmcse": {
            "version": mmcse.__version__,
            **git_state(PACKAGE_ROOT.parent),
            "path": str(PACKAGE_ROOT),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "packages": {**dict(_package_versions()), "torch": torch.__version__},  # + its build
        "cuda": _cuda(),
        "device": {**_device(device), "world_size": world_size()},
        "numerics": numerics(precision),
        "system": dict(_system()),
    }


def numerics(precision: str | None = None) -> dict[str, Any]:
    """Precision and the determinism switches as they are set now."""
    import torch

    matmul = torch.backends.cuda.matmul
    return {
        "precision": precision,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "tf32_matmul": bool(matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


@functools.cache
def git_state(checkout: Path) -> dict[str, Any]:
    """``{"commit", "dirty"}`` of the git checkout rooted at ``checkout``; both None when there
    is no git, no checkout there (an installed package), or git fails."""
    unknown = {"commit": None, "dirty": None}
    try:
        top, commit = _git(checkout, "rev-parse", "--show-toplevel", "HEAD").splitlines()
        if Path(top).resolve() != Path(checkout).resolve():
            return unknown  # a repository around an installed package is not its source
        changed = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    except (OSError, ValueError, subprocess.SubprocessError):
        return unknown
    return {"commit": commit, "dirty": bool(changed.strip())}


def _git(checkout: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--no-optional-locks", "-C", str(checkout), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=_GIT_TIMEOUT_S,
    ).stdout


@functools.cache
def _package_versions() -> tuple[tuple[str, str | None], ...]:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return tuple((name, version(name)) for name in PACKAGES)


def _cuda() -> dict[str, Any]:
    import torch

    available = torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "available": available,
        "version": torch.version.cuda,
        "cudnn": cudnn,
        "device_count": torch.cuda.device_count() if available else 0,
    }


def _device(device) -> dict[str, Any]:
    import torch

    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        return {
            "name": f"cuda:{index}",
            "model": torch.cuda.get_device_name(index),
            "count": torch.cuda.device_count(),
        }
    return {"name": str(device), "model": _cpu_model(), "count": 1}


@functools.cache
def _system() -> tuple[tuple[str, Any], ...]:
    return (
        ("os", platform.platform()),
        ("machine", platform.machine()),
        ("cpu", _cpu_model()),
        ("cpu_count", os.cpu_count()),
    )


@functools.cache
def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


# ---- reading records ----------------------------------------------------------------------------


def summary(record: Mapping[str, Any] | None) -> dict[str, str]:
    """The facts of a record that can change a number, as ``{label: text}`` (labels in a fixed
    order; unknown facts are ``?``). Records written before a key existed read as ``?`` too."""
    if not record:
        return {}

    def get(section: str, key: str) -> Any:
        value = (record.get(section) or {}).get(key)
        return "?" if value is None else value

    code = record.get("mmcse") or {}
    commit = code.get("commit")
    origin = "no git checkout" if commit is None else commit[:12]
    if code.get("dirty"):
        origin += ", uncommitted changes"
    device = record.get("device") or {}
    name, model, count = device.get("name") or "?", device.get("model"), device.get("count")
    if not name.startswith("cuda"):
        model = f"{name} ({model or '?'})"
    facts = {
        "mmcse": f"{get('mmcse', 'version')} ({origin})",
        "python": get("python", "version"),
        **{name: get("packages", name) for name in PACKAGES},
        "CUDA": get("cuda", "version"),
        "cuDNN": get("cuda", "cudnn"),
        "device": f"{model or name}"
        + (f" x{count}" if isinstance(count, int) and count > 1 else ""),
        "world size": get("device", "world_size"),
        "precision": get("numerics", "precision"),
        "deterministic algorithms": get("numerics", "deterministic_algorithms"),
        "cudnn.benchmark": get("numerics", "cudnn_benchmark"),
        "TF32 matmul": get("numerics", "tf32_matmul"),
        "TF32 cuDNN": get("numerics", "tf32_cudnn"),
        "matmul precision": get("numerics", "float32_matmul_precision"),
        "OS": get("system", "os"),
        "CPU": get("system", "cpu"),
    }
    return {label: str(value) for label, value in facts.items()}


def describe(record: Mapping[str, Any] | None) -> str:
    """One line: where the code came from, the main versions, the device and the numerics."""
    facts = summary(record)
    if not facts:
        return "environment not recorded"
    shown = (
        "mmcse",
        "python",
        "torch",
        "transformers",
        "CUDA",
        "device",
        "precision",
        "deterministic algorithms",
        "TF32 matmul",
        "OS",
    )
    return "Environment: " + "; ".join(f"{label} {facts[label]}" for label in shown) + "."


def differences(records: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """``"torch 2.14.1 (a, b) vs 2.13.0 (c)"`` for each fact on which the labelled records
    differ; nothing when they agree. Records that are None (not recorded) take no part."""
    facts = {label: summary(record) for label, record in records.items() if record}
    if len(facts) < 2:
        return []
    out = []
    for fact in next(iter(facts.values())):
        holders: dict[str, list[str]] = {}
        for label, values in facts.items():
            holders.setdefault(values.get(fact, "?"), []).append(label)
        if len(holders) > 1:
            parts = [f"{value} ({_labels(labels)})" for value, labels in holders.items()]
            out.append(f"{fact} " + " vs ".join(parts))
    return out


def _labels(labels: list[str], shown: int = 3) -> str:
    if len(labels) <= shown:
        return ", ".join(labels)
    return ", ".join(labels[:shown]) + f" and {len(labels) - shown} more"


def record_notes(records: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """For under a results table: the environment of the first labelled record (one line), and
    where the others differ from it; nothing when none was recorded."""
    known = {label: record for label, record in records.items() if record}
    if not known:
        return []
    found = differences(known)
    return [describe(next(iter(known.values())))] + (
        ["Environments differ: " + "; ".join(found) + "."] if found else []
    )
