"""What a training run reports: window-averaged loss terms, the run plan, progress lines.

``metrics.jsonl`` holds one JSON object per line. A training record averages every ``*_loss`` term
over the logging window — each term over the batches it was computed on (MCSE's image term only
exists on caption batches), ``loss`` over every step — and says how many text and caption batches
the window held; ``steps_per_s`` and ``data_wait_share`` exclude evaluation and checkpoint time.
An evaluation record has ``step`` and ``stsb_dev``. Readers treat any key ending in ``_loss`` as a
loss term and tolerate missing keys.

The step itself never waits for the device: terms are summed as device tensors and read back once
per window (:meth:`LossWindow.flush`), where a non-finite loss is also caught and its step named.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from mmcse.errors import MmcseError
from mmcse.evaluation.sts import dev_set_name
from mmcse.files import write_text_atomically
from mmcse.rundir import LEFT_OUT_FILE, RunDir
from mmcse.training.plan import batch_words, describe_checkpoints, whole_corpus_batches

if TYPE_CHECKING:
    from mmcse.training.update import Part

logger = logging.getLogger(__name__)
#: seconds between progress lines when stderr is not a terminal (log files, CI)
LOG_LINE_INTERVAL = 30.0


class LossWindow:
    """Sums of the loss terms of the steps since the last log record, kept on the device."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, Tensor | float] = {}  # device tensors; python floats from host terms
        self.counts: dict[str, int] = {}
        #: term names → their values summed, stacked in one device tensor (:meth:`add_step`)
        self.stacked: dict[tuple[str, ...], Tensor] = {}
        self.stacked_counts: dict[tuple[str, ...], int] = {}
        self.latest: dict[str, float] = {}  # non-loss host values (e.g. an auxiliary lr): last one
        self.totals: list[Tensor] = []  # per-step weighted loss, to name a non-finite step
        self.steps: list[tuple[int, str]] = []  # (step, batch kind)
        self.start_clock()

    def start_clock(self) -> None:
        """Time the window from now: steps/s counts the steps taken since (a resumed window's
        steps from before its save were timed by the run that took them)."""
        self.timed_steps = 0
        self.data_wait = 0.0
        self.excluded = 0.0  # eval / checkpoint seconds inside the window
        self.started = time.perf_counter()

    def add_step(
        self, step: int, kind: str, parts: list[Part], host: dict | None = None, waited: float = 0.0
    ) -> None:
        """One step's terms as the updates return them, added on the device now (no host sync; a
        replayed CUDA graph rewrites its outputs), a part named ``loss`` first the weighted total;
        ``host``: e.g. an auxiliary lr; ``waited``: seconds the loop waited for the batch."""
        for keys, values in parts:
            held = self.stacked.get(keys)
            self.stacked[keys] = values.clone() if held is None else held.add_(values)
            self.stacked_counts[keys] = self.stacked_counts.get(keys, 0) + 1
            if keys[0] == "loss":
                self.totals.append(values[0].clone())
        self.latest.update(host or {})
        self.steps.append((step, kind))
        self.timed_steps += 1
        self.data_wait += waited

    def _unstacked(self) -> None:
        """Fold the stacked sums into the per-term ones (at a flush or a save)."""
        for keys, values in self.stacked.items():
            count = self.stacked_counts[keys]
            for key, value in zip(keys, values.unbind(), strict=True):
                self.sums[key] = self.sums[key] + value if key in self.sums else value
                self.counts[key] = self.counts.get(key, 0) + count
        self.stacked, self.stacked_counts = {}, {}

    def exclude(self, seconds: float) -> None:
        """Time spent outside training (evaluation, checkpoints) that steps/s must not count."""
        self.excluded += seconds

    def __len__(self) -> int:
        return len(self.steps)

    def flush(self) -> dict[str, Any]:
        """Read the window back (the one host sync), check it is finite, and reset it."""
        self._unstacked()
        keys = [k for k, v in self.sums.items() if isinstance(v, Tensor)]
        device_values = [self.sums[k] for k in keys] + self.totals
        host = torch.stack([v.reshape(()) for v in device_values]).cpu().double().tolist()
        sums = dict(zip(keys, host[: len(keys)], strict=True))
        sums.update({k: float(v) for k, v in self.sums.items() if not isinstance(v, Tensor)})
        check_finite(host[len(keys) :], self.steps)
        first, last = self.steps[0][0], self.steps[-1][0]
        for key, value in sums.items():
            if not math.isfinite(value):
                raise MmcseError(
                    f"{key} became {value} in steps {first}-{last}; lower the lr (for an "
                    "auxiliary task's image_/audio_ terms, its own lr)"
                )
        elapsed = max(time.perf_counter() - self.started - self.excluded, 1e-9)
        kinds = [kind for _, kind in self.steps]
        record: dict[str, Any] = {"kind": kinds[0] if len(set(kinds)) == 1 else "mixed"}
        record.update({k: sums[k] / self.counts[k] for k in sorted(sums, key=_loss_first)})
        record.update(self.latest)
        record.update(
            text_batches=kinds.count("text"),
            caption_batches=kinds.count("caption"),
            steps_per_s=self.timed_steps / elapsed,
            data_wait_share=self.data_wait / elapsed,
        )
        self.reset()
        return record

    # -- resume --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._unstacked()
        to_host = {k: v.cpu() if isinstance(v, Tensor) else v for k, v in self.sums.items()}
        return {
            "sums": to_host,
            "counts": dict(self.counts),
            "latest": dict(self.latest),
            "totals": [t.cpu() for t in self.totals],
            "steps": list(self.steps),
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.reset()
        self.sums = {
            k: v.to(device) if isinstance(v, Tensor) else v for k, v in state["sums"].items()
        }
        self.counts = dict(state["counts"])
        self.latest = dict(state["latest"])
        self.totals = [t.to(device) for t in state["totals"]]
        self.steps = [tuple(s) for s in state["steps"]]


def _loss_first(key: str) -> tuple[int, str]:
    return (0 if key == "loss" else 1, key)


def check_finite(totals: list[float], steps: list[tuple[int, str]]) -> None:
    for value, (step, kind) in zip(totals, steps, strict=True):
        if not math.isfinite(value):
            first, last = steps[0][0], steps[-1][0]
            raise MmcseError(
                f"loss became {value} at step {step} (a {kind} batch; logging window steps "
                f"{first}-{last}); lower the lr or check the features for NaN/Inf"
            )


class MetricsLog:
    """Appends records to ``metrics.jsonl`` (and TensorBoard scalars with ``report_to``)."""

    def __init__(self, run_dir: Path, report_to: str = "none", purge_step: int | None = None):
        run = RunDir(run_dir)
        self.path = run.metrics
        self.tensorboard = None
        if report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MmcseError(
                    "--report-to tensorboard needs the tensorboard package: "
                    "pip install 'mmcse[tensorboard]'"
                ) from None
            self.tensorboard = SummaryWriter(str(run.tensorboard), purge_step=purge_step)

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in record.items():
                if key not in ("step", "epoch", "time") and isinstance(value, int | float):
                    self.tensorboard.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()


def truncate_metrics(path: Path, last_step: int, evaluated: bool = True) -> None:
    """Keep the records up to ``last_step`` (a resumed run rewrites what came after its save);
    ``evaluated`` False: ``last_step``'s evaluation is redone, so a record of it goes too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the kill
            continue
        step = record.get("step", 0)
        redone = step == last_step and not evaluated and "stsb_dev" in record
        if step <= last_step and not redone:
            kept.append(line)
    write_text_atomically(path, "".join(line + "\n" for line in kept))


def describe_plan(plan: dict[str, Any]) -> str:
    """The plan printed at start (and saved as ``plan.json``)."""
    per_epoch = ", ".join(f"{n} {kind}" for kind, n in plan["batches_per_epoch"].items())
    data = ", ".join(f"{n:,} {kind} sentences" for kind, n in plan["sentences"].items())
    evals = (
        f"{dev_set_name(plan['eval_data'])} every {plan['eval_steps']} steps ({plan['evals']} evals)"
        if plan["eval_data"]
        else f"no dev eval (last checkpoint kept as best/ every {plan['eval_steps']} steps)"
    )
    rule = f" ({plan['mixing_rule']})" if plan.get("mixing_rule") else ""
    lines = [
        f"plan: {plan['method']} on {plan['device']}, precision {plan['precision']}, "
        f"{plan['world_size']} process(es)",
        f"  data: {data}; mixing {plan['mixing']}{rule}",
        f"  per epoch: {per_epoch} batches of {batch_words(plan)} "
        f"({plan['steps_per_epoch']} steps) x {plan['epochs']} epoch(s) -> {plan['total_steps']} "
        "steps" + (f" (max_steps {plan['max_steps']})" if plan["max_steps"] else ""),
    ]
    for kind, left in (plan.get("left_out") or {}).items():
        reasons = ", ".join(f"{n:,} {why}" for why, n in left["by_reason"].items())
        lines.append(
            f"  left out: {left['left_out']:,} of {left['rows']:,} {kind} rows ({reasons}), "
            f"every one in {LEFT_OUT_FILE}"
        )
    if plan.get("packing"):
        lines.append(f"  batches: {plan['packing']}")
    if plan.get("batches_in_run"):
        taken = " + ".join(f"{n} {kind}" for kind, n in plan["batches_in_run"].items())
        lines.append(f"  this run: {taken} batches in {plan['total_steps']} steps")
    lines += [f"  note: {note}" for note in whole_corpus_batches(plan)]
    if plan.get("student"):
        lines.append(f"  {plan['student']['summary']}")
    if plan.get("recipes_mixing"):
        lines.append(f"  note: {recipes_mixing_note(plan['recipes_mixing'])}")
    lines += [
        f"  eval: {evals}; final test eval: {'yes' if plan['final_eval'] else 'no'}",
        f"  resumable checkpoint last/ every {plan['save_every']} steps",
    ]
    if plan.get("checkpoint_bytes"):
        lines.append(describe_checkpoints(plan["checkpoint_bytes"], plan["keep_last_checkpoint"]))
    if plan.get("capture"):
        lines.append(f"  whole-step capture: {plan['capture']}")
    if plan.get("resumed_from_step") is not None:
        lines.append(f"  resuming after step {plan['resumed_from_step']}")
    extended = plan.get("extended_from")
    if extended:
        lines.append(
            f"  extending the finished run from step {extended['step']} (max_steps "
            f"{extended['max_steps']}, epochs {extended['epochs']}); lr schedule recomputed"
        )
    return "\n".join(lines)


def recipes_mixing_note(recipes: dict[str, Any]) -> str:
    """The plan's line on how the recipes would mix this run's two corpora."""
    counts = recipes["batches_per_epoch"]
    if counts is None:
        taken = "it cannot run here (fewer text than caption batches per pass)"
    else:
        taken = "per epoch it would take " + " + ".join(f"{n} {k}" for k, n in counts.items())
    return (
        f"the two-corpus recipes mix with {recipes['mixing']} (MCSE's released train_mix.py); "
        f"{taken}; --mixing {recipes['mixing']} to match them"
    )


class Progress:
    """A tqdm bar on a terminal; elsewhere one log line every :data:`LOG_LINE_INTERVAL` s.
    Its steps/s and eta count training time only (:meth:`exclude`); evaluations say their time
    on a line of their own."""

    def __init__(self, total: int, initial: int, desc: str, enabled: bool) -> None:
        self.total, self.step, self.desc, self.enabled = total, initial, desc, enabled
        self.tty = sys.stderr.isatty()
        self.postfix: dict[str, str] = {}
        self.bar = None
        self.last_line = time.monotonic()
        self.started, self.start_step = time.monotonic(), initial
        self.line_step: int | None = None  # the step of the last progress line
        self.excluded = 0.0  # seconds since the last line that were not training
        if enabled and self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", mininterval=0.5)

    def set(self, **values: str | float) -> None:
        """New figures for the bar (no redraw now: the next interval shows them); a number is
        shown with 4 significant digits (a loss of 1.2e-05 is not ``0.0000``)."""
        self.postfix.update({k: v if isinstance(v, str) else f"{v:.4g}" for k, v in values.items()})
        if self.bar is not None:
            self.bar.set_postfix(self.postfix, refresh=False)

    def exclude(self, seconds: float) -> None:
        """Time that was not training (evaluation, checkpoints): left out of steps/s and the
        eta, in the log line and in the bar (whose clocks are moved on by it)."""
        self.excluded += seconds
        if self.bar is not None:
            self.bar.start_t += seconds
            self.bar.last_print_t += seconds

    def update(self, step: int) -> None:
        self.step = step
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            now = time.monotonic()
            if now - self.last_line >= LOG_LINE_INTERVAL or step == self.total:
                logger.info(self.line(now))
                self.last_line, self.line_step, self.excluded = now, step, 0.0

    def line(self, now: float) -> str:
        """The progress line; its rate is the steps since the last line's (recent speed: a
        compile in the first steps would drag an average since the start for the whole run)."""
        if self.line_step is None:
            since, steps = self.started, self.step - self.start_step
        else:
            since, steps = self.last_line, self.step - self.line_step
        rate = steps / max(now - since - self.excluded, 1e-9)
        eta = (self.total - self.step) / rate if rate > 0 else float("nan")
        extra = " ".join(f"{k} {v}" for k, v in self.postfix.items())
        return (
            f"{self.desc}: step {self.step}/{self.total} ({100 * self.step / self.total:.0f}%) "
            f"{extra} {rate:.2f} steps/s eta {eta / 60:.1f} min"
        ).replace("  ", " ")

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        logger.info(text)  # the CLI's log handler writes around an open bar

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
