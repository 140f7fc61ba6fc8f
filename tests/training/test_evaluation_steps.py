"""The dev-evaluation steps (mmcse.training.evaluation_steps) against the released trainers' rules."""

from __future__ import annotations

import pytest

from mmcse.recipes import get_recipe
from mmcse.training.evaluation_steps import eval_steps, is_eval_step


def hf_trainer_4_5(eval_every: int, total: int) -> list[int]:
    """transformers 4.5 ``DefaultFlowCallback.on_step_end`` under ``evaluation_strategy="steps"``:
    ``global_step % eval_steps == 0`` after each optimizer step; nothing at the end."""
    return [step for step in range(1, total + 1) if step % eval_every == 0]


def mcse_train_mix(eval_every: int, total: int) -> list[int]:
    """MCSE ``src/train_mix.py:399``: ``completed_steps % args.eval_steps == 0 or
    completed_steps >= args.max_train_steps`` (the loop stops at max_train_steps)."""
    return [s for s in range(1, total + 1) if s % eval_every == 0 or s >= total]


CASES = [(125, 7813), (125, 15625), (125, 100), (1, 5), (3, 10), (125, 0)]


@pytest.mark.parametrize(("eval_every", "total"), CASES)
def test_eval_steps_are_the_released_rules(eval_every, total):
    assert eval_steps(eval_every, total, last=False) == hf_trainer_4_5(eval_every, total)
    assert eval_steps(eval_every, total, last=True) == mcse_train_mix(eval_every, total)
    for last in (False, True):  # the loop's per-step test agrees with the plan's list
        evaluated = [
            s
            for s in range(1, total + 1)
            if is_eval_step(s, eval_every, total, last, dev_data=True)
        ]
        short = 0 < total < eval_every  # no evaluation step: the last step keeps best/
        assert evaluated == ([total] if short else eval_steps(eval_every, total, last))


def test_the_last_step_still_keeps_a_checkpoint_when_nothing_else_would():
    # 7813 = visualcse/roberta's steps: no dev score at the last step under the released rule
    assert not is_eval_step(7813, 125, 7813, last=False, dev_data=True)
    assert is_eval_step(7813, 125, 7813, last=False, dev_data=False)  # no dev data: keep the last
    assert is_eval_step(100, 125, 100, last=False, dev_data=True)  # shorter than one interval
    assert not is_eval_step(7812, 125, 7813, last=False, dev_data=False)


def test_recipes_take_their_codes_evaluation_steps():
    assert get_recipe("visualcse/roberta").to_dict()["train"]["eval_last_step"] is False
    assert get_recipe("audiocse/roberta").to_dict()["train"]["eval_last_step"] is False
    assert get_recipe("mcse/wiki+flickr/bert").to_dict()["train"]["eval_last_step"] is True
    assert "(not at the last step)" in get_recipe("visualcse/roberta").describe()
