"""Atomic checkpoints, unfinished-run marking, training resume after SIGKILL/SIGINT/SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support.runs import tiny_mcse_settings
from typer.testing import CliRunner

from mmcse.errors import MmcseError
from mmcse.evaluation.evaluate import unfinished_warning
from mmcse.files import atomic_dir, recover_dir, write_json
from mmcse.rundir import BEST_DIR, RUN_INFO_FILE
from mmcse.training import checkpoint as ckpt
from mmcse.training import fastpath
from mmcse.training import metrics as metrics_log
from mmcse.training.config import GivenSettings, TrainConfig
from mmcse.training.loop import train
from mmcse.training.stop import TrainingInterrupted

ROOT = Path(__file__).resolve().parents[2]
SENTEVAL_MINI = ROOT / "tests" / "fixtures" / "senteval_mini"
TIMING = ("time", "steps_per_s", "data_wait_share", "eval_s")

# A child that trains and SIGKILLs itself: after writing the record of step N ("record"; its
# checkpoints written as they are saved, so every save before the kill is on disk), or in the
# middle of the N-th last/ save, after the weights and before the trainer state ("save": the
# background writer's work is cut off, so the save before it is what resumes).
CHILD = """
import json, os, signal, sys
sys.path.insert(0, {root!r})
from mmcse.training import checkpoint as ckpt, checkpoint_writer, metrics as metrics_log
from mmcse.training.config import TrainConfig
from mmcse.training.loop import TrainingInterrupted, train

cfg = TrainConfig(**json.loads(sys.argv[1]))
mode, n = sys.argv[2], int(sys.argv[3])
calls = []
if mode == "save":
    real_save = ckpt.save_trainer_state
    def save(path, state):
        calls.append(path)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(path, state)
    ckpt.save_trainer_state = save
else:
    checkpoint_writer.BackgroundWriter.submit = lambda self, name, write: write()
    real_write = metrics_log.MetricsLog.write
    def write(self, record):
        real_write(self, record)
        if record.get("step") == n and "loss" in record:
            os.kill(os.getpid(), signal.SIGKILL)
    metrics_log.MetricsLog.write = write
train(cfg)
"""


def settings(tiny_model, tiny_world, out, **kw) -> dict:
    # log windows straddle the saves: the window state must resume too
    base = {"max_steps": 10, "log_every": 3, "save_every": 4, "eval_steps": 5}
    return tiny_mcse_settings(tiny_model, tiny_world, out, **{**base, **kw})


def comparable(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in lines]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def kill_child(cfg: dict, mode: str, n: int) -> None:
    script = CHILD.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg), mode, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tiny_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight") / "run"
    train(TrainConfig(**settings(tiny_model, tiny_world, out)))
    return out


def with_dev(tiny_model, tiny_world, out: Path) -> dict:
    """Scored on STS-B dev at steps 3, 6 and 9 (a signal after step 3's record comes before
    its evaluation) and 10."""
    return settings(tiny_model, tiny_world, out, eval_data=str(SENTEVAL_MINI), eval_steps=3)


@pytest.fixture(scope="module")
def uninterrupted_with_dev(tiny_model, tiny_world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("straight-dev") / "run"
    train(TrainConfig(**with_dev(tiny_model, tiny_world, out)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, n, resumed_from",
    [("record", 9, 8), ("save", 2, 4)],  # killed after step 9's record / inside the step-8 save
)
def test_sigkilled_run_resumes_to_the_same_metrics(
    mode, n, resumed_from, tiny_model, tiny_world, tmp_path, uninterrupted
):
    cfg = settings(tiny_model, tiny_world, tmp_path / "run")
    kill_child(cfg, mode, n)
    run = Path(cfg["output_dir"])
    info = json.loads((run / "last" / RUN_INFO_FILE).read_text())
    assert info["step"] == resumed_from and info["finished"] is False
    assert unfinished_warning(run / "last") is not None
    train(TrainConfig(**cfg), resume=True)
    assert comparable(run) == comparable(uninterrupted)
    assert same_weights(run / BEST_DIR, uninterrupted / BEST_DIR)
    assert json.loads((run / BEST_DIR / RUN_INFO_FILE).read_text())["finished"] is True
    assert not list(run.glob(".tmp-*")) and not list(run.glob(".old-*"))


@pytest.mark.parametrize("capture", ["off", "on"])
def test_sigint_stops_after_the_step_and_resumes(
    capture, tiny_model, tiny_world, tmp_path, monkeypatch
):
    """Eager, and with the whole update captured (``aot_eager``: the graphs and dropout draws of
    eager; the captured AdamW's moments and step counts go through last/ in torch's layout)."""
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": "aot_eager"})
    out = tmp_path / "run"
    static = {"dynamic_padding": False} if capture == "on" else {}  # as the run records it
    cfg = TrainConfig(
        **settings(tiny_model, tiny_world, out, max_steps=5, capture=capture, **static)
    )
    real_write = metrics_log.MetricsLog.write

    def write(self, record):
        real_write(self, record)
        if record.get("step") == 3:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(metrics_log.MetricsLog, "write", write)
    with pytest.raises(TrainingInterrupted, match="after step 3 of 5.*--resume"):
        train(cfg)
    cfg_dir = Path(cfg.output_dir)
    assert json.loads((cfg_dir / "last" / RUN_INFO_FILE).read_text())["step"] == 3
    monkeypatch.setattr(metrics_log.MetricsLog, "write", real_write)
    assert train(cfg, resume=True).steps == 5
    straight = train(TrainConfig(**{**cfg.to_dict(), "output_dir": str(tmp_path / "straight")}))
    assert comparable(cfg_dir) == comparable(straight.output_dir)


# `mmcse train --config FILE` through the CLI entry point; after writing the record of step 3 it
# waits until the parent has sent its signal (the parent removes the file after sending).
SIGNALLED_CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from mmcse.training import metrics as metrics_log

ready, config = sys.argv[1], sys.argv[2]
real_write = metrics_log.MetricsLog.write
def write(self, record):
    real_write(self, record)
    if record.get("step") == 3 and "loss" in record:
        open(ready, "w").close()
        while os.path.exists(ready):
            time.sleep(0.01)
metrics_log.MetricsLog.write = write
import cli
sys.argv = ["mmcse", "train", "--config", config]
cli.main()
"""


def signal_child_at_step_3(cfg: dict, signum: int, tmp_path: Path) -> subprocess.CompletedProcess:
    config, ready = tmp_path / "train.json", tmp_path / "ready"
    config.write_text(json.dumps(cfg))
    script = SIGNALLED_CHILD.format(root=str(ROOT))
    args = [sys.executable, "-c", script, str(ready), str(config)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 600
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if ready.exists():
            proc.send_signal(signum)
            ready.unlink()
        out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)]
)
def test_sigterm_and_sigusr1_stop_after_the_step_save_and_resume(
    signum, tiny_model, tiny_world, tmp_path, uninterrupted
):
    """What SLURM, Kubernetes and `timeout` send: saved like Ctrl-C, exit 128 + the signal."""
    cfg = settings(tiny_model, tiny_world, tmp_path / "run")
    proc = signal_child_at_step_3(cfg, signum, tmp_path)
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert f"{signal.Signals(signum).name} received" in proc.stderr
    run = Path(cfg["output_dir"])
    assert f"Continue with: mmcse train --resume {run}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads((run / "last" / RUN_INFO_FILE).read_text())["step"] == 3
    assert train(TrainConfig(**cfg), resume=True).steps == 10
    assert comparable(run) == comparable(uninterrupted)
    assert same_weights(run / BEST_DIR, uninterrupted / BEST_DIR)


def test_sigterm_before_a_dev_evaluation_resumes_to_the_same_metrics(
    tiny_model, tiny_world, tmp_path, uninterrupted_with_dev
):
    """SIGTERM during step 3, whose dev evaluation is due: the evaluation is left for the
    resume, which runs it first (step 3's dev score, and best/ of it, as uninterrupted)."""
    cfg = with_dev(tiny_model, tiny_world, tmp_path / "run")
    proc = signal_child_at_step_3(cfg, signal.SIGTERM, tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert "its dev evaluation was cut short and --resume runs it first" in proc.stderr
    run = Path(cfg["output_dir"])
    assert not any("stsb_dev" in record for record in comparable(run))
    assert train(TrainConfig(**cfg), resume=True).steps == 10
    got, want = comparable(run), comparable(uninterrupted_with_dev)
    assert [r["step"] for r in got if "stsb_dev" in r] == [3, 6, 9, 10]
    assert got == want
    assert same_weights(run / BEST_DIR, uninterrupted_with_dev / BEST_DIR)


def test_a_crash_mid_save_keeps_the_previous_checkpoint(tmp_path):
    target = tmp_path / "best"
    with atomic_dir(target) as tmp:
        (tmp / "model.safetensors").write_text("old weights")
        (tmp / RUN_INFO_FILE).write_text('{"step": 1}')
    with pytest.raises(OSError, match="disk full"), atomic_dir(target) as tmp:
        (tmp / "model.safetensors").write_text("new weights")
        raise OSError("disk full")
    assert (target / "model.safetensors").read_text() == "old weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_a_kill_between_the_renames_is_recovered(tmp_path):
    """Killed after the old save moved aside and before the new one moved in."""
    old, tmp = tmp_path / ".old-best", tmp_path / ".tmp-best-x1"
    old.mkdir()
    (old / RUN_INFO_FILE).write_text('{"step": 4}')
    tmp.mkdir()
    (tmp / "model.safetensors").write_text("half")
    recover_dir(tmp_path / "best")
    assert json.loads((tmp_path / "best" / RUN_INFO_FILE).read_text()) == {"step": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_resume_refuses_a_changed_setting_and_a_run_without_last(tiny_model, tiny_world, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_json(run / "config.json", TrainConfig(**settings(tiny_model, tiny_world, run)).to_dict())
    with pytest.raises(MmcseError, match=r"batch_size=16 \(run: 8\)"):
        ckpt.resume_config(run, None, GivenSettings({"batch_size": 16, "device": "cpu"}))
    given = GivenSettings({"batch_size": 8, "save_every": 2, "model": None})
    cfg = ckpt.resume_config(run, None, given)
    assert cfg.save_every == 2 and cfg.output_dir == str(run)
    with pytest.raises(MmcseError, match="no resumable checkpoint"):
        train(cfg, resume=True)


def test_eval_of_an_unfinished_checkpoint_warns(tmp_path):
    from cli import app

    best = tmp_path / "run" / BEST_DIR
    best.mkdir(parents=True)
    (best / "config.json").write_text("{}")
    info = {"step": 1, "total_steps": 4, "finished": False}
    (best / RUN_INFO_FILE).write_text(json.dumps(info))
    result = CliRunner().invoke(
        app, ["eval", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "none")]
    )
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "did not finish (saved at step 1 of 4)" in warnings[0]
    (best / RUN_INFO_FILE).write_text(json.dumps({**info, "finished": True}))
    result = CliRunner().invoke(
        app, ["eval", "--model", str(tmp_path / "run"), "--data", str(tmp_path / "none")]
    )
    assert "warning:" not in result.output


def test_visualcse_resume_restores_the_auxiliary_task(
    tiny_model, tiny_world, tmp_path, monkeypatch
):
    """The image task has its own AdamW, lr schedule position and heads: all resume."""
    import numpy as np

    from mmcse.cache import write_feature_set

    ids = [f"{c}/{i}" for c in ("cat", "dog") for i in range(4)]
    pixels = np.random.default_rng(0).integers(0, 255, (8, 3, 16, 16), dtype=np.uint8)
    write_feature_set(
        tmp_path / "images",
        ids,
        pixels,
        kind="image_tensor",
        dim=768,
        shape=[3, 16, 16],
        dtype="uint8",
        dataset="toy",
        split="train",
        producer={"teacher": "test"},
        extra={"classes": ["cat", "dog"]},
    )
    base = settings(tiny_model, tiny_world, tmp_path / "run", max_steps=4, log_every=1)
    base.update(
        method="visualcse",
        method_args={"image_batch_size": 4, "image_size": 16, "vit_init": "random"},
        features={"image_tensor": str(tmp_path / "images")},
        mixing="text-only",
        caption_corpus=None,
    )
    cfg = TrainConfig(**base)
    real_write = metrics_log.MetricsLog.write

    def write(self, record):
        real_write(self, record)
        if record.get("step") == 2:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(metrics_log.MetricsLog, "write", write)
    with pytest.raises(TrainingInterrupted):
        train(cfg)
    monkeypatch.setattr(metrics_log.MetricsLog, "write", real_write)
    train(cfg, resume=True)
    straight = train(TrainConfig(**{**base, "output_dir": str(tmp_path / "straight")}))
    got, want = comparable(Path(cfg.output_dir)), comparable(straight.output_dir)
    assert any(k.startswith("image_") and k.endswith("_loss") for k in got[-1])
    assert got == want


# `mmcse train --config FILE` whose dev evaluation runs a batch or two of sentences per forward;
# at its first forward it waits until the parent has sent SIGINT (the parent removes `ready`),
# and it counts the forwards the evaluation runs
EVAL_SIGNALLED_CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from mmcse.training import dev_eval

ready, forwards, config = sys.argv[1], sys.argv[2], sys.argv[3]
real_init, real_call = dev_eval.DevEvaluator.__init__, dev_eval.DevEvaluator.__call__
def init(self, encoder, tokenizer, data_dir, max_tokens=None):
    real_init(self, encoder, tokenizer, data_dir, max_tokens=16)
    print(f"dev batches: {{len(self.batches)}}", file=sys.stderr)
def call(self, encoder, *args, **kwargs):
    real_forward = encoder.backbone.forward
    def forward(*a, **k):
        first = not os.path.exists(forwards)
        with open(forwards, "a") as f:
            f.write("forward\\n")
        if first:
            open(ready, "w").close()
            while os.path.exists(ready):
                time.sleep(0.01)
        return real_forward(*a, **k)
    encoder.backbone.forward = forward
    try:
        return real_call(self, encoder, *args, **kwargs)
    finally:
        del encoder.backbone.forward
dev_eval.DevEvaluator.__init__, dev_eval.DevEvaluator.__call__ = init, call
import cli
sys.argv = ["mmcse", "train", "--config", config]
cli.main()
"""


def test_sigint_during_a_dev_evaluation_stops_it_saves_last_and_prints_the_hint(
    tiny_model, tiny_world, tmp_path, uninterrupted_with_dev
):
    """The evaluation stops at its next batch (no score, no best/ of it), last/ holds the
    step it evaluated, and the exit says how to resume and that the resume redoes the
    evaluation; the resumed run's records and best/ are the uninterrupted run's."""
    cfg = with_dev(tiny_model, tiny_world, tmp_path / "run")
    config, ready, forwards = tmp_path / "train.json", tmp_path / "ready", tmp_path / "forwards"
    config.write_text(json.dumps(cfg))
    script = EVAL_SIGNALLED_CHILD.format(root=str(ROOT))
    args = [sys.executable, "-c", script, str(ready), str(forwards), str(config)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 600
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT)
        ready.unlink()
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, err[-3000:]
    batches = int(err.split("dev batches: ")[1].split()[0])
    assert batches > 2 and forwards.read_text().count("forward") == 1  # stopped at the next one
    assert "STS-B dev" not in err.split("SIGINT received")[1]  # no score of the cut evaluation
    run = Path(cfg["output_dir"])
    assert f"Continue with: mmcse train --resume {run}" in err and "Traceback" not in err
    assert "its dev evaluation was cut short and --resume runs it first" in err
    assert json.loads((run / "last" / RUN_INFO_FILE).read_text())["step"] == 3
    assert not (run / BEST_DIR).exists()  # the first evaluation never finished
    assert train(TrainConfig(**cfg), resume=True).steps == 10
    assert comparable(run) == comparable(uninterrupted_with_dev)
    assert same_weights(run / BEST_DIR, uninterrupted_with_dev / BEST_DIR)


def test_sigint_during_the_final_evaluation_prints_the_hint_and_resume_scores(
    tiny_model, tiny_world, tmp_path, monkeypatch, library_log
):
    from mmcse.training import record

    cfg = settings(tiny_model, tiny_world, tmp_path / "run", eval_data=str(SENTEVAL_MINI),
                   final_eval=True)  # fmt: skip
    real = record.evaluate_sts

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what Ctrl-C raises once training's handlers are gone

    monkeypatch.setattr(record, "evaluate_sts", interrupted)
    with pytest.raises(TrainingInterrupted, match="final evaluation is left.*--resume"):
        train(TrainConfig(**cfg))
    assert "last/ holds step 10" in library_log()
    monkeypatch.setattr(record, "evaluate_sts", real)
    result = train(TrainConfig(**cfg), resume=True)
    assert result.test is not None and (Path(cfg["output_dir"]) / "results.json").exists()
