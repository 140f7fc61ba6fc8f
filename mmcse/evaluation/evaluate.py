"""``mmcse eval``: STS, then the suites asked for beyond it, of a run directory or a model dir."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation import evaluate_sts, format_table
from mmcse.evaluation.probe import check_mode
from mmcse.evaluation.suites import parse_suites, record, run_extra_suites, write_out
from mmcse.hub import resolve_model_source
from mmcse.rundir import Checkpoint, run_finished

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalRequest:
    """What ``mmcse eval`` is asked: the flags are made from these fields
    (:func:`mmcse.commands.flags.with_flags`) and the request travels as one object through
    :func:`evaluate_model` to every suite."""

    model: str = field(metadata={"help": "training run directory (uses run/best) or HF model dir"})
    tasks: str = field(
        default="sts",
        metadata={"help": "comma-separated: sts, transfer (or some of MR,CR,SUBJ,MPQA,SST2,"
                  "TREC,MRPC), retrieval"},
    )  # fmt: skip
    data: str | None = field(
        default=None,
        metadata={"help": "SentEval folder (holds downstream/STS) [../shared/data/senteval]"},
    )
    out: str | None = field(default=None, metadata={"help": "write the results as JSON here"})
    mode: str = field(
        default="test",
        metadata={"choices": ("test", "dev"), "help": "STS: the 7 tasks, or STS-B/SICK-R dev"},
    )
    pooler: str | None = field(
        default=None,
        metadata={"help": "cls | cls_before_pooler | avg (= mean) | max | avg_first_last | "
                  "avg_top2 | auto (default: the run's, else the student's own 1_Pooling "
                  "config, else cls_before_pooler)"},
    )  # fmt: skip
    batch_size: int = field(default=128, metadata={"help": "sentences per forward pass"})
    device: str | None = field(
        default=None, metadata={"help": "cpu, cuda, cuda:1, ... (default: cuda if any)"}
    )
    align_uniform: bool = field(
        default=False, metadata={"help": "STS: also alignment and uniformity"}
    )
    transfer_mode: str = field(
        default="test",
        metadata={"choices": ("test", "fasttest"), "help": "the papers' 10-fold Adam, or fast"},
    )
    images_features: str | None = field(
        default=None, metadata={"help": "retrieval: held-out images' feature set (by id)"}
    )
    captions: str | None = field(
        default=None, metadata={"help": "retrieval: their caption corpus (--caption-policy all)"}
    )
    head: str | None = field(
        default=None, metadata={"help": "retrieval: which loss term's heads [default: first]"}
    )


def evaluate_model(request: EvalRequest) -> Iterator[str]:
    """Score ``request.model`` on ``request.tasks`` (``"sts,transfer,retrieval"``, see
    :func:`~mmcse.evaluation.suites.parse_suites`); yields each table as soon as it is scored,
    then the files written. A run directory (or its best/) records each suite's result as soon as
    it is scored, beside the earlier ones (:func:`~mmcse.evaluation.suites.record`); every
    result's details hold its protocol and environment. A checkpoint of an unfinished run is
    evaluated with a warning."""
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
    return (
        f"{model_dir} is from a run that did not finish (saved at step "
        f"{info.get('step')}{of_total}); resume it with mmcse train --resume RUN_DIR"
    )
