"""Where a run is: the progress :class:`~mmcse.training.loop.Trainer` advances step by step,
last/ saves (``trainer_state.pt``) and a resume restores (:class:`mmcse.training.record.RunRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunState:
    """A run's progress: optimizer steps taken, the position of the next batch (its epoch and
    its index in that epoch's batch order), the best dev score with the step that had it, and
    whether this step's evaluation is still to do."""

    step: int = 0
    epoch: int = 0
    #: the index of the next batch in the epoch's batch order (a resume skips the ones before)
    next_index: int = 0
    best_dev: float | None = None
    best_step: int | None = None
    #: the evaluation due after ``step`` did not finish (a stop signal came before or during
    #: it): a resume runs it first, so the resumed run's metrics equal an uninterrupted run's
    eval_pending: bool = False

    def improves(self, score: float | None) -> bool:
        """Whether an evaluation scoring ``score`` keeps its step as best/: a higher score, or
        the first evaluation, or none (no dev data: each evaluation keeps the last step)."""
        return score is None or self.best_dev is None or score > self.best_dev

    def keep_best(self, score: float | None) -> None:
        """This step is the best so far, scoring ``score``."""
        self.best_dev, self.best_step = score, self.step
