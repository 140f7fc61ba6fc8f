"""Process-group helpers: in-batch negatives gathered across ranks, as SimCSE does.

With ``gather_across_ranks`` every rank sees the concatenation of all ranks' rows, its own rows
keeping their gradient, so N processes behave like one N-times-larger batch.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor

from mmcse.errors import MmcseError


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def gather_across_ranks(x: Tensor) -> Tensor:
    """All-gather rows of ``x`` from every rank; the local slice keeps its autograd graph."""
    if world_size() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank()] = x  # all_gather cuts the graph; put the local, differentiable copy back
    return torch.cat(parts, dim=0)


def env_int(name: str, default: int | None = None, minimum: int = 0) -> int | None:
    """An integer torchrun variable (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), checked."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise MmcseError(
            f"environment variable {name}={text!r} must be an integer ≥ {minimum} "
            "(set by torchrun; unset it for a single-process run)"
        )
    return value


def env_rank() -> int:
    """This process's rank as the environment says, before any process group exists."""
    return rank() if is_distributed() else env_int("RANK", 0) or 0


def env_world_size() -> int:
    """The processes this run trains on: the process group's size once it exists, else what
    torchrun's ``WORLD_SIZE`` says it will be (preflight runs before the group is joined)."""
    return world_size() if is_distributed() else env_int("WORLD_SIZE", 1, minimum=1) or 1


def check_env() -> None:
    """Refuse malformed torchrun variables with one line naming the variable."""
    world = env_int("WORLD_SIZE", 1, minimum=1)
    the_rank = env_int("RANK", 0)
    env_int("LOCAL_RANK", 0)
    if the_rank is not None and world is not None and the_rank >= world:
        raise MmcseError(f"environment variable RANK={the_rank} is not below WORLD_SIZE={world}")


def init_from_env() -> bool:
    """Join the process group torchrun describes in the environment; False when not launched so."""
    check_env()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ or is_distributed():
        return is_distributed()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(env_int("LOCAL_RANK", 0))
    return True


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any (one small all-reduce; False alone)."""
    if not is_distributed():
        return flag
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
