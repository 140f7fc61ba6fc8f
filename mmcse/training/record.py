"""A trainer's bookkeeping: the run directory, the plan record, run info, checkpoints, resuming.

Kept apart from :mod:`mmcse.training.loop` so that the trainer reads as setup + step + loop:
nothing here changes what a step computes. The run's progress is a
:class:`~mmcse.training.run_state.RunState` that the trainer advances and passes in; resuming
returns one. What the run directory holds, and under which names, is :mod:`mmcse.rundir`'s;
what the plan says :mod:`mmcse.training.plan`'s (:class:`~mmcse.training.plan.PlanRecord`); how
a checkpoint is written, and what it takes on disk, :mod:`mmcse.training.checkpoint_writer`'s;
what last/ holds and how a resume checks it :mod:`mmcse.training.checkpoint`'s.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors.torch import load_file
from torch import nn

from mmcse import distributed as dist
from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation import evaluate_sts, format_rows
from mmcse.evaluation.sts import eval_data_dir
from mmcse.files import write_json
from mmcse.rundir import FINAL, RunDir
from mmcse.training import checkpoint as ckpt
from mmcse.training.checkpoint_writer import CheckpointWriter, trained_sizes
from mmcse.training.corpora import write_left_out
from mmcse.training.metrics import MetricsLog, describe_plan, truncate_metrics
from mmcse.training.plan import PlanRecord, plan_record, steps_between_saves
from mmcse.training.preflight import input_fingerprints
from mmcse.training.run_state import RunState

if TYPE_CHECKING:
    from mmcse.methods import Method
    from mmcse.training.config import TrainConfig
    from mmcse.training.data import TrainData
    from mmcse.training.metrics import LossWindow
    from mmcse.training.plan import RunPlan
    from mmcse.training.resolved import ResolvedRun
    from mmcse.training.student import Student

logger = logging.getLogger(__name__)


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


def saved_heads(student: Student, aux: Any) -> nn.ModuleDict:
    """What a checkpoint saves as ``mmcse_heads``: the method's heads and the auxiliary task's
    (``aux``, e.g. VisualCSE's patch embedding and image head; None without one)."""
    heads = nn.ModuleDict({"heads": student.heads})
    if aux is not None:
        heads["aux"] = aux.heads
    return heads


def feature_teachers(data: TrainData, aux: Any) -> dict[str, dict]:
    """Provenance of every feature set the run reads (run info ``teachers``): the data's and
    the auxiliary task's (``aux``; None without one)."""
    teachers = data.teachers()
    if aux is not None:
        examples = aux.examples.manifest.provenance()
        teachers.update({f"feature:{k}": examples for k in aux.fingerprint})
    return teachers


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
        resolved: ResolvedRun,
        *,
        resuming: bool,
        device: torch.device,
        method: Method,
        student: Student,
        tokenizer: Any,
        aux: Any,
        data: TrainData,
        auxiliary_sets: dict,
        updates: Updates,
        window: LossWindow,
    ) -> None:
        """``resolved``: the run's pooler, capture, precision and student as decided at setup;
        ``aux``: the method's auxiliary task (VisualCSE's images: its heads and examples) or
        None; ``auxiliary_sets``: its feature sets by role, as preflight opened them."""
        self.cfg, self.plan, self.resolved, self.resuming = cfg, plan, resolved, resuming
        self.device, self.method, self.student, self.aux = device, method, student, aux
        self.data, self.auxiliary_sets = data, auxiliary_sets
        self.updates, self.window = updates, window
        self.heads = saved_heads(student, aux)
        self.total, self.save_every = plan.total_steps, steps_between_saves(cfg)
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
        self.writer = CheckpointWriter(student.encoder, tokenizer)

    # -- resuming ------------------------------------------------------------------------------
    def restore(self, saved: dict | None) -> RunState:
        """The run's state to start from: a new run's, or the one last/ saved (``saved``, its
        ``trainer_state.pt``), whose heads, updates, loss window and random states are loaded
        into the objects this record was given."""
        self.environment = environment(self.device, self.resolved.precision)
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
        state = ckpt.saved_run_state(saved)
        self.resumed_from, self.resumed_eval_pending = state.step, state.eval_pending
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
            *(self.out, step, self.total, old["max_steps"], cfg.max_steps),
            *(old["epochs"], cfg.epochs, self.total, lr, self.total),
        )

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
            plan = self.plan_record().as_json()
            write_json(run.plan, plan, default=str)
            logger.info(describe_plan(plan))
        purge = resumed + 1 if resumed is not None else None
        return MetricsLog(self.out, cfg.report_to if dist.is_main() else "none", purge)

    def plan_record(self) -> PlanRecord:
        """The plan as it stands (a resume's and an extension's included), with what best/ and
        last/ will take on disk."""
        tokenizer_folder = Path(student_source(self.cfg, self.resuming))
        return plan_record(
            self.cfg,
            self.plan,
            self.data,
            device=self.device,
            precision=self.resolved.precision,
            capture=self.resolved.capture,
            student=self.resolved.student_record(),
            eval_dir=self.eval_dir,
            resumed_from=self.resumed_from,
            extended_from=self.extended_from,
            checkpoint_bytes=trained_sizes(self.student, self.heads, tokenizer_folder),
        )

    # -- checkpoints ---------------------------------------------------------------------------
    def run_info(self, step: int, dev: float | None) -> dict:
        return {
            "config": self.cfg.to_dict(),
            "method": self.method.to_dict(),
            "step": step,
            "total_steps": self.total,
            "finished": False,  # set true when the run completes (Checkpoint.mark_finished)
            "stsb_dev": dev,
            "pooler": self.cfg.pooler,
            "pooler_source": self.resolved.pooler_source,
            # built as the resume check builds what it compares (one helper, no drift)
            "fingerprints": input_fingerprints(self.data, self.auxiliary_sets),
            "term_heads": self.student.term_heads,  # which heads of mmcse_heads each term used
            "teachers": feature_teachers(self.data, self.aux),
            "environment": self.environment,
        }

    def save_best(self, state: RunState) -> None:
        """best/: the weights at ``state``'s step, with its best dev score, written in the
        background (:class:`~mmcse.training.checkpoint_writer.CheckpointWriter`)."""
        info = self.run_info(state.step, state.best_dev)
        self.writer.save(self.run_dir.best, info, self.heads.state_dict())

    def save_last(self, state: RunState) -> None:
        """The resumable checkpoint: everything needed to continue after ``state``'s step."""
        started = time.perf_counter()
        if dist.is_main():
            saved = ckpt.trainer_state(state, self.updates.state_dict(), self.window.state_dict())
            info = self.run_info(state.step, state.best_dev)
            self.writer.save(self.run_dir.last, info, self.heads.state_dict(), saved)
        if dist.is_distributed():
            torch.distributed.barrier()
        self.window.exclude(time.perf_counter() - started)

    def held(self) -> contextlib.AbstractContextManager:
        """The run folder held by this process while it trains into it (rank 0 holds it for
        every rank): a second process that would train there is refused in one line
        (:class:`mmcse.rundir.RunLock`, released by the kernel if this one is killed)."""
        return self.run_dir.lock() if dist.is_main() else contextlib.nullcontext()

    def writing(self) -> contextlib.AbstractContextManager[None]:
        """The training loop's span: however it ends, the checkpoint in flight is on disk
        before the run goes on or exits; a clean end leaves the waiting to :meth:`finish`."""
        return self.writer.closed_on_error()

    def finish(self, state: RunState) -> RunResult:
        try:
            self.writer.close()  # best/ and last/ written (or a write's error raised) first
        finally:
            if dist.is_distributed():  # every rank leaves training once rank 0's writes end
                torch.distributed.barrier()
        test = None
        cfg, run = self.cfg, self.run_dir
        if dist.is_main() and cfg.final_eval and self.eval_dir is not None:
            logger.info(
                "final test: scoring best/ (step %s) on the 7 STS test sets", state.best_step
            )
            best, device = str(run.best.path), str(self.device)
            test = evaluate_sts(best, data_dir=self.eval_dir, device=device, progress=True)
            run.write_results("sts", test, source=FINAL)
        if dist.is_main():
            run.best.mark_finished()
            ckpt.mark_finished(run.last)  # saved anew: its integrity record stays true
            if not cfg.keep_last_checkpoint:  # best/ says the run finished; last/ only resumed
                shutil.rmtree(run.last.path)
                logger.info("removed %s (--drop-last-dir)", run.last.path)
        return RunResult(self.out, state.best_dev, state.best_step, test, state.step, cfg.method)

    def aborted_message(self, state: RunState) -> str:
        return ckpt.aborted_note(self.run_dir, state, self.total)

    def interrupted_message(self, state: RunState) -> str:
        return ckpt.interrupted_note(self.run_dir, state, self.total)
