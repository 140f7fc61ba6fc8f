"""A trainer's bookkeeping: the run directory, the plan record, run info, checkpoints, resuming.

Kept apart from :mod:`mmcse.training.loop` so that the trainer reads as setup + step + loop:
nothing here changes what a step computes. The run's progress is a
:class:`~mmcse.training.run_state.RunState` that the trainer advances and passes in; resuming
returns one. What the run directory holds, and under which names, is :mod:`mmcse.rundir`'s; the
integrity record of ``last/`` :mod:`mmcse.training.checkpoint`'s.
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
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

from mmcse import distributed as dist
from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation import evaluate_sts, format_rows
from mmcse.evaluation.sts import eval_data_dir
from mmcse.files import atomic_dir, write_json
from mmcse.packing import packed_row_width
from mmcse.rundir import FINAL, Checkpoint, RunDir
from mmcse.training import checkpoint as ckpt
from mmcse.training.corpora import left_out_summary, write_left_out
from mmcse.training.evaluation_steps import eval_steps
from mmcse.training.metrics import MetricsLog, describe_plan, truncate_metrics
from mmcse.training.plan import TOKENIZER_FILES, batch_sizes, checkpoint_sizes, mixing_plan
from mmcse.training.preflight import input_fingerprints
from mmcse.training.run_state import RunState

if TYPE_CHECKING:
    from mmcse.methods import Method
    from mmcse.training.config import TrainConfig
    from mmcse.training.data import TrainData
    from mmcse.training.metrics import LossWindow
    from mmcse.training.plan import RunPlan
    from mmcse.training.student import Student

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
        copied = torch.cuda.Event()  # pragma: cuda
        copied.record()  # pragma: cuda
        return snapshot, copied.synchronize  # pragma: cuda

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


class Updates(Protocol):
    """What the record saves and restores of a run's updates (the text one and the auxiliary
    task's): their state under ``trainer_state.pt``'s keys ``optimizer``, ``scheduler``,
    ``grad_scaler`` and ``aux`` (None without an auxiliary task)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None:
        """Restore from a whole trainer state (it reads its own keys)."""

    def extend_schedule(self, total: int) -> float:
        """A finished run extended to ``total`` steps: the lr schedule recomputed from the
        current step; the lr it continues at."""

    def lr(self) -> float: ...


def student_source(cfg: TrainConfig, resuming: bool) -> str:
    """Where the student's weights load from: the run's last/ when resuming, else the model."""
    return str(RunDir(cfg.output_dir).last.path) if resuming else cfg.model


class RunRecord:
    """The run directory of a :class:`~mmcse.training.loop.Trainer` and everything written to
    it: the plan record, run info, best/ and last/, resuming, the final evaluation. It reads
    what it is given — the settings, the plan, the student and the heads it writes, the updates
    and the loss window it saves — and the :class:`RunState` each call passes; it changes no
    step and sets nothing on the trainer (:meth:`restore` returns the run's state)."""

    def __init__(
        self,
        cfg: TrainConfig,
        plan: RunPlan,
        *,
        resuming: bool,
        device: torch.device,
        precision: str,
        capture: str,
        method: Method,
        pooler_source: str,
        student: Student,
        tokenizer: Any,
        aux: Any,
        data: TrainData,
        auxiliary_sets: dict,
        updates: Updates,
        window: LossWindow,
        student_plan: dict | None = None,
    ) -> None:
        """``student_plan``: the student's architecture, attention and dropout as chosen
        (:meth:`mmcse.students.StudentChoice.record`); ``capture``: the resolved capture mode
        (``off``, ``forward``, ``whole``); ``aux``:
        the method's auxiliary task (VisualCSE's images: its heads and examples) or None;
        ``auxiliary_sets``: its feature sets by role, as preflight opened them."""
        self.cfg, self.plan, self.resuming = cfg, plan, resuming
        self.device, self.precision, self.capture = device, precision, capture
        self.method, self.pooler_source = method, pooler_source
        self.student, self.tokenizer, self.aux = student, tokenizer, aux
        self.data, self.auxiliary_sets = data, auxiliary_sets
        self.updates, self.window = updates, window
        self.student_plan = student_plan
        self.heads = nn.ModuleDict({"heads": student.heads})
        if aux is not None:  # e.g. VisualCSE's patch embedding and image head
            self.heads["aux"] = aux.heads
        self.run_dir = RunDir(cfg.output_dir)
        self.out = self.run_dir.path
        self.eval_dir = eval_data_dir(cfg.eval_data)
        #: a finished run given a larger --max-steps/--epochs: where it had ended
        self.extended_from = ckpt.extension_of(cfg.to_dict()) if resuming else None
        #: the step a resumed run continues after (None: a new run), set by :meth:`restore`
        self.resumed_from: int | None = None
        #: whether the resumed step's evaluation is still to do (the resume runs it first)
        self.resumed_eval_pending = False
        self.environment: dict | None = None
        self.writer = BackgroundWriter()
        self.snapshots = HostSnapshots()

    @property
    def total(self) -> int:
        return self.plan.total_steps

    # -- resuming ------------------------------------------------------------------------------
    def restore(self, saved: dict | None) -> RunState:
        """The run's state to start from: a new run's, or the one last/ saved (``saved``, its
        ``trainer_state.pt``), whose heads, updates, loss window and random states are loaded
        into the objects this record was given."""
        self.environment = environment(self.device, self.precision)
        if self.extended_from and self.total <= self.extended_from["step"]:
            raise MmcseError(
                f"--resume {self.out}: max_steps {self.cfg.max_steps} and epochs "
                f"{self.cfg.epochs} still end the run at step {self.total}, where it finished; "
                "nothing to extend"
            )
        if saved is None:
            return RunState()
        self.heads.load_state_dict(load_file(str(self.run_dir.last.heads)))
        self.updates.load_state_dict(saved)
        self.window.load_state_dict(saved["window"], self.device)
        ckpt.set_rng_states(saved["rng"])
        state = RunState(
            step=saved["step"], epoch=saved["epoch"], next_index=saved["next_index"],
            best_dev=saved["best_dev"], best_step=saved["best_step"],
            eval_pending=saved.get("eval_pending", False),  # absent from last/ before issue 41
        )  # fmt: skip
        self.resumed_from = state.step
        self.resumed_eval_pending = state.eval_pending
        if self.extended_from:
            self._extend_schedule(state.step)
        return state

    def _extend_schedule(self, step: int) -> None:
        """A finished run extended: the lr schedule recomputed for the new total, from now."""
        lr, old, cfg = self.updates.extend_schedule(self.total), self.extended_from, self.cfg
        logger.warning(
            "extending the finished run %s from step %s to %s (max_steps %s -> %s, epochs %s -> "
            "%s): its lr had decayed to 0 and the linear schedule is recomputed for %s steps, so "
            "training continues at lr %.3g; the result is not what an uninterrupted %s-step run "
            "trains",
            self.out, step, self.total, old["max_steps"], cfg.max_steps,
            old["epochs"], cfg.epochs, self.total, lr, self.total,
        )  # fmt: skip

    # -- the plan and the log ------------------------------------------------------------------
    def open_log(self) -> MetricsLog:
        """Prepare the run dir, log and save the plan, open metrics.jsonl."""
        cfg, run, resumed = self.cfg, self.run_dir, self.resumed_from
        if dist.is_main():
            run.path.mkdir(parents=True, exist_ok=True)
            if resumed is not None:
                truncate_metrics(run.metrics, resumed, evaluated=not self.resumed_eval_pending)
                if self.extended_from:  # the run's settings now: a later resume compares them
                    write_json(run.config, cfg.to_dict())
            else:
                if cfg.overwrite:
                    run.clear()  # no stale best/, last/ or results beside the new run
                run.metrics.write_text("")
                write_json(run.config, cfg.to_dict())
            write_left_out(run.left_out, self.data.sources)
            plan = self.plan_record()
            write_json(run.plan, plan, default=str)
            logger.info(describe_plan(plan))
        purge = resumed + 1 if resumed is not None else None
        return MetricsLog(self.out, cfg.report_to if dist.is_main() else "none", purge)

    def plan_record(self) -> dict:
        cfg, plan = self.cfg, self.plan
        return {
            "method": cfg.method,
            "device": str(self.device),
            "precision": self.precision,
            "world_size": dist.world_size(),
            "sentences": {kind: len(src) for kind, src in self.data.sources.items()},
            "mixing": cfg.mixing,
            "global_batch": plan.global_batch,
            "batches_per_epoch": plan.batches_per_epoch,
            "steps_per_epoch": plan.steps_per_epoch,
            "epochs": cfg.epochs,
            "max_steps": cfg.max_steps,
            "total_steps": self.plan.total_steps,
            "eval_data": str(self.eval_dir) if self.eval_dir is not None else None,
            "eval_steps": cfg.eval_steps,
            "evals": len(self.eval_steps()),
            "final_eval": bool(cfg.final_eval and self.eval_dir is not None),
            "save_every": self.save_every,
            "resumed_from_step": self.resumed_from,
            "capture": self.capture_note(),
            "student": self.student_plan,
            "extended_from": self.extended_from,
            "checkpoint_bytes": self.checkpoint_bytes(),
            "keep_last_checkpoint": cfg.keep_last_checkpoint,
            "left_out": left_out_summary(self.data.sources),
            **mixing_plan(self.data, plan),
            # issue 41: what the steps train with, as the printed plan says it
            "batch_sizes": batch_sizes(plan.global_batch, self.data.sources),
            "packing": self.packing_note(),
        }

    def packing_note(self) -> str:
        """How a batch's sentences reach the encoder (:mod:`mmcse.packing`)."""
        cfg = self.cfg
        rows = f"rows of {packed_row_width(cfg.max_seq_length)} tokens"
        if cfg.packing:
            return f"packed: each batch's sentences end to end in {rows} (no padding)"
        if cfg.dynamic_padding:
            return "padded to the longest sentence of each batch"
        return f"padded to {cfg.max_seq_length} tokens"

    @property
    def save_every(self) -> int:
        """Steps between last/ saves: ``save_every``, else ``eval_steps``."""
        return self.cfg.save_every or self.cfg.eval_steps

    def checkpoint_bytes(self) -> dict[str, int]:
        """What best/ and last/ will take (:func:`mmcse.training.plan.checkpoint_sizes`): the
        weights and heads as saved, AdamW's moments of every trained parameter (the auxiliary
        task's too), the student's tokenizer files."""
        tensors = [*self.student.encoder.backbone.state_dict().values(),
                   *self.heads.state_dict().values()]  # fmt: skip
        weights = sum(v.numel() * v.element_size() for v in tensors)
        trained = {id(p): p for m in self.student.trained_modules() for p in m.parameters()}
        trained.update({id(p): p for p in self.heads.parameters()})
        parameters = sum(p.numel() for p in trained.values() if p.requires_grad)
        folder = Path(student_source(self.cfg, self.resuming))
        tokenizer = sum(
            (folder / name).stat().st_size for name in TOKENIZER_FILES if (folder / name).is_file()
        )
        return checkpoint_sizes(weights, parameters, tokenizer)

    def capture_note(self) -> str:
        """What the plan says about capture (:mod:`mmcse.training.fastpath`)."""
        if self.capture == "off":
            return f"off (--capture {self.cfg.capture} on {self.device.type}): eager step"
        replay = "replayed as CUDA graphs" if self.device.type == "cuda" else "no CUDA graphs"
        what = (
            "the whole update (forward, backward, clipping, AdamW, schedule)"
            if self.capture == "whole"
            else "forward and backward, the update eager"
            + ("" if self.cfg.capture == "forward" else " (DDP or fp16)")
        )
        return (
            f"on: {what} as one compiled graph per batch kind and batch size, {replay}; "
            f"batches padded to {self.cfg.max_seq_length} tokens"
        )

    def eval_steps(self) -> list[int]:
        return eval_steps(self.cfg.eval_steps, self.total, self.cfg.eval_last_step)

    # -- checkpoints ---------------------------------------------------------------------------
    def run_info(self, step: int, dev: float | None) -> dict:
        cfg = self.cfg
        return {
            "config": cfg.to_dict(),
            "method": self.method.to_dict(),
            "step": step,
            "total_steps": self.total,
            "finished": False,  # set true when the run completes (Checkpoint.mark_finished)
            "stsb_dev": dev,
            "pooler": cfg.pooler,
            "pooler_source": self.pooler_source,
            # built as the resume check builds what it compares (one helper, no drift)
            "fingerprints": input_fingerprints(self.data, self.auxiliary_sets),
            "term_heads": self.student.term_heads,  # which heads of mmcse_heads each term used
            "teachers": self.teachers(),
            "environment": self.environment,
        }

    def teachers(self) -> dict[str, dict]:
        """Provenance of every feature set the run reads (run info ``teachers``)."""
        teachers = self.data.teachers()
        if self.aux is not None:
            examples = self.aux.examples.manifest.provenance()
            teachers.update({f"feature:{k}": examples for k in self.aux.fingerprint})
        return teachers

    def save(self, checkpoint: Checkpoint, step: int, dev: float | None, saved=None) -> None:
        """Snapshot a checkpoint now and write it in the background (:class:`BackgroundWriter`):
        host copies of the weights, heads and trainer state (``saved``, last/ only) as they are
        after this step, so the steps that follow change nothing in it; written beside
        ``checkpoint`` and renamed into place (never half a save)."""
        info, name = self.run_info(step, dev), checkpoint.path.name
        self.writer.wait_for(name)  # the buffers of its last snapshot are reused
        live = {"weights": self.student.encoder.backbone.state_dict(),
                "heads": self.heads.state_dict(), "state": saved}  # fmt: skip
        snapshot, ready = self.snapshots.copy(name, live)
        self.writer.submit(name, lambda: self._write(checkpoint, step, info, snapshot, ready))

    def _write(self, checkpoint: Checkpoint, step: int, info: dict, snapshot, ready) -> None:
        ready()
        weights, heads, saved = snapshot["weights"], snapshot["heads"], snapshot["state"]
        with atomic_dir(checkpoint.path) as tmp:
            self.student.encoder.save_checkpoint(tmp, self.tokenizer, heads, info, weights=weights)
            if saved is not None:
                ckpt.save_trainer_state(tmp, saved)
                ckpt.write_integrity(  # last: it records every file above
                    tmp, step=step, settings=info["config"], fingerprints=info["fingerprints"]
                )

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The run folder held by this process while it trains into it (rank 0 holds it for
        every rank): a second process that would train there is refused in one line
        (:class:`mmcse.rundir.RunLock`, released by the kernel if this one is killed)."""
        if not dist.is_main():
            yield
            return
        with self.run_dir.lock():
            yield

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

    def save_best(self, state: RunState) -> None:
        """best/: the weights at ``state``'s step, with its best dev score."""
        self.save(self.run_dir.best, state.step, state.best_dev)

    def save_last(self, state: RunState) -> None:
        """The resumable checkpoint: everything needed to continue after ``state``'s step."""
        started = time.perf_counter()
        if dist.is_main():
            updates = self.updates.state_dict()
            saved = {
                "step": state.step,
                "epoch": state.epoch,
                "next_index": state.next_index,  # position in the epoch's batch order
                **{key: updates[key] for key in ("optimizer", "scheduler", "grad_scaler")},
                "rng": ckpt.rng_states(),
                "window": self.window.state_dict(),
                "best_dev": state.best_dev,
                "best_step": state.best_step,
                "aux": updates["aux"],
                "eval_pending": state.eval_pending,
            }
            self.save(self.run_dir.last, state.step, state.best_dev, saved)
        if dist.is_distributed():
            torch.distributed.barrier()
        self.window.exclude(time.perf_counter() - started)

    def finish(self, state: RunState) -> RunResult:
        try:
            self.writer.close()  # best/ and last/ written (or a write's error raised) first
        finally:
            if dist.is_distributed():  # every rank leaves training once rank 0's writes end
                torch.distributed.barrier()
        test = None
        cfg = self.cfg
        if dist.is_main() and cfg.final_eval and self.eval_dir is not None:
            best = str(self.run_dir.best.path)
            logger.info(
                "final test: scoring best/ (step %s) on the 7 STS test sets", state.best_step
            )
            test = evaluate_sts(
                best, data_dir=self.eval_dir, device=str(self.device), progress=True
            )
            self.run_dir.write_results("sts", test, source=FINAL)
        if dist.is_main():
            self.run_dir.best.mark_finished()
            ckpt.mark_finished(self.run_dir.last)  # saved anew: its integrity record stays true
            if not cfg.keep_last_checkpoint:  # best/ says the run finished; last/ only resumed
                shutil.rmtree(self.run_dir.last.path)
                logger.info("removed %s (--drop-last-dir)", self.run_dir.last.path)
        return RunResult(self.out, state.best_dev, state.best_step, test, state.step, cfg.method)

    def aborted_message(self, state: RunState) -> str:
        """What an interrupted exit that did not stop at a step boundary leaves to resume
        from: the step last/ holds (none: say so)."""
        info = self.run_dir.last.read_info()
        if not info:
            return (f"interrupted at step {state.step}; no last/ was saved, nothing to resume: "
                    "start the run again (--overwrite)")  # fmt: skip
        saved = info.get("step", "?")
        left = " (the final evaluation is left)" if saved == self.total else ""
        return (
            f"interrupted at step {state.step} of {self.total}; last/ holds step {saved}{left}. "
            f"Continue with: mmcse train --resume {self.out}"
        )

    def interrupted_message(self, state: RunState) -> str:
        redo = (
            "; its dev evaluation was cut short and --resume runs it first"
            if state.eval_pending
            else ""
        )
        return (
            f"interrupted after step {state.step} of {self.total}; last/ saved{redo}. "
            f"Continue with: mmcse train --resume {self.out}"
        )
