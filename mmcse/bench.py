"""``mmcse bench train``: step time of every registered method next to SimCSE, in one run.

Every method trains through the real :class:`mmcse.train.Run` (cache gather, both dropout views,
every active term, AdamW) on synthetic corpora and synthetic feature sets written through the
real cache writer, on caption batches (where every term is active: the worst case for the
multimodal methods). Rounds alternate between methods so drift (thermal, other load) hits all
alike; the reported step time is the median. Random init: speed does not depend on weights.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mmcse.cache import write_corpus, write_feature_set
from mmcse.config import TrainConfig
from mmcse.methods import build_method
from mmcse.registry import METHODS
from mmcse.tiny import SIZES, SPECIAL_TOKENS, build_tiny_bert

#: feature dims of the roles methods read, at the sizes the papers' teachers have
ROLE_DIMS = {"image": 2048, "clip_image": 768, "clip_text": 768}
DEFAULT_ROLE_DIM = 768
#: dense bf16 peak FLOP/s per GPU model, for MFU
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


@dataclasses.dataclass
class BenchWorld:
    root: Path
    model: Path
    captions: Path
    features: dict[str, str]


def synthetic_world(root: Path, size: str, seq_len: int, rows: int, roles: set[str]) -> BenchWorld:
    """A student, a caption corpus of exactly ``seq_len`` tokens, and features for ``roles``."""
    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(30522 - len(SPECIAL_TOKENS))]
    model = build_tiny_bert(root / "model", size=size, vocab=vocab, max_position_embeddings=512)
    rng = np.random.default_rng(0)
    words = rng.integers(0, len(vocab) - len(SPECIAL_TOKENS), size=(rows, seq_len - 2))
    texts = [" ".join(f"w{i}" for i in row) for row in words]
    ids = [f"c{i}" for i in range(rows)]
    image_ids = [f"img{i}" for i in range(rows)]
    write_corpus(root / "captions", ids, texts, image_ids=image_ids, dataset="bench", split="train")
    features = {}
    for role in sorted(roles):
        dim = ROLE_DIMS.get(role, DEFAULT_ROLE_DIM)
        keyed_by_image = role in ROLE_DIMS and role != "clip_text"
        values = rng.standard_normal((rows, dim), dtype=np.float32).astype(np.float16)
        write_feature_set(
            root / role,
            image_ids if keyed_by_image else ids,
            values,
            kind="image" if keyed_by_image else "text",
            dim=dim,
            dtype="float16",
            dataset="bench",
            split="train",
            producer={"teacher": "random-bench"},
        )
        features[role] = str(root / role)
    return BenchWorld(root, model, root / "captions", features)


def method_roles(names: list[str]) -> set[str]:
    roles: set[str] = set()
    for name in names:
        m = build_method(name)
        roles |= set(m.caption_roles) | set(m.text_roles)
    return roles


def make_run(world: BenchWorld, method: str, batch: int, device: str, precision: str):
    from mmcse.train import Run

    m = build_method(method)
    roles = set(m.caption_roles) | set(m.text_roles)
    cfg = TrainConfig(
        model=str(world.model),
        method=method,
        caption_corpus=str(world.captions),
        features={r: world.features[r] for r in roles},
        mixing="caption-only",
        batch_size=batch,
        eval_data="",
        final_eval=False,
        device=device,
        precision=precision,
        output_dir=str(world.root / "runs" / method),
    )
    run = Run(cfg)
    optimizer = torch.optim.AdamW(run.student.parameters(), lr=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batches = run.data.schedule(0, batch)
    return run, optimizer, scheduler, batches


def time_steps(state, start: int, n: int, device: torch.device) -> list[float]:
    run, optimizer, scheduler, batches = state
    times = []
    for i in range(start, start + n):
        kind, rows = batches[i % len(batches)]
        t0 = time.perf_counter()
        run._step(kind, rows, optimizer, scheduler)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def bench_train(
    size: str = "tiny",
    device: str = "cpu",
    steps: int = 20,
    warmup: int = 3,
    rounds: int = 4,
    batch: int = 64,
    seq_len: int = 32,
    methods: list[str] | None = None,
    precision: str = "auto",
) -> dict:
    """Median step seconds per method, ratios to SimCSE, and SimCSE steps/s (+ MFU on CUDA)."""
    names = methods or METHODS.names()
    names = ["simcse", *[n for n in names if n != "simcse"]]
    dev = torch.device(device)
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        world = synthetic_world(Path(tmp), size, seq_len, batch * 8, method_roles(names))
        states = {n: make_run(world, n, batch, device, precision) for n in names}
        for n in names:
            time_steps(states[n], 0, warmup, dev)
        times: dict[str, list[float]] = {n: [] for n in names}
        per_round = max(1, steps // rounds)
        for r in range(rounds):
            for n in names:
                times[n] += time_steps(states[n], warmup + r * per_round, per_round, dev)
    step_s = {n: statistics.median(t) for n, t in times.items()}
    result = {
        "size": size,
        "device": device,
        "batch": batch,
        "seq_len": seq_len,
        "step_seconds": step_s,
        "ratios": {n: step_s[n] / step_s["simcse"] for n in names},
        "simcse_steps_per_s": 1.0 / step_s["simcse"],
    }
    mfu = simcse_mfu(size, batch, seq_len, step_s["simcse"], dev)
    if mfu is not None:
        result["simcse_mfu"] = mfu
    return result


def simcse_mfu(size: str, batch: int, seq_len: int, step_s: float, device: torch.device):
    """Model FLOPs utilisation of a SimCSE step (6·params·tokens + attention), CUDA only."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    if peak is None:
        return None
    c = SIZES[size]
    h, layers, ff = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"]
    params = layers * (4 * h * h + 2 * h * ff)
    tokens = 2 * batch * seq_len  # two dropout views
    flops = 6 * params * tokens + 12 * layers * h * seq_len * tokens
    return flops / step_s / peak
