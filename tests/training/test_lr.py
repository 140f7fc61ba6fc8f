"""The lr schedules' device forms (read inside a captured update) against the schedules' equations
written out here: HF's linear warm-up and decay, and the released image/audio lr's cosine."""

from __future__ import annotations

import math

import pytest
import torch

from mmcse.training.lr import CosineSchedule, LinearSchedule


def linear(step: int, warmup: int, total: int) -> float:
    """transformers.get_linear_schedule_with_warmup's lr_lambda."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def cosine(step: int, total: int) -> float:
    """0.5 (1 + cos(π min(s, T) / T)): no warm-up, flat after T."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


STEPS = range(0, 30)


@pytest.mark.parametrize("warmup, total", [(0, 20), (5, 20), (3, 3)])
def test_the_linear_schedule_on_the_device_is_the_host_one(warmup, total):
    schedule = LinearSchedule(warmup, total)
    factor = schedule.on_device(torch.device("cpu"))
    for step in STEPS:
        want = linear(step, warmup, total)
        assert schedule(step) == pytest.approx(want)
        assert factor(torch.tensor(float(step))).item() == pytest.approx(want, abs=1e-6)


def test_the_cosine_schedule_on_the_device_is_the_host_one_and_follows_a_retarget():
    schedule = CosineSchedule(20)
    factor = schedule.on_device(torch.device("cpu"))
    for step in STEPS:
        assert schedule(step) == pytest.approx(cosine(step, 20))
        assert factor(torch.tensor(float(step))).item() == pytest.approx(cosine(step, 20), abs=1e-6)
    schedule.retarget(40)  # a finished run extended: the captured graph reads the new length
    for step in STEPS:
        assert factor(torch.tensor(float(step))).item() == pytest.approx(cosine(step, 40), abs=1e-6)


def test_a_cosine_of_unknown_length_is_constant():
    schedule = CosineSchedule(None)
    factor = schedule.on_device(torch.device("cpu"))
    assert schedule(7) == 1.0 and factor(torch.tensor(7.0)).item() == 1.0
