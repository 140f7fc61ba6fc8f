"""SentEval STS evaluation (STS12-16, STS-B, SICK-R), alignment/uniformity, and fast encoding.

The names below load their module on first use (PEP 562): importing a light submodule such as
:mod:`mmcse.evaluation.request` (the ``mmcse eval`` flags) must not load torch, so that
``mmcse --help`` and an early error stay fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "align_uniform": "align_uniform",
    "alignment": "align_uniform",
    "uniformity": "align_uniform",
    "encode_sentences": "encode",
    "format_rows": "report",
    "format_table": "report",
    "write_report": "report",
    "STS_YEAR_SUBSETS": "sts",
    "TASKS_BY_MODE": "sts",
    "StsTask": "sts",
    "Subset": "sts",
    "evaluate_sts": "sts",
    "load_task": "sts",
    "load_tasks": "sts",
}

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    globals()[name] = value
    return value
