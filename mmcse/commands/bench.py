"""``mmcse bench all|train|precision|extract|objects``: speed figures, measured in one run."""

from __future__ import annotations

import typer

from mmcse.commands import show

app = typer.Typer(help="Speed benchmarks (ratios measured in one run).", no_args_is_help=True)
Opt = typer.Option


@app.command("all")
def bench_all_cmd(
    device: str = Opt("cpu", help="cpu|cuda"),
    size: str = Opt(None, help="real|base|small|tiny [default: real on CUDA, tiny on CPU]"),
    out: str = Opt(None, help="JSON path, Markdown beside it [docs/benchmarks/results-DEVICE.json]"),
    sections: str = Opt(None, help="comma-separated subset of the sections (default: all)"),
    method: list[str] = Opt(None, "--method", help="restrict the train section to these"),
    eval_data: str = Opt(None, help="SentEval dir ('' skips the eval sections)"),
    peak_tflops: float = Opt(None, help="declare the device's peak (for MFU where none is known)"),
    compile_on_cpu: bool = Opt(False, help="also measure --compile on CPU (slow)"),
) -> None:
    """Every speed figure in one run: extraction, objects, training steps (ratios, MFU, data
    wait, memory), fast paths on/off, dev and STS evaluation -> JSON + Markdown."""
    from mmcse.bench.suite import bench_all

    show(bench_all(device, size, out, sections, method, eval_data=eval_data,
                   peak_tflops=peak_tflops, compile_on_cpu=compile_on_cpu))  # fmt: skip


@app.command("train")
def bench_train_cmd(
    size: str = Opt("tiny", help="tiny|small|base (BERT-base shapes, random init)"),
    device: str = Opt("cpu", help="cpu|cuda"),
    steps: int = Opt(20, help="timed steps per method"),
    batch_size: int = Opt(64),
    seq_len: int = Opt(32),
    method: list[str] = Opt(None, "--method", help="restrict to these methods"),
    gather_rows: int = Opt(1_000_000, help="rows of the synthetic set for the gather benchmark"),
) -> None:
    """Step time of every method ÷ SimCSE's, measured in one run; cache gather rows/s."""
    from mmcse.bench.train_step import train_report

    show(train_report(size, device, steps, batch_size, seq_len, method, gather_rows))


@app.command("precision")
def bench_precision_cmd(
    model: str = Opt(None, help="student [default: the packaged all-MiniLM-L6-v2]"),
    sentences: str = Opt(None, help="one sentence per line [default: shared Wiki1M sample]"),
    methods: str = Opt("simcse,mcse", help="comma-separated methods"),
    steps: int = Opt(8, help="batches measured per method"),
    batch_size: int = Opt(32),
    dropout: float = Opt(0.1, help="0 measures the number format alone"),
) -> None:
    """Loss and gradient change of one step under bf16/fp16 autocast vs fp32, on CPU."""
    from mmcse.bench.precision import precision_report

    show(precision_report(model, sentences, methods, steps, batch_size, dropout))


@app.command("extract")
def bench_extract_cmd(
    teacher: str = Opt("resnet50", help="Registered teacher (random weights)."),
    device: str = Opt("cpu", help="cpu | cuda | cuda:N."),
    images: int = Opt(64, help="Synthetic 500x375 JPEGs to decode and encode."),
    batch_size: int = Opt(16, help="Images per batch."),
    num_workers: int = Opt(2, help="DataLoader decode workers."),
    size: str = Opt("real", help="real | tiny."),
    sentences: int = Opt(512, help="Synthetic captions for text teachers."),
) -> None:
    """Images/s of decoding, of the teacher, and end to end (sentences/s for text teachers)."""
    from mmcse.bench.extract import extract_report

    show(extract_report(teacher, device, images, batch_size, num_workers, size, sentences))


@app.command("objects")
def bench_objects_cmd(
    size: str = Opt("tiny", help="real (Florence-2-large, SAM2.1-L, real teacher) | tiny."),
    device: str = Opt("cpu", help="cpu | cuda | cuda:N."),
    images: int = Opt(4, help="Images timed per stage."),
    batch_size: int = Opt(4, help="Images per call."),
    new_tokens: int = Opt(64, help="Florence-2 tokens generated per image (fixed)."),
    teacher: str = Opt("resnet50", help="Image teacher encoding the objects."),
) -> None:
    """Images/s of Florence-2 grounding, SAM2 masks and object encoding (random weights)."""
    from mmcse.bench.objects import objects_report

    show(objects_report(size, device, images, batch_size, new_tokens, teacher))
