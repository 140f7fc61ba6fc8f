"""A ``last/`` written before the updates moved into ``mmcse/training/`` (issue 30) still resumes.

``fixtures/pre30/`` holds ``last/`` of a SimCSE and a VisualCSE run written by 36dbdbc's code
(eager, 3 steps, finished; its README says how). Each is resumed here by today's trainer —
the student's weights from that ``last/``, the updates' state through ``trainer.updates``, the
call :class:`~mmcse.training.record.RunRecord` makes — extended to 6 steps, eager and with the
whole update captured. Checked against the file read independently with ``torch.load``: every
AdamW moment and step count (the text update's and the image update's), the schedule's position
and the lr the run continues at (HF's linear decay and the released cosine written out here);
then two more steps, which must continue from those moments, not from fresh ones.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcse.cache import write_feature_set
from mmcse.training import fastpath
from mmcse.training.config import TrainConfig
from mmcse.training.loop import Trainer

FIXTURES = Path(__file__).parent / "fixtures" / "pre30"
BETAS = (0.9, 0.999)
LR, WARMUP, SAVED_STEPS, TOTAL = 3e-5, 1, 3, 6
#: the auxiliary optimizer as these runs had it (before issue 41: the encoder and the task heads)
IMAGE_ARGS = {
    "image_batch_size": 4,
    "image_size": 16,
    "vit_init": "random",
    "image_optimizer_scope": "task",
}


def image_set(root: Path) -> str:
    """The fixture's image examples (the same rows; the shapes are what matter)."""
    ids = [f"{c}/{i}" for c in ("cat", "dog") for i in range(4)]
    pixels = np.random.default_rng(0).integers(0, 255, (8, 3, 16, 16), dtype=np.uint8)
    write_feature_set(root / "images", ids, pixels, kind="image_tensor", dim=768,
                      shape=[3, 16, 16], dtype="uint8", dataset="toy", split="train",
                      producer={"teacher": "test"}, extra={"classes": ["cat", "dog"]})  # fmt: skip
    return str(root / "images")


def resumed(name: str, capture: str, tiny_world, tmp_path: Path) -> tuple[Trainer, dict]:
    """A trainer whose student loads from a copy of the fixture's last/, the updates' state
    loaded from its trainer_state.pt; and that state as the file holds it."""
    last = tmp_path / "last"
    shutil.copytree(FIXTURES / name / "last", last)
    saved = torch.load(last / "trainer_state.pt", weights_only=False)
    extra = {}
    if name == "visualcse":
        extra = {"features": {"image_tensor": image_set(tmp_path)}, "method_args": IMAGE_ARGS}
    cfg = TrainConfig(
        model=str(last), method=name, text_corpus=tiny_world["text"], batch_size=8,
        eval_data="", final_eval=False, device="cpu", max_steps=TOTAL, log_every=1,
        capture=capture, warmup_steps=WARMUP, weight_decay=0.01, mixing="text-only",
        output_dir=str(tmp_path / "run"), **extra,
    )  # fmt: skip
    trainer = Trainer(cfg).setup()
    trainer.updates.load_state_dict(torch.load(last / "trainer_state.pt", weights_only=False))
    return trainer, saved


def assert_same_moments(got: dict, want: dict) -> None:
    assert got["state"].keys() == want["state"].keys()
    for index, entry in want["state"].items():
        assert float(got["state"][index]["step"]) == float(entry["step"])
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["state"][index][moment], entry[moment], rtol=0, atol=0)


def assert_continued(after: dict, before: dict, steps: int) -> None:
    """Every parameter that stepped ``steps`` more times continued from its loaded moments:
    with g = (m' − β₁m)/(1 − β₁) (one step), v' = β₂v + (1 − β₂)g² — which fresh moments (0)
    would break. Steps are checked on all, the moments on the one-step case."""
    b1, b2 = BETAS
    for index, entry in before["state"].items():
        now = after["state"][index]
        assert float(now["step"]) == float(entry["step"]) + steps
        if steps == 1:
            grad = (now["exp_avg"] - b1 * entry["exp_avg"]) / (1 - b1)
            want = b2 * entry["exp_avg_sq"] + (1 - b2) * grad.square()
            torch.testing.assert_close(now["exp_avg_sq"], want, rtol=1e-4, atol=1e-12)


@pytest.fixture
def aot_eager(monkeypatch):
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": "aot_eager"})
    torch._dynamo.reset()


@pytest.mark.parametrize("capture", ["off", "on"])
@pytest.mark.parametrize("name", ["simcse", "visualcse"])
def test_a_last_of_before_issue_30_resumes(name, capture, tiny_world, tmp_path, aot_eager):
    trainer, saved = resumed(name, capture, tiny_world, tmp_path)
    assert trainer.capture == ("whole" if capture == "on" else "off")
    loaded = trainer.updates.state_dict()
    assert_same_moments(loaded["optimizer"], saved["optimizer"])
    assert loaded["scheduler"]["last_epoch"] == saved["scheduler"]["last_epoch"] == SAVED_STEPS
    assert saved["scheduler"]["_last_lr"] == [0.0, 0.0]  # the run had finished: lr decayed to 0
    # extended to TOTAL: HF's linear decay from step 3, (T − s)/(T − w)
    want_lr = LR * (TOTAL - SAVED_STEPS) / (TOTAL - WARMUP)
    assert trainer.updates.extend_schedule(TOTAL) == pytest.approx(want_lr, rel=1e-12)
    assert trainer.updates.text.lr() == pytest.approx(want_lr, rel=1e-12)
    if name == "visualcse":
        aux = loaded["aux"]
        assert aux["steps_taken"] == saved["aux"]["steps_taken"] == SAVED_STEPS
        assert_same_moments(aux["optimizer"], saved["aux"]["optimizer"])
    else:
        assert loaded["aux"] is None and saved["aux"] is None

    batches = trainer.batches(0, 0)
    logged = []
    for step in (1, 2):
        index, batch, _ = next(batches)
        trainer.train_step(batch, 0, index)
        logged.append(dict(trainer.window.latest))
        after = trainer.updates.state_dict()
        if step == 1:
            assert_continued(after["optimizer"], saved["optimizer"], 1)
            if name == "visualcse":
                assert_continued(after["aux"]["optimizer"], saved["aux"]["optimizer"], 1)
    assert_continued(after["optimizer"], saved["optimizer"], 2)
    assert after["scheduler"]["last_epoch"] == SAVED_STEPS + 2
    assert trainer.updates.text.lr() == pytest.approx(
        LR * (TOTAL - 5) / (TOTAL - WARMUP), rel=1e-12
    )
    if name == "visualcse":
        assert after["aux"]["steps_taken"] == SAVED_STEPS + 2
        assert_continued(after["aux"]["optimizer"], saved["aux"]["optimizer"], 2)
        # the image lr: the released cosine over the run's 6 steps, at steps 3 and 4
        image_lr = trainer.aux.settings.lr
        for index, host in zip((3, 4), logged, strict=True):
            want = image_lr * 0.5 * (1 + math.cos(math.pi * index / TOTAL))
            assert host["image_lr"] == pytest.approx(want, rel=1e-12)
