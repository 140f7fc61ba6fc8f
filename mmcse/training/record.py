"""A trainer's bookkeeping: the run directory, the plan record, run info, checkpoints, resuming.

Kept apart from :mod:`mmcse.training.loop` so that the trainer reads as setup + step + loop:
nothing here changes what a step computes. What the run directory holds, and under which names,
is :mod:`mmcse.rundir`'s; the integrity record of ``last/`` :mod:`mmcse.training.checkpoint`'s.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

from mmcse import distributed as dist
from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation import evaluate_sts, format_rows
from mmcse.files import atomic_dir, write_json
from mmcse.rundir import FINAL, Checkpoint, RunDir
from mmcse.training import checkpoint as ckpt
from mmcse.training.dev_eval import resolve_eval_dir
from mmcse.training.metrics import MetricsLog, describe_plan, truncate_metrics
from mmcse.training.plan import TOKENIZER_FILES, checkpoint_sizes, mixing_plan
from mmcse.training.preflight import input_fingerprints
from mmcse.training.schedule import eval_steps

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Checkpoint writes on one background thread, in order: the training thread only
    snapshots (copies into host buffers, :class:`HostSnapshots`); the writing (hundreds of MB,
    seconds at BERT-base, where a captured step takes milliseconds) overlaps the steps that
    follow. At most :data:`MAX_PENDING` writes wait (an evaluation step saves best/ and last/:
    both go at once); a further write waits for the oldest, a new snapshot of a checkpoint for
    that checkpoint's last write (:meth:`wait_for`: its buffers are reused). A write's error
    (a full disk) is raised in the training thread at the next save or at the end of the run
    (:meth:`close`). A run killed outright (SIGKILL) loses the write in flight, never the
    checkpoint before it (each is written beside and renamed into place), so it resumes from
    that one; a stop signal waits for the writes."""

    MAX_PENDING = 2

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmcse-checkpoint")
        self.pending: collections.deque[tuple[str, Future]] = collections.deque()

    def submit(self, name: str, write: Callable[[], None]) -> None:
        """Queue ``write`` (of the checkpoint ``name``) after the writes before it."""
        while len(self.pending) >= self.MAX_PENDING:
            self.pending.popleft()[1].result()
        self.pending.append((name, self.pool.submit(write)))

    def wait_for(self, name: str) -> None:
        """Until the last write of checkpoint ``name`` (and every write before it) is on disk:
        its snapshot's buffers are free again (:class:`HostSnapshots`)."""
        while any(pending == name for pending, _ in self.pending):
            self.pending.popleft()[1].result()

    def wait(self) -> None:
        """Until every write is on disk; the first failed one's error raised here."""
        while self.pending:
            self.pending.popleft()[1].result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)


class HostSnapshots:
    """Snapshots of a checkpoint's tensors in host buffers kept for that checkpoint's next save.

    Allocating a snapshot anew each save costs the training thread the allocation and its page
    faults (BERT-base: best/ 0.44 GB, last/ with AdamW's moments 1.3 GB); from a GPU into
    ordinary memory, the copy also waits for the queued steps and runs at pageable speed. Here
    each tensor, found by its place in the nested state (its pytree path), is copied into the
    buffer the last save of the same ``name`` used (a new one where its shape or dtype changed);
    from CUDA the buffers are pinned and the copies queued (``non_blocking``) on the current
    stream, so they follow the step that saved and the next step's in-place updates follow
    them; the returned ``ready`` waits for them (the writer thread calls it, never the training
    thread). The caller must not snapshot ``name`` again while a write of the last snapshot
    of ``name`` may still read it (:meth:`BackgroundWriter.wait_for`)."""

    def __init__(self) -> None:
        self.buffers: dict[str, dict[tuple, torch.Tensor]] = {}

    def copy(self, name: str, value: Any) -> tuple[Any, Callable[[], None]]:
        """(the snapshot of ``value``, a function that returns once its copies are done)."""
        leaves, spec = tree_flatten_with_path(value)
        kept, used = self.buffers.get(name, {}), {}
        for path, leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                used[path] = self._filled(kept.get(path), leaf.detach())
        self.buffers[name] = used  # the buffer of a tensor no longer in the state is dropped
        snapshot = tree_unflatten([used.get(path, leaf) for path, leaf in leaves], spec)
        if not any(isinstance(leaf, torch.Tensor) and leaf.is_cuda for _, leaf in leaves):
            return snapshot, lambda: None
        copied = torch.cuda.Event()
        copied.record()
        return snapshot, copied.synchronize

    @staticmethod
    def _filled(buffer: torch.Tensor | None, source: torch.Tensor) -> torch.Tensor:
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)
        return buffer.copy_(source, non_blocking=source.is_cuda)


@dataclass
class RunResult:
    output_dir: Path
    best_dev: float | None
    best_step: int | None
    test: dict | None
    steps: int
    method: str = ""

    def table(self) -> str:
        """The STS test scores of best/ as a table ('' when there was no final evaluation)."""
        if self.test is None:
            return ""

        dev = "-" if self.best_dev is None else f"{self.best_dev:.2f}"
        return format_rows({f"{self.method} (best step {self.best_step}, dev {dev})": self.test})


class RunRecord:
    """The run directory of a :class:`~mmcse.training.loop.Trainer` and everything written to
    it; reads the trainer's state, never changes a step."""

    def __init__(self, trainer: Any, auxiliary_sets: dict) -> None:
        self.trainer = trainer
        cfg = trainer.cfg
        self.run_dir = RunDir(cfg.output_dir)
        self.out = self.run_dir.path
        self.eval_dir = resolve_eval_dir(cfg)
        self.auxiliary_sets = auxiliary_sets  # VisualCSE's images by role, as preflight opened
        #: a finished run given a larger --max-steps/--epochs: where it had ended
        self.extended_from = ckpt.extension_of(cfg.to_dict()) if trainer.resuming else None
        self.environment: dict | None = None
        self.writer = BackgroundWriter()
        self.snapshots = HostSnapshots()

    # -- resuming ------------------------------------------------------------------------------
    def resume_state(self) -> dict:
        return ckpt.load_trainer_state(self.out)

    def student_source(self) -> str:
        """Where the student's weights load from: last/ when resuming, else the model."""
        return str(self.run_dir.last.path) if self.trainer.resuming else self.trainer.cfg.model

    def restore(self, state: dict | None) -> tuple[int, int]:
        """Load a resumed run's state; (epoch, index in its schedule) to start from."""
        t = self.trainer
        self.environment = environment(t.device, t.precision)
        if self.extended_from and t.total <= self.extended_from["step"]:
            raise MmcseError(
                f"--resume {self.out}: max_steps {t.cfg.max_steps} and epochs {t.cfg.epochs} "
                f"still end the run at step {t.total}, where it finished; nothing to extend"
            )
        if state is None:
            return 0, 0
        self.heads().load_state_dict(load_file(str(self.run_dir.last.heads)))
        t.updates.load_state_dict(state)  # optimizer, scheduler, grad_scaler, aux
        t.window.load_state_dict(state["window"], t.device)
        t.best_dev, t.best_step = state["best_dev"], state["best_step"]
        t.step_count = state["step"]
        ckpt.set_rng_states(state["rng"])
        if self.extended_from:
            self._extend_schedule()
        return state["epoch"], state["next_index"]

    def _extend_schedule(self) -> None:
        """A finished run extended: the linear decay recomputed for the new total, from now."""
        t = self.trainer
        lr = t.updates.extend_schedule(t.total)
        old = self.extended_from
        logger.warning(
            "extending the finished run %s from step %s to %s (max_steps %s -> %s, epochs %s -> "
            "%s): its lr had decayed to 0 and the linear schedule is recomputed for %s steps, so "
            "training continues at lr %.3g; the result is not what an uninterrupted %s-step run "
            "trains",
            self.out, t.step_count, t.total, old["max_steps"], t.cfg.max_steps,
            old["epochs"], t.cfg.epochs, t.total, lr, t.total,
        )  # fmt: skip

    # -- the plan and the log ------------------------------------------------------------------
    def open_log(self) -> MetricsLog:
        """Prepare the run dir, log and save the plan, open metrics.jsonl."""
        t = self.trainer
        resumed = t.resume_state is not None
        run = self.run_dir
        if dist.is_main():
            run.path.mkdir(parents=True, exist_ok=True)
            if resumed:
                truncate_metrics(run.metrics, t.step_count)
                if self.extended_from:  # the run's settings now: a later resume compares them
                    write_json(run.config, t.cfg.to_dict())
            else:
                if t.cfg.overwrite:
                    run.clear()  # no stale best/, last/ or results beside the new run
                run.metrics.write_text("")
                write_json(run.config, t.cfg.to_dict())
            plan = self.plan_record()
            write_json(run.plan, plan, default=str)
            logger.info(describe_plan(plan))
        purge = t.step_count + 1 if resumed else None
        return MetricsLog(self.out, t.cfg.report_to if dist.is_main() else "none", purge)

    def plan_record(self) -> dict:
        t = self.trainer
        cfg = t.cfg
        per_epoch = t.data.batches_per_epoch(t.global_batch)
        return {
            "method": cfg.method,
            "device": str(t.device),
            "precision": t.precision,
            "world_size": dist.world_size(),
            "sentences": {kind: len(src) for kind, src in t.data.sources.items()},
            "mixing": cfg.mixing,
            "global_batch": t.global_batch,
            "batches_per_epoch": per_epoch,
            "steps_per_epoch": sum(per_epoch.values()),
            "epochs": cfg.epochs,
            "max_steps": cfg.max_steps,
            "total_steps": t.total,
            "eval_data": str(self.eval_dir) if self.eval_dir is not None else None,
            "eval_steps": cfg.eval_steps,
            "evals": len(self.eval_steps()),
            "final_eval": bool(cfg.final_eval and self.eval_dir is not None),
            "save_every": t.save_every,
            "resumed_from_step": t.step_count if t.resume_state is not None else None,
            "capture": self.capture_note(),
            "extended_from": self.extended_from,
            "checkpoint_bytes": self.checkpoint_bytes(),
            "keep_last_checkpoint": cfg.keep_last_checkpoint,
            **mixing_plan(t.data, t.global_batch, t.total),
        }

    def checkpoint_bytes(self) -> dict[str, int]:
        """What best/ and last/ will take (:func:`mmcse.training.plan.checkpoint_sizes`): the
        weights and heads as saved, AdamW's moments of every trained parameter (the auxiliary
        task's too), the student's tokenizer files."""
        t = self.trainer
        tensors = [*t.encoder.backbone.state_dict().values(), *self.heads().state_dict().values()]
        weights = sum(v.numel() * v.element_size() for v in tensors)
        trained = {id(p): p for m in t.student.trained_modules() for p in m.parameters()}
        trained.update({id(p): p for p in self.heads().parameters()})
        parameters = sum(p.numel() for p in trained.values() if p.requires_grad)
        folder = Path(self.student_source())
        tokenizer = sum(
            (folder / name).stat().st_size for name in TOKENIZER_FILES if (folder / name).is_file()
        )
        return checkpoint_sizes(weights, parameters, tokenizer)

    def capture_note(self) -> str:
        """What the plan says about capture (:mod:`mmcse.training.fastpath`)."""
        t = self.trainer
        if t.capture == "off":
            return f"off (--capture {t.cfg.capture} on {t.device.type}): eager step"
        replay = "replayed as CUDA graphs" if t.device.type == "cuda" else "no CUDA graphs"
        what = (
            "the whole update (forward, backward, clipping, AdamW, schedule)"
            if t.capture == "whole"
            else "forward and backward (the update eager: DDP or fp16)"
        )
        return (
            f"on: {what} as one compiled graph per batch kind and batch size, {replay}; "
            f"batches padded to {t.cfg.max_seq_length} tokens"
        )

    def eval_steps(self) -> list[int]:
        cfg = self.trainer.cfg
        return eval_steps(cfg.eval_steps, self.trainer.total, cfg.eval_last_step)

    # -- checkpoints ---------------------------------------------------------------------------
    def run_info(self, step: int, dev: float | None) -> dict:
        t = self.trainer
        return {
            "config": t.cfg.to_dict(),
            "method": t.method.to_dict(),
            "step": step,
            "total_steps": t.total,
            "finished": False,  # set true when the run completes (Checkpoint.mark_finished)
            "stsb_dev": dev,
            "pooler": t.cfg.pooler,
            "pooler_source": t.pooler_source,
            # built as the resume check builds what it compares (one helper, no drift)
            "fingerprints": input_fingerprints(t.data, self.auxiliary_sets),
            "term_heads": t.student.term_heads,  # which heads of mmcse_heads each term used
            "teachers": self.teachers(),
            "environment": self.environment,
        }

    def teachers(self) -> dict[str, dict]:
        """Provenance of every feature set the run reads (run info ``teachers``)."""
        t = self.trainer
        teachers = t.data.teachers()
        if t.aux is not None:
            examples = t.aux.examples.manifest.provenance()
            teachers.update({f"feature:{k}": examples for k in t.aux.fingerprint})
        return teachers

    def heads(self) -> nn.ModuleDict:
        t = self.trainer
        heads = nn.ModuleDict({"heads": t.student.heads})
        if t.aux is not None:  # e.g. VisualCSE's patch embedding and image head
            heads["aux"] = t.aux.heads
        return heads

    def save(self, checkpoint: Checkpoint, step: int, dev: float | None, state=None) -> None:
        """Snapshot a checkpoint now and write it in the background (:class:`BackgroundWriter`):
        host copies of the weights, heads and trainer state as they are after this step, so the
        steps that follow change nothing in it; written beside ``checkpoint`` and renamed into
        place (never half a save)."""
        t = self.trainer
        info, name = self.run_info(step, dev), checkpoint.path.name
        self.writer.wait_for(name)  # the buffers of its last snapshot are reused
        live = {"weights": t.encoder.backbone.state_dict(), "heads": self.heads().state_dict(),
                "state": state}  # fmt: skip
        snapshot, ready = self.snapshots.copy(name, live)
        self.writer.submit(name, lambda: self._write(checkpoint, step, info, snapshot, ready))

    def _write(self, checkpoint: Checkpoint, step: int, info: dict, snapshot, ready) -> None:
        t = self.trainer
        ready()
        weights, heads, state = snapshot["weights"], snapshot["heads"], snapshot["state"]
        with atomic_dir(checkpoint.path) as tmp:
            t.encoder.save_checkpoint(tmp, t.tokenizer, heads, info, weights=weights)
            if state is not None:
                ckpt.save_trainer_state(tmp, state)
                ckpt.write_integrity(  # last: it records every file above
                    tmp, step=step, settings=info["config"], fingerprints=info["fingerprints"]
                )

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """The training loop's span: however it ends (a stop signal, an error), the checkpoint
        in flight is on disk before the run goes on or exits; a clean end leaves the waiting to
        :meth:`finish`, which raises a failed write's error."""
        try:
            yield
        except BaseException:
            try:
                self.writer.close()
            except Exception as exc:  # the loop's own error is the one to report
                logger.error("writing a checkpoint failed too: %s", exc)
            raise

    def save_best(self, score: float | None) -> None:
        self.save(self.run_dir.best, self.trainer.step_count, score)

    def save_last(self, epoch: int, next_index: int) -> None:
        """The resumable checkpoint: everything needed to continue after this step."""
        t = self.trainer
        started = time.perf_counter()
        if dist.is_main():
            state = {
                "step": t.step_count,
                "epoch": epoch,
                "next_index": next_index,  # position in the epoch's schedule
                **t.updates.state_dict(),  # optimizer, scheduler, grad_scaler, aux
                "rng": ckpt.rng_states(),
                "window": t.window.state_dict(),
                "best_dev": t.best_dev,
                "best_step": t.best_step,
            }
            self.save(self.run_dir.last, t.step_count, t.best_dev, state)
        if dist.is_distributed():
            torch.distributed.barrier()
        t.window.exclude(time.perf_counter() - started)

    def finish(self) -> RunResult:
        t = self.trainer
        try:
            self.writer.close()  # best/ and last/ written (or a write's error raised) first
        finally:
            if dist.is_distributed():  # every rank leaves training once rank 0's writes end
                torch.distributed.barrier()
        test = None
        if dist.is_main() and t.cfg.final_eval and self.eval_dir is not None:
            best = str(self.run_dir.best.path)
            logger.info("final test: scoring best/ (step %s) on the 7 STS test sets", t.best_step)
            test = evaluate_sts(best, data_dir=self.eval_dir, device=str(t.device), progress=True)
            self.run_dir.write_results("sts", test, source=FINAL)
        if dist.is_main():
            self.run_dir.best.mark_finished()
            ckpt.mark_finished(self.run_dir.last)  # saved anew: its integrity record stays true
            if not t.cfg.keep_last_checkpoint:  # best/ says the run finished; last/ only resumed
                shutil.rmtree(self.run_dir.last.path)
                logger.info("removed %s (--drop-last-dir)", self.run_dir.last.path)
        return RunResult(self.out, t.best_dev, t.best_step, test, t.step_count, t.cfg.method)

    def aborted_message(self) -> str:
        """What an interrupted exit that did not stop at a step boundary leaves to resume
        from: the step last/ holds (none: say so)."""
        t, info = self.trainer, self.run_dir.last.read_info()
        if not info:
            return (f"interrupted at step {t.step_count}; no last/ was saved, nothing to resume: "
                    "start the run again (--overwrite)")  # fmt: skip
        saved = info.get("step", "?")
        left = " (the final evaluation is left)" if saved == t.total else ""
        return (
            f"interrupted at step {t.step_count} of {t.total}; last/ holds step {saved}{left}. "
            f"Continue with: mmcse train --resume {self.out}"
        )

    def interrupted_message(self) -> str:
        t = self.trainer
        return (
            f"interrupted after step {t.step_count} of {t.total}; last/ saved. "
            f"Continue with: mmcse train --resume {self.out}"
        )
