"""How many decode processes a Stage-1 job runs: the one owner of ``--workers`` for every job
that decodes in DataLoader workers (``extract-images``, ``extract-image-tensors``,
``extract-audio``).

Unset: ``min(8, the CPUs)``. Negative: refused in one line (torch's DataLoader would die in a
traceback). More than this process may run on: lowered to that, with a warning (torch's
DataLoader would otherwise die part-way, or the workers would only compete).
"""

from __future__ import annotations

import logging
import os

from mmcse.errors import MmcseError

logger = logging.getLogger(__name__)

#: the default's ceiling: more decode processes than this rarely help one GPU
DEFAULT_MAX_WORKERS = 8


def machine_workers() -> int:
    """The decode processes this machine allows: the CPUs this process may run on (torch's
    DataLoader suggests no more); decoding is CPU-bound, so more only compete."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def decode_workers(workers: int | None) -> int:
    """``--workers`` as the machine allows (None: the default)."""
    allowed = machine_workers()
    if workers is None:
        return min(DEFAULT_MAX_WORKERS, allowed)
    if workers < 0:
        raise MmcseError(f"--workers {workers}: give 0 (decode in this process) or more processes")
    if workers > allowed:
        logger.warning(
            f"--workers {workers} is more than this machine allows ({allowed} CPUs for this "
            f"process); decoding with {allowed} workers"
        )
        return allowed
    return workers
