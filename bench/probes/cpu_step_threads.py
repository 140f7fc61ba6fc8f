"""CPU probe, 2026-11-26 (closing note of issue 21's second session): the eager SimCSE step's time
distribution with N torch threads, with batches prefetched on the worker thread (as the trainer
runs) or gathered synchronously (``sync``), to tell whether a stall comes from the prefetch
thread or from the machine's load.

Run from the repo root: ``PYTHONPATH=$PWD python bench/probes/cpu_step_threads.py THREADS
[sync]`` (tiny student, batch 8 × 32, 40 timed steps after 3)."""

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import mmcse.training.loop as loop
from mmcse.bench import train_step as bench

BATCH, SEQ_LEN, STEPS = 8, 32, 40


def gathered_synchronously(items, gather, device):
    """The trainer's ``prefetched`` without its worker thread."""
    for item in items:
        started = time.perf_counter()
        batch = gather(item)
        yield item, batch, time.perf_counter() - started


def main(threads: int, sync: bool) -> None:
    torch.set_num_threads(threads)
    if sync:
        loop.prefetched = gathered_synchronously
    world = bench.synthetic_world(
        Path(tempfile.mkdtemp()), "tiny", SEQ_LEN, BATCH * 60, bench.method_needs("simcse")
    )
    state = bench.BenchState.of(world, "simcse", BATCH, SEQ_LEN, "cpu", "auto", capture="off")
    for _ in range(3):
        state.step()
    seconds = []
    for _ in range(STEPS):
        started = time.perf_counter()
        state.step()
        seconds.append(time.perf_counter() - started)
    seconds.sort()
    print(
        f"threads={threads} {'sync' if sync else 'prefetched'}: median "
        f"{1000 * statistics.median(seconds):.1f} ms, p90 {1000 * seconds[int(0.9 * STEPS) - 1]:.1f}"
        f", max {1000 * seconds[-1]:.1f}, load {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), len(sys.argv) > 2 and sys.argv[2] == "sync")
