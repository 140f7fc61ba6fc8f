"""The ``mmcse`` command line (typer). Thin: each command parses flags and calls the library.

Errors a user can fix (:class:`mmcse.errors.MmcseError`, missing files, bad values) print one
``error: ...`` line and exit with status 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer

from mmcse.errors import MmcseError

app = typer.Typer(
    help="Multimodal contrastive sentence embeddings: Stage-1 teacher cache + Stage-2 trainer.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
cache_app = typer.Typer(
    help="Inspect, verify, merge and remove cached feature sets.", no_args_is_help=True
)
bench_app = typer.Typer(help="Speed benchmarks (ratios measured in one run).", no_args_is_help=True)
recipes_app = typer.Typer(help="Paper settings as named recipes.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")
app.add_typer(bench_app, name="bench")
app.add_typer(recipes_app, name="recipes")


def _version(value: bool) -> None:
    if value:
        from mmcse import __version__

        typer.echo(f"mmcse {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
) -> None:
    """Multimodal contrastive sentence embeddings: Stage-1 teacher cache + Stage-2 trainer."""


# ---- train / demo / bench train (Stage 2) --------------------------------------------------
Opt = typer.Option


@app.command()
def train(
    config: str = Opt(None, "--config", help="JSON/TOML file of training settings"),
    model: str = Opt(None, help="student: local HF dir or hub id"),
    method: str = Opt(None, help="registered method (mmcse methods lists them)"),
    method_arg: list[str] = Opt(None, "--method-arg", help="method hyperparameter KEY=VALUE"),
    text_corpus: str = Opt(None, help="text corpus: corpus table dir or .txt"),
    caption_corpus: str = Opt(None, help="caption corpus table dir (from extract-images)"),
    feature: list[str] = Opt(None, "--feature", help="cached features ROLE=DIR"),
    expect_fingerprint: list[str] = Opt(None, "--expect-fingerprint", help="ROLE=SHA"),
    mixing: str = Opt(
        None, help="interleave|mcse-train-mix|proportional-random|caption-only|text-only"
    ),
    output_dir: str = Opt(None, help="run directory"),
    overwrite: bool = Opt(None, "--overwrite", help="replace the run in a non-empty --output-dir"),
    batch_size: int = Opt(None),
    learning_rate: float = Opt(None, "--lr", "--learning-rate"),
    epochs: int = Opt(None),
    max_steps: int = Opt(None),
    max_seq_length: int = Opt(None),
    seed: int = Opt(None),
    eval_steps: int = Opt(None),
    eval_data: str = Opt(None, help="SentEval-layout dir ('' disables evaluation)"),
    final_eval: bool = Opt(None, "--final-eval/--no-final-eval"),
    pooler: str = Opt(
        None,
        help="auto (the student's own sentence-transformers pooling, else cls_before_pooler) "
        "| cls | cls_before_pooler | avg (= mean) | max | avg_first_last | avg_top2",
    ),
    device: str = Opt(None),
    precision: str = Opt(None, help="auto|bf16|fp16|fp32 (auto: bf16 on CUDA)"),
    adam_eps: float = Opt(None, help="AdamW epsilon [1e-6, transformers.AdamW's]"),
    drop_last: bool = Opt(None, "--drop-last/--keep-last", help="last partial batch [kept]"),
    attn_implementation: str = Opt(None, help="encoder attention: sdpa (default) | eager"),
    compile_encoder: bool = Opt(None, "--compile/--no-compile", help="torch.compile the encoder"),
    fused_adamw: bool = Opt(None, "--fused-adamw/--no-fused-adamw", help="fused AdamW (CUDA)"),
    tf32: bool = Opt(None, "--tf32/--no-tf32", help="TF32 matmuls for fp32 runs on CUDA"),
    dynamic_padding: bool = Opt(
        None, "--dynamic-padding/--no-dynamic-padding", help="pad batches to their longest"
    ),
    dry_run: bool = Opt(False, help="print the resolved config and method, train nothing"),
    resume: str = Opt(None, help="continue the run in RUN_DIR from its last/ checkpoint"),
    save_every: int = Opt(None, help="steps between resumable last/ saves [0 = eval-steps]"),
    log_every: int = Opt(None, help="steps per metrics.jsonl record (terms averaged) [10]"),
    report_to: str = Opt(None, help="none|tensorboard (writes RUN_DIR/tensorboard)"),
) -> None:
    """Fine-tune a student against cached features (``--method simcse|mcse|...``)."""
    from mmcse.training.config import parse_pairs, parse_value, resolve_config
    from mmcse.training.loop import train as run_training

    args = {k: parse_value(v) for k, v in parse_pairs(method_arg, "--method-arg").items()}
    overrides = dict(
        model=model,
        method=method,
        method_args=args or None,
        text_corpus=text_corpus,
        caption_corpus=caption_corpus,
        features=parse_pairs(feature, "--feature") or None,
        expect_fingerprints=parse_pairs(expect_fingerprint, "--expect-fingerprint") or None,
        mixing=mixing,
        output_dir=output_dir,
        overwrite=overwrite,
        batch_size=batch_size,
        learning_rate=learning_rate,
        epochs=epochs,
        max_steps=max_steps,
        max_seq_length=max_seq_length,
        seed=seed,
        eval_steps=eval_steps,
        eval_data=eval_data,
        final_eval=final_eval,
        pooler=pooler,
        device=device,
        precision=precision,
        adam_eps=adam_eps,
        drop_last=drop_last,
        save_every=save_every,
        log_every=log_every,
        report_to=report_to,
        attn_implementation=attn_implementation,
        compile_encoder=compile_encoder,
        fused_adamw=fused_adamw,
        tf32=tf32,
        dynamic_padding=dynamic_padding,
    )
    if resume:
        from mmcse.training.checkpoint import resume_config

        cfg = resume_config(resume, config, overrides)
    else:
        cfg = resolve_config(config, **overrides)
    if dry_run:
        import json

        from mmcse.training.preflight import preflight

        method = preflight(cfg)  # the checks a real run makes before its first step
        typer.echo(json.dumps(cfg.to_dict(), indent=2))
        typer.echo(method.describe())
        typer.echo("preflight: every input checked")
        return
    result = run_training(cfg, resume=bool(resume))
    typer.echo(f"run directory: {result.output_dir}")


def _show_config_defaults(command) -> None:
    """``train --help`` shows each setting's TrainConfig default: the flags themselves default to
    None, so that a --config file can fill what the command line leaves out."""
    import dataclasses
    import inspect

    from mmcse.training.config import TrainConfig

    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(TrainConfig)
    }
    plural = {"method_arg": "method_args", "feature": "features"}
    plural["expect_fingerprint"] = "expect_fingerprints"
    for name, param in inspect.signature(command).parameters.items():
        info, key = param.default, plural.get(name, name)
        if isinstance(info, typer.models.OptionInfo) and key in defaults and info.default is None:
            info.help = f"{info.help or ''} (default: {defaults[key]!r})".strip()


_show_config_defaults(train)


@bench_app.command("all")
def bench_all_cmd(
    device: str = Opt("cpu", help="cpu|cuda"),
    size: str = Opt(None, help="real|small|tiny [default: real on CUDA, tiny on CPU]"),
    out: str = Opt(
        None, help="JSON path (Markdown beside it) [default: bench/results-DEVICE.json]"
    ),
    sections: str = Opt(None, help="comma-separated subset of the sections (default: all)"),
    method: list[str] = Opt(None, "--method", help="restrict the train section to these"),
    eval_data: str = Opt(None, help="SentEval dir ('' skips the eval sections)"),
    peak_tflops: float = Opt(None, help="declare the device's peak (for MFU where none is known)"),
    compile_on_cpu: bool = Opt(False, help="also measure --compile on CPU (slow)"),
) -> None:
    """Every speed figure in one run: extraction, objects, training steps (ratios, MFU, data
    wait, memory), fast paths on/off, dev and STS evaluation -> JSON + Markdown."""
    from pathlib import Path

    from mmcse.bench.suite import SECTIONS, SuiteOptions, run_suite

    options = SuiteOptions(
        device=device,
        size=size or ("real" if device.startswith("cuda") else "tiny"),
        sections=tuple(s.strip() for s in sections.split(",")) if sections else SECTIONS,
        methods=tuple(method or ()),
        eval_data=eval_data,
        peak_tflops=peak_tflops,
        compile_on_cpu=compile_on_cpu,
    )
    target = Path(out or f"bench/results-{device.split(':')[0]}.json")
    run_suite(options, target, echo=typer.echo)
    typer.echo(f"wrote {target} and {target.with_suffix('.md')}")


@bench_app.command("train")
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
    from mmcse.bench.gather import gather_throughput
    from mmcse.bench.train_step import bench_train

    r = bench_train(size, device, steps, batch=batch_size, seq_len=seq_len, methods=method)
    typer.echo(f"device {r['device']}  size {r['size']}  batch {r['batch']} x len {r['seq_len']}")
    for name, seconds in r["step_seconds"].items():
        typer.echo(f"step {name}: {seconds * 1000:.1f} ms")
    for name, ratio in r["ratios"].items():
        if name != "simcse":
            typer.echo(f"ratio {name}/simcse: {ratio:.3f}")
    typer.echo(f"simcse steps/s: {r['simcse_steps_per_s']:.2f}")
    if "simcse_mfu" in r:
        typer.echo(f"simcse MFU: {100 * r['simcse_mfu']:.1f}%")
    g = gather_throughput(num_rows=gather_rows, dim=2048, dtype="float16", batch=128)
    typer.echo(
        f"cache gather: {g['rows_per_s']:,.0f} rows/s (128-id batches, {gather_rows:,} x 2048 fp16)"
    )


@bench_app.command("precision")
def bench_precision_cmd(
    model: str = Opt(None, help="student [default: the packaged all-MiniLM-L6-v2]"),
    sentences: str = Opt(None, help="one sentence per line [default: shared Wiki1M sample]"),
    methods: str = Opt("simcse,mcse", help="comma-separated methods"),
    steps: int = Opt(8, help="batches measured per method"),
    batch_size: int = Opt(32),
    dropout: float = Opt(0.1, help="0 measures the number format alone"),
) -> None:
    """Loss and gradient change of one step under bf16/fp16 autocast vs fp32, on CPU."""
    from mmcse.bench.precision import bench_precision, default_inputs, format_rows, read_sentences

    model, sentences = default_inputs(model, sentences)
    texts = read_sentences(sentences, steps * batch_size)
    rows = bench_precision(
        model,
        texts,
        methods=tuple(m for m in methods.split(",") if m),
        batch_size=batch_size,
        dropout=dropout,
    )
    typer.echo(f"model {model}; {steps} batches of {batch_size} from {sentences}; CPU autocast")
    typer.echo(format_rows(rows))


@app.command()
def demo(
    out: str = Opt("runs/demo", help="where the generated world, cache and runs go"),
    steps: int = Opt(300, help="training steps per method"),
    device: str = Opt("auto", help="auto|cpu|cuda"),
) -> None:
    """Offline end-to-end demo: drawn images → Stage 1 → SimCSE vs MCSE → table and curves."""
    import time
    from pathlib import Path

    from mmcse.demo.run import run_demo

    started = time.perf_counter()
    run_demo(Path(out), steps=steps, device=device)
    typer.echo(f"runs in {out}/simcse and {out}/mcse ({time.perf_counter() - started:.0f} s)")


@app.command()
def methods() -> None:
    """Registered methods: loss terms, feature roles, settings with defaults."""
    from mmcse.reports.overview import method_names, method_overview

    for name in method_names():
        typer.echo(method_overview(name))


# ---- eval ------------------------------------------------------------------------------------


@app.command("eval")
def eval_command(
    model: str = typer.Option(..., help="Training run directory (uses run/best) or HF model dir."),
    pooler: str | None = typer.Option(
        None,
        help="cls | cls_before_pooler | avg (= mean) | max | avg_first_last | avg_top2 | auto "
        "(default: the run's pooler, else the student's own 1_Pooling config, "
        "else cls_before_pooler)",
    ),
    data: str | None = typer.Option(
        None, help="SentEval data folder (holds downstream/STS) (default: ../shared/data/senteval)"
    ),
    out: str | None = typer.Option(None, help="Write the results as JSON to this file."),
    mode: str = typer.Option("test", help="test: the 7 STS tasks; dev: STS-B and SICK-R dev."),
    batch_size: int = typer.Option(128, help="Sentences per forward pass."),
    device: str | None = typer.Option(None, help="cpu, cuda, cuda:1, ... (default: cuda if any)"),
    align_uniform: bool = typer.Option(
        False, "--align-uniform", help="Also report alignment and uniformity on STS-B."
    ),
    tasks: str = typer.Option(
        "sts",
        help="Comma-separated: sts, transfer (or some of MR,CR,SUBJ,MPQA,SST2,TREC,MRPC), retrieval.",
    ),
    transfer_mode: str = typer.Option(
        "test", help="SimCSE's transfer setting: test (the papers': 10-fold, Adam) | fasttest."
    ),
    images_features: str | None = typer.Option(
        None, help="Retrieval: cached image feature set of held-out images (keyed by image id)."
    ),
    captions: str | None = typer.Option(
        None,
        help="Retrieval: caption corpus of those images (extract-images, --caption-policy all).",
    ),
    head: str | None = typer.Option(
        None, help="Retrieval: which loss term's heads [default: first]."
    ),
) -> None:
    """SentEval STS (Spearman x 100, 'all'), transfer tasks and cross-modal retrieval."""
    from mmcse.evaluation import evaluate_sts, format_table, write_report
    from mmcse.evaluation.suites import parse_suites, run_extra_suites
    from mmcse.hub import resolve_model_dir
    from mmcse.training.checkpoint import unfinished_warning

    suites = parse_suites(tasks, images_features, captions, data)
    warning = unfinished_warning(resolve_model_dir(model))
    if warning:
        typer.echo(warning, err=True)
    if "sts" not in suites:
        run_extra_suites(
            model, suites, data, out, pooler, batch_size, device, transfer_mode,
            images_features, captions, head,
        )  # fmt: skip
        return
    results = evaluate_sts(
        model,
        data_dir=data,
        mode=mode,
        pooler=pooler,
        batch_size=batch_size,
        device=device,
        with_align_uniform=align_uniform,
        progress=True,
    )
    typer.echo(format_table(results))
    if len(suites) > 1:
        run_extra_suites(
            model, suites, data, out, pooler, batch_size, device, transfer_mode,
            images_features, captions, head, sts=results,
        )  # fmt: skip
    elif out:
        typer.echo(f"wrote {write_report(results, out)}")


@app.command()
def export(
    run: str = typer.Argument(..., help="training run dir (uses run/best), checkpoint or HF dir"),
    out: str = typer.Argument(..., help="sentence-transformers model dir to write"),
    pooler: str = typer.Option(None, help="(default: the pooler mmcse eval uses for RUN)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a non-empty OUT"),
) -> None:
    """Write a sentence-transformers model dir that encodes exactly as mmcse eval scores RUN."""
    from mmcse.reports.export import export_run

    path, used = export_run(run, out, pooler=pooler, overwrite=overwrite)
    typer.echo(f"exported {run} to {path} (pooling {used}); model card {path}/README.md")


# ---- compare / plot --------------------------------------------------------------------------


@app.command()
def compare(
    runs: list[str] = typer.Argument(..., help="Run directories, or folders of seed runs."),
    table_format: str = typer.Option("md", "--format", help="md | csv | latex"),
    out: str | None = typer.Option(None, help="Also write the table to this file."),
) -> None:
    """STS (+ transfer, + retrieval) of runs in one table: mean ± std over seeds, best marked."""
    from pathlib import Path

    from mmcse.reports.compare_runs import compare_table

    table = compare_table(runs, table_format)
    typer.echo(table)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(table + "\n")
        typer.echo(f"wrote {out}")


@app.command()
def plot(
    runs: list[str] = typer.Argument(..., help="Run directories, seed folders or ablation dirs."),
    out_dir: str | None = typer.Option(
        None, help="Where the multi-run scatter goes [default: beside the first run]."
    ),
    align_uniform: bool = typer.Option(
        False, "--align-uniform", help="Compute alignment/uniformity on STS-B where missing."
    ),
    data: str | None = typer.Option(None, help="SentEval data folder (for --align-uniform)."),
) -> None:
    """PNG training curves per run, the alignment–uniformity scatter, ablation bar charts."""
    from mmcse.reports.plots import write_run_plots

    for path in write_run_plots(runs, out_dir, compute_align_uniform=align_uniform, data_dir=data):
        typer.echo(f"wrote {path}")


# ---- cache -----------------------------------------------------------------------------------


@cache_app.command("ls")
def cache_ls(root: str = typer.Argument("cache", help="Directory searched for sets.")) -> None:
    """List the feature sets and corpora under ROOT (unfinished writes and bad manifests marked)."""
    from mmcse.cache import list_sets
    from mmcse.reports.overview import format_cache_listing

    entries = list(list_sets(root))
    if not entries:
        typer.echo(f"no feature sets or corpora under {root}")
        return
    typer.echo(format_cache_listing(entries))


@cache_app.command("verify")
def cache_verify(
    path: str = typer.Argument(..., help="A feature set or corpus, or a folder of them."),
) -> None:
    """Re-hash every shard, check schemas, rows, ids and NaN/Inf of one set or of every set
    under a folder; exit 2 naming the first problem if any."""
    from mmcse.cache import Manifest, verify_tree
    from mmcse.errors import CacheError

    results = verify_tree(path)
    problems = [problem for found in results.values() for problem in found]
    for set_path, found in results.items():
        if not found:
            manifest = Manifest.read(set_path)
            typer.echo(
                f"ok: {set_path} ({manifest.num_rows} rows, {len(manifest.shards)} shards, "
                f"fingerprint {manifest.fingerprint})"
            )
    if problems:
        for problem in problems[1:]:
            typer.echo(f"  also: {problem}", err=True)
        more = f" (+{len(problems) - 1} more above)" if len(problems) > 1 else ""
        raise CacheError(problems[0] + more)


@cache_app.command("rm")
def cache_rm(path: str = typer.Argument(..., help="Feature set or corpus directory.")) -> None:
    """Delete one set (refuses directories that are not a set or hold other files)."""
    from mmcse.cache import remove

    remove(path)
    typer.echo(f"removed {path}")


@cache_app.command("finalize")
def cache_finalize(
    path: str = typer.Argument(..., help="Directory the ranks wrote their shards into."),
    num_shards: int = typer.Option(None, help="Require exactly shards 0..N-1."),
) -> None:
    """Write the manifest of a set whose shards were written by several ranks or jobs."""
    from mmcse.cache import FeatureSetWriter

    manifest = FeatureSetWriter.reopen(path).finalize(num_shards=num_shards)
    typer.echo(f"finalized {path}: {manifest.num_rows} rows, fingerprint {manifest.fingerprint}")


@cache_app.command("merge")
def cache_merge(
    sources: list[str] = typer.Argument(..., help="Finished sets of the same producer."),
    out: str = typer.Option(..., "--out", "-o", help="Directory of the merged set."),
) -> None:
    """Combine finished sets (e.g. one per extraction job) into a new set OUT."""
    from mmcse.cache import merge

    manifest = merge(sources, out)
    typer.echo(f"merged {len(sources)} sets into {out}: {manifest.num_rows} rows")


# ---- extract-images / extract-text / import-hdf5 / bench extract (Stage 1) -------------------


def _run_options(**flags):
    from pipeline.extract import RunOptions, default_workers, resolve_rank

    rank, world_size = resolve_rank(flags.pop("rank", None), flags.pop("world_size", None))
    if flags.get("workers", 0) is None:
        flags["workers"] = default_workers()
    return RunOptions(rank=rank, world_size=world_size, **{"workers": 0, **flags})


def _with_run_options(*names: str, **defaults):
    """Add the shared Stage-1 run flags ``names`` (see ``_RUN_FLAGS``) to an extract command and
    hand it one ``options: RunOptions`` instead. One definition for every extract command;
    ``defaults`` overrides a flag's default for one command."""
    import functools
    import inspect

    def decorate(command):
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.name != "options"]
        added = []
        for name in names:
            kind, option = _RUN_FLAGS[name]
            if name in defaults:
                option = typer.Option(defaults[name], *option.param_decls, help=option.help)
            added.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind
                )
            )

        @functools.wraps(command)
        def run(**kwargs):
            flags = {name: kwargs.pop(name) for name in names}
            return command(**kwargs, options=_run_options(**flags))

        run.__signature__ = signature.replace(parameters=kept + added)
        run.__annotations__ = {k: v for k, v in command.__annotations__.items() if k != "options"}
        return run

    return decorate


def _path(value: str | None):
    from pathlib import Path

    return Path(value) if value else None


def _source(images, captions, split_file, text_file=None):
    from pipeline.datasets import DataSource

    return DataSource(_path(images), _path(captions), _path(split_file), _path(text_file))


def _build_teacher(name: str, weights: str, size: str, device: str, compute_dtype: str | None):
    import torch

    from pipeline import teachers

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return teachers.build_teacher(
        name, weights=weights, device=device, dtype=compute_dtype, size=size
    )


def _report(results: dict) -> None:
    for part, manifest in results.items():
        state = (
            f"{manifest.num_rows} rows, {manifest.extra.get('num_errors', 0)} errors, "
            f"fingerprint {manifest.fingerprint[:12]}"
            if manifest is not None
            else "this rank's shards done; the last rank finalizes"
        )
        typer.echo(f"{part}: {state}")


_SHARD_SIZE = typer.Option(4096, help="Items per shard (fixed boundaries; resume unit).")
_BATCH_SIZE = typer.Option(256, help="Items per teacher call (never crosses a shard).")
_WORKERS = typer.Option(None, help="DataLoader decode workers (default min(8, CPUs)).")
_DTYPE = typer.Option("float32", help="Storage dtype of the features: float32 or float16.")
_STRICT = typer.Option(False, "--strict", help="Stop at the first bad input (exit 2).")
_RANK = typer.Option(None, help="This job's rank (default $RANK or 0).")
_WORLD = typer.Option(None, help="Number of jobs (default $WORLD_SIZE or 1).")
_DECODE = typer.Option("cpu", hidden=True, help="Only cpu (Pillow); gpu was removed.")
_MAX_PIXELS = typer.Option(89_478_485, help="Refuse images decoding larger than this many pixels.")
_BACKEND = typer.Option("arrow", help="Shard format: arrow or hdf5.")
_RUN_FLAGS = {  # name: (type, option) — the shared flags of the extract commands
    "shard_size": (int, _SHARD_SIZE),
    "batch_size": (int, _BATCH_SIZE),
    "workers": (int, _WORKERS),
    "dtype": (str, _DTYPE),
    "strict": (bool, _STRICT),
    "rank": (int, _RANK),
    "world_size": (int, _WORLD),
    "decode": (str, _DECODE),
    "max_pixels": (int, _MAX_PIXELS),
    "backend": (str, _BACKEND),
}
_TEXT_RUN_FLAGS = ("shard_size", "batch_size", "dtype", "strict", "rank", "world_size", "backend")
_IMAGE_RUN_FLAGS = (*_TEXT_RUN_FLAGS, "workers", "decode", "max_pixels")
_WEIGHTS = typer.Option("default", help="default | random | PATH to local weights.")
_SIZE = typer.Option("real", "--teacher-size", help="real | tiny (random small model for tests).")
_DEVICE = typer.Option("auto", help="auto | cpu | cuda | cuda:N.")
_COMPUTE = typer.Option(None, "--compute-dtype", help="bfloat16 | float16 | float32.")
_POLICY = typer.Option("random-one", help="random-one (MCSE) | all (KDMCSE, DALR) | longest.")


@app.command("extract-images")
@_with_run_options(*_IMAGE_RUN_FLAGS)
def extract_images_cmd(
    dataset: str = typer.Option(..., help="Registered dataset (flickr30k, coco, flickr8k, local)."),
    split: str = typer.Option("train", help="Split to extract."),
    images: str = typer.Option(None, help="Image root folder."),
    captions: str = typer.Option(None, help="Caption file or folder (see the dataset loader)."),
    split_file: str = typer.Option(None, help="List of image files/ids in the split."),
    teacher: str = typer.Option("resnet50", help="Registered image teacher."),
    weights: str = _WEIGHTS,
    teacher_size: str = _SIZE,
    device: str = _DEVICE,
    compute_dtype: str = _COMPUTE,
    out: str = typer.Option(None, help="Output folder (default cache/<dataset>/<split>)."),
    caption_policy: str = _POLICY,
    seed: int = typer.Option(0, help="Seed of the random-one caption draw."),
    options=None,
) -> None:
    """Image features (+ caption features for CLIP teachers) and the caption corpus table."""
    from pathlib import Path

    from pipeline.datasets import load_dataset
    from pipeline.extract import extract_images

    records = load_dataset(dataset, _source(images, captions, split_file), split)
    model = _build_teacher(teacher, weights, teacher_size, device, compute_dtype)
    target = _path(out) or Path("cache") / dataset / split
    _report(
        extract_images(
            records,
            model,
            teacher,
            target,
            caption_policy=caption_policy,
            seed=seed,
            options=options,
        )
    )


@app.command("extract-text")
@_with_run_options(*_TEXT_RUN_FLAGS)
def extract_text_cmd(
    corpus: str = typer.Option(..., help="wiki1m, a caption dataset name, or a corpus table dir."),
    split: str = typer.Option("train", help="Split (dataset names only)."),
    text_file: str = typer.Option(None, help="Sentence file for text corpora (wiki1m)."),
    images: str = typer.Option(None, help="Image root (caption datasets)."),
    captions: str = typer.Option(None, help="Caption file or folder (caption datasets)."),
    split_file: str = typer.Option(None, help="List of image files/ids in the split."),
    teacher: str = typer.Option(
        "simcse",
        help="Registered text teacher, or none: the corpus table only, no teacher pass "
        "(all SimCSE/MCSE/KDMCSE read of a text corpus).",
    ),
    weights: str = _WEIGHTS,
    teacher_size: str = _SIZE,
    device: str = _DEVICE,
    compute_dtype: str = _COMPUTE,
    out: str = typer.Option(None, help="Output folder (default cache/<corpus>/<split>)."),
    caption_policy: str = _POLICY,
    seed: int = typer.Option(0, help="Seed of the random-one caption draw."),
    options=None,
) -> None:
    """Text features of a corpus (one row per sentence id) and, if needed, its corpus table."""
    from pathlib import Path

    from pipeline.datasets import load_dataset
    from pipeline.extract import extract_corpus_texts, extract_texts

    no_teacher = teacher == "none"
    if no_teacher and Path(corpus).is_dir():
        raise MmcseError(f"{corpus} is already a corpus table; --teacher none has nothing to add")
    model = None
    if not no_teacher:
        model = _build_teacher(teacher, weights, teacher_size, device, compute_dtype)
    if Path(corpus).is_dir():
        target = _path(out) or Path(corpus).parent
        _report(extract_corpus_texts(Path(corpus), model, teacher, target, options))
        return
    records = load_dataset(corpus, _source(images, captions, split_file, text_file), split)
    target = _path(out) or Path("cache") / corpus / split
    _report(
        extract_texts(
            records,
            model,
            None if no_teacher else teacher,
            target,
            caption_policy=caption_policy,
            seed=seed,
            options=options,
        )
    )


@app.command("import-hdf5")
def import_hdf5_cmd(
    features: str = typer.Option(..., help="MCSE's HDF5 file (a [N, dim] features dataset)."),
    captions: str = typer.Option(..., help="Row-aligned captions, one per line."),
    dataset: str = typer.Option(..., help="Dataset name recorded in the manifests and ids."),
    split: str = typer.Option("train", help="Split recorded in the manifests."),
    out: str = typer.Option(..., help="Output folder (captions/ + image-<teacher>/)."),
    key: str = typer.Option("features", help="HDF5 dataset holding the features."),
    teacher_name: str = typer.Option("mcse-resnet50", help="Name for the image feature set."),
    dtype: str = typer.Option(None, help="Storage dtype (default: the file's)."),
) -> None:
    """Turn MCSE's released HDF5 features + captions into a feature set and a corpus table."""
    from pathlib import Path

    from pipeline.hdf5_import import import_hdf5_features

    for path in (features, captions):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path} does not exist")
    _report(
        import_hdf5_features(
            Path(features),
            Path(captions),
            dataset=dataset,
            split=split,
            out=Path(out),
            key=key,
            teacher_name=teacher_name,
            dtype=dtype,
        )
    )


@app.command("extract-image-tensors")
def extract_image_tensors(
    source: str = typer.Argument(..., help="class-per-folder image tree, or a CIFAR python dir"),
    out: str = typer.Argument(..., help="feature set directory to write (kind image_tensor)"),
    source_format: str = typer.Option("folder", "--format", help="folder|cifar"),
    dataset: str = typer.Option(None, help="dataset name for the manifest (default: folder name)"),
    split: str = typer.Option("train", help="CIFAR split (train|test); recorded in the manifest"),
    size: int = typer.Option(256, help="cached side length; training crops views from it"),
    classes: int = typer.Option(None, help="random subset of this many classes (paper: 60)"),
    per_class: int = typer.Option(None, help="random subset of files per class (paper: 500)"),
    file_list: str = typer.Option(None, "--list", help="exact files (authors' sampled list)"),
    seed: int = typer.Option(0, help="seed of the random class/file subset"),
    shard_rows: int = typer.Option(1024),
    workers: int = typer.Option(4, help="decoding processes"),
) -> None:
    """Cache unpaired labelled images as uint8 tensors for VisualCSE (ids: CLASS/NAME)."""
    from pathlib import Path

    from pipeline import nonling_cache as nc

    if source_format == "cifar":
        examples = nc.cifar_batches(source, split)
    elif source_format != "folder":
        raise MmcseError(f"--format must be folder or cifar, not {source_format!r}")
    elif file_list:
        examples = nc.listed_files(source, file_list)
    else:
        examples = nc.class_folder(source, nc.IMAGE_SUFFIXES, classes, per_class, seed)
    name = dataset or Path(source).resolve().name
    manifest = nc.write_image_tensors(
        examples, out, dataset=name, split=split, size=size, shard_rows=shard_rows, workers=workers
    )
    typer.echo(f"{out}: {manifest.num_rows} images, {len(manifest.extra['classes'])} classes")


@app.command("extract-audio")
def extract_audio(
    source: str = typer.Argument(..., help="class-per-folder tree of WAV files (class=speaker)"),
    out: str = typer.Argument(..., help="feature set directory to write (kind audio_fbank)"),
    dataset: str = typer.Option(None, help="dataset name for the manifest (default: folder name)"),
    split: str = typer.Option("train"),
    classes: int = typer.Option(None, help="random subset of this many classes (paper: 50)"),
    per_class: int = typer.Option(None, help="random subset of files per class"),
    seed: int = typer.Option(0, help="seed of the random class/file subset"),
    mel_bins: int = typer.Option(128),
    frames: int = typer.Option(1024, help="frames per clip (zero-padded or cut)"),
    window: str = typer.Option("hanning", help="hanning (SSAST)|povey (Kaldi default)|hamming"),
    dtype: str = typer.Option("float16", help="float16|float32"),
    shard_rows: int = typer.Option(256),
    workers: int = typer.Option(4, help="decoding processes"),
) -> None:
    """Cache SSAST-style Kaldi log-mel filterbanks of unpaired labelled audio for AudioCSE."""
    from pathlib import Path

    from pipeline import nonling_cache as nc
    from pipeline.fbank import FbankConfig

    examples = nc.class_folder(source, nc.AUDIO_SUFFIXES, classes, per_class, seed)
    cfg = FbankConfig(num_mel_bins=mel_bins, target_frames=frames, window=window)
    name = dataset or Path(source).resolve().name
    manifest = nc.write_audio_fbanks(
        examples,
        out,
        dataset=name,
        split=split,
        cfg=cfg,
        dtype=dtype,
        shard_rows=shard_rows,
        workers=workers,
    )
    typer.echo(f"{out}: {manifest.num_rows} clips, {len(manifest.extra['classes'])} classes")


@bench_app.command("extract")
def bench_extract_cmd(
    teacher: str = typer.Option("resnet50", help="Registered teacher (random weights)."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N."),
    images: int = typer.Option(64, help="Synthetic 500x375 JPEGs to decode and encode."),
    batch_size: int = typer.Option(16, help="Images per batch."),
    num_workers: int = typer.Option(2, help="DataLoader decode workers."),
    size: str = typer.Option("real", help="real | tiny."),
    sentences: int = typer.Option(512, help="Synthetic captions for text teachers."),
) -> None:
    """Images/s of decoding, of the teacher, and end to end (sentences/s for text teachers)."""
    from mmcse.bench.extract import run_extract_bench

    run_extract_bench(
        teacher, device, images, batch_size, num_workers, size, sentences, echo=typer.echo
    )


# ---- extract-objects / bench objects (MCSEO) -------------------------------------------------


@app.command("extract-objects")
@_with_run_options(*_TEXT_RUN_FLAGS, shard_size=1024, batch_size=8)
def extract_objects_cmd(
    dataset: str = Opt(None, help="Registered dataset (flickr30k, coco, local)."),
    split: str = Opt("train", help="Split to extract."),
    images: str = Opt(None, help="Image root folder."),
    captions: str = Opt(None, help="Caption file or folder (see the dataset loader)."),
    split_file: str = Opt(None, help="List of image files/ids in the split."),
    detector: str = Opt("florence2-sam2", help="florence2-sam2 | boxes-file PATH (JSONL)."),
    boxes_file: str = Opt(None, "--boxes-file", help="JSONL of image_id, caption, phrase, box."),
    masks: str = Opt("sam2", help="sam2 | box (with --detector boxes-file)."),
    florence: str = Opt("florence-community/Florence-2-large", help="Florence-2 id or dir."),
    sam2: str = Opt("facebook/sam2.1-hiera-large", help="SAM2 id or dir (smaller: -base-plus, …)."),
    num_beams: int = Opt(3, help="Florence-2 beams (Grounded-SAM-2 uses 3)."),
    max_new_tokens: int = Opt(256, help="Florence-2 generation budget."),
    from_objects: str = Opt(None, help="Re-encode an objects table dir (no detection)."),
    teacher: str = Opt("resnet50", help="Registered image teacher for the objects."),
    weights: str = _WEIGHTS,
    teacher_size: str = _SIZE,
    device: str = _DEVICE,
    compute_dtype: str = _COMPUTE,
    background: str = Opt("mean", help="Fill of the cut-out's transparent area: mean|black|white."),
    out: str = Opt(None, help="Output folder (default cache/<dataset>/<split>)."),
    caption_policy: str = Opt("longest", help="longest (MCSEO) | all | random-one."),
    seed: int = Opt(0, help="Seed of the random-one caption draw."),
    options=None,
) -> None:
    """MCSEO object–phrase pairs: objects table + object features (ids = object ids)."""
    from pathlib import Path

    from pipeline.objects.extract import ObjectSettings, extract_objects, reencode_objects

    if from_objects:
        model = _build_teacher(teacher, weights, teacher_size, device, compute_dtype)
        target = _path(out) or Path(from_objects).parent
        results = reencode_objects(
            Path(from_objects), model, teacher, target, background=background, options=options
        )
        _report(results)
        return
    if dataset is None:
        raise MmcseError("give --dataset (or --from-objects DIR to re-encode existing objects)")
    from pipeline.datasets import load_dataset

    settings = ObjectSettings(background, masks, caption_policy, seed)
    records = load_dataset(dataset, _source(images, captions, split_file), split)
    model = _build_teacher(teacher, weights, teacher_size, device, compute_dtype)
    found, segmenter = _object_detector(
        detector, boxes_file, masks, florence, sam2, num_beams, max_new_tokens, model.device
    )
    target = _path(out) or Path("cache") / dataset / split
    results = extract_objects(
        records, found, segmenter, model, teacher, target, settings=settings, options=options
    )
    _report(results)
    table = results.get("objects")
    if table is not None:
        typer.echo(f"object–phrase pairs per caption: {table.extra.get('pairs_per_caption')}")


def _object_detector(detector, boxes_file, masks, florence, sam2, num_beams, tokens, device):
    from pipeline.objects.extract import BoxesFile
    from pipeline.objects.florence import Florence2Grounder
    from pipeline.objects.sam2 import Sam2Segmenter

    if detector == "boxes-file":
        if not boxes_file:
            raise MmcseError("--detector boxes-file needs --boxes-file PATH")
        found = BoxesFile(boxes_file)
    elif detector == "florence2-sam2":
        if masks != "sam2":
            raise MmcseError("--masks box only goes with --detector boxes-file")
        found = Florence2Grounder(florence, device, num_beams, tokens)
    else:
        raise MmcseError(f"--detector must be florence2-sam2 or boxes-file, not {detector!r}")
    return found, Sam2Segmenter(sam2, device) if masks == "sam2" else None


@bench_app.command("objects")
def bench_objects_cmd(
    size: str = Opt("tiny", help="real (Florence-2-large, SAM2.1-L, real teacher) | tiny."),
    device: str = Opt("cpu", help="cpu | cuda | cuda:N."),
    images: int = Opt(4, help="Images timed per stage."),
    batch_size: int = Opt(4, help="Images per call."),
    new_tokens: int = Opt(64, help="Florence-2 tokens generated per image (fixed)."),
    teacher: str = Opt("resnet50", help="Image teacher encoding the objects."),
) -> None:
    """Images/s of Florence-2 grounding, SAM2 masks and object encoding (random weights)."""
    from mmcse.bench.objects import bench_objects

    for result in bench_objects(size, device, images, batch_size, new_tokens, teacher):
        typer.echo(f"{result.stage:32s} {result.images_per_s:10.2f} images/s  ({result.detail})")


# ---- recipes / ablate --------------------------------------------------------------------------

_CACHE_ROOT = Opt("cache", "--cache-root", help="Stage-1 cache root (layout: mmcse.recipes.recipe)")
_SEEDS = Opt(None, help="comma-separated seeds (default: the recipe's, e.g. 0,1,2,3,4)")
_MODEL = Opt(None, help="student override: local HF dir or hub id")
_MAX_STEPS = Opt(None, help="stop each run after N steps (smoke runs)")
_SET = Opt(None, "--set", help="TrainConfig override KEY=VALUE (repeatable)")
_DRY_RUN = Opt(False, "--dry-run", help="print every run it would train, then stop")
_OVERWRITE = Opt(False, "--overwrite", help="replace runs already in the seed folders")


def _recipe_seeds(recipe, seeds: str | None) -> tuple[int, ...]:
    if not seeds:
        return recipe.seeds
    try:
        return tuple(int(s) for s in seeds.split(","))
    except ValueError:
        raise MmcseError(f"--seeds expects comma-separated integers, got {seeds!r}") from None


def _set_overrides(items: list[str] | None, overwrite: bool = False) -> dict:
    from mmcse.training.config import parse_pairs, parse_value

    overrides = {k: parse_value(v) for k, v in parse_pairs(items, "--set").items()}
    return {**overrides, "overwrite": True} if overwrite else overrides


@recipes_app.command("list")
def recipes_list() -> None:
    """Every recipe, its data setting and the published STS avg it should reproduce."""
    from mmcse.recipes import RECIPES

    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        published = recipe.published[0] if recipe.published else None
        avg = f"{published.mean['avg']:.2f}  {published.source}" if published else "-"
        typer.echo(f"{name:<34} {recipe.method:<10} {avg}")


@recipes_app.command("show")
def recipes_show(
    name: str = typer.Argument(..., help="recipe name (mmcse recipes list)"),
    cache_root: str = _CACHE_ROOT,
) -> None:
    """A recipe's settings, the cache sets it reads and its published numbers."""
    from mmcse.recipes import get_recipe
    from mmcse.reports.compare import markdown_table, published_row

    recipe = get_recipe(name)
    typer.echo(recipe.describe(cache_root))
    if recipe.published:
        rows = [published_row(p, p.label) for p in recipe.published]
        typer.echo("\n" + markdown_table(rows, extra_columns=("source",)))


@recipes_app.command("run")
def recipes_run(
    name: str = typer.Argument(..., help="recipe name (mmcse recipes list)"),
    cache_root: str = _CACHE_ROOT,
    seeds: str = _SEEDS,
    model: str = _MODEL,
    max_steps: int = _MAX_STEPS,
    output_dir: str = Opt(None, help="run directory (default: runs/<name>); seeds in seed<k>/"),
    set_: list[str] = _SET,
    dry_run: bool = _DRY_RUN,
    overwrite: bool = _OVERWRITE,
) -> None:
    """Train a recipe over seeds and print it next to the published numbers."""
    from mmcse.recipes import get_recipe, run_recipe

    recipe = get_recipe(name)
    out = output_dir or f"runs/{name}"
    if dry_run:
        from pathlib import Path

        from mmcse.recipes.runs import describe_plan

        chosen = _recipe_seeds(recipe, seeds)
        overrides = _set_overrides(set_)
        typer.echo(
            describe_plan(
                recipe,
                [(name, Path(out), overrides)],
                cache_root=cache_root,
                seeds=chosen,
                model=model,
                max_steps=max_steps,
                user_overrides=overrides,
            )
        )
        return
    runs, table = run_recipe(
        recipe,
        cache_root=cache_root,
        seeds=_recipe_seeds(recipe, seeds),
        output_dir=out,
        model=model,
        max_steps=max_steps,
        overrides=_set_overrides(set_, overwrite),
    )
    typer.echo(table)
    typer.echo(f"results: {out}/results.json")


@app.command()
def ablate(
    recipe: str = Opt(..., "--recipe", help="recipe name (mmcse recipes list)"),
    drop: str = Opt(..., help="terms to zero: a,b+c gives rows 'w/o a' and 'w/o b & c'"),
    cache_root: str = _CACHE_ROOT,
    seeds: str = _SEEDS,
    model: str = _MODEL,
    max_steps: int = _MAX_STEPS,
    output_dir: str = Opt(None, help="run directories (default: runs/ablate/<recipe>)"),
    out: str = Opt(None, help="markdown table (default: <output-dir>/ablation.md; + .json)"),
    set_: list[str] = _SET,
    dry_run: bool = _DRY_RUN,
    overwrite: bool = _OVERWRITE,
) -> None:
    """Rerun a recipe with loss terms switched off; mean ± std and Welch p-values per row."""
    from mmcse.recipes import get_recipe
    from mmcse.recipes.ablate import ablate as run_ablation
    from mmcse.recipes.ablate import parse_drops, write_ablation

    chosen = get_recipe(recipe)
    runs_dir = output_dir or f"runs/ablate/{recipe}"
    if dry_run:
        from mmcse.recipes.ablate import ablation_plan, label_of
        from mmcse.recipes.runs import describe_plan

        overrides = _set_overrides(set_)
        plan = ablation_plan(chosen, parse_drops(drop), runs_dir, overrides)
        rows = [(label_of(terms), d, over) for terms, _, d, over in plan]
        typer.echo(
            describe_plan(
                chosen,
                rows,
                cache_root=cache_root,
                seeds=_recipe_seeds(chosen, seeds),
                model=model,
                max_steps=max_steps,
                user_overrides=overrides,
            )
        )
        return
    result = run_ablation(
        chosen,
        parse_drops(drop),
        cache_root=cache_root,
        seeds=_recipe_seeds(chosen, seeds),
        output_dir=runs_dir,
        model=model,
        max_steps=max_steps,
        overrides=_set_overrides(set_, overwrite),
    )
    md, js = write_ablation(result, out or f"{runs_dir}/ablation.md")
    typer.echo(result.markdown())
    typer.echo(f"wrote {md} and {js}")


def main() -> None:
    """Entry point: usage errors come from typer; user errors become one line and exit 2."""
    from mmcse.errors import os_error_message

    try:
        app()
    except OSError as exc:  # disk full, read-only folder, permissions: name the path
        _fail(os_error_message(exc))
    except (MmcseError, ValueError, KeyError) as exc:
        _fail(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    except KeyboardInterrupt:  # training saved last/ and printed how to resume
        sys.exit(130)


def _fail(message) -> None:
    """One ``error:`` line on its own line (an open progress bar is closed first), exit 2."""
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
    typer.echo(f"error: {message}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
