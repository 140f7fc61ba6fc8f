"""``mmcse eval --tasks sts,transfer,retrieval``: the suites beyond STS, run and saved together.

Results of a training run directory are also recorded in it
(:meth:`mmcse.rundir.RunDir.write_results`; the trainer records STS), which is where
``mmcse compare`` and ``mmcse plot`` look for them.
"""

from __future__ import annotations

from collections.abc import Iterator

from mmcse.errors import MmcseError
from mmcse.evaluation.report import write_report
from mmcse.evaluation.transfer import TRANSFER_TASKS, check_task_folders, parse_tasks
from mmcse.rundir import run_of_model

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
    model, suites, data, out, pooler, batch_size, device, transfer_mode,
    images_features, captions, head, sts: dict | None = None,
) -> Iterator[str]:  # fmt: skip
    """Run transfer/retrieval as asked and save them; yields their tables and the files written."""
    from mmcse.evaluation.retrieval import evaluate_retrieval, format_retrieval_table
    from mmcse.evaluation.transfer import evaluate_transfer, format_transfer_table

    results: dict = {} if sts is None else {"sts": sts}
    if "retrieval" in suites:  # cheap, and its inputs are the likeliest to be wrong: first
        results["retrieval"] = evaluate_retrieval(
            model, images_features, captions, pooler=pooler, batch_size=batch_size,
            device=device, head=head, progress=True,
        )  # fmt: skip
    if "transfer" in suites:
        results["transfer"] = evaluate_transfer(
            model, data_dir=data, mode=transfer_mode, tasks=suites["transfer"], pooler=pooler,
            batch_size=batch_size, device=device, progress=True,
        )  # fmt: skip
        yield format_transfer_table(results["transfer"])
    if "retrieval" in results:
        yield format_retrieval_table(results["retrieval"])
    run = run_of_model(model)
    if run is not None:
        for suite in ("transfer", "retrieval"):
            if suite in results:
                yield f"wrote {run.write_results(suite, results[suite])}"
    if out:
        yield f"wrote {write_report(results, out)}"
