"""metrics.jsonl: window-averaged loss terms, batch counts, non-finite detection, plan, progress."""

from __future__ import annotations

import dataclasses
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


def add(window: LossWindow, step: int, kind: str, terms: dict) -> None:
    """One step's terms as the trainer hands them to the window: the loss terms stacked in one
    tensor (``loss`` first), any other value a host value."""
    is_loss = {k: k == "loss" or k.endswith("_loss") for k in terms}
    losses = {k: float(v) for k, v in terms.items() if is_loss[k]}
    host = {k: v for k, v in terms.items() if not is_loss[k]}
    window.add_step(step, kind, [(tuple(losses), torch.tensor(list(losses.values())))], host)


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
        add(window, i + 1, kind, {k: torch.tensor(v) for k, v in terms.items()})
    record = window.flush()
    assert record["loss"] == pytest.approx(np.mean([t["loss"] for t in steps]))
    assert record["simcse_loss"] == pytest.approx(np.mean([t["simcse_loss"] for t in steps]))
    caption_terms = [t["image_text_loss"] for t in steps if "image_text_loss" in t]
    assert record["image_text_loss"] == pytest.approx(np.mean(caption_terms))
    assert (record["text_batches"], record["caption_batches"]) == (3, 2)
    assert record["kind"] == "mixed" and len(window) == 0


def test_host_terms_and_non_loss_values():
    """An auxiliary task's terms are averaged like the step's; a non-loss value (its lr) keeps
    the last one."""
    window = LossWindow()
    add(window, 1, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": 0.5, "image_lr": 1e-6})
    add(window, 2, "text", {"loss": torch.tensor(3.0), "image_supcon_loss": 1.5, "image_lr": 2e-6})
    record = window.flush()
    assert record["loss"] == 2.0 and record["image_supcon_loss"] == 1.0
    assert record["image_lr"] == 2e-6 and record["kind"] == "text"


def test_a_non_finite_loss_is_named_by_its_step():
    window = LossWindow()
    for step, value in [(11, 1.0), (12, float("nan")), (13, 2.0)]:
        add(window, step, "caption" if step == 12 else "text", {"loss": torch.tensor(value)})
    with pytest.raises(MmcseError, match=r"nan at step 12 \(a caption batch; .*steps 11-13\)"):
        window.flush()


def test_a_non_finite_auxiliary_term_is_caught_at_the_window():
    window = LossWindow()
    add(window, 5, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": torch.tensor(1.0)})
    add(window, 6, "text", {"loss": torch.tensor(1.0), "image_supcon_loss": torch.tensor(np.inf)})
    with pytest.raises(MmcseError, match="image_supcon_loss became inf in steps 5-6"):
        window.flush()


def test_window_state_survives_a_round_trip():
    a, b = LossWindow(), LossWindow()
    add(a, 1, "text", {"loss": torch.tensor(1.0), "x_loss": torch.tensor(4.0), "lr2": 0.1})
    b.load_state_dict(a.state_dict(), torch.device("cpu"))
    for w in (a, b):
        add(w, 2, "caption", {"loss": torch.tensor(2.0)})
    ra, rb = a.flush(), b.flush()
    assert {k: v for k, v in ra.items() if k not in TIMING} == {
        k: v for k, v in rb.items() if k not in TIMING
    }


class FakeClock:
    """``time.perf_counter`` that moves only when told (steps/s without real timings)."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def test_steps_per_s_counts_only_the_steps_timed_since_the_clock_started(monkeypatch):
    """A resumed window holds steps taken before its save; steps/s divides only the steps
    taken since the resume by the time since (not 3 steps by one step's time)."""
    clock = FakeClock()
    monkeypatch.setattr(metrics_log, "time", clock)
    saved = LossWindow()
    add(saved, 1, "text", {"loss": torch.tensor(1.0)})
    add(saved, 2, "text", {"loss": torch.tensor(1.0)})
    resumed = LossWindow()
    resumed.load_state_dict(saved.state_dict(), torch.device("cpu"))
    clock.now += 50.0  # setup: not training time
    resumed.start_clock()
    add(resumed, 3, "text", {"loss": torch.tensor(1.0)})
    clock.now += 4.0
    record = resumed.flush()
    assert record["text_batches"] == 3 and record["steps_per_s"] == pytest.approx(1 / 4.0)


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
    # plain `mmcse train` interleaves; the plan says so, and what the recipes' mixing would take:
    # train_mix.py takes a caption batch at every step s with s % ⌊12/8⌋ == 0, i.e. all 20
    assert plan["mixing_rule"] == (
        "each corpus once per epoch, a caption batch before each text batch"
    )
    assert sum(plan["batches_in_run"].values()) == 3
    assert plan["recipes_mixing"] == {
        "mixing": "mcse-train-mix",
        "batches_per_epoch": {"text": 0, "caption": 20},
    }
    assert "mixing interleave (each corpus once per epoch" in out
    assert "note: the two-corpus recipes mix with mcse-train-mix" in out
    assert "per epoch it would take 0 text + 20 caption; --mixing mcse-train-mix" in out


def test_plan_counts_every_batch_of_an_epoch_and_names_the_caption_rate():
    from mmcse.training.plan import mixing_rule

    assert mixing_rule("interleave", {"text": 400, "caption": 10}).endswith(
        "a caption batch before every 40th text batch"
    )
    assert "s % 40 == 0" in mixing_rule("mcse-train-mix", {"text": 400, "caption": 10})
    assert mixing_rule("text-only", {"text": 400}) == "text batches only"


def test_plan_of_a_run_that_mixes_as_the_recipes_has_no_note(tiny_model, tiny_world, tmp_path):
    from mmcse.methods import build_method
    from mmcse.training.plan import RunPlan, mixing_plan
    from mmcse.training.preflight import check_join

    def run_plan(data, total):
        return RunPlan(8, data.batches_per_epoch(8), total)

    cfg = config(tiny_model, tiny_world, tmp_path / "r", max_steps=0, mixing="mcse-train-mix")
    data = check_join(cfg, build_method("mcse"))  # the corpora joined, nothing tokenised
    plan = mixing_plan(data, run_plan(data, 20))
    assert "recipes_mixing" not in plan and plan["batches_in_run"] == {"text": 0, "caption": 20}
    cfg = dataclasses.replace(cfg, mixing="interleave", epochs=2)
    data = check_join(cfg, build_method("mcse"))
    plan = mixing_plan(data, run_plan(data, 40))  # every batch twice
    assert plan["batches_in_run"] == {"text": 24, "caption": 16}


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


def test_progress_shows_a_number_with_significant_digits(monkeypatch, library_log):
    monkeypatch.setattr(metrics_log, "LOG_LINE_INTERVAL", 0.0)
    progress = Progress(total=2, initial=0, desc="train x", enabled=True)
    progress.set(loss=1.2345e-5, dev="-")
    progress.update(1)
    progress.set(loss=0.123456789)
    progress.update(2)
    first, second = library_log().splitlines()
    assert "loss 1.234e-05 dev -" in first and "loss 0.1235 dev -" in second


def test_progress_rate_and_eta_count_training_time_only(monkeypatch, library_log):
    """A dev evaluation used to drop steps/s (0.09 -> 0.02) and double the eta: 10 steps in 10 s
    of training and 30 s of evaluation are 1 step/s, and 10 steps left take 10 s."""
    clock = iter([0.0, 0.0, 40.0])  # the bar's start, the line's check, the line's time
    monkeypatch.setattr(metrics_log.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(metrics_log, "LOG_LINE_INTERVAL", 1.0)
    progress = Progress(total=20, initial=0, desc="train x", enabled=True)
    for step in range(1, 10):
        progress.step = step
    progress.exclude(30.0)
    progress.update(10)
    (line,) = library_log().splitlines()
    assert line.endswith("1.00 steps/s eta 0.2 min")


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
