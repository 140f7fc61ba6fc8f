"""When a run scores STS-B dev: the released trainers' two rules.

* MCSE's ``train_mix.py`` (and KDMCSE's, DALR's copies): ``completed_steps % eval_steps == 0 or
  completed_steps >= max_train_steps`` — every ``eval_steps`` steps **and the last step**.
* SimCSE's HF Trainer (transformers 4.5), on which VisualCSE/AudioCSE's trainers are built:
  ``DefaultFlowCallback.on_step_end`` sets ``should_evaluate`` when ``global_step % eval_steps ==
  0`` — **multiples only**; nothing evaluates the last step (``evaluation_strategy="steps"``).

``eval_last_step`` (:class:`mmcse.training.config.TrainConfig`) picks one: True = MCSE's, False
= the HF Trainer's. Either way a run keeps a ``best/``: with no dev data every evaluation keeps
the current step ("keep the last"), and the last step always counts then, as it does when no
evaluation has kept a checkpoint yet (a run shorter than ``eval_steps``) — the HF Trainer then
keeps the final model (``load_best_model_at_end`` finds no best checkpoint).
"""

from __future__ import annotations


def eval_steps(eval_every: int, total: int, last: bool) -> list[int]:
    """The steps (1-based, ≤ ``total``) at which dev is scored: the multiples of ``eval_every``,
    plus ``total`` when ``last`` (once, if it is a multiple already)."""
    if eval_every < 1:
        raise ValueError(f"eval_every must be at least 1, not {eval_every}")
    steps = list(range(eval_every, total + 1, eval_every))
    if last and total > 0 and (not steps or steps[-1] != total):
        steps.append(total)
    return steps


def is_eval_step(step: int, eval_every: int, total: int, last: bool, *, dev_data: bool) -> bool:
    """Whether the loop evaluates (scores dev when there is dev data, and keeps ``best/``) after
    ``step``: a step of :func:`eval_steps`; also the last step when there is no dev data (keep the
    last) or when no step of :func:`eval_steps` comes before it (``total < eval_every``: nothing kept
    yet). Depends on the arguments only, so every rank of a distributed run agrees."""
    if step % eval_every == 0:
        return True
    return step == total and (last or not dev_data or total < eval_every)
