"""The run's config resolved once, before anything is built from it: what ``auto`` and the
device leave open is decided here, and the trainer, the run's record and the bench read the
result (:class:`ResolvedRun`) instead of deciding again.

- the pooler: ``auto`` becomes the student's own pooling, else the method's;
- the student (:mod:`mmcse.students`): ``--attn-implementation auto`` becomes the fastest its
  architecture has, and ``--packing``/``--dropout`` are checked against it (refused in one line
  before the model loads); what was chosen is recorded (plan.json ``student``);
- capture (:func:`mmcse.training.fastpath.capture_mode`): off, the forward, or the whole update
  (the forward when the auxiliary update must step parameters its loss does not reach);
- padding: a captured run pads every batch to ``max_seq_length`` (one shape per batch kind, one
  graph), so dynamic padding is turned off;
- packing (:func:`resolve_packing`): ``auto`` (``packing`` None) becomes on or off per device,
  from what was measured (:data:`PACKING_AUTO`);
- the precision's name, as run info records it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from mmcse.errors import MmcseError
from mmcse.methods import Method
from mmcse.model import check_student, resolve_pooler
from mmcse.pooling import DEFAULT_POOLER
from mmcse.precision import precision_name
from mmcse.rundir import resolve_model_dir
from mmcse.students import StudentChoice
from mmcse.training.config import TrainConfig, packing_required
from mmcse.training.fastpath import capture_mode
from mmcse.training.updates import auxiliary_decays_unreached

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedRun:
    """What resolving the config decided beyond the config itself."""

    #: where the pooler came from (``"given"``, the student's config, ...: :func:`resolve_pooler`)
    pooler_source: str
    #: ``"off"``, ``"forward"`` or ``"whole"`` (:data:`mmcse.training.fastpath.CAPTURE_MODES`)
    capture: str
    #: the precision as run info records it (``"bf16 autocast"``, ``"fp32"``, ...)
    precision: str
    #: the student's architecture, attention and dropout (None: a hub id not downloaded yet)
    student: StudentChoice | None = None
    #: why the run packs or pads (``"given"``, ``"auto on cpu"``, ...: :func:`resolve_packing`)
    packing_source: str = "given"

    def student_record(self) -> dict | None:
        """plan.json's ``student``: the choice and its line in the plan."""
        if self.student is None:
            return None
        return {**self.student.record(), "summary": self.student.describe()}


#: what ``--packing`` auto means per device type, from measurements: on for a CPU (the step
#: 1.26x faster, packed ÷ padded 0.59-0.62 on Wiki and COCO lengths: BENCHMARKS.md "Packing");
#: on for CUDA (the GPU check on an H200, SimCSE at BERT-base 128 x 32, bf16: packed ÷ padded
#: 0.83 with the whole update captured, 0.91 with the forward: BENCHMARKS.md "GPU check"); a
#: device type not here (MPS) pads
PACKING_AUTO = {"cpu": True, "cuda": True}


def resolve_run_config(
    cfg: TrainConfig, method: Method, device: torch.device, distributed: bool
) -> tuple[TrainConfig, ResolvedRun]:
    """``cfg`` with every setting decided (the config the run trains with, and config.json
    records), and what was decided with it."""
    pooler, pooler_source = resolve_training_pooler(cfg, method)
    cfg = dataclasses.replace(cfg, pooler=pooler)
    student = check_student(cfg.model, cfg.attn_implementation, packing_required(cfg), cfg.dropout)
    if student is not None:
        for warning in student.warnings:
            logger.warning(warning)
        if cfg.pooler == "cls" and not student.architecture.pooler_layer:
            logger.warning(
                "pooler cls: %s has no pooler layer, so cls reads the first token's last state "
                "(as cls_before_pooler does)",
                student.architecture.name,
            )
        logger.info(student.describe())
        cfg = dataclasses.replace(cfg, attn_implementation=student.attention)
    capture = capture_mode(cfg, device, distributed)
    if capture == "whole" and auxiliary_decays_unreached(method, cfg):
        reason = "the auxiliary update decays what it does not reach: only the eager one can"
        logger.info("capture: the forward only (%s)", reason)
        capture = "forward"
    if capture != "off" and cfg.dynamic_padding:  # one shape per batch kind: one graph
        logger.info("capture: batches padded to --max-seq-length (no dynamic padding)")
        cfg = dataclasses.replace(cfg, dynamic_padding=False)
    packing, packing_source = resolve_packing(cfg, device, student)
    cfg = dataclasses.replace(cfg, packing=packing)
    precision = precision_name(device, cfg.precision, cfg.tf32)
    return cfg, ResolvedRun(pooler_source, capture, precision, student, packing_source)


def resolve_packing(
    cfg: TrainConfig, device: torch.device, student: StudentChoice | None
) -> tuple[bool, str]:
    """``cfg.packing`` with auto (None) decided, and why: as given (an explicit ``--packing``
    the student cannot run was refused by :func:`mmcse.model.check_student`); off for a student
    whose packing is refused (:mod:`mmcse.students`); on for varlen attention (it runs packed
    batches only; the student was checked as if packing were given); else
    :data:`PACKING_AUTO` for the device. A student whose config cannot be
    read before it loads (a hub id not downloaded yet) follows the device."""
    if cfg.packing is not None:
        return cfg.packing, "given"
    if cfg.attn_implementation == "varlen":  # checked against the student as given packing
        return True, "varlen attention runs packed only"
    if student is not None and not student.architecture.packs_with(student.attention):
        return False, f"auto: {student.architecture.name} pads"
    packing = PACKING_AUTO.get(device.type, False)
    logger.info("packing: %s (auto on %s)", "on" if packing else "off", device.type)
    return packing, f"auto on {device.type}"


def resolve_training_pooler(cfg: TrainConfig, method: Method) -> tuple[str, str]:
    """``cfg.pooler`` with ``auto`` resolved: the student's own pooling, else the method's."""
    try:
        student_dir = resolve_model_dir(cfg.model)
    except MmcseError:
        student_dir = None  # the loader reports the bad path
    fallback = getattr(method, "pooler", DEFAULT_POOLER)
    return resolve_pooler(cfg.pooler, student_dir, fallback)
