"""``mmcse eval --tasks sts,transfer,retrieval``: the suites beyond STS, run and saved together.

Results of a training run directory (or of its best/) are also recorded in it, each suite as
soon as it is scored (:meth:`mmcse.rundir.RunDir.write_results`: they accumulate per task and
protocol beside the trainer's own end-of-training STS result), which is where ``mmcse compare``
and ``mmcse plot`` look for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation.report import write_report
from mmcse.evaluation.request import EvalRequest
from mmcse.evaluation.retrieval import evaluate_retrieval, format_retrieval_table
from mmcse.evaluation.transfer import (
    TRANSFER_TASKS,
    check_task_folders,
    evaluate_transfer,
    format_transfer_table,
    parse_tasks,
)
from mmcse.rundir import EVAL, RunDir, is_run_dir, run_of_checkpoint, run_of_model

SUITES = ("sts", "transfer", "retrieval")


def parse_suites(
    text: str,
    images_features: str | None = None,
    captions: str | None = None,
    data_dir: str | None = None,
) -> dict[str, list[str] | None]:
    """``"sts,transfer"`` → ``{"sts": None, "transfer": [all 7]}``; transfer task names select
    a subset (``"sts,MR,TREC"``). Retrieval needs both of its folders."""
    suites: dict[str, list[str] | None] = {}
    for name in (t.strip() for t in text.split(",") if t.strip()):
        lowered = name.lower()
        if lowered in ("sts", "retrieval"):
            suites[lowered] = None
        elif lowered == "transfer":
            suites["transfer"] = list(TRANSFER_TASKS)
        else:
            try:
                task = parse_tasks([name])[0]
            except MmcseError:
                raise MmcseError(
                    f"unknown --tasks entry {name!r}; use sts, transfer, retrieval or "
                    f"transfer task names ({', '.join(TRANSFER_TASKS)})"
                ) from None
            suites.setdefault("transfer", [])
            if task not in suites["transfer"]:
                suites["transfer"].append(task)
    if not suites:
        raise MmcseError("--tasks is empty; use sts, transfer, retrieval")
    if "retrieval" in suites and not (images_features and captions):
        raise MmcseError("--tasks retrieval needs --images-features DIR and --captions DIR")
    if "transfer" in suites:  # a missing folder fails now, not after the STS tasks
        check_task_folders(data_dir, suites["transfer"])
    return suites


def run_extra_suites(
    request: EvalRequest, suites: dict[str, list[str] | None], collected: dict
) -> Iterator[str]:
    """Run retrieval and transfer as ``suites`` (parsed from ``request.tasks``) ask (retrieval
    first: cheap, and its inputs are the likeliest to be wrong), each recorded in the run as soon
    as it is scored (see :func:`record`); yields each table and file written; ``collected`` gets
    each result."""
    r = request
    if "retrieval" in suites:
        collected["retrieval"] = evaluate_retrieval(
            r.model,
            r.images_features,
            r.captions,
            pooler=r.pooler,
            batch_size=r.batch_size,
            device=r.device,
            head=r.head,
            progress=True,
        )
        yield format_retrieval_table(collected["retrieval"])
        yield from record(r.model, "retrieval", collected["retrieval"])
    if "transfer" in suites:
        collected["transfer"] = evaluate_transfer(
            r.model,
            data_dir=r.data,
            mode=r.transfer_mode,
            tasks=suites["transfer"],
            pooler=r.pooler,
            batch_size=r.batch_size,
            device=r.device,
            progress=True,
        )
        yield format_transfer_table(collected["transfer"])
        yield from record(r.model, "transfer", collected["transfer"])


def recording_run(model: str | Path) -> RunDir | None:
    """The training run whose results ``model`` adds to: a run directory, or its best/."""
    run = run_of_model(model) or run_of_checkpoint(model)
    return run if run is not None and is_run_dir(run.path) else None


def record(model: str | Path, suite: str, results: dict) -> Iterator[str]:
    """Add ``results`` to the run ``model`` is (:meth:`mmcse.rundir.RunDir.write_results`:
    they join the earlier ones, replacing only the same tasks measured the same way)."""
    run = recording_run(model)
    if run is not None:
        yield f"wrote {run.write_results(suite, results, source=EVAL)}"


def write_out(collected: dict, out: str | Path) -> str:
    """``--out``: the one suite's result when only STS ran, else ``{suite: result}``."""
    payload = collected["sts"] if list(collected) == ["sts"] else collected
    return f"wrote {write_report(payload, out)}"
