"""What a run's plan says about batch mixing: the rule, the batches of each kind the run will
take, and — for a two-corpus run that mixes otherwise — what the recipes' mixing would take.

Plain ``mmcse train`` mixes with ``interleave`` (each corpus once per epoch); every two-corpus
recipe mixes with ``mcse-train-mix`` (MCSE's released ``train_mix.py``). On a small caption set
the two differ a lot (one caption batch in forty steps, or several), so the plan shows both.

:func:`preview` is the plan from the corpora alone (preflight: nothing tokenised), printed by
``--dry-run``; :func:`plan_warnings` is what preflight warns about before any run: a multimodal
method that would see few caption batches, a corpus smaller than one batch. A run's whole plan
(its batches, evaluations, saves, capture, packing, disk) is one :class:`PlanRecord`, built by
:func:`plan_record` once the student has loaded, saved as ``plan.json`` and printed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmcse import distributed
from mmcse.errors import MmcseError
from mmcse.methods import Method
from mmcse.packing import packed_row_width
from mmcse.training.batch_order import (
    CAPTION,
    RECIPES_MIXING,
    TEXT,
    batches_in_run,
    mixing_rule,
    train_mix_counts,
)
from mmcse.training.checkpoint_writer import format_bytes
from mmcse.training.corpora import left_out_summary
from mmcse.training.data import TrainData
from mmcse.training.evaluation_steps import eval_steps

if TYPE_CHECKING:
    import torch

    from mmcse.training.config import TrainConfig

#: a multimodal run with a smaller share of caption batches, and fewer of them than
#: MIN_CAPTION_BATCHES, is warned to be nearly text-only. Both, because MCSE's published
#: Wiki1M + Flickr30k setting is ~3 % caption batches yet ~470 of them an epoch: multimodal by
#: design, not by accident (a share alone would warn at every faithful recipe run)
MIN_CAPTION_SHARE = 0.05
MIN_CAPTION_BATCHES = 100


def mixing_plan(data: TrainData, plan: RunPlan) -> dict[str, Any]:
    """``mixing_rule``, ``batches_in_run`` and, when it differs, ``recipes_mixing`` (the
    recipes' mixing and its batches per epoch here; None where it cannot run). The mixing and
    epochs are the data's run's (``data.cfg``), so the rule and the counts cannot disagree."""
    mixing, epochs = data.cfg.mixing, data.cfg.epochs
    passes = data.batches_per_pass(plan.global_batch)
    out: dict[str, Any] = {
        "mixing_rule": mixing_rule(mixing, passes),
        "batches_in_run": batches_in_run(data, plan.global_batch, plan.total_steps, epochs),
    }
    if len(passes) == 2 and mixing != RECIPES_MIXING:
        try:
            counts = train_mix_counts(passes[TEXT], passes[CAPTION])
        except MmcseError:  # fewer text than caption batches: the released order divides by 0
            counts = None
        out["recipes_mixing"] = {"mixing": RECIPES_MIXING, "batches_per_epoch": counts}
    return out


@dataclass(frozen=True)
class RunPlan:
    """The batch plan of a run: sentences per optimizer step across every process, the batches
    of each kind in one epoch, and the optimizer steps the run takes (:func:`plan_run`)."""

    global_batch: int
    batches_per_epoch: dict[str, int]
    total_steps: int

    @property
    def steps_per_epoch(self) -> int:
        return sum(self.batches_per_epoch.values())


def plan_run(data: TrainData, world_size: int | None = None) -> RunPlan:
    """The run's batch plan from its data and config (``data.cfg``): the one place the global
    batch and the step count are computed. ``world_size`` defaults to the launcher's
    (``WORLD_SIZE``), so the plan is the same before and after the processes join: preflight
    makes it, the trainer keeps it, and ``--dry-run`` and plan.json show it."""
    cfg = data.cfg
    world = distributed.env_world_size() if world_size is None else world_size
    global_batch = cfg.batch_size * world
    per_epoch = data.batches_per_epoch(global_batch, world)
    return RunPlan(global_batch, per_epoch, total_steps(per_epoch, cfg.epochs, cfg.max_steps))


def total_steps(batches_per_epoch: dict[str, int], epochs: int, max_steps: int) -> int:
    """Optimizer steps of a run: every batch of every epoch, cut at ``max_steps`` (when > 0)."""
    total = sum(batches_per_epoch.values()) * epochs
    return min(total, max_steps) if max_steps > 0 else total


def preview(data: TrainData, plan: RunPlan) -> dict[str, Any]:
    """The plan's batch figures before the run starts (what ``--dry-run`` prints and preflight
    warns about): ``plan`` (:func:`plan_run`) with the corpora's sizes, the batches of each kind
    the run takes and the mixing rule."""
    cfg = data.cfg
    return {
        "sentences": {kind: len(src) for kind, src in data.sources.items()},
        "mixing": cfg.mixing,
        "global_batch": plan.global_batch,
        "batches_per_epoch": plan.batches_per_epoch,
        "epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "total_steps": plan.total_steps,
        **mixing_plan(data, plan),
    }


def describe_preview(plan: dict[str, Any]) -> str:
    """``--dry-run``'s plan: the batches of each kind, per epoch and in the whole run."""
    per_epoch = ", ".join(f"{n} {kind}" for kind, n in plan["batches_per_epoch"].items())
    taken = " + ".join(f"{n} {kind}" for kind, n in plan["batches_in_run"].items())
    cut = f" (max_steps {plan['max_steps']})" if plan["max_steps"] else ""
    lines = [
        f"plan: mixing {plan['mixing']} ({plan['mixing_rule']})",
        f"  per epoch: {per_epoch} batches of {batch_words(plan)} x {plan['epochs']} "
        f"epoch(s) -> {plan['total_steps']} steps{cut}",
        f"  this run: {taken} batches in {plan['total_steps']} steps",
    ]
    lines += [f"  note: {note}" for note in whole_corpus_batches(plan)]
    return "\n".join(lines)


def batch_sizes(global_batch: int, sources: dict) -> dict[str, int]:
    """The sentences a step of each batch kind trains on (all ranks): the global batch, or a
    corpus smaller than that whole (plan.json's ``batch_sizes``; ``global_batch`` is what
    was asked)."""
    return {kind: min(global_batch, len(source)) for kind, source in sources.items()}


def batch_words(plan: dict[str, Any]) -> str:
    """The batch size the run really trains with: ``--batch-size`` (x world size), or, for a
    corpus smaller than that, the corpus itself (``12 (the whole text corpus; --batch-size
    100000 is larger)``), so the plan's batch line never names a batch no step has."""
    batch = plan["global_batch"]
    small = {kind: n for kind, n in plan["sentences"].items() if n < batch}
    if not small:
        return str(batch)
    if len(small) == len(plan["sentences"]):
        sizes = ", ".join(str(n) for n in small.values())
        corpora = " and ".join(small)
        return f"{sizes} (the whole {corpora} corpus; the batch size asked, {batch}, is larger)"
    kinds = ", ".join(f"{kind}: {n}, its whole corpus" for kind, n in small.items())
    return f"{batch} ({kinds})"


def whole_corpus_batches(plan: dict[str, Any]) -> list[str]:
    """A corpus smaller than one batch is one batch of all its sentences per pass (the
    released loaders keep a partial batch): said, since the plan's batch size is not its size."""
    batch = plan["global_batch"]
    return [
        f"the {kind} corpus has {n} sentences, fewer than a batch of {batch}: each pass trains "
        f"it as one batch of {n} ({n - 1} in-batch negatives, not {batch - 1})"
        for kind, n in plan["sentences"].items()
        if n < batch
    ]


def plan_warnings(plan: dict[str, Any], method: Method) -> list[str]:
    """What preflight warns about: a multimodal method (terms only caption batches train) that
    will see few caption batches (:data:`MIN_CAPTION_SHARE`, :data:`MIN_CAPTION_BATCHES`), and
    corpora smaller than a batch."""
    warnings = whole_corpus_batches(plan)
    taken = plan["batches_in_run"]
    caption_terms = [t.name for t in method.active_terms() if t.on == CAPTION]
    steps, captions = sum(taken.values()), taken.get(CAPTION, 0)
    few = captions < MIN_CAPTION_BATCHES and captions < MIN_CAPTION_SHARE * steps
    if caption_terms and steps and few:
        warnings.append(
            f"{method.name} will train {captions} caption batches in {steps} steps "
            f"({100 * captions / steps:.1f} %, under "
            f"{MIN_CAPTION_SHARE:.0%}): its caption-only terms ({', '.join(caption_terms)}) "
            "act on those alone, so the run is nearly text-only; give a larger caption corpus "
            "or a smaller text corpus, or --mixing caption-only"
        )
    return warnings


# ---- the plan record -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRecord:
    """What a run's plan says, built once (:func:`plan_record`): saved as ``plan.json``
    (:meth:`as_json`: these keys in this order, which reports and tests read) and printed at
    the start (:func:`mmcse.training.metrics.describe_plan` renders :meth:`as_json`)."""

    method: str
    device: str
    precision: str
    world_size: int
    sentences: dict[str, int]
    mixing: str
    global_batch: int
    batches_per_epoch: dict[str, int]
    steps_per_epoch: int
    epochs: int
    max_steps: int
    total_steps: int
    eval_data: str | None  # the dev folder; None: no dev evaluation
    eval_steps: int
    evals: int  # the dev evaluations the run makes
    final_eval: bool
    save_every: int  # steps between last/ saves (:func:`steps_between_saves`)
    resumed_from_step: int | None
    capture: str  # :func:`capture_note`
    student: dict | None  # the student as chosen (:meth:`mmcse.students.StudentChoice.record`)
    extended_from: dict | None  # a finished run extended: where it had ended
    checkpoint_bytes: dict[str, int]  # :func:`mmcse.training.checkpoint_writer.trained_sizes`
    keep_last_checkpoint: bool
    left_out: dict  # :func:`mmcse.training.corpora.left_out_summary`
    mixing_rule: str  # this and the next two: :func:`mixing_plan`
    batches_in_run: dict[str, int]
    recipes_mixing: dict | None  # left out of plan.json when None
    batch_sizes: dict[str, int]  # what a step of each kind trains on (:func:`batch_sizes`)
    packing: str  # :func:`packing_note`

    def as_json(self) -> dict[str, Any]:
        values = {field.name: getattr(self, field.name) for field in fields(self)}
        if self.recipes_mixing is None:
            del values["recipes_mixing"]
        return values


def plan_record(
    cfg: TrainConfig,
    plan: RunPlan,
    data: TrainData,
    *,
    device: torch.device,
    precision: str,
    capture: str,
    student: dict | None,
    eval_dir: Path | None,
    resumed_from: int | None,
    extended_from: dict | None,
    checkpoint_bytes: dict[str, int],
) -> PlanRecord:
    """The plan of a run set up on ``device`` (``capture``: the resolved mode, ``off``,
    ``forward`` or ``whole``; ``student``: its architecture, attention and dropout as chosen),
    its dev set in ``eval_dir``, resumed after ``resumed_from`` (None: a new run)."""
    mixing = mixing_plan(data, plan)
    return PlanRecord(
        method=cfg.method,
        device=str(device),
        precision=precision,
        world_size=distributed.world_size(),
        sentences={kind: len(source) for kind, source in data.sources.items()},
        mixing=cfg.mixing,
        global_batch=plan.global_batch,
        batches_per_epoch=plan.batches_per_epoch,
        steps_per_epoch=plan.steps_per_epoch,
        epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        total_steps=plan.total_steps,
        eval_data=None if eval_dir is None else str(eval_dir),
        eval_steps=cfg.eval_steps,
        evals=len(eval_steps(cfg.eval_steps, plan.total_steps, cfg.eval_last_step)),
        final_eval=bool(cfg.final_eval and eval_dir is not None),
        save_every=steps_between_saves(cfg),
        resumed_from_step=resumed_from,
        capture=capture_note(cfg, capture, device),
        student=student,
        extended_from=extended_from,
        checkpoint_bytes=checkpoint_bytes,
        keep_last_checkpoint=cfg.keep_last_checkpoint,
        left_out=left_out_summary(data.sources),
        mixing_rule=mixing["mixing_rule"],
        batches_in_run=mixing["batches_in_run"],
        recipes_mixing=mixing.get("recipes_mixing"),
        batch_sizes=batch_sizes(plan.global_batch, data.sources),
        packing=packing_note(cfg),
    )


def steps_between_saves(cfg: TrainConfig) -> int:
    """Steps between last/ saves: ``save_every``, else ``eval_steps``."""
    return cfg.save_every or cfg.eval_steps


def packing_note(cfg: TrainConfig) -> str:
    """How a batch's sentences reach the encoder (:mod:`mmcse.packing`)."""
    rows = f"rows of {packed_row_width(cfg.max_seq_length)} tokens"
    if cfg.packing:
        return f"packed: each batch's sentences end to end in {rows} (no padding)"
    if cfg.dynamic_padding:
        return "padded to the longest sentence of each batch"
    return f"padded to {cfg.max_seq_length} tokens"


def capture_note(cfg: TrainConfig, capture: str, device: torch.device) -> str:
    """What the plan says about capture (``capture``: the resolved mode;
    :mod:`mmcse.training.fastpath`)."""
    if capture == "off":
        return f"off (--capture {cfg.capture} on {device.type}): eager step"
    replay = "replayed as CUDA graphs" if device.type == "cuda" else "no CUDA graphs"
    what = (
        "the whole update (forward, backward, clipping, AdamW, schedule)"
        if capture == "whole"
        else "forward and backward, the update eager"
        + ("" if cfg.capture == "forward" else " (DDP or fp16)")
    )
    return (
        f"on: {what} as one compiled graph per batch kind and batch size, {replay}; "
        f"batches padded to {cfg.max_seq_length} tokens"
    )


def describe_checkpoints(sizes: dict, keep_last: bool) -> str:
    """The plan's disk line."""
    after = "kept" if keep_last else "removed once the run finishes (keep_last false)"
    return (
        f"  disk: best/ about {format_bytes(sizes['best'])}, last/ about "
        f"{format_bytes(sizes['last'])} (weights + AdamW's moments; {after})"
    )
