"""metrics.jsonl: window-averaged loss terms, batch counts, non-finite detection, plan, progress."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support.runs import tiny_mcse_settings

from mmcse.errors import MmcseError
from mmcse.training import metrics as metrics_log
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train
from mmcse.training.metrics import LossWindow, Progress, truncate_metrics

TIMING = ("time", "steps_per_s", "data_wait_share", "eval_s")


def config(tiny_model, tiny_world, out, **kw) -> TrainConfig:
    return TrainConfig(
        **tiny_mcse_settings(
            tiny_model, tiny_world, out, **{"max_steps": 10, "eval_steps": 100, **kw}
        )
    )


def records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_window_averages_each_term_over_the_batches_it_was_computed_on():
    rng = np.random.default_rng(0)
    kinds = ["caption", "text", "text", "caption", "text"]
    steps = []
    for kind in kinds:
        terms = {"loss": rng.random(), "simcse_loss": rng.random()}
        if kind == "caption":
            terms["image_text_loss"] = rng.random()
        steps.append(terms)
    window = LossWindow()
    for i, (kind, terms) in enumerate(zip(kinds, steps, strict=True)):
        window.add(i + 1, kind, {k: torch.tensor(v) for k, v in terms.items()})
    record = window.flush()
    assert record["loss"] == pytest.approx(np.mean([t["loss"] for t in steps]))
    assert record["simcse_loss"] == pytest.approx(np.mean([t["simcse_loss"] for t in steps]))
    caption_terms = [t["image_text_loss"] for t in steps if "image_text_loss" in t]
    assert record["image_text_loss"] == pytest.approx(np.mean(caption_terms))
    assert (record["text_batches"], record["caption_batches"]) == (3, 2)
    assert record["kind"] == "mixed" and len(window) == 0


def test_host_terms_and_non_loss_values():
    """An auxiliary task's terms arrive as floats; a non-loss value (its lr) keeps the last one."""
    window = LossWindow()
    window.add(1, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": 0.5, "image_lr": 1e-6})
    window.add(2, "text", {"loss": torch.tensor(3.0), "image_supcon_loss": 1.5, "image_lr": 2e-6})
    record = window.flush()
    assert record["loss"] == 2.0 and record["image_supcon_loss"] == 1.0
    assert record["image_lr"] == 2e-6 and record["kind"] == "text"


def test_a_non_finite_loss_is_named_by_its_step():
    window = LossWindow()
    for step, value in [(11, 1.0), (12, float("nan")), (13, 2.0)]:
        window.add(step, "caption" if step == 12 else "text", {"loss": torch.tensor(value)})
    with pytest.raises(MmcseError, match=r"nan at step 12 \(a caption batch; .*steps 11-13\)"):
        window.flush()


def test_a_non_finite_auxiliary_term_is_caught_at_the_window():
    window = LossWindow()
    window.add(5, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": torch.tensor(1.0)})
    window.add(6, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": torch.tensor(np.inf)})
    with pytest.raises(MmcseError, match="image_supcon_loss became inf in steps 5-6"):
        window.flush()


def test_window_state_survives_a_round_trip():
    a, b = LossWindow(), LossWindow()
    a.add(1, "text", {"loss": torch.tensor(1.0), "x_loss": torch.tensor(4.0), "lr2": 0.1})
    b.load_state_dict(a.state_dict(), torch.device("cpu"))
    for w in (a, b):
        w.add(2, "caption", {"loss": torch.tensor(2.0)})
    ra, rb = a.flush(), b.flush()
    assert {k: v for k, v in ra.items() if k not in TIMING} == {
        k: v for k, v in rb.items() if k not in TIMING
    }


def test_trainer_windows_equal_the_mean_of_per_step_records(tiny_model, tiny_world, tmp_path):
    """Same seed, log_every 1 vs 4: each window record is the mean of its steps' records, each
    term over the steps that computed it, and counts the batches of each kind."""
    kw = dict(max_steps=7)
    every = records(
        train(config(tiny_model, tiny_world, tmp_path / "a", log_every=1, **kw)).output_dir
    )
    windows = records(
        train(config(tiny_model, tiny_world, tmp_path / "b", log_every=4, **kw)).output_dir
    )
    assert [w["step"] for w in windows] == [4, 7]
    assert any(w["caption_batches"] for w in windows) and any(w["text_batches"] for w in windows)
    bounds = [0, 4, 7]
    for window, lo, hi in zip(windows, bounds[:-1], bounds[1:], strict=True):
        steps = every[lo:hi]
        assert window["caption_batches"] == sum(s["kind"] == "caption" for s in steps)
        assert window["text_batches"] == sum(s["kind"] == "text" for s in steps)
        for key in ("loss", "simcse_loss", "image_text_loss"):
            values = [s[key] for s in steps if key in s]
            if values:
                assert window[key] == pytest.approx(np.mean(values), rel=1e-5), key
            else:
                assert key not in window
        assert window["lr"] == steps[-1]["lr"] and window["epoch"] == steps[-1]["epoch"]
        assert all(window[k] >= 0 for k in ("time", "steps_per_s", "data_wait_share"))


def test_plan_is_logged_and_saved(tiny_model, tiny_world, tmp_path, library_log):
    result = train(config(tiny_model, tiny_world, tmp_path / "r", max_steps=3, eval_steps=2))
    plan = json.loads((result.output_dir / "plan.json").read_text())
    assert plan["total_steps"] == 3 and plan["batches_per_epoch"] == {"text": 12, "caption": 8}
    assert plan["sentences"] == {"text": 96, "caption": 64} and plan["device"] == "cpu"
    assert plan["precision"] == "fp32" and plan["evals"] == 2 and plan["save_every"] == 2
    out = library_log()
    assert "plan: mcse on cpu" in out and "12 text, 8 caption batches of 8" in out


def test_non_tty_progress_logs_a_line_per_interval(monkeypatch, library_log):
    monkeypatch.setattr(metrics_log, "LOG_LINE_INTERVAL", 3600.0)
    progress = Progress(total=50, initial=0, desc="train x", enabled=True)
    for step in range(1, 51):
        progress.set(loss=f"{step:.4f}")
        progress.update(step)
    lines = library_log().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train x: step 50/50 (100%) loss 50.0000")
    monkeypatch.setattr(metrics_log, "LOG_LINE_INTERVAL", 0.0)
    progress = Progress(total=3, initial=0, desc="train x", enabled=True)
    for step in range(1, 4):
        progress.update(step)
    assert len(library_log().splitlines()) == 3


def test_truncate_keeps_records_up_to_the_step_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 3}\n{"step": 5, "stsb_dev": 1}\n{"step": 6}\n{"step": 7, "lo')
    truncate_metrics(path, 5)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [3, 5]


def test_report_to_tensorboard_writes_events(tiny_model, tiny_world, tmp_path):
    pytest.importorskip("tensorboard")
    cfg = config(tiny_model, tiny_world, tmp_path / "tb", max_steps=2, report_to="tensorboard")
    result = train(cfg)
    assert list((result.output_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_unknown_report_to_is_refused(tiny_model, tiny_world, tmp_path):
    with pytest.raises(MmcseError, match="--report-to"):
        config(tiny_model, tiny_world, tmp_path, report_to="wandb")
