"""Probe, 2026-11-26 (BENCHMARKS.md, "Compile"): the first (compiling) step of a method's captured
update, with Dynamo's per-phase compile times and inductor's cache counters.

Run from the repo root: ``PYTHONPATH=$PWD python bench/probes/compile_first_step.py BACKEND
METHOD SIZE`` (e.g. ``inductor simcse tiny``; ``aot_eager simcse base`` times the
device-independent front end: Dynamo's tracing and AOTAutograd). Run it twice with one
``TORCHINDUCTOR_CACHE_DIR`` to see a second process compile from the caches."""

import json
import sys
import tempfile
import time
from pathlib import Path

from torch._dynamo.utils import compile_times, counters

from mmcse.bench import train_step as bench
from mmcse.training import fastpath

BATCH, SEQ_LEN = 16, 32


def main(backend: str, method: str, size: str, device: str = "cpu") -> None:
    fastpath.CAPTURE_COMPILE[device] = {"backend": backend}
    world = bench.synthetic_world(
        Path(tempfile.mkdtemp()), size, SEQ_LEN, 4 * BATCH, bench.method_needs(method)
    )
    state = bench.BenchState.of(
        world, method, BATCH, SEQ_LEN, device, "auto", capture="on", dynamic_padding=False
    )
    started = time.perf_counter()
    state.step()
    first = time.perf_counter() - started
    started = time.perf_counter()
    state.step()
    second = time.perf_counter() - started
    print(f"first step {first:.2f} s, second step {second:.2f} s")
    print(compile_times(repr="str", aggregate=True))
    caches = {k: dict(counters[k]) for k in ("inductor", "aot_autograd") if k in counters}
    print(json.dumps(caches))


if __name__ == "__main__":
    main(*sys.argv[1:4])
