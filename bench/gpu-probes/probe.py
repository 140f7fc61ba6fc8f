"""GPU probe, 2026-11-26 (BENCHMARKS.md, GPU section): whole-update capture vs eager at BERT-base,
batch 128 x 32, bf16: step ms, first-step (compile) seconds, syncs, host ops per step.
Run from the repo root: OUT=DIR python bench/gpu-probes/probe.py simcse,mcse 128."""

import json
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
import torch

torch._logging.set_logs(perf_hints=True, recompiles=True)
logging.basicConfig(level=logging.WARNING)
from pathlib import Path  # noqa: E402

from mmcse.bench import train_step as bench  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}


def dump():
    (OUT / "probe.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res), flush=True)


names = sys.argv[1].split(",")
B = int(sys.argv[2]) if len(sys.argv) > 2 else 128
with tempfile.TemporaryDirectory() as tmp:
    needs = set().union(*(bench.method_needs(n) for n in names))
    t0 = time.time()
    world = bench.synthetic_world(Path(tmp), "base", 32, B * 6, needs)
    res["world_s"] = time.time() - t0
    for name in names:
        for capture in ("on", "off"):
            key = f"{name}/{capture}"
            try:
                t0 = time.time()
                state = bench.BenchState.of(world, name, B, 32, "cuda", "auto", capture=capture)
                setup = time.time() - t0
                t0 = time.time()
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
                torch.cuda.set_sync_debug_mode("error")
                try:
                    state.step()
                    torch.cuda.synchronize()
                    sync = "none"
                except RuntimeError as e:
                    sync = str(e)[:400]
                torch.cuda.set_sync_debug_mode(0)
                from torch.profiler import ProfilerActivity, profile  # noqa: E402

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    state.step()
                ops = [
                    e.name
                    for e in prof.events()
                    if e.name.startswith("aten::")
                    and not any(c.name.startswith("aten::") for c in e.cpu_children)
                ]
                from collections import Counter

                res[key] = dict(
                    setup_s=round(setup, 2),
                    first_step_s=round(first, 2),
                    step_ms=round(ms, 2),
                    sync=sync,
                    leaf_ops=len(ops),
                    top_ops=Counter(ops).most_common(8),
                    mode=state.trainer.capture,
                )
                del state
                torch.cuda.empty_cache()
            except Exception:
                import traceback

                res[key] = {"error": traceback.format_exc()[-1500:]}
            dump()
