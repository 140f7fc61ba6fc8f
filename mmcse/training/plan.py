"""What a run's plan says about batch mixing: the rule, the batches of each kind the run will
take, and — for a two-corpus run that mixes otherwise — what the recipes' mixing would take.

Plain ``mmcse train`` mixes with ``interleave`` (each corpus once per epoch); every two-corpus
recipe mixes with ``mcse-train-mix`` (MCSE's released ``train_mix.py``). On a small caption set
the two differ a lot (one caption batch in forty steps, or several), so the plan shows both.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mmcse.errors import MmcseError
from mmcse.training.data import CAPTION, TEXT, TrainData, train_mix_counts

#: the mixing of every two-corpus recipe (:mod:`mmcse.recipes.recipe`)
RECIPES_MIXING = "mcse-train-mix"


def mixing_plan(data: TrainData, global_batch: int, total: int) -> dict[str, Any]:
    """``mixing_rule``, ``batches_in_run`` and, when it differs, ``recipes_mixing`` (the
    recipes' mixing and its batches per epoch here; None where it cannot run). The mixing and
    epochs are the data's run's (``data.cfg``), so the rule and the counts cannot disagree."""
    mixing, epochs = data.cfg.mixing, data.cfg.epochs
    passes = data.batches_per_pass(global_batch)
    plan: dict[str, Any] = {
        "mixing_rule": mixing_rule(mixing, passes),
        "batches_in_run": batches_in_run(data, global_batch, total, epochs),
    }
    if len(passes) == 2 and mixing != RECIPES_MIXING:
        try:
            counts = train_mix_counts(passes[TEXT], passes[CAPTION])
        except MmcseError:  # fewer text than caption batches: the released schedule divides by 0
            counts = None
        plan["recipes_mixing"] = {"mixing": RECIPES_MIXING, "batches_per_epoch": counts}
    return plan


def mixing_rule(mixing: str, passes: dict[str, int]) -> str:
    """How the batch kinds take turns, in words, with this run's numbers."""
    if len(passes) == 1:
        return f"{next(iter(passes))} batches only"
    text, caption = passes[TEXT], passes[CAPTION]
    if mixing == "mcse-train-mix":
        every = max(1, text // caption)
        return (
            f"MCSE's released train_mix.py: a caption batch at every step s with s % {every} == 0,"
            " captions revisited and part of the text skipped each epoch"
        )
    if mixing == "proportional-random":
        return "each corpus once per epoch, batch kinds in a random order"
    every = max(1, text // caption)
    return f"each corpus once per epoch, a caption batch before {_every(every)} text batch"


def batches_in_run(data: TrainData, global_batch: int, total: int, epochs: int) -> dict[str, int]:
    """Batches of each kind among the run's ``total`` steps (a ``max_steps`` cut included)."""
    counts: Counter[str] = Counter({kind: 0 for kind in data.sources})
    left = total
    for epoch in range(epochs):
        if left <= 0:
            break
        kinds = [kind for kind, _ in data.schedule(epoch, global_batch)][:left]
        counts.update(kinds)
        left -= len(kinds)
    return dict(counts)


def _every(n: int) -> str:
    if n == 1:
        return "each"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix}"
