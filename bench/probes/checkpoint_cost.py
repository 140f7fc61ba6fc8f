"""CPU probe, 2026-11-26 (BENCHMARKS.md, "Checkpoints"): what saving last/ and best/ at an
evaluation step costs the training thread, and when the files are on disk.

A random BERT-base SimCSE trainer (eager, batch 16 × 32) takes two steps, then saves last/
(weights, heads and AdamW's state: ~1.3 GB) and best/ (~0.44 GB) back to back, as a run does at
an evaluation step whose score improved (``save_every`` defaults to ``eval_steps``). Printed:
the seconds the training thread spent in the two calls, and the seconds until both were on disk.
Works on commits before the background writer too (there the two are the same).

Run from the repo root: ``PYTHONPATH=$PWD python bench/probes/checkpoint_cost.py [ROUNDS]``."""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from mmcse.bench import train_step as bench


def main(rounds: int) -> None:
    world = bench.synthetic_world(
        Path(tempfile.mkdtemp()), "base", 32, 64, bench.method_needs("simcse")
    )
    state = bench.BenchState.of(world, "simcse", 16, 32, "cpu", "auto", capture="off")
    state.step()
    state.step()
    record = state.trainer.record
    writer = getattr(record, "writer", None)
    blocked, on_disk = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        record.save_last(0, 2)
        record.save_best(1.0)
        blocked.append(time.perf_counter() - started)
        if writer is not None:
            writer.wait()
        on_disk.append(time.perf_counter() - started)
    print(
        f"training thread in save_last + save_best: median {statistics.median(blocked):.2f} s "
        f"({', '.join(f'{s:.2f}' for s in blocked)}); both on disk after: median "
        f"{statistics.median(on_disk):.2f} s ({', '.join(f'{s:.2f}' for s in on_disk)})"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
