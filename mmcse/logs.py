"""How mmcse's log records are shown: plain lines on stderr, around any open tqdm bar.

Library modules log with ``logging.getLogger(__name__)`` (loggers ``mmcse.*`` and ``pipeline.*``)
and print nothing; the ``mmcse`` command calls :func:`show_logs` once, a script may too::

    undo = show_logs(logging.INFO)   # plan, progress, warnings ...
    ...
    undo()                           # the loggers as they were
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from tqdm import tqdm

LOGGERS = ("mmcse", "pipeline")


class LineHandler(logging.Handler):
    """A record as one plain line on the current ``sys.stderr`` (``warning: `` before a
    warning), written through tqdm so that an open progress bar stays whole."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prefix = "warning: " if record.levelno == logging.WARNING else ""
            tqdm.write(prefix + record.getMessage(), file=sys.stderr)
        except Exception:  # logging's contract: a failing handler reports, never raises
            self.handleError(record)


def show_logs(level: int = logging.INFO) -> Callable[[], None]:
    """Show the records of :data:`LOGGERS` from ``level`` on; returns the function that undoes
    it (so an in-process caller, e.g. a test, gets its logging back)."""
    handler, loggers = LineHandler(level), [logging.getLogger(name) for name in LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(level)

    def undo() -> None:
        for logger, old in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(old)

    return undo
