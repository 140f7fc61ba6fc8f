"""The Stage-2 training loop: one plain loop, readable in one sitting.

Per step: gather a batch from the pre-tokenised corpus and the memory-mapped feature cache, encode
it twice in one forward (the two dropout views), let every active term of the method compute its
losses from the embeddings, step AdamW on the weighted sum. Every ``eval_steps`` the student is
scored on STS-B dev and the best checkpoint kept; at the end the best one is scored on the 7 STS
test sets. The same command runs under ``torchrun`` (DDP; in-batch negatives gathered across ranks).

The step never waits for the device: its loss terms are summed on the device and read back once
per ``log_every`` window (:mod:`mmcse.training.metrics`, which also catches a non-finite loss there),
and the next batch is gathered on a worker thread meanwhile (:mod:`mmcse.training.prefetch`). Checkpoints
are written beside and renamed into place; ``last/`` (every ``save_every`` steps) holds what
``--resume`` needs to continue exactly, with an integrity record checked before a resume
(:mod:`mmcse.training.checkpoint`). SIGINT stops after the step.
What the run directory holds, and under which names, is :mod:`mmcse.rundir`'s.

Whole-step capture (``capture``, on by default on CUDA; :mod:`mmcse.training.fastpath`): the
student's forward — encoder, both views, every active term — and its backward run as one
compiled graph per batch kind, replayed as CUDA graphs, instead of thousands of separate
operators; the optimizer step, clipping and the schedule stay as they are. Batches are then
padded to ``max_seq_length``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from mmcse import distributed as dist
from mmcse.devices import pick_device
from mmcse.environment import environment
from mmcse.errors import MmcseError, naming_os_errors
from mmcse.evaluation import format_rows
from mmcse.files import atomic_dir, write_json
from mmcse.hub import load_tokenizer
from mmcse.losses.base import LossInputs
from mmcse.methods import Method, build_heads, build_losses, build_method
from mmcse.model import SentenceEncoder, resolve_pooler
from mmcse.pooling import DEFAULT_POOLER
from mmcse.precision import autocast_for, grad_scaler_for, precision_name
from mmcse.rundir import FINAL, Checkpoint, RunDir, resolve_model_dir
from mmcse.training import checkpoint as ckpt
from mmcse.training.config import TrainConfig
from mmcse.training.data import Batch, TrainData
from mmcse.training.dev_eval import DevEvaluator, resolve_eval_dir
from mmcse.training.fastpath import (
    apply_fast_paths,
    begin_captured_step,
    capture,
    capture_enabled,
    fresh_capture_cache,
    fused_adamw,
)
from mmcse.training.metrics import LossWindow, MetricsLog, Progress, describe_plan, truncate_metrics
from mmcse.training.plan import mixing_plan
from mmcse.training.prefetch import CPU, prefetched
from mmcse.training.preflight import input_fingerprints, preflight

logger = logging.getLogger(__name__)



class Student(nn.Module):
    """The encoder, the heads the method declares (each built once, trained with it) and the
    method's parameter-free loss modules."""

    def __init__(self, encoder: SentenceEncoder, method: Method, feature_dims: dict[str, int]):
        super().__init__()
        self.encoder = encoder
        self.terms = method.active_terms()
        self.heads = build_heads(method, encoder.hidden_size, feature_dims)
        self.losses = build_losses(method)
        #: term → slot → head name (saved with each checkpoint: which term trained which head)
        self.term_heads = {t.name: t.head_names() for t in self.terms}
        # term → slot → head module, resolved once (not at every step)
        self.term_modules = {
            term: {slot: self.heads[name] for slot, name in slots.items()}
            for term, slots in self.term_heads.items()
        }
        self.needs_token_states = any(m.needs_token_states for m in self.losses.values())

    def forward(self, batch: Batch, extras: dict) -> dict[str, Tensor]:
        """Weighted total under ``"loss"`` plus every raw ``*_loss`` term of this batch."""
        n = batch.size
        out = self.encoder(
            input_ids=batch.input_ids.repeat(2, 1), attention_mask=batch.attention_mask.repeat(2, 1)
        )
        inputs = LossInputs(
            view1=out.sentence[:n],
            view2=out.sentence[n:],
            features=batch.features,
            batch_kind=batch.kind,
            token_states=(out.token_states[:n], out.token_states[n:])
            if self.needs_token_states
            else None,
            attention_mask=batch.attention_mask,
            extras=extras,
        )
        terms: dict[str, Tensor] = {}
        total = out.sentence.new_zeros(())
        for term in self.terms:
            if not term.applies_to(batch.kind):
                continue
            for key, value in self.losses[term.name](inputs, self.term_modules[term.name]).items():
                terms[key] = value
                total = total + term.weight * value
        return {"loss": total, **terms}


def detached_terms(terms: dict[str, Tensor], copy: bool) -> dict[str, Tensor]:
    """The step's terms for the loss window. ``copy``: in one new tensor, since a replayed CUDA
    graph rewrites its outputs at the next step (one stack, not a copy per term)."""
    if not copy:
        return {k: v.detach() for k, v in terms.items()}
    values = torch.stack([v.detach().float() for v in terms.values()])
    return dict(zip(terms, values.unbind(), strict=True))


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def adamw_groups(student: nn.Module) -> list[dict]:
    """One AdamW group per module whose parameters step together (the encoder, each head):
    parameters of a group share their step count, which ε's scaling needs."""
    seen: set[int] = set()  # a module's parameters join one group only
    groups = []
    for module in (student.encoder, *student.heads.values()):  # losses hold no parameters
        params = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            groups.append({"params": params})
    return groups


def use_transformers_eps(optimizer: torch.optim.Optimizer, eps: float) -> None:
    """Make torch's AdamW step equal transformers.AdamW's: that adds ε to √v before folding the
    bias correction into the step size, i.e. torch's ε scaled by 1/√(1 − β₂ᵗ) at step t."""
    for group in optimizer.param_groups:
        state = optimizer.state.get(group["params"][0], {})  # a group's params step together
        t = int(state.get("step", 0)) + 1
        group["eps"] = eps / math.sqrt(1.0 - group["betas"][1] ** t)


def linear_schedule(optimizer, warmup: int, total: int):
    """HF's ``get_linear_schedule_with_warmup`` exactly: factor ``s/w`` for ``s < w``, then
    ``(T − s)/(T − w)``, ``s`` = optimizer steps taken (the first step runs at factor 0 when
    ``w > 0``, as in the released code)."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def resolve_training_pooler(cfg: TrainConfig, method: Method) -> tuple[str, str]:
    """``cfg.pooler`` with ``auto`` resolved: the student's own pooling, else the method's."""

    try:
        student_dir = resolve_model_dir(cfg.model)
    except MmcseError:
        student_dir = None  # the loader reports the bad path
    fallback = getattr(method, "pooler", DEFAULT_POOLER)
    return resolve_pooler(cfg.pooler, student_dir, fallback)


class StopRequest:
    """SIGINT asks the loop to stop after the current step (a second one interrupts at once)."""

    def __init__(self) -> None:
        self.requested = False
        self.previous = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        logger.warning("stopping after this step (Ctrl-C again to abort now)")

    def agreed(self, at_sync_point: bool) -> bool:
        """Under DDP every rank must stop at the same step: they agree at sync points only."""
        if not dist.is_distributed():
            return self.requested
        return at_sync_point and dist.any_rank(self.requested)


class TrainingInterrupted(KeyboardInterrupt):
    """Raised after SIGINT once last/ is saved; ``mmcse`` exits 130 (the resume hint is printed)."""


class Run:
    """State of one training run (kept small: the loop itself is :meth:`fit`)."""

    def __init__(self, cfg: TrainConfig, resume: bool = False) -> None:
        preflight(cfg, resuming=resume)  # every input checked before the model loads
        self.cfg = cfg
        dist.init_from_env()
        self.device = pick_device(cfg.device)
        seed_everything(cfg.seed)
        self.run_dir = RunDir(cfg.output_dir)
        self.out = self.run_dir.path
        self.resume_state = ckpt.load_trainer_state(self.out) if resume else None
        #: a finished run given a larger --max-steps/--epochs: where it had ended
        self.extended_from = ckpt.extension_of(cfg.to_dict()) if resume else None
        self.method = build_method(cfg.method, **cfg.method_args)
        # 'auto' becomes the student's own pooling (or the method's); the run's config records it
        pooler, self.pooler_source = resolve_training_pooler(cfg, self.method)
        self.cfg = cfg = dataclasses.replace(cfg, pooler=pooler)
        self.captured = capture_enabled(cfg, self.device)
        if self.captured and cfg.dynamic_padding:  # one shape per batch kind: one graph each
            logger.info("capture: batches padded to --max-seq-length (no dynamic padding)")
            self.cfg = cfg = dataclasses.replace(cfg, dynamic_padding=False)
        self.tokenizer = load_tokenizer(cfg.model)
        source = str(self.run_dir.last.path) if resume else cfg.model
        encoder = SentenceEncoder.from_pretrained(
            source, cfg.pooler, cfg.dropout, attn_implementation=cfg.attn_implementation
        )
        self.data = TrainData(cfg, self.tokenizer, self.method)
        dims = {role: int(fs.dim) for role, fs in self.data.feature_sets.items()}
        self.student = Student(encoder, self.method, dims).to(self.device)
        apply_fast_paths(cfg, encoder, self.device, self.captured)
        if self.captured:
            fresh_capture_cache()
            capture(self.student, self.device)  # inside DDP: its hooks stay eager
        self.environment = environment(self.device, precision_name(self.device, cfg.precision))
        self.model = self.student
        if dist.is_distributed():
            self.model = nn.parallel.DistributedDataParallel(
                self.student,
                find_unused_parameters=True,  # caption-only heads idle on text batches
            )
        self.aux = self.method.auxiliary_task(encoder, cfg, self.device)
        if self.captured and self.aux is not None:
            self.aux.capture(lambda module: capture(module, self.device))
        self.scaler = grad_scaler_for(self.device, cfg.precision)
        self.eval_dir = resolve_eval_dir(cfg)
        self.dev_evaluator: DevEvaluator | None = None
        self.best_dev: float | None = None
        self.best_step: int | None = None
        self.step, self.total = 0, 0
        self.window = LossWindow()

    @property
    def encoder(self) -> SentenceEncoder:
        return self.student.encoder

    @property
    def save_every(self) -> int:
        return self.cfg.save_every or self.cfg.eval_steps

    def plan(self) -> tuple[int, int]:
        """(global batch, total optimizer steps)."""
        global_batch = dist.global_batch(self.cfg.batch_size)
        per_epoch = sum(self.data.batches_per_epoch(global_batch).values())  # = len(schedule)
        total = per_epoch * self.cfg.epochs
        if self.cfg.max_steps > 0:
            total = min(total, self.cfg.max_steps)
        return global_batch, total

    def fit(self) -> RunResult:
        cfg = self.cfg
        global_batch, self.total = self.plan()
        if self.aux is not None:
            self.aux.total_steps = self.total  # the auxiliary task's own lr schedule spans the run
        optimizer = torch.optim.AdamW(
            adamw_groups(self.student),
            lr=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
            eps=cfg.adam_eps,
            fused=fused_adamw(cfg, self.device),
        )
        scheduler = linear_schedule(optimizer, cfg.warmup_steps, self.total)
        if self.extended_from and self.total <= self.extended_from["step"]:
            raise MmcseError(
                f"--resume {self.out}: max_steps {cfg.max_steps} and epochs {cfg.epochs} still "
                f"end the run at step {self.total}, where it finished; nothing to extend"
            )
        epoch0, index0 = self._start(optimizer, scheduler)
        log = self._open_log(global_batch)
        progress = Progress(self.total, self.step, f"train {cfg.method}", dist.is_main())
        with StopRequest() as stop, log, progress:
            for epoch in range(epoch0, cfg.epochs):
                skip = index0 if epoch == epoch0 else 0
                for index, batch, waited in self._batches(epoch, global_batch, skip):
                    if self.step >= self.total:
                        break
                    terms = self._step(batch.kind, batch.rows, optimizer, scheduler, batch)
                    self.step += 1
                    self.window.add(self.step, batch.kind, terms, waited)
                    if self.step % cfg.log_every == 0 or self.step == self.total:
                        self._log(log, progress, epoch, scheduler)
                    if self.step % cfg.eval_steps == 0 or self.step == self.total:
                        self._evaluate(log, progress, epoch)
                    stopping = stop.agreed(self.step % cfg.log_every == 0)
                    if self.step % self.save_every == 0 or self.step == self.total or stopping:
                        self._save_last(epoch, index + 1, optimizer, scheduler)
                    progress.update(self.step)
                    if stopping:
                        self._interrupted()
        return self._finish(self.step)

    def _step(
        self, kind: str, rows: np.ndarray, optimizer, scheduler, batch: Batch | None = None
    ) -> dict:
        """One optimizer step; returns the terms as device tensors (read back per log window)."""
        # the auxiliary (image/audio) update first, then the text one: the released trainer's
        # order (VisualCSE's Algorithm 1 lists the text update first)
        record = self.aux.step() if self.aux is not None else {}
        self.model.train()
        if batch is None:
            batch = self.data.batch(kind, rows, self.device)
        extras = self.method.batch_extras(self.data, batch)
        optimizer.zero_grad(set_to_none=True)  # before the forward: no grad outlives its step
        if self.captured:
            begin_captured_step(self.device)
        with autocast_for(self.device, self.cfg.precision):
            terms = self.model(batch, extras)
        self.scaler.scale(terms["loss"]).backward()
        if self.cfg.grad_clip > 0:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.cfg.grad_clip)
        if self.cfg.adam_eps_style == "transformers":
            use_transformers_eps(optimizer, self.cfg.adam_eps)
        self.scaler.step(optimizer)
        self.scaler.update()
        scheduler.step()
        record.update(detached_terms(terms, copy=self.captured))
        return record

    def _batches(self, epoch: int, global_batch: int, skip: int):
        """This rank's batches of one epoch from position ``skip``, gathered one step ahead."""
        size, rank = self.cfg.batch_size, dist.rank()
        schedule = self.data.schedule(epoch, global_batch)
        items = [
            (index, kind, rows[rank * size : (rank + 1) * size])
            for index, (kind, rows) in enumerate(schedule)
            if index >= skip
        ]
        for (index, _, _), batch, waited in prefetched(
            items, lambda item: self.data.batch(item[1], item[2], CPU), self.device
        ):
            yield index, batch, waited

    # -- logging ---------------------------------------------------------------------------
    def _open_log(self, global_batch: int) -> MetricsLog:
        """Prepare the run dir, log and save the plan, open metrics.jsonl."""
        resumed = self.resume_state is not None
        run = self.run_dir
        if dist.is_main():
            run.path.mkdir(parents=True, exist_ok=True)
            if resumed:
                truncate_metrics(run.metrics, self.step)
                if self.extended_from:  # the run's settings now: a later resume compares them
                    write_json(run.config, self.cfg.to_dict())
            else:
                if self.cfg.overwrite:
                    run.clear()  # no stale best/, last/ or results beside the new run
                run.metrics.write_text("")
                write_json(run.config, self.cfg.to_dict())
            plan = self._plan_record(global_batch)
            write_json(run.plan, plan, default=str)
            logger.info(describe_plan(plan))
        purge = self.step + 1 if resumed else None
        return MetricsLog(self.out, self.cfg.report_to if dist.is_main() else "none", purge)

    def _plan_record(self, global_batch: int) -> dict:
        cfg = self.cfg
        per_epoch = self.data.batches_per_epoch(global_batch)
        return {
            "method": cfg.method,
            "device": str(self.device),
            "precision": precision_name(self.device, cfg.precision),
            "world_size": dist.world_size(),
            "sentences": {kind: len(src) for kind, src in self.data.sources.items()},
            "mixing": cfg.mixing,
            "global_batch": global_batch,
            "batches_per_epoch": per_epoch,
            "steps_per_epoch": sum(per_epoch.values()),
            "epochs": cfg.epochs,
            "max_steps": cfg.max_steps,
            "total_steps": self.total,
            "eval_data": str(self.eval_dir) if self.eval_dir is not None else None,
            "eval_steps": cfg.eval_steps,
            "evals": len(self._eval_steps()),
            "final_eval": bool(cfg.final_eval and self.eval_dir is not None),
            "save_every": self.save_every,
            "resumed_from_step": self.step if self.resume_state is not None else None,
            "capture": self.capture_note(),
            "extended_from": self.extended_from,
            **mixing_plan(self.data, global_batch, self.total),
        }

    def capture_note(self) -> str:
        """What the plan says about whole-step capture (:mod:`mmcse.training.fastpath`)."""
        if not self.captured:
            return f"off (--capture {self.cfg.capture} on {self.device.type}): eager step"
        replay = "replayed as CUDA graphs" if self.device.type == "cuda" else "no CUDA graphs"
        return (
            f"on: one compiled graph per batch kind and batch size, {replay}; batches padded "
            f"to {self.cfg.max_seq_length} tokens"
        )

    def _eval_steps(self) -> list[int]:
        steps = list(range(self.cfg.eval_steps, self.total + 1, self.cfg.eval_steps))
        return steps if steps and steps[-1] == self.total else [*steps, self.total]

    def _log(self, log: MetricsLog, progress: Progress, epoch: int, scheduler) -> None:
        try:
            window, error = self.window.flush(), None  # the window's one host sync
        except MmcseError as exc:  # a non-finite loss, named by its step
            window, error = None, exc
        if dist.any_rank(error is not None):  # every rank stops at the same point
            raise error or MmcseError("the loss became non-finite on another rank")
        if not dist.is_main():
            return
        record = {"step": self.step, "epoch": epoch, "time": time.time()}
        record.update(lr=scheduler.get_last_lr()[0], **window)
        log.write(record)
        progress.set(loss=f"{record['loss']:.4f}", dev=self._dev_text())

    def _dev_evaluator(self) -> DevEvaluator:
        """The run's STS-B dev evaluator, its data prepared at the first evaluation."""
        if self.dev_evaluator is None:
            self.dev_evaluator = DevEvaluator(self.encoder, self.tokenizer, self.eval_dir)
        return self.dev_evaluator

    def _dev_text(self) -> str:
        return "-" if self.best_dev is None else f"{self.best_dev:.2f}"

    def _evaluate(self, log: MetricsLog, progress: Progress, epoch: int) -> None:
        """Score STS-B dev on rank 0; keep the best checkpoint. No eval data → keep the last."""
        started = time.perf_counter()
        score = None
        if dist.is_main():
            if self.eval_dir is not None:
                score = self._dev_evaluator()(self.encoder)
            if score is None or self.best_dev is None or score > self.best_dev:
                self.best_dev, self.best_step = score, self.step
                self._save(self.run_dir.best, self.step, score)
            if score is not None:
                seconds = time.perf_counter() - started
                log.write(
                    {
                        "step": self.step,
                        "epoch": epoch,
                        "time": time.time(),
                        "stsb_dev": score,
                        "eval_s": seconds,
                    }
                )
                progress.set(dev=self._dev_text())
        if dist.is_distributed():
            torch.distributed.barrier()
        self.window.exclude(time.perf_counter() - started)

    # -- checkpoints -----------------------------------------------------------------------
    def _run_info(self, step: int, dev: float | None) -> dict:
        info = {
            "config": self.cfg.to_dict(),
            "method": self.method.to_dict(),
            "step": step,
            "total_steps": self.total,
            "finished": False,  # set true when the run completes (Checkpoint.mark_finished)
            "stsb_dev": dev,
            "pooler": self.cfg.pooler,
            "pooler_source": self.pooler_source,
            # built as the resume check builds what it compares (one helper, no drift)
            "fingerprints": input_fingerprints(self.data, self._auxiliary_sets()),
            "term_heads": self.student.term_heads,  # which heads of mmcse_heads each term used
            "teachers": self.teachers(),
            "environment": self.environment,
        }
        return info

    def _auxiliary_sets(self) -> dict:
        """The auxiliary task's example set by role (VisualCSE's images), as preflight opens them."""
        if self.aux is None:
            return {}
        return {role: self.aux.examples for role in self.method.auxiliary_roles()}

    def teachers(self) -> dict[str, dict]:
        """Provenance of every feature set the run reads (run info ``teachers``)."""
        teachers = self.data.teachers()
        if self.aux is not None:
            examples = self.aux.examples.manifest.provenance()
            teachers.update({f"feature:{k}": examples for k in self.aux.fingerprint})
        return teachers

    def _heads(self) -> nn.ModuleDict:
        heads = nn.ModuleDict({"heads": self.student.heads})
        if self.aux is not None:  # e.g. VisualCSE's patch embedding and image head
            heads["aux"] = self.aux.heads
        return heads

    def _save(
        self, checkpoint: Checkpoint, step: int, dev: float | None, trainer_state=None
    ) -> None:
        """Write a checkpoint beside ``checkpoint`` and rename it into place (never half a save)."""
        with atomic_dir(checkpoint.path) as tmp:
            info = self._run_info(step, dev)
            self.encoder.save_checkpoint(tmp, self.tokenizer, self._heads(), info)
            if trainer_state is not None:
                ckpt.save_trainer_state(tmp, trainer_state)
                ckpt.write_integrity(  # last: it records every file above
                    tmp, step=step, settings=info["config"], fingerprints=info["fingerprints"]
                )

    def _save_last(self, epoch: int, next_index: int, optimizer, scheduler) -> None:
        """The resumable checkpoint: everything needed to continue after this step."""
        started = time.perf_counter()
        if dist.is_main():
            aux = self.aux
            state = {
                "step": self.step,
                "epoch": epoch,
                "next_index": next_index,  # position in the epoch's schedule
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "grad_scaler": self.scaler.state_dict(),  # fp16 loss scale ({} when disabled)
                "rng": ckpt.rng_states(),
                "window": self.window.state_dict(),
                "best_dev": self.best_dev,
                "best_step": self.best_step,
                "aux": None if aux is None else aux.trainer_state(),
            }
            self._save(self.run_dir.last, self.step, self.best_dev, state)
        if dist.is_distributed():
            torch.distributed.barrier()
        self.window.exclude(time.perf_counter() - started)

    def _start(self, optimizer, scheduler) -> tuple[int, int]:
        """(epoch, index in its schedule) to start from: (0, 0), or where last/ was saved."""
        state = self.resume_state
        if state is None:
            return 0, 0
        from safetensors.torch import load_file

        self._heads().load_state_dict(load_file(str(self.run_dir.last.heads)))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        if self.aux is not None and state["aux"] is not None:
            self.aux.load_trainer_state(state["aux"])
        self.window.load_state_dict(state["window"], self.device)
        self.best_dev, self.best_step = state["best_dev"], state["best_step"]
        self.step = state["step"]
        ckpt.set_rng_states(state["rng"])
        if self.extended_from:
            self._extend_schedule(optimizer, scheduler)
        return state["epoch"], state["next_index"]

    def _extend_schedule(self, optimizer, scheduler) -> None:
        """A finished run extended: the linear decay recomputed for the new total, from now."""
        factor = scheduler.lr_lambdas[0](scheduler.last_epoch)
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * factor
        old = self.extended_from
        logger.warning(
            "extending the finished run %s from step %s to %s (max_steps %s -> %s, epochs %s -> "
            "%s): its lr had decayed to 0 and the linear schedule is recomputed for %s steps, so "
            "training continues at lr %.3g; the result is not what an uninterrupted %s-step run "
            "trains",
            self.out, self.step, self.total, old["max_steps"], self.cfg.max_steps,
            old["epochs"], self.cfg.epochs, self.total, optimizer.param_groups[0]["lr"],
            self.total,
        )  # fmt: skip

    def _interrupted(self) -> None:
        message = (
            f"interrupted after step {self.step} of {self.total}; last/ saved. "
            f"Continue with: mmcse train --resume {self.out}"
        )
        if dist.is_main():
            logger.warning(message)
        raise TrainingInterrupted(message)

    def _finish(self, steps: int) -> RunResult:
        test = None
        if dist.is_main() and self.cfg.final_eval and self.eval_dir is not None:
            from mmcse.evaluation import evaluate_sts

            best = str(self.run_dir.best.path)
            logger.info(
                "final test: scoring best/ (step %s) on the 7 STS test sets", self.best_step
            )
            test = evaluate_sts(
                best, data_dir=self.eval_dir, device=str(self.device), progress=True
            )
            self.run_dir.write_results("sts", test, source=FINAL)
        if dist.is_main():
            self.run_dir.best.mark_finished()
            ckpt.mark_finished(self.run_dir.last)  # saved anew: its integrity record stays true
        return RunResult(self.out, self.best_dev, self.best_step, test, steps, self.cfg.method)


def train(cfg: TrainConfig, resume: bool = False) -> RunResult:
    """Train a run; ``resume`` continues the run in ``cfg.output_dir`` from its last/ (a
    finished run only when a larger ``max_steps``/``epochs`` extends it; else nothing happens)."""
    finished = ckpt.finished_note(cfg.to_dict()) if resume else None
    if finished is not None:
        logger.info(finished)
        return RunResult(Path(cfg.output_dir), None, None, None, 0, cfg.method)
    run = Run(cfg, resume)
    with naming_os_errors(run.out):  # disk full, read-only folder: one line naming the path
        return run.fit()
