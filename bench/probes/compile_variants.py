"""Probe, 2026-11-26 (BENCHMARKS.md, "Compile: what else was tried"): the first (compiling)
step of the captured SimCSE update in three forms, with Dynamo's compile times.

* ``whole``: the default, the whole update as one function (:class:`mmcse.update.CapturedUpdate`);
* ``forward``: only the student's forward/backward compiled, the update eager (the capture
  mode DDP and fp16 use), for the share of the compile that the update adds;
* ``regions``: ``whole`` with each transformer layer marked as a nested compile region
  (``torch.compiler.nested_compile_region``: trace and compile one layer, reuse it 12 times),
  the lever for a cold compile of BERT-base; reports whether Dynamo accepts it under the
  update's ``torch.func.grad_and_value``.

Run from the repo root with an empty cache:
``TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD python bench/probes/compile_variants.py
MODE BACKEND SIZE`` (e.g. ``whole inductor tiny``, ``regions aot_eager base``)."""

import sys
import tempfile
import time
import types
from pathlib import Path

import torch
from torch._dynamo.utils import compile_times

from mmcse.bench import train_step as bench
from mmcse.training import fastpath
from mmcse.training import loop as training_loop

BATCH, SEQ_LEN = 16, 32


def mark_layers_as_regions(model: torch.nn.Module) -> int:
    """Every layer of every ``layer`` ModuleList (HF BERT/RoBERTa encoders) calls one shared
    nested-region function; returns how many layers were marked."""
    regions, marked = {}, 0
    for module in model.modules():
        layers = getattr(module, "layer", None)
        if isinstance(layers, torch.nn.ModuleList):
            for layer in layers:
                cls = type(layer)
                region = regions.setdefault(cls, torch.compiler.nested_compile_region(cls.forward))
                layer.forward = types.MethodType(region, layer)
                marked += 1
    return marked


def main(mode: str, backend: str, size: str) -> None:
    fastpath.CAPTURE_COMPILE["cpu"] = {"backend": backend}
    if mode == "forward":
        training_loop.capture_mode = lambda cfg, device, distributed: "forward"
    world = bench.synthetic_world(
        Path(tempfile.mkdtemp()), size, SEQ_LEN, 4 * BATCH, bench.method_needs("simcse")
    )
    state = bench.BenchState.of(
        world, "simcse", BATCH, SEQ_LEN, "cpu", "auto", capture="on", dynamic_padding=False
    )
    if mode == "regions":
        print(f"layers marked: {mark_layers_as_regions(state.trainer.student)}")
    started = time.perf_counter()
    try:
        state.step()
    except Exception as exc:  # the finding is whether Dynamo accepts it
        print(f"{mode}: the compile failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        return
    print(f"{mode}: first step {time.perf_counter() - started:.2f} s")
    print(compile_times(repr="str", aggregate=True))


if __name__ == "__main__":
    main(*sys.argv[1:4])
