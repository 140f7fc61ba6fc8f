"""``mmcse demo``: the whole job, offline, on a drawn grounded world, in a few CPU minutes.

Generates scenes + captions + a text corpus + a synthetic STS set (:mod:`mmcse.demo_data`), runs
the real Stage-1 extractor with a tiny randomly initialised image teacher, builds a small student
from a config, trains SimCSE and MCSE through the real trainer, evaluates both with the real
SentEval-protocol evaluator and prints them side by side. Only the data and the tiny configs are
demo-specific.
"""

from __future__ import annotations

from pathlib import Path

import torch
import typer

from mmcse.config import TrainConfig
from mmcse.demo_data import generate
from mmcse.tiny import build_tiny_bert
from mmcse.train import train

TEACHER = "resnet50"


def extract(paths: dict[str, Path], cache: Path, device: str) -> dict[str, str]:
    """Stage 1 on the drawn images: caption corpus + image features (the real extractor)."""
    from pipeline.datasets import DataSource, load_dataset
    from pipeline.extract import RunOptions, extract_images
    from pipeline.teachers import build_teacher

    records = load_dataset(
        "local", DataSource(paths["images"], paths["captions"], None, None), "train"
    )
    teacher = build_teacher(TEACHER, weights="random", device=device, size="tiny")
    options = RunOptions(shard_size=256, batch_size=64, workers=0)
    extract_images(records, teacher, TEACHER, cache, caption_policy="all", seed=0, options=options)
    return {"captions": str(cache / "captions"), "image": str(cache / f"image-{TEACHER}")}


def demo_config(method: str, student: Path, paths, cached, out: Path, steps: int, device: str):
    return TrainConfig(
        model=str(student),
        method=method,
        method_args={"image_text_weight": 0.1} if method == "mcse" else {},
        text_corpus=str(paths["text"]),
        caption_corpus=cached["captions"],
        features={"image": cached["image"]} if method == "mcse" else {},
        mixing="proportional-random",
        batch_size=32,
        learning_rate=3e-4,  # a small model from scratch needs more than BERT fine-tuning's 3e-5
        epochs=100,  # max_steps decides
        max_steps=steps,
        eval_steps=max(1, steps // 6),
        eval_data=str(paths["senteval"]),
        output_dir=str(out / method),
        overwrite=True,  # a rerun of the demo regenerates its whole folder
        device=device,
        seed=0,
    )


def run_demo(out: Path, steps: int = 300, device: str = "auto") -> dict[str, dict]:
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    typer.echo(f"[1/4] generating the drawn world under {out / 'data'}")
    paths = generate(out / "data")
    typer.echo("[2/4] Stage 1: extracting image features with a tiny random ResNet teacher")
    cached = extract(paths, out / "cache", device)
    texts = paths["text"].read_text().splitlines()
    student = build_tiny_bert(out / "student-init", texts=texts, size="small")
    results = {}
    for i, method in enumerate(("simcse", "mcse"), start=3):
        typer.echo(f"[{i}/4] Stage 2: training {method} for {steps} steps")
        cfg = demo_config(method, student, paths, cached, out, steps, device)
        results[method] = train(cfg).test
    return results
