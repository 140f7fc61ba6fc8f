"""GPU diagnostic, 2026-11-26 (BENCHMARKS.md, GPU section): SimCSE whole-update vs forward-only
capture at BERT-base, batch 128 x 32, bf16, with the CUDA kernels of a step (profiler).
Run from the repo root: OUT=DIR python bench/gpu-probes/diag.py whole,forward."""

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
from pathlib import Path

import torch

from mmcse.bench import train_step as bench  # noqa: E402
from mmcse.training import fastpath  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
res = {}


def dump():
    (OUT / "diag.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res)[-3000:], flush=True)


B = 128
from torch.profiler import ProfilerActivity, profile  # noqa: E402


def kernels(state, n=3):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            state.step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    rows = sorted(
        [
            (e.key, e.device_time_total / n / 1000, e.count // n)
            for e in ka
            if e.device_time_total > 0
        ],
        key=lambda r: -r[1],
    )
    total = sum(
        r[1]
        for r in rows
        if not r[0].startswith(("Torch-Compiled", "CompiledFunction", "cudaGraph", "## "))
    )
    return {
        "top": [(k[:90], round(ms, 3), c) for k, ms, c in rows[:25]],
        "sum_ms_approx": round(total, 2),
    }


with tempfile.TemporaryDirectory() as tmp:
    world = bench.synthetic_world(Path(tmp), "base", 32, B * 6, set())
    for mode in sys.argv[1].split(","):
        try:
            t0 = time.time()
            if mode == "whole-nocg":
                fastpath.CAPTURE_COMPILE["cuda"] = {"backend": "inductor"}
                state = bench.BenchState.of(world, "simcse", B, 32, "cuda", "auto", capture="on")
            elif mode == "forward":
                import mmcse.training.loop as L

                L.capture_mode = lambda cfg, device, d: "forward"
                fastpath.CAPTURE_COMPILE["cuda"] = {
                    "backend": "inductor",
                    "mode": "reduce-overhead",
                }
                state = bench.BenchState.of(world, "simcse", B, 32, "cuda", "auto", capture="on")
            else:
                fastpath.CAPTURE_COMPILE["cuda"] = {
                    "backend": "inductor",
                    "mode": "reduce-overhead",
                }
                state = bench.BenchState.of(world, "simcse", B, 32, "cuda", "auto", capture="on")
            state.step()
            torch.cuda.synchronize()
            first = time.time() - t0
            for _ in range(3):
                state.step()
            torch.cuda.synchronize()
            t0 = time.time()
            for _ in range(20):
                state.step()
            torch.cuda.synchronize()
            ms = (time.time() - t0) / 20 * 1000
            res[mode] = {
                "first_s": round(first, 1),
                "step_ms": round(ms, 2),
                "mode": state.trainer.capture,
                **kernels(state),
            }
            del state
            torch.cuda.empty_cache()
        except Exception:
            import traceback

            res[mode] = traceback.format_exc()[-1500:]
        dump()
