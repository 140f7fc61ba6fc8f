"""What a run's plan says about batch mixing: the rule, the batches of each kind the run will
take, and — for a two-corpus run that mixes otherwise — what the recipes' mixing would take.

Plain ``mmcse train`` mixes with ``interleave`` (each corpus once per epoch); every two-corpus
recipe mixes with ``mcse-train-mix`` (MCSE's released ``train_mix.py``). On a small caption set
the two differ a lot (one caption batch in forty steps, or several), so the plan shows both.

:func:`preview` is the plan from the corpora alone (preflight: nothing tokenised), printed by
``--dry-run``; :func:`plan_warnings` is what preflight warns about before any run: a multimodal
method that would see few caption batches, a corpus smaller than one batch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmcse import distributed
from mmcse.errors import MmcseError
from mmcse.methods import Method
from mmcse.training.batch_order import (
    CAPTION,
    RECIPES_MIXING,
    TEXT,
    batches_in_run,
    mixing_rule,
    train_mix_counts,
)
from mmcse.training.data import TrainData

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


# ---- disk: what each checkpoint will take ------------------------------------------------------

#: AdamW keeps two fp32 moments per trained parameter (``exp_avg``, ``exp_avg_sq``), which
#: ``last/``'s trainer state holds beside the weights; ``best/`` holds the weights only
OPTIMIZER_BYTES_PER_PARAMETER = 2 * 4
#: what a checkpoint writes besides tensors and tokenizer: model config, run info, integrity
#: record (a few KB); last/'s trainer state adds the RNG states and bookkeeping (tens of KB)
CHECKPOINT_OVERHEAD = 8 * 1024
TRAINER_STATE_OVERHEAD = 32 * 1024
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spm.model",
    "sentencepiece.bpe.model",
    "special_tokens_map.json",
    "tokenizer_config.json",
)


def checkpoint_sizes(weight_bytes: int, trained_parameters: int, other_bytes: int) -> dict:
    """``{"best": bytes, "last": bytes}``: best/ is the weights (student and heads, as trained)
    and the tokenizer; last/ adds AdamW's two fp32 moments per trained parameter."""
    best = weight_bytes + other_bytes + CHECKPOINT_OVERHEAD
    moments = OPTIMIZER_BYTES_PER_PARAMETER * trained_parameters
    return {"best": best, "last": best + moments + TRAINER_STATE_OVERHEAD}


def checkpoint_estimate(model: str) -> dict | None:
    """:func:`checkpoint_sizes` of a run of the student ``model`` before it loads: its
    parameters counted from the safetensors headers (saved in fp32, as a run trains them; all
    trained), its tokenizer files as they are. The method's heads (a projection or two) are not
    counted. None when the student is not a local folder with safetensors weights."""
    from mmcse.rundir import resolve_model_dir

    folder = Path(resolve_model_dir(model))
    if not folder.is_dir():  # a hub id: its snapshot in the local hub cache, if there
        folder = hub_snapshot(model) or folder
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if files:
        parameters = sum(safetensors_parameters(f) for f in files)
    elif model in RECIPE_STUDENTS:
        parameters = bert_parameters(*RECIPE_STUDENTS[model])
    else:
        return None
    tokenizer = sum((folder / n).stat().st_size for n in TOKENIZER_FILES if (folder / n).is_file())
    return checkpoint_sizes(4 * parameters, parameters, tokenizer)


#: the recipes' students, for a plan made before they are downloaded: (vocabulary, positions,
#: token types, hidden, layers, intermediate) from their published config.json
RECIPE_STUDENTS = {
    "bert-base-uncased": (30522, 512, 2, 768, 12, 3072),
    "roberta-base": (50265, 514, 1, 768, 12, 3072),
}


def bert_parameters(
    vocab: int, positions: int, types: int, hidden: int, layers: int, intermediate: int
) -> int:
    """Parameters of a BERT-style encoder with its pooler (as ``save_pretrained`` writes it):
    bert-base-uncased 109,482,240, roberta-base 124,645,632."""
    embeddings = (vocab + positions + types) * hidden + 2 * hidden  # + LayerNorm
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden
    feed_forward = 2 * hidden * intermediate + intermediate + hidden + 2 * hidden
    pooler = hidden * hidden + hidden
    return embeddings + layers * (attention + feed_forward) + pooler


def hub_snapshot(model: str) -> Path | None:
    """The folder of ``model``'s snapshot in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a valid repo id, no hub library: no snapshot to count
        return None
    return Path(found).parent if isinstance(found, str) else None


def safetensors_parameters(path: Path) -> int:
    """Elements in a safetensors file, from its JSON header (no tensor is read)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def format_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            break
        count /= 1000
    return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"


def describe_checkpoints(sizes: dict, keep_last: bool) -> str:
    """The plan's disk line."""
    after = "kept" if keep_last else "removed once the run finishes (keep_last false)"
    return (
        f"  disk: best/ about {format_bytes(sizes['best'])}, last/ about "
        f"{format_bytes(sizes['last'])} (weights + AdamW's moments; {after})"
    )
