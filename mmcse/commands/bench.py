"""``mmcse bench all``: the toolkit's speed figures, measured in one run."""

from __future__ import annotations

import typer

from mmcse.commands import show

app = typer.Typer(help="Speed benchmarks (ratios measured in one run).", no_args_is_help=True)
Opt = typer.Option


def _choices(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",")) if text else ()


@app.command("all")
def bench_all_cmd(
    device: str = Opt("cpu", help="cpu|cuda"),
    size: str = Opt(None, help="real|base|small|tiny [default: real on CUDA, tiny on CPU]"),
    out: str = Opt(
        None, help="JSON path, Markdown beside it [docs/benchmarks/results-DEVICE.json]"
    ),
    sections: str = Opt(None, help="comma-separated subset of the sections (default: all)"),
    method: list[str] = Opt(None, "--method", help="restrict the train section to these"),
    capture: str = Opt(
        None, help="train steps, comma-separated off|forward|whole [whole on CUDA, off on CPU]"
    ),
    packing: str = Opt("off", help="train steps padded and/or packed: off|on|off,on"),
    lengths: str = Opt("coco", help="synthetic caption lengths: coco|wiki (measured means)|full"),
    eval_data: str = Opt(None, help="SentEval dir ('' skips the eval sections)"),
    peak_tflops: float = Opt(None, help="declare the device's peak (for MFU where none is known)"),
) -> None:
    """Every speed figure in one run: extraction, objects, every method's step ÷ SimCSE's (ms,
    MFU, data wait, memory; per capture and packing choice), dev and STS evaluation, mmcse vs
    sentence-transformers -> JSON + Markdown."""
    from mmcse.bench.suite import bench_all
    from mmcse.errors import BadValueError

    switches = {"off": False, "on": True}
    if not set(_choices(packing)) <= set(switches):
        raise BadValueError(f"--packing takes off, on or off,on, not {packing!r}")
    show(
        bench_all(
            device,
            size,
            out,
            sections,
            method,
            eval_data=eval_data,
            peak_tflops=peak_tflops,
            capture=_choices(capture),
            lengths=lengths,
            packing=tuple(switches[p] for p in _choices(packing)),
        )
    )
