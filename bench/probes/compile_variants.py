"""Probe, 2026-11-26 (BENCHMARKS.md, "Compile: what else was tried"): the first (compiling)
step of the captured SimCSE update in four forms, with Dynamo's compile times, and the
update's parameters after 3 steps against 3 eager steps (dropout from the eager kernels:
inductor's ``fallback_random``).

* ``whole``: the default, the whole update as one function (:class:`mmcse.update.CapturedUpdate`),
  its gradient by ``torch.func.grad_and_value``;
* ``autograd``: ``whole`` with the gradient by ``torch.autograd.grad``, traced into the graph
  (``torch._dynamo.config.trace_autograd_ops``);
* ``forward``: only the student's forward/backward compiled, the update eager (the capture
  mode DDP and fp16 use), for the share of the compile that the update adds;
* ``regions``: ``whole`` with each transformer layer marked as a nested compile region
  (``torch.compiler.nested_compile_region``: trace and compile one layer, reuse it 12 times),
  the lever for a cold compile of BERT-base; reports whether Dynamo accepts it under the
  update's ``torch.func.grad_and_value``.

Run from the repo root with an empty cache:
``TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=$PWD python bench/probes/compile_variants.py
MODE BACKEND SIZE`` (e.g. ``whole inductor tiny``, ``autograd aot_eager base``)."""

import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch._inductor.config
from torch._dynamo.utils import compile_times

from mmcse import update
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


def traced_autograd_gradients(self, params: dict, inputs: tuple) -> tuple[dict, dict]:
    """:meth:`mmcse.update.CapturedUpdate._gradients` by ``torch.autograd.grad``."""
    leaves = {name: view.detach().requires_grad_() for name, view in params.items()}
    with torch.enable_grad():
        loss, terms = self._loss(leaves, self.buffers, inputs)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return dict(zip(leaves, grads, strict=True)), terms


def trained(world, capture: str, steps: int = 3) -> tuple[list[torch.Tensor], float]:
    """(the student's parameters after ``steps`` SimCSE steps, seconds of the first step)."""
    torch.manual_seed(0)
    state = bench.BenchState.of(
        world, "simcse", BATCH, SEQ_LEN, "cpu", "auto", capture=capture, dynamic_padding=False
    )
    started = time.perf_counter()
    state.step()
    first = time.perf_counter() - started
    for _ in range(steps - 1):
        state.step()
    return [p.detach().clone() for p in state.trainer.student.parameters()], first


def main(mode: str, backend: str, size: str) -> None:
    fastpath.CAPTURE_COMPILE["cpu"] = {"backend": backend}
    if mode == "forward":
        training_loop.capture_mode = lambda cfg, device, distributed: "forward"
    if mode == "autograd":
        torch._dynamo.config.trace_autograd_ops = True
        update.CapturedUpdate._gradients = traced_autograd_gradients
    if mode == "regions":
        real_build = training_loop.Trainer._build_updates

        def build_with_regions(trainer):
            print(f"layers marked: {mark_layers_as_regions(trainer.student)}")
            return real_build(trainer)

        training_loop.Trainer._build_updates = build_with_regions
    world = bench.synthetic_world(
        Path(tempfile.mkdtemp()), size, SEQ_LEN, 4 * BATCH, bench.method_needs("simcse")
    )
    with torch._inductor.config.patch(fallback_random=True):
        try:
            captured, first = trained(world, "on")
        except Exception as exc:  # the finding is whether Dynamo accepts it
            print(f"{mode}: the compile failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            return
    eager, _ = trained(world, "off")
    diff = max((a - b).abs().max().item() for a, b in zip(captured, eager, strict=True))
    print(f"{mode}: first step {first:.2f} s; largest parameter difference to eager {diff:.2e}")
    print(compile_times(repr="str", aggregate=True))


if __name__ == "__main__":
    main(*sys.argv[1:4])
