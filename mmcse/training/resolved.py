"""The run's config resolved once, before anything is built from it: what ``auto`` and the
device leave open is decided here, and the trainer, the run's record and the bench read the
result (:class:`ResolvedRun`) instead of deciding again.

- the pooler: ``auto`` becomes the student's own pooling, else the method's;
- capture (:func:`mmcse.training.fastpath.capture_mode`): off, the forward, or the whole update;
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
from mmcse.model import resolve_pooler
from mmcse.pooling import DEFAULT_POOLER
from mmcse.precision import precision_name
from mmcse.rundir import resolve_model_dir
from mmcse.training.config import TrainConfig
from mmcse.training.fastpath import capture_mode

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
    #: why the run packs or pads (``"given"``, ``"auto on cpu"``, ...: :func:`resolve_packing`)
    packing_source: str = "given"


#: what ``--packing`` auto means per device type, from measurements: on for a CPU (the step
#: 1.26x faster, packed ÷ padded 0.59-0.62 on Wiki and COCO lengths: BENCHMARKS.md "Packing");
#: off for CUDA until the GPU check (``docs/benchmarks/gpu_check.py``) measures it; a device type
#: not here (MPS) pads
PACKING_AUTO = {"cpu": True, "cuda": False}


def resolve_run_config(
    cfg: TrainConfig, method: Method, device: torch.device, distributed: bool
) -> tuple[TrainConfig, ResolvedRun]:
    """``cfg`` with every setting decided (the config the run trains with, and config.json
    records), and what was decided with it."""
    pooler, pooler_source = resolve_training_pooler(cfg, method)
    cfg = dataclasses.replace(cfg, pooler=pooler)
    capture = capture_mode(cfg, device, distributed)
    if capture != "off" and cfg.dynamic_padding:  # one shape per batch kind: one graph
        logger.info("capture: batches padded to --max-seq-length (no dynamic padding)")
        cfg = dataclasses.replace(cfg, dynamic_padding=False)
    packing, packing_source = resolve_packing(cfg, device)
    cfg = dataclasses.replace(cfg, packing=packing)
    precision = precision_name(device, cfg.precision, cfg.tf32)
    return cfg, ResolvedRun(pooler_source, capture, precision, packing_source)


def resolve_packing(cfg: TrainConfig, device: torch.device) -> tuple[bool, str]:
    """``cfg.packing`` with auto (None) decided, and why: as given; on for varlen attention
    (it runs packed batches only); off for a student that cannot pack; else
    :data:`PACKING_AUTO` for the device."""
    if cfg.packing is not None:
        return cfg.packing, "given"
    if cfg.attn_implementation == "varlen":
        return True, "varlen attention runs packed only"
    if not student_can_pack(cfg):
        return False, "the student cannot pack"
    packing = PACKING_AUTO.get(device.type, False)
    logger.info("packing: %s (auto on %s)", "on" if packing else "off", device.type)
    return packing, f"auto on {device.type}"


def student_can_pack(cfg: TrainConfig) -> bool:
    """Whether the student's architecture runs packed batches. The hook for the student
    registry (issue 39: which architectures pack is proven or refused there): every student
    packs until it answers."""
    return True


def resolve_training_pooler(cfg: TrainConfig, method: Method) -> tuple[str, str]:
    """``cfg.pooler`` with ``auto`` resolved: the student's own pooling, else the method's."""
    try:
        student_dir = resolve_model_dir(cfg.model)
    except MmcseError:
        student_dir = None  # the loader reports the bad path
    fallback = getattr(method, "pooler", DEFAULT_POOLER)
    return resolve_pooler(cfg.pooler, student_dir, fallback)
