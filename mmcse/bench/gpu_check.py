"""The GPU check: the first thing to run when a GPU is lent, one command, inside 8 minutes.

``python -m mmcse.bench.gpu_check --out gpu-check.json`` (on one H100/H200; ``--device cpu --size
tiny --captures off`` runs the same steps at a tiny size, eager, as the CPU suite does in
``tests/bench/test_gpu_check.py``: a captured step compiles for minutes on a shared CPU):

1. ``pytest -m cuda``: every CUDA-only line (its ``pragma: cuda`` comment) run by its test;
2. SimCSE (Wiki lengths) and MCSE (COCO lengths) at BERT-base, batch 128, length 32, bf16, each
   with the forward or the whole update captured, padded and packed: step ms, MFU on real tokens
   (the FLOPs of the sentences' own tokens: what packing saves is not counted as work), the first
   step's seconds (the cold compile); the most informative first, and whatever the time budget
   (``--budget-s``, 420 s by default) leaves no room for is recorded as skipped, not run late;
3. a one-screen summary: which default each figure supports (packing on CUDA, whole-update
   capture, the 9 ms SimCSE and 35 % MFU targets).

The JSON is rewritten after every figure, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

#: the step figures, most informative first: (method, the lengths its batches have)
METHODS = (("simcse", "wiki"), ("mcse", "coco"))
#: (capture, packed) per method, most informative first
VARIANTS = (("whole", False), ("whole", True), ("forward", False), ("forward", True))
#: sizes: the student, batch, length, timed steps, warm-up steps
SIZES = {
    "base": {"student": "base", "batch": 128, "seq_len": 32, "steps": 20, "warmup": 3},
    "tiny": {"student": "tiny", "batch": 8, "seq_len": 16, "steps": 2, "warmup": 1},
}
TARGET_SIMCSE_MS = 9.0


def variant_order(variant: tuple[str, bool]) -> int:
    """The rank of a (capture, packed) choice: :data:`VARIANTS`' order, then the others."""
    return VARIANTS.index(variant) if variant in VARIANTS else len(VARIANTS)


TARGET_MFU = 0.35


def run_cuda_tests(pytest_args: list[str]) -> dict:
    """``pytest -m cuda`` in a child process: its exit status and last lines."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run([*command, *pytest_args], capture_output=True, text=True)
    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
    return {
        "command": " ".join(["pytest -m cuda", *pytest_args]),
        "exit_code": done.returncode,  # 0: passed; 5: none collected (no CUDA test selected)
        "seconds": time.perf_counter() - started,
        "tail": tail,
    }


def measure_step(world, method: str, size: dict, device: str, capture: str, packed: bool, peak):
    """One method's step figures under one capture and packing choice."""
    import torch
    import torch._dynamo

    from mmcse.bench import train_step as bench
    from mmcse.bench.flops import EncoderShape, mfu, train_step_flops

    torch._dynamo.reset()
    state = bench.BenchState.of(
        world,
        method,
        size["batch"],
        size["seq_len"],
        device,
        "bf16",
        capture=bench.CAPTURE_FLAGS[capture],
        packing=packed,
        dynamic_padding=False,
    )
    compile_s = bench.timed(state.step, device)
    stats = bench.time_variants(
        {method: state}, torch.device(device), size["steps"], size["warmup"], rounds=1
    )[method]
    shape = EncoderShape.of(state.trainer.encoder.backbone.config)
    real = float(statistics.fmean(state.trainer.data.sources["caption"].lengths))
    real_flops = train_step_flops(shape, size["batch"], round(real))
    return {
        "method": method,
        "capture": capture,
        "packed": packed,
        "step": state.trainer.capture,
        "step_ms": 1000 * stats.step_s,
        "compile_s": compile_s,
        "mean_real_tokens": real,
        "mfu_real_tokens": mfu(real_flops, stats.step_s, peak),
        "peak_memory_bytes": stats.peak_memory_bytes,
    }


def summary(results: dict) -> list[str]:
    """Which default each figure supports, one line each."""
    steps = {(r["method"], r["capture"], r["packed"]): r for r in results["steps"]}
    tests = results.get("cuda_tests")
    lines = []
    if tests is not None:
        passed = tests["exit_code"] in (0, 5)
        lines.append(
            f"pytest -m cuda: exit {tests['exit_code']} "
            f"({'the GPU path holds' if passed else 'FIX FIRST: a CUDA test fails'})"
        )
    for method, _ in METHODS:
        for capture in ("whole", "forward", "off"):
            padded, packed = steps.get((method, capture, False)), steps.get((method, capture, True))
            if padded and packed:
                ratio = packed["step_ms"] / padded["step_ms"]
                device = results.get("device", "cuda").split(":")[0]
                verdict = f"supports packing auto=on for {device}" if ratio < 1 else "keeps it off"
                lines.append(f"{method} {capture}: packed ÷ padded step {ratio:.2f}: {verdict}")
        whole, forward = steps.get((method, "whole", False)), steps.get((method, "forward", False))
        if whole and forward:
            ratio = whole["step_ms"] / forward["step_ms"]
            verdict = "supports capture auto=whole" if ratio < 1 else "supports forward capture"
            lines.append(f"{method}: whole ÷ forward step {ratio:.2f}: {verdict}")
    best = [r for r in results["steps"] if r["method"] == "simcse"]
    if best:
        fastest = min(best, key=lambda r: r["step_ms"])
        ms, mfu_real = fastest["step_ms"], fastest["mfu_real_tokens"]
        mfu_text = "n/a (no peak)" if mfu_real is None else f"{100 * mfu_real:.0f} %"
        lines.append(
            f"simcse fastest ({fastest['capture']}, {'packed' if fastest['packed'] else 'padded'}): "
            f"{ms:.1f} ms (target ≤ {TARGET_SIMCSE_MS:g}), MFU on real tokens {mfu_text} "
            f"(target ≥ {100 * TARGET_MFU:.0f} %)"
        )
    compiles = [r["compile_s"] for r in results["steps"]]
    if compiles:
        lines.append(f"cold compiles: {min(compiles):.0f}-{max(compiles):.0f} s per figure")
    lines += [f"skipped (time budget): {s}" for s in results["skipped"]]
    return lines


def run(
    device: str,
    size_name: str,
    out: Path,
    budget_s: float,
    pytest_args: list[str] | None,
    captures: tuple[str, ...] = ("whole", "forward"),
    methods: tuple[str, ...] = tuple(m for m, _ in METHODS),
):
    """Every step of the check, the JSON written after each; returns the results.
    ``captures``: the capture choices measured (``off``: eager, what a CPU test can afford);
    ``methods``: those of :data:`METHODS` measured (a second run finishes what a first skipped)."""
    import torch
    import transformers

    from mmcse.bench.flops import peak_flops
    from mmcse.demo.synthetic import method_needs, synthetic_world

    started = time.perf_counter()
    size = SIZES[size_name]
    peak, peak_source = peak_flops(device)
    results: dict = {
        "device": device,
        "size": size_name,
        "settings": size,
        "precision": "bf16",
        "peak_source": peak_source,
        "steps": [],
        "skipped": [],
    }
    results["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}

    def save() -> None:
        results["seconds"] = time.perf_counter() - started
        results["summary"] = summary(results)
        out.write_text(json.dumps(results, indent=2) + "\n")

    if pytest_args is not None:
        results["cuda_tests"] = run_cuda_tests(pytest_args)
        save()
    with tempfile.TemporaryDirectory(prefix="mmcse-gpu-check-") as tmp:
        for method, lengths in (m for m in METHODS if m[0] in methods):
            rows = size["batch"] * 8
            root = Path(tmp) / method
            world = synthetic_world(
                root, size["student"], size["seq_len"], rows, set(method_needs(method)), lengths
            )
            variants = [(c, p) for c in captures for p in (False, True)]
            for capture, packed in sorted(variants, key=variant_order):
                label = f"{method} {capture} {'packed' if packed else 'padded'}"
                if time.perf_counter() - started > budget_s:
                    results["skipped"].append(label)
                    continue
                logger.info("gpu check: %s", label)
                results["steps"].append(
                    measure_step(world, method, size, device, capture, packed, peak)
                )
                save()
    save()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mmcse.bench.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="no new figure starts after this many seconds"
    )
    parser.add_argument(
        "--captures",
        default="whole,forward",
        help="capture choices measured: whole, forward, off (eager)",
    )
    parser.add_argument(
        "--methods", default=",".join(m for m, _ in METHODS), help="methods measured: simcse, mcse"
    )
    parser.add_argument("--no-tests", action="store_true", help="skip pytest -m cuda")
    parser.add_argument(
        "--pytest-args", default="tests", help="what pytest -m cuda collects (space-separated)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from mmcse.devices import check_device
    from mmcse.errors import MmcseError

    try:
        check_device(args.device)
    except MmcseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tests = None if args.no_tests else args.pytest_args.split()
    captures = tuple(args.captures.split(","))
    if not set(captures) <= {"whole", "forward", "off"}:
        print(
            f"error: --captures takes whole, forward, off, not {args.captures!r}", file=sys.stderr
        )
        return 2
    methods = tuple(args.methods.split(","))
    if not set(methods) <= {m for m, _ in METHODS}:
        print(f"error: --methods takes simcse, mcse, not {args.methods!r}", file=sys.stderr)
        return 2
    results = run(args.device, args.size, args.out, args.budget_s, tests, captures, methods)
    print("\n".join([f"GPU check ({args.device}, {args.size}): {args.out}", *results["summary"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
