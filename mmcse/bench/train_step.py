"""``mmcse bench train``: step time of every registered method next to SimCSE, in one run.

Every method trains through the real :class:`mmcse.training.loop.Run` (cache gather, both dropout views,
every active term, its per-batch extras, its auxiliary step, AdamW) on caption batches (where
every term is active: the worst case for the multimodal methods). The synthetic fixtures go
through the real Stage-1 writers at the dims the papers' teachers have:

* plain vector roles (image, CLIP, text-teacher features): random rows written by the cache
  writer, keyed like their kind (:func:`role_kind`, from the recipes), so the trainer's id join
  is exercised; each as wide as its recipe's teacher (:func:`role_dim`);
* MCSEO's ``object`` role: a boxes file (~4 phrases per caption) run through
  :func:`pipeline.objects.extract.extract_objects` with a one-block-per-stage ResNet-50-shaped
  random teacher (2048-d like ResNet-50, at 32-px crops so generation stays fast);
* VisualCSE/AudioCSE's examples: ``image_tensor`` / ``audio_fbank`` sets from the
  :mod:`pipeline.nonling_cache` writers (random pixels, noise WAVs), so their ratios include the
  second, non-linguistic pass they take by design.

Rounds alternate between methods so drift (thermal, other load) hits all alike; the reported
step time is the median (:mod:`mmcse.bench.timing`). Random init: speed does not depend on weights.
FLOPs and MFU: :mod:`mmcse.bench.flops`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import tempfile
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch._dynamo

from mmcse.bench.flops import EncoderShape, mfu, peak_flops, train_step_flops
from mmcse.bench.timing import (
    Timing,
    peak_memory_bytes,
    quiet_profile,
    repeat,
    reset_peak_memory,
    timed,
)
from mmcse.cache import write_corpus, write_feature_set
from mmcse.errors import BadValueError, MmcseError
from mmcse.methods import Method, build_method
from mmcse.registry import METHODS
from mmcse.tiny import SIZES as TINY_SIZES
from mmcse.tiny import SPECIAL_TOKENS, build_tiny_bert
from mmcse.training.config import TrainConfig
from mmcse.training.loop import Trainer

#: cache kinds whose rows have a fixed shape (their writer's), not a teacher's width
UNPAIRED_KINDS = ("image_tensor", "audio_fbank")
#: settings that only avoid the network (speed does not depend on weights), and DALR's ℓ_CMA
#: image head: the released ℓ_CMA reads the raw image, which must be as wide as the student
#: (ViT-L/14's 768 = BERT-base's); the bench's 512-d image at every student size needs the head
METHOD_ARGS = {"visualcse": {"vit_init": "random"}, "dalr": {"cma_image_head": True}}
CAPTIONS_PER_IMAGE = 4  # several captions per image, so an image-keyed join is not the identity
PHRASES_PER_CAPTION = 4
NONLING_EXAMPLES = 48  # one batch of the papers' 48
NONLING_CLASSES = 8
AUDIO_RATE = 16000


def recipe_roles(method: str) -> dict:
    """``role → Feature(kind, teacher)`` of the method's first recipe in the catalogue: the
    teachers the papers' settings read, so the bench's sets have the widths a real run has (one
    source: :mod:`mmcse.recipes.catalogue`)."""
    from mmcse.recipes import RECIPES

    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        if recipe.method == method:
            return recipe.roles
    raise MmcseError(f"bench: method {method!r} has no recipe; add one to the catalogue")


def role_kind(role: str) -> str:
    """The cache kind of a role's set, as every recipe that reads the role has it: it decides
    the join key (image sets join on the caption's image id, text sets on the sentence id) and
    which writer builds the set."""
    from mmcse.recipes import RECIPES

    kinds = {
        feature.kind
        for name in RECIPES.names()
        for name_role, feature in RECIPES.get(name).roles.items()
        if name_role == role
    }
    if len(kinds) != 1:
        raise MmcseError(f"bench: the recipes give role {role!r} the kinds {sorted(kinds)}")
    return kinds.pop()


def role_dim(method: str, role: str) -> int:
    """The width of the role's set: its recipe teacher's (0 for fixed-shape example sets)."""
    from pipeline.teachers import TEACHER_DIMS

    feature = recipe_roles(method)[role]
    return 0 if feature.kind in UNPAIRED_KINDS else TEACHER_DIMS[feature.teacher]


def roles_of(method: Method) -> set[str]:
    """Every feature role a method instance reads, its auxiliary task's examples included."""
    roles = set(method.caption_roles) | set(method.text_roles)
    nonlinguistic = getattr(method, "nonlinguistic", None)
    return roles | {nonlinguistic} if nonlinguistic else roles


@dataclasses.dataclass
class BenchWorld:
    root: Path
    model: Path
    captions: Path
    #: (role, dim) → feature set dir (dim 0 for sets whose shape is fixed by their writer)
    features: dict[tuple[str, int], str]


@dataclasses.dataclass
class Captions:
    ids: list[str]
    texts: list[str]
    image_ids: list[str]
    images: dict[str, Path]  # image id → file (for the object extraction)


def synthetic_vocab() -> list[str]:
    """BERT-base's vocabulary size (30,522: the embedding and its gradient cost the same)."""
    return SPECIAL_TOKENS + [f"w{i}" for i in range(30522 - len(SPECIAL_TOKENS))]


def synthetic_world(
    root: Path, size: str, seq_len: int, rows: int, needs: set, varied: bool = False
) -> BenchWorld:
    """A student, a caption corpus of exactly ``seq_len`` tokens, and the ``(role, dim)`` sets
    (``varied``: also ``root / "captions-varied"``, lengths varied, for SimCSE runs)."""
    vocab = synthetic_vocab()
    model = build_tiny_bert(root / "model", size=size, vocab=vocab, max_position_embeddings=512)
    rng = np.random.default_rng(0)
    num_words = len(vocab) - len(SPECIAL_TOKENS)
    captions = write_captions(root, rng, rows, seq_len, num_words)
    features = {}
    for role, dim in sorted(needs):
        features[role, dim] = str(write_role(root, role, dim, captions, rng))
    if varied:
        write_captions(root, rng, rows, seq_len, num_words, varied=True)
    return BenchWorld(root, model, root / "captions", features)


def write_captions(
    root: Path, rng, rows: int, seq_len: int, num_words: int, varied: bool = False
) -> Captions:
    """Captions of ``seq_len - 2`` distinct words (so phrases match once), ids sorted as the
    Stage-1 extraction orders them, and one random image file per ``CAPTIONS_PER_IMAGE``.

    ``varied`` (corpus ``captions-varied``): word counts drawn from a normal of mean
    ``0.4 · seq_len`` and sd ``0.15 · seq_len``, clipped to ``[4, seq_len - 2]`` — short captions
    (COCO-like) whose batches stop well short of ``seq_len``: dynamic padding's good case."""
    from PIL import Image

    from pipeline.datasets.base import caption_id

    name = "captions-varied" if varied else "captions"
    (root / f"images-{name}").mkdir()
    ids, texts, image_ids, images = [], [], [], {}
    for n in range(-(-rows // CAPTIONS_PER_IMAGE)):
        image_id = f"img{n:06d}"
        images[image_id] = root / f"images-{name}" / f"{image_id}.png"
        pixels = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images[image_id])
        for k in range(CAPTIONS_PER_IMAGE):
            count = varied_length(rng, seq_len) if varied else seq_len - 2
            words = rng.choice(num_words, size=count, replace=False)
            ids.append(caption_id(image_id, k))
            texts.append(" ".join(f"w{i}" for i in words))
            image_ids.append(image_id)
    write_corpus(root / name, ids, texts, image_ids=image_ids, dataset="bench", split="train")
    return Captions(ids, texts, image_ids, images)


def varied_length(rng, seq_len: int) -> int:
    return int(np.clip(round(rng.normal(0.4 * seq_len, 0.15 * seq_len)), 4, seq_len - 2))


def write_role(root: Path, role: str, dim: int, captions: Captions, rng) -> Path:
    kind = role_kind(role)
    if kind == "object":
        return write_objects(root, captions)
    if kind in ("image_tensor", "audio_fbank"):
        return write_nonlinguistic(root, kind, rng)
    ids = sorted(set(captions.image_ids)) if kind == "image" else captions.ids
    out = root / f"{role}-{dim}"
    values = rng.standard_normal((len(ids), dim), dtype=np.float32).astype(np.float16)
    write_feature_set(
        out,
        ids,
        values,
        kind=kind,
        dim=dim,
        dtype="float16",
        dataset="bench",
        split="train",
        producer={"teacher": "random-bench"},
    )
    return out


def write_objects(root: Path, captions: Captions) -> Path:
    """MCSEO's objects table and 2048-d object features, through the real extraction."""
    from pipeline.datasets.base import DatasetRecords, ImageRecord
    from pipeline.extract import RunOptions
    from pipeline.objects.extract import BoxesFile, ObjectSettings, extract_objects

    boxes = root / "boxes.jsonl"
    with boxes.open("w", encoding="utf-8") as f:
        for text, image_id in zip(captions.texts, captions.image_ids, strict=True):
            words = text.split()
            for p in range(PHRASES_PER_CAPTION):  # spread over the caption, boxes inside 64 px
                phrase = words[p * len(words) // PHRASES_PER_CAPTION]
                box = [4 * p, 4 * p, 32 + 4 * p, 40 + 4 * p]
                row = {"image_id": image_id, "caption": text, "phrase": phrase, "box": box}
                f.write(json.dumps(row) + "\n")
    by_image: dict[str, list[str]] = {}
    for text, image_id in zip(captions.texts, captions.image_ids, strict=True):
        by_image.setdefault(image_id, []).append(text)
    records = DatasetRecords(
        "bench",
        "train",
        [ImageRecord(i, captions.images[i], tuple(t)) for i, t in by_image.items()],
    )
    extract_objects(
        records,
        BoxesFile(boxes),
        None,
        resnet50_shaped_teacher(),
        "resnet50",
        root,  # its captions corpus is checked against the bench's (same ids and texts)
        settings=ObjectSettings(masks="box", caption_policy="all"),
        options=RunOptions(shard_size=4096, batch_size=256, workers=0, progress=False),
    )
    return root / "object-resnet50"


def resnet50_shaped_teacher():
    """Random one-Bottleneck-per-stage ResNet: ResNet-50's 2048-d output at a fraction of the
    cost (the object term's step time depends on the dim, not on the teacher)."""
    from torchvision.models.resnet import Bottleneck, ResNet

    from pipeline.teachers.resnet import TINY_PREPROCESS, ResNetTeacher
    from pipeline.teachers.runtime import WeightsInfo, seeded

    with seeded(0):
        net = ResNet(Bottleneck, [1, 1, 1, 1])
    dim = net.fc.in_features
    net.fc = torch.nn.Identity()
    weights = WeightsInfo("random", "resnet-bottleneck-1111", "random", 0)
    return ResNetTeacher("resnet50", dim, net, weights, size="tiny", preprocess=TINY_PREPROCESS)


def write_nonlinguistic(root: Path, kind: str, rng) -> Path:
    """VisualCSE's uint8 image tensors or AudioCSE's fbanks, at the writers' real row shapes."""
    from pipeline import nonling_cache as nc

    out = root / kind
    if kind == "image_tensor":
        examples = [
            nc.Example(f"c{i % NONLING_CLASSES}/x{i}", rng.integers(0, 256, (64, 64, 3), np.uint8))
            for i in range(NONLING_EXAMPLES)
        ]
        nc.write_image_tensors(examples, out, dataset="bench", workers=0)
        return out
    examples = []
    for i in range(NONLING_EXAMPLES):
        path = root / "wavs" / f"c{i % NONLING_CLASSES}" / f"x{i}.wav"
        write_noise_wav(path, rng)
        examples.append(nc.Example(f"c{i % NONLING_CLASSES}/x{i}", path))
    nc.write_audio_fbanks(examples, out, dataset="bench", workers=0)
    return out


def write_noise_wav(path: Path, rng, seconds: float = 0.25) -> None:
    """Short noise: the fbank writer pads every row to its fixed ``[1024, 128]`` shape."""
    samples = rng.integers(-8000, 8000, size=int(seconds * AUDIO_RATE), dtype=np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(AUDIO_RATE)
        f.writeframes(samples.astype("<i2").tobytes())


def method_needs(name: str) -> set[tuple[str, int]]:
    """The ``(role, dim)`` feature sets a method trains on."""
    return {(role, role_dim(name, role)) for role in roles_of(build_method(name, **args_of(name)))}


def args_of(name: str) -> dict:
    return METHOD_ARGS.get(name, {})


def bench_config(
    world: BenchWorld,
    method: str,
    batch: int,
    seq_len: int,
    device: str,
    precision,
    captions: Path | None = None,
    **fast_paths,
) -> TrainConfig:
    """The trainer's config for ``method`` on the bench world's caption batches (every term
    active); ``fast_paths`` are :class:`~mmcse.training.config.TrainConfig` fields (their
    ``method_args`` added to the bench's own)."""
    method_args = {**args_of(method), **fast_paths.pop("method_args", {})}
    return TrainConfig(
        model=str(world.model),
        method=method,
        method_args=method_args,
        caption_corpus=str(captions or world.captions),
        features={role: world.features[role, dim] for role, dim in method_needs(method)},
        mixing="caption-only",
        batch_size=batch,
        max_seq_length=seq_len,
        eval_data="",
        final_eval=False,
        device=device,
        precision=precision,
        output_dir=str(world.root / "runs" / method),
        **fast_paths,
    )


def bench_trainer(world: BenchWorld, method: str, *args, **kwargs) -> Trainer:
    """The real :class:`~mmcse.training.loop.Trainer`, set up (its own optimizer groups and
    schedule, its captured or eager update) on the bench world."""
    return Trainer(bench_config(world, method, *args, **kwargs)).setup()


@dataclasses.dataclass
class BenchState:
    """A trainer stepping through its own batches (gathered and copied ahead, as in a run)."""

    trainer: Trainer
    batches: Iterator
    data_wait_s: float = 0.0
    widths: list[int] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, world: BenchWorld, method: str, batch: int, seq_len: int, device, precision, **kw):
        trainer = bench_trainer(world, method, batch, seq_len, device, precision, **kw)
        return cls(trainer, endless_batches(trainer))

    def step(self) -> None:
        """What the training loop does per step: the trainer's step, then the loss window."""
        _, batch, waited = next(self.batches)
        parts, host = self.trainer.step(batch)
        self.trainer.state.step += 1
        self.trainer.window.add_step(self.trainer.state.step, batch.kind, parts, host, waited)
        self.data_wait_s += waited
        self.widths.append(int(batch.input_ids.shape[1]))

    def reset(self) -> None:
        self.data_wait_s, self.widths = 0.0, []


def endless_batches(trainer: Trainer) -> Iterator:
    """The trainer's batches, epoch after epoch (a bench runs as many steps as it needs)."""
    epoch = 0
    while True:
        yield from trainer.batches(epoch, 0)
        epoch += 1


@dataclasses.dataclass
class StepStats:
    """Timed steps of one run: median step, data-wait share, padded widths, peak memory."""

    timing: Timing = dataclasses.field(default_factory=Timing)
    data_wait_s: float = 0.0
    widths: list[int] = dataclasses.field(default_factory=list)
    peak_memory_bytes: int | None = None

    @property
    def step_s(self) -> float:
        return self.timing.seconds

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / sum(self.timing.samples)

    @property
    def mean_width(self) -> float:
        return statistics.fmean(self.widths)


def time_variants(
    states: dict[str, BenchState], device, steps: int, warmup: int, rounds: int
) -> dict[str, StepStats]:
    """Warm every state up, then time them in alternating rounds (drift hits all alike)."""
    for state in states.values():
        for _ in range(warmup):
            state.step()
    stats = {name: StepStats() for name in states}
    per_round = max(1, steps // rounds)
    for _ in range(rounds):
        for name, state in states.items():
            state.reset()
            reset_peak_memory(device)
            stats[name].timing.extend(repeat(state.step, device, warmup=0, repeats=per_round))
            stats[name].data_wait_s += state.data_wait_s
            stats[name].widths += state.widths
            peak = peak_memory_bytes(device)
            if peak is not None:
                stats[name].peak_memory_bytes = max(stats[name].peak_memory_bytes or 0, peak)
    return stats


#: profiler events of the kernels inductor generates for the CPU (``graph_<id>_cpp_fused_...``;
#: recorded when compiled with ``torch._inductor.config.cpp.enable_kernel_profile``)
COMPILED_CPU_KERNEL = re.compile(r"^(graph_\d+_)?cpp_")
#: profiler events spanning a compiled graph (its forward; a backward outside it, if any)
GRAPH_EVENTS = ("Torch-Compiled Region", "CompiledFunctionBackward")
#: operators that read a device value on the host (on CUDA: a sync that stalls the queue)
HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")


def count_ops(state: BenchState) -> int:
    """Leaf ``aten::`` operators (and compiled CPU kernels) one whole training step dispatches,
    the update included: on a GPU each is at least one launch, so this counts what a
    launch-bound step pays for. Deterministic, so it compares methods on any machine."""
    return len(step_ops(profile_step(state)))


def profile_step(state: BenchState) -> list:
    """The profiler's events of one step."""
    from torch.profiler import ProfilerActivity

    with quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
        state.step()
    return list(prof.events())


def within(event, spans: list[tuple[float, float]]) -> bool:
    return any(start <= event.time_range.start <= end for start, end in spans)


def spans_of(events: list, prefixes: tuple[str, ...]) -> list[tuple[float, float]]:
    return [(e.time_range.start, e.time_range.end) for e in events if e.name.startswith(prefixes)]


def step_ops(events: list) -> list:
    """The events :func:`count_ops` counts: leaf ATen operators and compiled CPU kernels."""
    return [e for e in events if is_leaf_aten(e) or COMPILED_CPU_KERNEL.match(e.name)]


def ops_outside_graphs(events: list) -> list:
    """The counted operators of a step that ran outside its compiled graphs: the host work a
    captured step still dispatches one by one."""
    graphs = spans_of(events, GRAPH_EVENTS)
    return [e for e in step_ops(events) if not within(e, graphs)]


def host_reads(events: list) -> int:
    return sum(1 for e in events if e.name in HOST_READS)


def is_leaf_aten(event) -> bool:
    """An ``aten::`` operator that calls no other: the one that does the work."""
    return event.name.startswith("aten::") and not any(
        c.name.startswith("aten::") for c in event.cpu_children
    )


def step_flops(trainer: Trainer, batch: int, width: int) -> dict[str, int]:
    """Counted FLOPs of one step: the text step and, for VisualCSE/AudioCSE, the auxiliary
    image/audio step (both views of its examples through the encoder's layers)."""
    shape = EncoderShape.of(trainer.encoder.backbone.config)
    flops = {"text": train_step_flops(shape, batch, width)}
    aux = trainer.aux
    if aux is not None and aux.settings.weight != 0:
        tokens = aux.heads["patch_embed"].num_patches + 1  # the patches and [CLS]
        flops["auxiliary"] = train_step_flops(shape, aux.settings.batch_size, tokens)
    return flops


def step_report(stats: StepStats, state: BenchState, batch: int, peak: float | None) -> dict:
    """One run's figures: step ms, tokens/s, counted FLOPs (every step) and MFU, data wait,
    peak memory."""
    width = stats.mean_width
    flops = step_flops(state.trainer, batch, round(width))
    total = sum(flops.values())
    return {
        "step_ms": 1000 * stats.step_s,
        "step_ms_range": [1000 * min(stats.timing.samples), 1000 * max(stats.timing.samples)],
        "steps_per_s": 1 / stats.step_s,
        "tokens_per_s": batch * width / stats.step_s,
        "mean_width": width,
        "flops_per_step": total,
        "flops_by_step": flops,
        "mfu": mfu(total, stats.step_s, peak),
        "data_wait_share": stats.data_wait_share,
        "peak_memory_bytes": stats.peak_memory_bytes,
        "samples_ms": [1000 * t for t in stats.timing.samples],
    }


def ratio_with_spread(method: dict, simcse: dict) -> dict:
    """The method's step ÷ SimCSE's, with the range the timed rounds allow (min ÷ max and
    max ÷ min); ``disagree``: the rounds' ranges do not overlap the median ratio's side."""
    low = min(method["samples_ms"]) / max(simcse["samples_ms"])
    high = max(method["samples_ms"]) / min(simcse["samples_ms"])
    ratio = method["step_ms"] / simcse["step_ms"]
    spread = max(high - ratio, ratio - low)
    return {"ratio": ratio, "ratio_range": [low, high], "noisy": spread > 0.1 * ratio}


def bench_methods(
    world: BenchWorld,
    names: list[str],
    batch: int,
    seq_len: int,
    device: str,
    precision: str = "auto",
    steps: int = 20,
    warmup: int = 3,
    rounds: int = 4,
    peak: float | None = None,
    capture: str = "off",
    on_method=None,
) -> dict[str, dict]:
    """:func:`step_report` per method (``capture`` as the trainer's flag; the report says which
    step ran) plus its ``ratio`` to SimCSE's, measured with it in alternating rounds. A captured
    method also reports the seconds of its first step (the compile, cold unless inductor's
    on-disk cache holds its graphs), operators outside its graphs and host reads per step.
    ``on_method(name, report)`` is called after each (a suite writes its JSON there)."""
    names = ["simcse", *[n for n in names if n != "simcse"]]
    reports: dict[str, dict] = {}
    simcse = None
    for name in names:
        torch._dynamo.reset()  # a fresh Dynamo cache per method (inductor's disk cache stays)
        state = BenchState.of(world, name, batch, seq_len, device, precision, capture=capture,
                              dynamic_padding=capture == "off")  # fmt: skip
        compile_s = timed(state.step, device)  # compiles when captured
        states = {name: state} if simcse is None else {"simcse": simcse, name: state}
        stats = time_variants(states, torch.device(device), steps, warmup, rounds)
        report = step_report(stats[name], state, batch, peak)
        events = profile_step(state)
        report.update(
            step=state.trainer.capture,
            first_step_s=compile_s,
            ops_per_step=len(step_ops(events)),
            ops_outside_graphs=len(ops_outside_graphs(events)),
            host_reads_per_step=host_reads(events),
        )
        if simcse is None:
            simcse, reports[name] = state, report
            report.update(ratio=1.0, ratio_range=[1.0, 1.0], noisy=False)
        else:
            report["simcse_same_rounds"] = step_report(stats["simcse"], simcse, batch, peak)
            report.update(ratio_with_spread(report, report["simcse_same_rounds"]))
            reports[name] = report
            del state
        if on_method is not None:
            on_method(name, report)
    return reports


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
    peak_tflops: float | None = None,
) -> dict:
    """Median step seconds per method, ratios to SimCSE, SimCSE steps/s, MFU where a peak is
    known (:func:`mmcse.bench.flops.peak_flops`), and every method's full :func:`step_report`."""
    if size not in TINY_SIZES:
        raise BadValueError(f"--size must be one of {', '.join(TINY_SIZES)}, not {size!r}")
    if min(steps, rounds, batch, seq_len) < 1:
        raise BadValueError("--steps, --batch-size and --seq-len must be at least 1")
    names = methods or METHODS.names()
    names = ["simcse", *[n for n in names if n != "simcse"]]
    peak, peak_source = peak_flops(device, peak_tflops)
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as tmp:
        needs = set().union(*(method_needs(n) for n in names))
        world = synthetic_world(Path(tmp), size, seq_len, batch * 8, needs)
        reports = bench_methods(
            world, names, batch, seq_len, device, precision, steps, warmup, rounds, peak
        )
    result = {
        "size": size,
        "device": device,
        "batch": batch,
        "seq_len": seq_len,
        "step_seconds": {n: r["step_ms"] / 1000 for n, r in reports.items()},
        "ratios": {n: r["ratio"] for n, r in reports.items()},
        "simcse_steps_per_s": reports["simcse"]["steps_per_s"],
        "peak_source": peak_source,
        "methods": reports,
    }
    if reports["simcse"]["mfu"] is not None:
        result["simcse_mfu"] = reports["simcse"]["mfu"]
    return result


def train_report(
    size: str = "tiny",
    device: str = "cpu",
    steps: int = 20,
    batch: int = 64,
    seq_len: int = 32,
    methods: list[str] | None = None,
    gather_rows: int = 1_000_000,
) -> Iterator[str]:
    """``mmcse bench train``: :func:`bench_train`'s step times and ratios, then cache gather
    rows/s (:func:`mmcse.bench.gather.gather_throughput`), as lines when each is measured."""
    from mmcse.bench.gather import gather_throughput

    r = bench_train(size, device, steps, batch=batch, seq_len=seq_len, methods=methods)
    yield f"device {r['device']}  size {r['size']}  batch {r['batch']} x len {r['seq_len']}"
    for name, seconds in r["step_seconds"].items():
        yield f"step {name}: {seconds * 1000:.1f} ms"
    for name, report in r["methods"].items():
        if name != "simcse":
            low, high = report["ratio_range"]
            flag = "  (rounds disagree: not a finding)" if report["noisy"] else ""
            yield f"ratio {name}/simcse: {report['ratio']:.3f} (rounds {low:.2f}-{high:.2f}){flag}"
    yield f"simcse steps/s: {r['simcse_steps_per_s']:.2f}"
    if "simcse_mfu" in r:
        yield f"simcse MFU: {100 * r['simcse_mfu']:.1f}%"
    g = gather_throughput(num_rows=gather_rows, dim=2048, dtype="float16", batch=128)
    yield f"cache gather: {g['rows_per_s']:,.0f} rows/s (128-id batches, {gather_rows:,} x 2048 fp16)"
