"""SentEval STS evaluation (STS12-16, STS-B, SICK-R), alignment/uniformity, and fast encoding."""

from mmcse.evaluation.align_uniform import align_uniform, alignment, uniformity
from mmcse.evaluation.encode import encode_sentences
from mmcse.evaluation.report import format_rows, format_table, write_report
from mmcse.evaluation.sts import (
    STS_YEAR_SUBSETS,
    TASKS_BY_MODE,
    StsTask,
    Subset,
    evaluate_sts,
    load_task,
    load_tasks,
)

__all__ = [
    "STS_YEAR_SUBSETS",
    "TASKS_BY_MODE",
    "StsTask",
    "Subset",
    "align_uniform",
    "alignment",
    "encode_sentences",
    "evaluate_sts",
    "format_rows",
    "format_table",
    "load_task",
    "load_tasks",
    "uniformity",
    "write_report",
]
