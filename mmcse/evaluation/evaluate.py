"""``mmcse eval``: STS, then the suites asked for beyond it, of a run directory or a model dir."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation import evaluate_sts, format_table
from mmcse.evaluation.probe import check_mode
from mmcse.evaluation.request import EvalRequest
from mmcse.evaluation.suites import parse_suites, record, run_extra_suites, write_out
from mmcse.hub import resolve_model_source
from mmcse.precision import evaluating_in
from mmcse.rundir import BEST_DIR, LAST_DIR, Checkpoint, run_finished

logger = logging.getLogger(__name__)


def evaluate_model(request: EvalRequest) -> Iterator[str]:
    """Score ``request.model`` on ``request.tasks`` (``"sts,transfer,retrieval"``, see
    :func:`~mmcse.evaluation.suites.parse_suites`); yields each table as soon as it is scored,
    then the files written. A run directory (or its best/) records each suite's result as soon as
    it is scored, beside the earlier ones (:func:`~mmcse.evaluation.suites.record`); every
    result's details hold its protocol and environment. A checkpoint of an unfinished run is
    evaluated with a warning."""
    with evaluating_in(request.precision):
        yield from _evaluate_model(request)


def _evaluate_model(request: EvalRequest) -> Iterator[str]:
    r = request
    suites = parse_suites(r.tasks, r.images_features, r.captions, r.data)
    check_mode(r.transfer_mode)  # refused now, not after the STS tasks ran
    warning = unfinished_warning(resolve_model_source(r.model))
    if warning:
        logger.warning(warning)
    collected: dict = {}
    if "sts" in suites:
        collected["sts"] = evaluate_sts(
            r.model,
            data_dir=r.data,
            mode=r.mode,
            pooler=r.pooler,
            batch_size=r.batch_size,
            device=r.device,
            with_align_uniform=r.align_uniform,
            progress=True,
        )
        yield format_table(collected["sts"])
        yield from record(r.model, "sts", collected["sts"])
    yield from run_extra_suites(request, suites, collected)
    if r.out:
        yield write_out(collected, r.out)


def unfinished_warning(model_dir: str | Path) -> str | None:
    """The warning for a checkpoint whose run did not finish (its ``mmcse_run.json`` says so)."""
    checkpoint = Checkpoint(model_dir)
    try:
        info = checkpoint.read_info()
    except MmcseError:
        return f"{checkpoint.run_info} is unreadable; cannot tell whether its run finished"
    if run_finished(info) is not False:
        return None
    of_total = f" of {info['total_steps']}" if info.get("total_steps") else ""
    run = Path(model_dir).parent if Path(model_dir).name in (BEST_DIR, LAST_DIR) else model_dir
    return (
        f"{model_dir} is from a run that did not finish (saved at step "
        f"{info.get('step')}{of_total}); resume it with mmcse train --resume {run}"
    )
