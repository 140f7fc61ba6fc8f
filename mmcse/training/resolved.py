"""The run's config resolved once, before anything is built from it: what ``auto`` and the
device leave open is decided here, and the trainer, the run's record and the bench read the
result (:class:`ResolvedRun`) instead of deciding again.

- the pooler: ``auto`` becomes the student's own pooling, else the method's;
- capture (:func:`mmcse.training.fastpath.capture_mode`): off, the forward, or the whole update;
- padding: a captured run pads every batch to ``max_seq_length`` (one shape per batch kind, one
  graph), so dynamic padding is turned off;
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
    return cfg, ResolvedRun(pooler_source, capture, precision_name(device, cfg.precision, cfg.tf32))


def resolve_training_pooler(cfg: TrainConfig, method: Method) -> tuple[str, str]:
    """``cfg.pooler`` with ``auto`` resolved: the student's own pooling, else the method's."""
    try:
        student_dir = resolve_model_dir(cfg.model)
    except MmcseError:
        student_dir = None  # the loader reports the bad path
    fallback = getattr(method, "pooler", DEFAULT_POOLER)
    return resolve_pooler(cfg.pooler, student_dir, fallback)
