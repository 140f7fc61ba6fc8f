"""CPU probe, 2026-11-26 (BENCHMARKS.md, "Dev evaluation"): one STS-B dev evaluation as the
trainer runs it (:class:`mmcse.training.dev_eval.DevEvaluator`, random student of a bench size):
its forwards, padded tokens, top-level ATen operators dispatched, and median wall seconds.

Run from the repo root (any commit, to compare two):
``PYTHONPATH=$PWD python bench/probes/dev_eval_batches.py small 3``  (size, timed calls)."""

import statistics
import sys
import tempfile
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from mmcse.bench.suite import _random_student
from mmcse.evaluation.sts import default_data_dir
from mmcse.hub import load_tokenizer
from mmcse.model import SentenceEncoder
from mmcse.training import dev_eval


def main(size: str, calls: int) -> None:
    model, _ = _random_student(Path(tempfile.mkdtemp()), size)
    encoder = SentenceEncoder.from_pretrained(str(model))
    evaluator = dev_eval.DevEvaluator(encoder, load_tokenizer(str(model)), default_data_dir())
    evaluator(encoder)  # warm
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        evaluator(encoder)
        seconds.append(time.perf_counter() - started)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        evaluator(encoder)
    ops = sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)
    padded = sum(ids.numel() for ids, _ in evaluator.batches)
    print(
        f"{size}: forwards={len(evaluator.batches)} padded={padded} top-level aten ops={ops} "
        f"median s={statistics.median(seconds):.3f}"
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
