"""Where a teacher's weights come from, and their sha256 for the feature-set manifest.

Every teacher takes ``weights``:

* ``"default"`` — the published checkpoint (Hugging Face hub id, torchvision or open_clip
  default). Already-cached files are used without touching the network; with
  ``HF_HUB_OFFLINE=1`` or no network, resolution fails at once with an :class:`MmcseError` naming
  the hub id and the ``--weights PATH`` option (it never waits on a dead connection).
* ``"random"`` — random init at the real architecture (from configs embedded in code, so no
  network): for speed benchmarks and tests only, the features mean nothing.
* a local path — an HF model directory, a ``.safetensors`` file or a ``.pth``/``.pt`` state
  dict (read with ``torch.load(weights_only=True)``: no pickled code runs).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import socket
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.files import sha256_file

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt")
#: files an HF text/CLIP model needs besides its weights (config + every tokenizer format)
HF_SIDE_FILES = ["*.json", "*.txt", "*.model"]
#: weight formats in order of preference (the first one a repo has is downloaded)
HF_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
#: seconds to wait on the hub before giving up on a download that does not start
NETWORK_TIMEOUT_S = 20


def weights_kind(weights: str) -> str:
    """``"default"``, ``"random"`` or ``"path"`` (a missing path is an error, not a hub id)."""
    if weights in ("default", "random"):
        return weights
    if not Path(weights).exists():
        raise MmcseError(f"--weights {weights!r}: no such file or directory")
    return "path"


def weight_files(path: str | Path) -> list[Path]:
    """The weight files of a checkpoint: the file itself, or a directory's weight files."""
    p = Path(path)
    if p.is_file():
        return [p]
    files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise MmcseError(f"{p}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) in this directory")
    return files


def hf_weight_files(model_dir: str | Path) -> list[Path]:
    """The files ``from_pretrained`` reads weights from: safetensors when present, else .bin."""
    files = weight_files(model_dir)
    safetensors = [f for f in files if f.suffix == ".safetensors"]
    return safetensors or [f for f in files if f.suffix == ".bin"] or files


def weights_sha256(files: Iterable[str | Path]) -> str:
    """One file: its sha256 (comparable with ``sha256sum``). Several: sha256 over
    ``name:sha256`` lines in name order (a sharded checkpoint is one identity)."""
    files = sorted(Path(f) for f in files)
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{f.name}:{sha256_file(f)}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def unavailable(source: str, reason: str) -> MmcseError:
    return MmcseError(
        f"cannot get the default weights {source} ({reason}); download them where there is "
        f"network, or pass a local copy with --weights PATH (weights=PATH)"
    )


def hf_snapshot(hub_id: str, weights: tuple[str, ...] = HF_WEIGHTS) -> Path:
    """Local directory holding ``hub_id``'s config, tokenizer and weights: the first of the
    ``weights`` patterns the repo has (safetensors over pickles; one format, not all).

    The cache is tried first without the network; a download only happens when online."""
    from huggingface_hub import HfApi, snapshot_download

    try:
        cached = Path(snapshot_download(hub_id, local_files_only=True))
        if any(any(cached.glob(pattern)) for pattern in weights):
            return cached
    except Exception:  # not cached (any flavour of hub error): go online below
        pass
    if offline():
        raise unavailable(f"'{hub_id}'", "HF_HUB_OFFLINE is set and it is not in the HF cache")
    try:
        with network_timeout():
            names = [s.rfilename for s in HfApi().model_info(hub_id).siblings or []]
            chosen = next((p for p in weights if fnmatch.filter(names, p)), weights[-1])
            return Path(snapshot_download(hub_id, allow_patterns=[*HF_SIDE_FILES, chosen]))
    except Exception as exc:  # every hub failure becomes one actionable line
        raise unavailable(f"'{hub_id}'", f"{type(exc).__name__}") from exc


def torch_hub_file(url: str) -> Path:
    """A torchvision/open_clip weights URL as a cached local file (``$TORCH_HOME/hub``)."""
    import torch

    target = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if target.exists():
        return target
    if offline():
        raise unavailable(url, "HF_HUB_OFFLINE is set and it is not in the torch hub cache")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with network_timeout():
            torch.hub.download_url_to_file(url, str(target), progress=True)
    except Exception as exc:
        raise unavailable(url, f"{type(exc).__name__}") from exc
    return target


@contextmanager
def network_timeout():
    """urllib (torch.hub) has no timeout of its own: bound every socket wait while downloading."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(NETWORK_TIMEOUT_S)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def load_state_dict(path: str | Path) -> dict:
    """A ``.safetensors`` file or a ``.pth``/``.pt`` state dict, on CPU."""
    import torch

    p = Path(path)
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(p))
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise MmcseError(f"{p}: not a readable state dict ({type(exc).__name__})") from exc
    if not isinstance(state, dict):
        raise MmcseError(f"{p}: expected a state dict, got {type(state).__name__}")
    return state.get("state_dict", state)  # Lightning-style wrappers


def load_strict(module, state: dict, source: str | Path) -> None:
    """``load_state_dict(strict=True)`` with a one-line error naming the file and some keys."""
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches raise even when not strict
        raise MmcseError(f"{source}: weights do not fit the architecture (wrong sizes)") from exc
    if missing or unexpected:
        raise MmcseError(
            f"{source}: weights do not fit the architecture (missing {list(missing)[:3]}, "
            f"unexpected {list(unexpected)[:3]})"
        )
