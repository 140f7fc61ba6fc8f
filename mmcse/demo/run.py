"""``mmcse demo``: the whole job, offline, on a drawn grounded world, in a few CPU minutes.

Generates scenes + captions + a text corpus + scored scene pairs (:mod:`mmcse.demo.world`), runs
the real Stage-1 extractor with a tiny randomly initialised image teacher, builds a small student
from a config, trains SimCSE and MCSE through the real trainer (checkpoints selected on held-out
scene pairs), scores both with the real STS scorer on the demo's own named tasks, and ends by
writing the comparison table (``comparison.md``/``.json``) and the curves (``curves.png``).

Why it shows learning: captions and corpus sentences say the same things with sampled synonyms;
the student starts from random weights with mean pooling, so its first embeddings are a bag of
(random) word vectors. Text-only SimCSE has nothing that ties "crimson disc" to "red circle"
(its dev curve stays nearly flat); MCSE's image–caption term does, because one drawing carries
captions in different words, so its dev score climbs through the run. Only the data and the tiny
configs are demo-specific.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from mmcse.demo.world import DEV_NAME, generate
from mmcse.errors import MmcseError
from mmcse.rundir import RunDir
from mmcse.tiny import build_tiny_bert
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

TEACHER = "resnet50"
METHODS = ("simcse", "mcse")
DEV_LABEL = DEV_NAME

logger = logging.getLogger(__name__)


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
        # the grounding term at full weight: with a random student it is the only signal that
        # ties synonyms together (the papers' 0.01-0.1 suit pretrained BERT)
        method_args={"image_text_weight": 1.0} if method == "mcse" else {},
        text_corpus=str(paths["text"]),
        caption_corpus=cached["captions"],
        features={"image": cached["image"]} if method == "mcse" else {},
        mixing="proportional-random",
        batch_size=32,
        learning_rate=3e-4,  # a small model from scratch needs more than BERT fine-tuning's 3e-5
        epochs=100,  # max_steps decides
        max_steps=steps,
        eval_steps=max(1, steps // 12),
        eval_data=str(paths["senteval"]),
        final_eval=False,  # the demo scores its own named tasks (score_demo_tasks)
        pooler="avg",  # a random student's [CLS] carries little; its mean is a bag of words
        output_dir=str(out / method),
        overwrite=True,  # a rerun of the demo regenerates its whole folder
        device=device,
        seed=0,
    )


def load_demo_tasks(folder: Path):
    """``tasks/<name>.tsv`` (sentence, sentence, gold) as the STS scorer's tasks."""
    from mmcse.evaluation.sts import StsTask, Subset

    tasks = []
    for path in sorted(folder.glob("*.tsv")):
        rows = [line.split("\t") for line in path.read_text().splitlines() if line]
        pairs = [(a, b) for a, b, _ in rows]
        gold = np.array([float(g) for *_, g in rows])
        tasks.append(StsTask(path.stem, [Subset(path.stem, pairs, gold)]))
    return tasks


def score_demo_tasks(run_dir: Path, tasks, device: str) -> dict[str, float]:
    """Spearman x 100 of the run's best checkpoint on every demo task, plus their average."""
    from mmcse.evaluation.encode import encode_sentences
    from mmcse.evaluation.sts import embed_unique, load_encoder, score_task

    encoder, tokenizer, _, _ = load_encoder(run_dir, None, device)
    sentences = [s for task in tasks for s in task.sentences()]
    vectors, row = embed_unique(sentences, lambda s: encode_sentences(encoder, tokenizer, s))
    scores = {task.name: score_task(task, vectors, row)["all"] for task in tasks}
    return {**scores, "avg": float(np.mean(list(scores.values())))}


def dev_curve(run_dir: Path) -> list[tuple[int, float]]:
    rows = RunDir(run_dir).read_metrics()
    return [(r["step"], r["stsb_dev"]) for r in rows if r.get("stsb_dev") is not None]


def reading_note(steps: int | None) -> str:
    """What the demo's numbers can and cannot mean, printed with its table."""
    trained = f"{steps} steps" if steps else "a few hundred steps"
    return (
        f"How to read this: a tiny student built from a config (random start), trained {trained} "
        "with 1 seed per method, on a drawn world, with image features from a teacher "
        "with random weights. The gap shows that the pipeline works and that MCSE's "
        "image-caption term ties captions of one drawing together (a random teacher still gives "
        "one drawing one vector); it is not evidence that MCSE beats SimCSE on real data, and "
        "it says nothing about any published number: "
        "1 seed: not compared (no spread, no test), random teacher, toy tasks."
    )


def comparison_markdown(
    results: dict[str, dict], curves: dict[str, list], steps: int | None = None
) -> str:
    tasks = [k for k in next(iter(results.values())) if k != "avg"]
    header = ["method", *tasks, "avg", f"best {DEV_LABEL}"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *["---:"] * (len(header) - 1)]) + "|",
    ]
    for method, scores in results.items():
        step, best = max(curves[method], key=lambda point: point[1])
        cells = [f"{scores[t]:.2f}" for t in tasks] + [f"{scores['avg']:.2f}"]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {best:.2f} (step {step}) |")
    note = (
        "Spearman x 100 on the demo's synthetic scene-pair tasks (not SentEval STS), best "
        "checkpoint of each run by the dev split."
    )
    return "\n".join([note, "", *lines, "", reading_note(steps)]) + "\n"


def write_demo_plots(run_dirs: dict[str, Path], out_dir: Path) -> Path | None:
    """Dev score and training loss of each run against steps → ``out_dir/curves.png``.

    A local hook (the coordinator may route it to ``mmcse plot``); None without matplotlib.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (dev_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for method, run_dir in run_dirs.items():
        rows = RunDir(run_dir).read_metrics()
        dev = [(r["step"], r["stsb_dev"]) for r in rows if r.get("stsb_dev") is not None]
        if dev:
            dev_ax.plot(*zip(*dev, strict=True), marker="o", label=method)
        terms = sorted({k for r in rows for k in r if k.endswith("_loss")})  # every loss term
        for term in terms:
            points = [(r["step"], r[term]) for r in rows if r.get(term) is not None]
            label = f"{method} {term.removesuffix('_loss')}"
            loss_ax.plot(*zip(*points, strict=True), label=label, alpha=0.8)
    dev_ax.set(xlabel="step", ylabel="Spearman x 100", title=DEV_LABEL)
    loss_ax.set(xlabel="step", ylabel="loss term", title="training loss terms", yscale="log")
    for ax in (dev_ax, loss_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(out_dir) / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_demo(out: str | Path, steps: int = 300, device: str = "auto") -> str:
    """``mmcse demo`` into ``out``; returns the comparison table, the dev curves and what it
    wrote (the steps are logged as they run)."""
    out, started = Path(out), time.perf_counter()
    check_demo_folder(out)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # tiny matrices: one thread is as fast, and robust on busy hosts
    try:
        report = _run(out, steps, device)
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - started
    return f"{report}\nruns in {out}/simcse and {out}/mcse ({elapsed:.0f} s)"


#: what a demo folder holds at its top (an earlier demo is replaced, anything else refused)
DEMO_ENTRIES = frozenset(
    {"data", "cache", "student-init", *METHODS, "comparison.md", "comparison.json", "curves.png"}
)


def check_demo_folder(out: Path) -> None:
    """``out`` is new, empty, or an earlier demo (replaced, and the log says so); a folder that
    holds anything else is refused before anything is written."""
    if out.exists() and not out.is_dir():
        raise MmcseError(f"{out} is a file, not a folder; give the demo another folder")
    held = {p.name for p in out.iterdir()} if out.is_dir() else set()
    other = sorted(held - DEMO_ENTRIES)
    if other:
        raise MmcseError(
            f"{out} holds {', '.join(other[:4])}, which no demo wrote; give the demo an empty "
            "or new folder (it replaces an earlier demo's)"
        )
    if held:
        logger.warning("%s holds an earlier demo: replacing it", out)


def _run(out: Path, steps: int, device: str) -> str:
    logger.info(f"[1/5] generating the drawn world under {out / 'data'}")
    paths = generate(out / "data")
    logger.info("[2/5] Stage 1: extracting image features with a tiny random ResNet teacher")
    cached = extract(paths, out / "cache", device)
    texts = paths["text"].read_text().splitlines()
    student = build_tiny_bert(out / "student-init", texts=texts, size="small")
    run_dirs = {}
    for i, method in enumerate(METHODS, start=3):
        logger.info(f"[{i}/5] Stage 2: training {method} for {steps} steps")
        cfg = demo_config(method, student, paths, cached, out, steps, device)
        run_dirs[method] = train(cfg).output_dir
    logger.info("[5/5] scoring the best checkpoints on the demo's scene-pair tasks")
    tasks = load_demo_tasks(paths["tasks"])
    results = {m: score_demo_tasks(d, tasks, device) for m, d in run_dirs.items()}
    curves = {m: dev_curve(d) for m, d in run_dirs.items()}
    table = comparison_markdown(results, curves, steps)
    (out / "comparison.md").write_text(table)
    (out / "comparison.json").write_text(
        json.dumps({"test": results, "dev_curves": curves}, indent=2) + "\n"
    )
    plot = write_demo_plots(run_dirs, out)
    lines = ["", table]
    for method, curve in curves.items():
        lines.append(f"{DEV_LABEL}, {method}: " + " ".join(f"{s}:{v:.1f}" for s, v in curve))
    lines.append(f"wrote {out / 'comparison.md'}, {out / 'comparison.json'}")
    lines.append(f"wrote {plot}" if plot else "no plot: matplotlib is not installed")
    return "\n".join(lines)
