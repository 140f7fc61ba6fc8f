"""The ``train`` section of ``mmcse bench all``: every registered method's step next to SimCSE's.

Every method trains through the real :class:`mmcse.training.loop.Trainer` (``setup()``, then its
public ``train_step``, the training loop's: cache gather, both dropout views, every active term,
its per-batch extras, its auxiliary update, AdamW, the run's state and loss window) on caption
batches (every term active: the worst case for
the multimodal methods) of the synthetic cache (:mod:`mmcse.demo.synthetic`). Rounds alternate
between a method and SimCSE so drift (thermal, other load) hits both alike; the reported step
time is the median (:mod:`mmcse.bench.timing`). Random init: speed does not depend on weights.
FLOPs and MFU: :mod:`mmcse.bench.flops`.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import statistics
from collections.abc import Iterator

import torch
import torch._dynamo

from mmcse.bench.flops import EncoderShape, mfu, train_step_flops
from mmcse.bench.timing import (
    Timing,
    peak_memory_bytes,
    quiet_profile,
    repeat,
    reset_peak_memory,
    timed,
)
from mmcse.demo.synthetic import SyntheticWorld, args_of, method_needs
from mmcse.training.config import TrainConfig
from mmcse.training.loop import Trainer

#: the bench's capture choices → the trainer's ``--capture`` (``forward``: forward/backward
#: compiled, update eager; ``whole``: the whole update one graph)
CAPTURE_FLAGS = {"off": "off", "forward": "forward", "whole": "on"}


def bench_config(
    world: SyntheticWorld,
    method: str,
    batch: int,
    seq_len: int,
    device: str,
    precision,
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
        caption_corpus=str(world.captions),
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


def bench_trainer(world: SyntheticWorld, method: str, *args, **kwargs) -> Trainer:
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
    def of(
        cls, world: SyntheticWorld, method: str, batch: int, seq_len: int, device, precision, **kw
    ):
        trainer = bench_trainer(world, method, batch, seq_len, device, precision, **kw)
        return cls(trainer, endless_batches(trainer))

    def step(self) -> None:
        """The training loop's step (:meth:`~mmcse.training.loop.Trainer.train_step`: the
        updates, the run's state, the loss window, whose host reads are part of a step's
        cost)."""
        epoch, index, batch, waited = next(self.batches)
        self.trainer.train_step(batch, epoch, index, waited)
        self.data_wait_s += waited
        self.widths.append(int(batch.input_ids.shape[1]))

    def reset(self) -> None:
        self.data_wait_s, self.widths = 0.0, []


def endless_batches(trainer: Trainer) -> Iterator:
    """``(epoch, index, batch, waited)`` of the trainer's run, replayed from its first as often
    as a bench needs.

    The run's own batches, not further epochs: a packed run's row budget is fixed for the batches
    it draws (:meth:`~mmcse.training.data.TrainData.fix_pack_budgets`), and a later epoch's
    shuffle may need more (on an H200, MCSE packed at batch 128: "a batch needs 31 packed rows,
    more than its budget of 30")."""
    while True:
        epochs = (epoch_batches(trainer, epoch) for epoch in itertools.count())
        yield from itertools.islice(itertools.chain.from_iterable(epochs), trainer.total)


def epoch_batches(trainer: Trainer, epoch: int) -> Iterator:
    for index, batch, waited in trainer.batches(epoch, 0):
        yield epoch, index, batch, waited


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
    """Leaf ``aten::`` operators (and compiled CPU kernels) of a step, the update included: on a
    GPU each is at least one launch, so this counts what a launch-bound step pays for."""
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
    world: SyntheticWorld,
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
    packing: bool = False,
    on_method=None,
) -> dict[str, dict]:
    """:func:`step_report` per method (``capture``: a key of :data:`CAPTURE_FLAGS`; ``packing``
    the trainer's ``--packing``) plus its ``ratio`` to SimCSE's, measured with it in alternating
    rounds. Also the seconds of its first step (the compile, when captured), its operators
    outside compiled graphs and its host reads per step. ``on_method(name, report)`` is called
    after each (the suite writes its JSON there)."""
    names = ["simcse", *[n for n in names if n != "simcse"]]
    reports: dict[str, dict] = {}
    simcse = None
    for name in names:
        torch._dynamo.reset()  # a fresh Dynamo cache per method (inductor's disk cache stays)
        state = BenchState.of(
            world,
            name,
            batch,
            seq_len,
            device,
            precision,
            capture=CAPTURE_FLAGS[capture],
            packing=packing,
            dynamic_padding=capture == "off",
        )
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
