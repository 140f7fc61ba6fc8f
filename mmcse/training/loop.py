"""The Stage-2 trainer: configuration read, :meth:`Trainer.setup` builds everything once,
:meth:`Trainer.train_step` is one training step, :meth:`Trainer.fit` the loop around it.

A step (:meth:`Trainer.train_step`, which ``mmcse bench`` calls too): the auxiliary image/audio
update of VisualCSE/AudioCSE first (the released trainer's order), then the text update — both
dropout views of a gathered batch in one forward, every active term of the method, the weighted
sum's gradient, clipping, AdamW and the lr schedule — then the run's state advanced and the
step's terms added to the loss window. Every ``eval_steps`` the student is scored on
STS-B dev and the best checkpoint kept; at the end the best one is scored on the 7 STS test
sets. The same command runs under ``torchrun`` (DDP; in-batch negatives gathered across ranks).

The host stays off the step's critical path: the next batch — token ids, every cached feature the
method reads, its per-batch extras — is gathered on a worker thread and copied to the device on a
side stream meanwhile (:mod:`mmcse.training.prefetch`); the step's terms stay on the device,
summed per logging window and read back once per ``log_every`` steps
(:mod:`mmcse.training.metrics`, which also catches a non-finite loss there).

The updates a step runs, and their state in ``last/``, are :mod:`mmcse.training.updates`'s.
Whole-update capture (``capture``, on by default on CUDA; :mod:`mmcse.training.update`,
:mod:`mmcse.training.fastpath`): the text update — forward, backward, clipping, AdamW, schedule —
is one compiled function per batch kind, replayed as one CUDA graph; so is the auxiliary update.
Batches are then padded to ``max_seq_length``. Under DDP or fp16 only the student's forward and
backward are compiled and the update stays eager (:class:`mmcse.training.update.EagerUpdate`).

The run's progress (step, epoch, position, best dev) is one :class:`~mmcse.training.run_state.RunState`
that the loop advances; bookkeeping — the run directory, the plan record, run info, checkpoints,
resuming — is :mod:`mmcse.training.record`'s, given that state and the objects it saves. SIGINT
stops after the step (last/ saved); a dev evaluation it cut short is run first by the resume.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from mmcse import distributed as dist
from mmcse.devices import pick_device
from mmcse.errors import MmcseError, naming_os_errors
from mmcse.hub import load_tokenizer
from mmcse.model import SentenceEncoder
from mmcse.precision import autocast_context, evaluating_in
from mmcse.training import checkpoint as ckpt
from mmcse.training.config import TrainConfig
from mmcse.training.data import Batch
from mmcse.training.dev_eval import DevEvaluator
from mmcse.training.evaluation_steps import is_eval_step
from mmcse.training.fastpath import apply_fast_paths, capture, fresh_capture_cache
from mmcse.training.metrics import LossWindow, MetricsLog, Progress
from mmcse.training.prefetch import CPU, prefetched
from mmcse.training.preflight import preflight
from mmcse.training.record import RunRecord, RunResult, student_source
from mmcse.training.resolved import resolve_run_config
from mmcse.training.run_state import RunState
from mmcse.training.stop import EvaluationStopped, StopRequest, TrainingInterrupted
from mmcse.training.student import Student
from mmcse.training.updates import build_updates

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """One training run. ``Trainer(cfg).setup()`` checks every input and builds everything once;
    :meth:`step` is one training step; :meth:`fit` the loop (evaluation, logging, checkpoints)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False) -> None:
        self.cfg, self.resuming = cfg, resume
        #: the run's progress: steps taken, the next batch's place, the best dev (fit advances it)
        self.state = RunState()
        self.window = LossWindow()
        self.dev_evaluator: DevEvaluator | None = None

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> Trainer:
        """Preflight (every input checked before the model loads), then the student, the data,
        the auxiliary task and the updates, each built once; a resumed run's state loaded."""
        checked = preflight(self.cfg, resuming=self.resuming)
        dist.init_from_env()
        self.device = pick_device(self.cfg.device)
        seed_everything(self.cfg.seed)
        self.method = checked.method
        # pooler, capture, padding and precision decided once; the run's config records them
        self.cfg, self.resolved = resolve_run_config(
            self.cfg, self.method, self.device, dist.is_distributed()
        )
        cfg = self.cfg
        self.pooler_source = self.resolved.pooler_source
        self.capture, self.precision = self.resolved.capture, self.resolved.precision
        self.autocast = autocast_context(self.device, cfg.precision)  # resolved once
        saved = ckpt.load_trainer_state(Path(cfg.output_dir)) if self.resuming else None
        self.tokenizer = load_tokenizer(cfg.model)
        encoder = SentenceEncoder.from_pretrained(
            student_source(cfg, self.resuming),
            cfg.pooler,
            cfg.dropout,
            attn_implementation=cfg.attn_implementation,
        )
        self.data = checked.data.tokenise(self.tokenizer, cfg)  # preflight's join, kept
        dims = {role: int(fs.dim) for role, fs in self.data.feature_sets.items()}
        self.student = Student(encoder, self.method, dims).to(self.device)
        apply_fast_paths(cfg, encoder, self.device, self.capture != "off")
        self.model = self._wrapped_student()
        self.aux = self.method.auxiliary_task(encoder, cfg, self.device)
        # preflight's plan: the same corpora (tokenising them changes no count), the same world
        self.run_plan = checked.run_plan
        self.global_batch, self.total = self.run_plan.global_batch, self.run_plan.total_steps
        if cfg.packing and not cfg.dynamic_padding:  # static shapes: one packed budget per kind
            budgets = self.data.fix_pack_budgets(self.run_batches())
            logger.info(
                "packing: %s rows of %d tokens per dropout view (the most any batch needs)",
                ", ".join(f"{kind} {rows}" for kind, rows in sorted(budgets.items())),
                self.data.pack_width,
            )
        self.updates = build_updates(
            cfg,
            self.student,
            self.model,
            self.aux,
            self.device,
            self.capture,
            self.total,
            self.autocast,
        )
        self.record = self._run_record(checked.auxiliary)
        self.state = self.record.restore(saved)
        return self

    def _run_record(self, auxiliary_sets: dict) -> RunRecord:
        """The run's bookkeeping, given what it records and saves."""
        return RunRecord(
            self.cfg,
            self.run_plan,
            self.resolved,
            resuming=self.resuming,
            device=self.device,
            method=self.method,
            student=self.student,
            tokenizer=self.tokenizer,
            aux=self.aux,
            data=self.data,
            auxiliary_sets=auxiliary_sets,
            updates=self.updates,
            window=self.window,
        )

    def _wrapped_student(self) -> nn.Module:
        """The student as the eager text step calls it: compiled (forward capture), inside DDP."""
        if self.capture == "forward":
            fresh_capture_cache()
            capture(self.student, self.device)  # inside DDP: its hooks stay eager
        if not dist.is_distributed():
            return self.student
        return nn.parallel.DistributedDataParallel(
            self.student,
            find_unused_parameters=True,  # caption-only heads idle on text batches
        )

    @property
    def encoder(self) -> SentenceEncoder:
        return self.student.encoder

    # -- one step ------------------------------------------------------------------------------
    def train_step(self, batch: Batch, epoch: int, index: int, waited: float = 0.0) -> None:
        """One step on ``batch``, the one at ``index`` of ``epoch``'s batch order: VisualCSE/
        AudioCSE's image/audio update on its own batch first (the released trainer's order),
        the text update, the run's state advanced, the terms added to the loss window (on the
        device: read once per ``log_every``). :meth:`fit` and ``mmcse bench`` call it."""
        parts, host = [], {}
        if self.updates.auxiliary is not None:
            part, host = self.updates.auxiliary.step()
            parts.append(part)
        self.student.train()
        parts.append(self.updates.text.step(batch.kind, (batch,)))
        state = self.state
        state.step, state.epoch, state.next_index = state.step + 1, epoch, index + 1
        self.window.add_step(state.step, batch.kind, parts, host, waited)

    # -- the loop ------------------------------------------------------------------------------
    def fit(self) -> RunResult:
        """From the run's state (a resumed run's next batch) to its last step, the run folder
        held meanwhile (one process trains into it at a time: :meth:`RunRecord.held`)."""
        with self.record.held():
            log = self.record.open_log()
            title = f"train {self.cfg.method}"
            progress = Progress(self.total, self.state.step, title, dist.is_main())
            with self.record.writing(), StopRequest() as stop, log, progress:
                self.window.start_clock()  # steps/s from here: not setup, nor a save's steps
                if self.state.eval_pending:  # a stop came before or during its evaluation
                    self._evaluate_resumed_step(log, progress, stop)
                self._train(log, progress, stop)
            return self.record.finish(self.state)

    def _train(self, log: MetricsLog, progress: Progress, stop: StopRequest) -> None:
        state, first = self.state, self.state.epoch
        for epoch in range(first, self.cfg.epochs):
            skip = state.next_index if epoch == first else 0
            for index, batch, waited in self.batches(epoch, skip):
                if state.step >= self.total:
                    break
                self.train_step(batch, epoch, index, waited)
                self._after_step(log, progress, stop)

    def _evaluate_resumed_step(
        self, log: MetricsLog, progress: Progress, stop: StopRequest
    ) -> None:
        """The evaluation a stop signal left undone at last/'s step, before the next step:
        the resumed run scores (and keeps best/ of) every step an uninterrupted run does."""
        logger.info("resume: running the dev evaluation of step %d first", self.state.step)
        self._evaluate(log, progress, stop)
        if stop.agreed(True):  # stopped again: last/ says what is still to do
            self.record.save_last(self.state)
            self._interrupted()

    def _after_step(self, log: MetricsLog, progress: Progress, stop: StopRequest) -> None:
        """Logging, evaluation and checkpoints due after this step; stops on a SIGINT."""
        step, cfg = self.state.step, self.cfg
        if step % cfg.log_every == 0 or step == self.total:
            self._log(log, progress)
        paused = time.perf_counter()  # evaluation and checkpoints: not in steps/s and eta
        dev_data = self.record.eval_dir is not None
        if is_eval_step(step, cfg.eval_steps, self.total, cfg.eval_last_step, dev_data=dev_data):
            self._evaluate(log, progress, stop)
        stopping = stop.agreed(step % cfg.log_every == 0)
        if step % self.record.save_every == 0 or step == self.total or stopping:
            self.record.save_last(self.state)
        progress.exclude(time.perf_counter() - paused)
        progress.update(step)
        if stopping:
            self._interrupted()

    def _interrupted(self) -> None:
        self.record.writer.wait()  # last/ on disk before the message says so
        message = self.record.interrupted_message(self.state)
        if dist.is_main():
            logger.warning(message)
        raise TrainingInterrupted(message)

    def run_batches(self):
        """``(kind, rows)``: this rank's part of every batch the run draws, in order (every
        epoch up to the run's last step)."""
        size, rank, left = self.cfg.batch_size, dist.rank(), self.total
        epoch = 0
        while left > 0:
            order = self.data.batch_order(epoch, self.global_batch)
            for kind, rows in order[:left]:
                yield kind, rows[rank * size : (rank + 1) * size]
            left -= len(order)
            epoch += 1

    def batches(self, epoch: int, skip: int):
        """This rank's batches of one epoch from position ``skip``, each gathered (with the
        method's extras) and copied to the device while the step before it runs."""
        size, rank = self.cfg.batch_size, dist.rank()
        order = self.data.batch_order(epoch, self.global_batch)
        items = [
            (index, kind, rows[rank * size : (rank + 1) * size])
            for index, (kind, rows) in enumerate(order)
            if index >= skip
        ]
        for (index, _, _), batch, waited in prefetched(items, self.gather, self.device):
            yield index, batch, waited

    def gather(self, item) -> Batch:
        """A batch on the host: token ids, cached features and the method's extras."""
        _, kind, rows = item
        batch = self.data.batch(kind, rows, CPU)
        self.method.batch_inputs(self.data, batch).apply_to(batch)
        return batch

    # -- logging and evaluation ----------------------------------------------------------------
    def _log(self, log: MetricsLog, progress: Progress) -> None:
        try:
            window, error = self.window.flush(), None  # the window's one host sync
        except MmcseError as exc:  # a non-finite loss, named by its step
            window, error = None, exc
        if dist.any_rank(error is not None):  # every rank stops at the same point
            raise error or MmcseError("the loss became non-finite on another rank")
        if not dist.is_main():
            return
        record = {"step": self.state.step, "epoch": self.state.epoch, "time": time.time()}
        record.update(lr=self.updates.text.lr(), **window)
        log.write(record)
        progress.set(loss=record["loss"], dev=self._dev_text())

    def _dev_evaluator(self) -> DevEvaluator:
        """The run's STS-B dev evaluator, its data prepared at the first evaluation."""
        if self.dev_evaluator is None:
            self.dev_evaluator = DevEvaluator(self.encoder, self.tokenizer, self.record.eval_dir)
        return self.dev_evaluator

    def _dev_text(self) -> str:
        best = self.state.best_dev
        return "-" if best is None else f"{best:.2f}"

    def _evaluate(
        self, log: MetricsLog, progress: Progress, stop: StopRequest | None = None
    ) -> None:
        """Score STS-B dev on rank 0; keep the best checkpoint. No eval data → keep the last.
        A stop signal (``stop``) before it or between its batches ends it: no score, no best/,
        and the run's state says it is still to do (a resume runs it first)."""
        started, state = time.perf_counter(), self.state
        score, stopped = None, False
        if dist.is_main():
            if self.record.eval_dir is not None:
                asked = None if stop is None else (lambda: stop.requested)
                try:
                    if asked is not None and asked():
                        raise EvaluationStopped("a stop signal came before the evaluation")
                    score = self._dev_evaluator()(self.encoder, stop=asked)
                except EvaluationStopped:
                    stopped = True
                    logger.warning(
                        "dev eval at step %d not finished (a stop signal): a resume runs it",
                        state.step,
                    )
            if not stopped and state.improves(score):
                state.keep_best(score)
                self.record.save_best(state)
            if score is not None:
                seconds = time.perf_counter() - started
                log.write(
                    {
                        "step": state.step,
                        "epoch": state.epoch,
                        "time": time.time(),
                        "stsb_dev": score,
                        "eval_s": seconds,
                    }
                )
                progress.set(dev=self._dev_text())
                progress.write(
                    f"{self.dev_evaluator.name} at step {state.step}: {score:.2f} "
                    f"(best {self._dev_text()}); "
                    f"evaluated in {seconds:.1f} s, not counted in steps/s or eta"
                )
        state.eval_pending = stopped  # rank 0's word: only it saves last/
        if dist.is_distributed():
            torch.distributed.barrier()
        self.window.exclude(time.perf_counter() - started)


def train(cfg: TrainConfig, resume: bool = False) -> RunResult:
    """Train a run; ``resume`` continues the run in ``cfg.output_dir`` from its last/ (a
    finished run only when a larger ``max_steps``/``epochs`` extends it; else nothing happens)."""
    finished = ckpt.finished_note(cfg.to_dict()) if resume else None
    if finished is not None:
        logger.info(finished)
        return RunResult(Path(cfg.output_dir), None, None, None, 0, cfg.method)
    trainer = Trainer(cfg, resume).setup()
    try:
        with naming_os_errors(trainer.record.out), evaluating_in(cfg.eval_precision):
            return trainer.fit()
    except TrainingInterrupted:
        raise
    except KeyboardInterrupt:  # a second Ctrl-C, or one in the final evaluation: still a hint
        message = trainer.record.aborted_message(trainer.state)
        if dist.is_main():
            logger.warning(message)
        raise TrainingInterrupted(message) from None
