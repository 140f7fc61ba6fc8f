"""Checkpoints are snapshotted by the training thread and written by a background one
(:class:`mmcse.training.checkpoint_writer.BackgroundWriter`): what is written is the state of
the step that saved it, the training thread writes no file, and a failed write fails the run."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from safetensors.torch import load_file
from support.runs import tiny_mcse_settings

from mmcse.errors import MmcseError
from mmcse.rundir import RunDir
from mmcse.training import checkpoint as ckpt
from mmcse.training.checkpoint_writer import BackgroundWriter, CheckpointWriter, HostSnapshots
from mmcse.training.config import TrainConfig
from mmcse.training.loop import Trainer, train


def settings(tiny_model, tiny_world, out, **overrides) -> dict:
    return tiny_mcse_settings(tiny_model, tiny_world, out, max_steps=4, eval_steps=2, **overrides)


class HeldWriter:
    """A writer that holds its writes until the test runs them."""

    def __init__(self) -> None:
        self.held = []

    def submit(self, name, write) -> None:
        self.held.append((name, write))

    def wait_for(self, name) -> None:
        assert name not in [held for held, _ in self.held], "a snapshot's buffers still in use"


def test_a_checkpoint_holds_its_steps_weights_not_those_of_the_steps_after(
    tiny_model, tiny_world, tmp_path
):
    trainer = Trainer(TrainConfig(**settings(tiny_model, tiny_world, tmp_path / "run"))).setup()
    trainer.record.writer.background = HeldWriter()
    saved = {k: v.clone() for k, v in trainer.encoder.backbone.state_dict().items()}
    trainer.state.keep_best(0.5)
    trainer.record.save_best(trainer.state)
    with torch.no_grad():  # the steps after the save change the live weights in place
        for p in trainer.encoder.backbone.parameters():
            p.add_(1.0)
    ((_, write),) = trainer.record.writer.background.held
    write()  # written after those steps, as a background write may be
    written = load_file(str(RunDir(tmp_path / "run").best.path / "model.safetensors"))
    assert written.keys() and all(torch.equal(written[k], saved[k]) for k in written)


def test_a_snapshot_copies_nested_state_into_buffers_its_next_save_reuses():
    snapshots = HostSnapshots()
    live = {"a": [torch.ones(2), (torch.zeros(1), 3)], "b": "text", "c": None}
    first, ready = snapshots.copy("best", live)
    ready()
    live["a"][0].add_(1)
    live["a"][1][0].add_(1)
    assert torch.equal(first["a"][0], torch.ones(2))
    assert torch.equal(first["a"][1][0], torch.zeros(1)) and first["a"][1][1] == 3
    assert first["b"] == "text" and first["c"] is None and isinstance(first["a"][1], tuple)
    assert first["a"][0].data_ptr() != live["a"][0].data_ptr()

    second, _ = snapshots.copy("best", live)  # its next save: the same buffers, new values
    assert second["a"][0].data_ptr() == first["a"][0].data_ptr()
    assert torch.equal(second["a"][0], torch.full((2,), 2.0))
    other, _ = snapshots.copy("last", live)  # another checkpoint: buffers of its own
    assert other["a"][0].data_ptr() != first["a"][0].data_ptr()

    live["a"][0] = torch.ones(3, dtype=torch.float64)  # a changed shape or dtype: a new buffer
    third, _ = snapshots.copy("best", live)
    assert third["a"][0].dtype == torch.float64 and torch.equal(third["a"][0], torch.ones(3))
    assert torch.equal(third["a"][1][0], torch.ones(1))


def test_a_save_waits_for_the_last_write_of_the_same_checkpoint_only():
    writer = BackgroundWriter()
    release, done = threading.Event(), []
    writer.submit("best", lambda: (release.wait(5), done.append("best")))
    writer.submit("last", lambda: done.append("last"))
    threading.Timer(0.2, release.set).start()
    writer.wait_for("best")  # returns once best/'s write (the oldest) is done
    assert done[:1] == ["best"] and [name for name, _ in writer.pending] in ([], ["last"])
    writer.wait_for("best")  # none pending: returns at once
    writer.close()
    assert done == ["best", "last"]


def test_checkpoints_are_written_off_the_training_thread(
    tiny_model, tiny_world, tmp_path, monkeypatch
):
    writers = []
    original = CheckpointWriter._write

    def recording_write(self, *args, **kwargs):
        writers.append(threading.current_thread().name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointWriter, "_write", recording_write)
    result = train(TrainConfig(**settings(tiny_model, tiny_world, tmp_path / "run")))
    run = RunDir(result.output_dir)
    assert run.best.path.is_dir() and run.last.path.is_dir() and run.last.finished()
    assert len(writers) >= 2  # best/ and last/, each at least once
    assert all(name.startswith("mmcse-checkpoint") for name in writers), writers


def test_a_failed_write_fails_the_run_and_leaves_no_half_checkpoint(
    tiny_model, tiny_world, tmp_path, monkeypatch
):
    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_trainer_state", disk_full)
    with pytest.raises(MmcseError, match="run: No space left on device"):  # one line
        train(TrainConfig(**settings(tiny_model, tiny_world, tmp_path / "run")))
    run = RunDir(tmp_path / "run")
    assert not run.last.path.exists()  # never half a save
    assert not list(run.path.glob(".tmp-*"))


def test_a_writer_keeps_at_most_two_writes_in_flight_in_order_and_raises_their_error():
    writer = BackgroundWriter()
    release, done = threading.Event(), []
    writer.submit("best", lambda: (release.wait(5), done.append(1)))
    writer.submit("last", lambda: done.append(2))  # one evaluation step's two: no wait
    assert done == [] and len(writer.pending) == 2
    release.set()
    writer.submit("best", lambda: done.append(3))  # a third waits for the oldest
    assert done[:1] == [1]
    writer.submit("last", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        writer.close()
    assert done == [1, 2, 3]


def test_a_loop_error_waits_for_the_write_in_flight_and_stays_the_error_raised(caplog):
    """A stop signal or an error in the training loop: the checkpoint being written is on disk
    before the error goes on, and a write that fails too is logged, not raised instead."""
    writer = CheckpointWriter(encoder=None, tokenizer=None)
    release, done = threading.Event(), []
    writer.background.submit("last", lambda: (release.wait(5), done.append("last")))
    threading.Timer(0.2, release.set).start()
    with pytest.raises(KeyboardInterrupt), writer.closed_on_error():
        raise KeyboardInterrupt
    assert done == ["last"]

    failing = CheckpointWriter(encoder=None, tokenizer=None)
    failing.background.submit("last", lambda: 1 / 0)
    errors = caplog.at_level(logging.ERROR)
    with errors, pytest.raises(KeyboardInterrupt), failing.closed_on_error():
        raise KeyboardInterrupt
    assert "writing a checkpoint failed too: division by zero" in caplog.text
