"""The batch order of a run: which corpus each optimizer step draws from, and which rows.

Each epoch's global batches are ``(kind, row indices)``, identical on every rank (each takes its
slice). ``--mixing`` chooses how the kinds take turns: ``interleave`` and ``proportional-random``
use each corpus once per epoch (:func:`mix_batches`), ``mcse-train-mix`` is MCSE's released
``train_mix.py`` (:func:`train_mix_counts`), ``text-only``/``caption-only`` one corpus. The run's
plan (:func:`mmcse.training.plan.plan_run`) counts its steps from :meth:`BatchOrder.batches_per_epoch`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from mmcse import distributed as dist
from mmcse.errors import MmcseError

TEXT, CAPTION = "text", "caption"
#: the mixing of every two-corpus recipe (:mod:`mmcse.recipes.recipe`)
RECIPES_MIXING = "mcse-train-mix"


class BatchOrder:
    """The batch order over a run's corpora (``sources``: kind → a sized corpus) under its
    config (``cfg``: ``mixing``, ``seed``, ``drop_last``); :class:`~mmcse.training.data.TrainData`
    is one."""

    sources: dict
    cfg: object

    def batches_per_pass(self, global_batch: int, world_size: int | None = None) -> dict[str, int]:
        """Batches in one pass over each corpus: full ones, plus the last partial one if kept
        (``world_size``: the run's processes, by default the launcher's)."""
        counts = {}
        for kind, src in self.sources.items():
            partial = self._keeps_partial(len(src), global_batch, world_size)
            counts[kind] = len(src) // global_batch + int(partial)
            if counts[kind] == 0:
                raise MmcseError(
                    f"the {kind} corpus has {len(src)} sentences, fewer than one "
                    f"global batch ({global_batch}); lower --batch-size"
                )
        return counts

    def _keeps_partial(self, n: int, global_batch: int, world_size: int | None) -> bool:
        """Keep the last partial batch (torch's DataLoader default, which the released loaders
        use) unless --drop-last; it needs 2 rows for in-batch negatives, and under DDP it is
        dropped because it cannot be split into equal per-rank batches. The world size is the
        launcher's until the processes join (:func:`mmcse.distributed.env_world_size`), so
        preflight's plan and the run's agree."""
        world = dist.env_world_size() if world_size is None else world_size
        return not self.cfg.drop_last and n % global_batch >= 2 and world == 1

    def batches_per_epoch(self, global_batch: int, world_size: int | None = None) -> dict[str, int]:
        """Batches per corpus in one epoch of the batch order; their sum is the epoch's steps."""
        passes = self.batches_per_pass(global_batch, world_size)
        if self.cfg.mixing == "mcse-train-mix" and len(passes) == 2:
            return train_mix_counts(passes[TEXT], passes[CAPTION])
        return passes

    def batch_order(self, epoch: int, global_batch: int) -> list[tuple[str, np.ndarray]]:
        """Global batches of one epoch: (kind, row indices), identical on every rank."""
        if self.cfg.mixing == "mcse-train-mix" and len(self.sources) == 2:
            return self._train_mix_order(epoch, global_batch)
        rng = np.random.default_rng([self.cfg.seed, epoch])
        chunks = {}
        for kind, n in self.batches_per_pass(global_batch).items():
            order = rng.permutation(len(self.sources[kind]))
            chunks[kind] = [order[i * global_batch : (i + 1) * global_batch] for i in range(n)]
        return mix_batches(chunks.get(TEXT, []), chunks.get(CAPTION, []), self.cfg.mixing, rng)

    def _train_mix_order(self, epoch: int, global_batch: int) -> list[tuple[str, np.ndarray]]:
        """MCSE's ``train_mix.py``: step ``s`` of the epoch takes the next caption batch when
        ``s % ⌊N_text/N_caption⌋ == 0``, else the next text batch, from two endless loaders
        (each re-shuffled per pass, continuing across epochs)."""
        passes = self.batches_per_pass(global_batch)
        counts = self.batches_per_epoch(global_batch)
        every = passes[TEXT] // passes[CAPTION]
        streams = {
            kind: self._endless_batches(kind, global_batch, epoch * counts[kind], counts[kind])
            for kind in (TEXT, CAPTION)
        }
        steps = counts[TEXT] + counts[CAPTION]
        return [
            (kind, next(streams[kind]))
            for kind in (CAPTION if s % every == 0 else TEXT for s in range(steps))
        ]

    def _endless_batches(self, kind: str, global_batch: int, start: int, count: int):
        """Batches ``start .. start+count-1`` of an endless loader over one corpus."""
        n = len(self.sources[kind])
        per_pass = self.batches_per_pass(global_batch)[kind]
        order, current = None, -1
        for i in range(start, start + count):
            pass_index, j = divmod(i, per_pass)
            if pass_index != current:
                key = [self.cfg.seed, (TEXT, CAPTION).index(kind), pass_index]
                order, current = np.random.default_rng(key).permutation(n), pass_index
            yield order[j * global_batch : (j + 1) * global_batch]


def batches_in_run(order: BatchOrder, global_batch: int, total: int, epochs: int) -> dict[str, int]:
    """Batches of each kind among the run's ``total`` steps (a ``max_steps`` cut included)."""
    counts: Counter[str] = Counter({kind: 0 for kind in order.sources})
    left = total
    for epoch in range(epochs):
        if left <= 0:
            break
        kinds = [kind for kind, _ in order.batch_order(epoch, global_batch)][:left]
        counts.update(kinds)
        left -= len(kinds)
    return dict(counts)


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


def _every(n: int) -> str:
    if n == 1:
        return "each"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"every {n}{suffix}"


def train_mix_counts(text_batches: int, caption_batches: int) -> dict[str, int]:
    """Batches per kind in one epoch of MCSE's ``train_mix.py`` batch order.

    The released loop runs ``N_t + N_c`` steps per epoch (``N`` = ``len(DataLoader)``, i.e.
    batches per pass, the last partial one included) and takes a caption batch at every step
    ``s`` with ``s % ⌊N_t/N_c⌋ == 0``: ``⌈(N_t + N_c)/⌊N_t/N_c⌋⌉`` caption batches, the rest text.
    """
    if text_batches < caption_batches:
        raise MmcseError(
            f"--mixing mcse-train-mix needs at least as many text batches as caption batches "
            f"per pass (got {text_batches} text, {caption_batches} caption): the released "
            "train_mix.py divides by ⌊N_text/N_caption⌋ = 0 here; use --mixing interleave"
        )
    every = text_batches // caption_batches
    steps = text_batches + caption_batches
    captions = (steps - 1) // every + 1
    return {TEXT: steps - captions, CAPTION: captions}


def mix_batches(
    text: list[np.ndarray], caption: list[np.ndarray], mixing: str, rng: np.random.Generator
) -> list[tuple[str, np.ndarray]]:
    """Order text and caption batches that each use their corpus once (one pass per epoch).

    ``interleave``: a caption batch before every ⌊N_text/N_caption⌋-th text batch, leftovers at
    the end — mmcse's own schedule, *not* MCSE's released one (that is ``mcse-train-mix``,
    :meth:`BatchOrder.batch_order`, which revisits captions and skips part of the text corpus);
    ``proportional-random``: batch kinds shuffled, so each kind appears in proportion to its
    size; ``text-only``/``caption-only``: one corpus.
    """
    if mixing == "text-only" or not caption:
        return [(TEXT, b) for b in text]
    if mixing == "caption-only" or not text:
        return [(CAPTION, b) for b in caption]
    if mixing == "proportional-random":
        kinds = np.array([TEXT] * len(text) + [CAPTION] * len(caption))
        rng.shuffle(kinds)
        its = {TEXT: iter(text), CAPTION: iter(caption)}
        return [(k, next(its[k])) for k in kinds]
    every = max(1, len(text) // len(caption))
    out: list[tuple[str, np.ndarray]] = []
    cap = iter(caption)
    used = 0
    for i, b in enumerate(text):
        if i % every == 0 and used < len(caption):
            out.append((CAPTION, next(cap)))
            used += 1
        out.append((TEXT, b))
    out.extend((CAPTION, b) for b in cap)
    return out
