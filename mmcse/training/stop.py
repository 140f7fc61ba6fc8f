"""Stopping a training run cleanly on a signal: the step in progress finishes, ``last/`` is
saved, the way to resume is logged and :class:`TrainingInterrupted` ends the run.

A dev evaluation in progress (up to a minute and more on a CPU) does not make the signal wait:
it checks the request between its batches and stops (:class:`EvaluationStopped`); its score is
dropped, ``last/`` holds the step it evaluated and records the evaluation as still to do, and a
resume runs it before the next step (so a resumed run's metrics equal an uninterrupted run's). Every interrupted exit logs how to resume: one
during the final evaluation (the training's checkpoints are on disk; ``--resume`` scores best/),
and one from a second signal (the hint names the step ``last/`` holds, or that there is none).

Three signals ask for it: SIGINT (Ctrl-C), SIGTERM (what SLURM, Kubernetes, ``timeout`` and
``kill`` send; SLURM follows it with SIGKILL after a grace period) and SIGUSR1 (what SLURM's
``--signal=USR1@SECONDS`` sends ahead of the time limit). A second signal of the same kind acts
at once, as it would without mmcse. ``mmcse`` exits ``128 + signal number``, the status a shell
gives a process that signal killed (130 SIGINT, 143 SIGTERM, 138 SIGUSR1 on Linux), so a job
script sees "stopped by a signal" and not success.
"""

from __future__ import annotations

import logging
import signal
import threading

from mmcse import distributed as dist

logger = logging.getLogger(__name__)

# SIGUSR1 does not exist on Windows
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1") if hasattr(signal, name)
)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopRequest:
    """A stop signal asks the loop to stop after the current step (a second one acts at once)."""

    last_signal: int | None = None  # the signal that asked, for TrainingInterrupted's exit code

    def __init__(self) -> None:
        self.requested = False
        self.previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        StopRequest.last_signal = None
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in STOP_SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()

    def _handle(self, signum, frame) -> None:
        self.requested = True
        StopRequest.last_signal = signum
        # the next one of this signal does what it would without us: interrupt / terminate now
        at_once = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, at_once)
        again = "Ctrl-C" if signum == signal.SIGINT else signal_name(signum)
        logger.warning(
            "%s received: stopping after this step (or this evaluation) and saving last/ "
            "(%s again to abort now)",
            signal_name(signum),
            again,
        )

    def agreed(self, at_sync_point: bool) -> bool:
        """Under DDP every rank must stop at the same step: they agree at sync points only."""
        if not dist.is_distributed():
            return self.requested
        return at_sync_point and dist.any_rank(self.requested)


class EvaluationStopped(Exception):
    """A dev evaluation stopped between its batches because a stop signal came."""


class TrainingInterrupted(KeyboardInterrupt):
    """Raised once last/ is saved after a stop signal (the resume hint is logged); ``mmcse``
    exits with :attr:`exit_code`, 128 + the signal's number (130 after Ctrl-C)."""

    def __init__(self, message: str = "", signum: int | None = None) -> None:
        super().__init__(message)
        # the loop raises it without the signal: the StopRequest that stopped it recorded it
        self.signum = signum or StopRequest.last_signal or signal.SIGINT

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)
