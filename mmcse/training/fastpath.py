"""Switchable fast paths of a training run (each a :class:`~mmcse.training.config.TrainConfig` field).

=====================  ==================  ====================================================
field                  flag                effect
=====================  ==================  ====================================================
``attn_implementation``  ``--attn-implementation``  ``auto`` (default): ``sdpa`` where the
                                           student has it, else ``eager``
                                           (:mod:`mmcse.students`); ``sdpa``: PyTorch's fused
                                           attention kernels; ``eager``: HF's reference
                                           attention; ``flex_attention`` (GPU for training);
                                           ``varlen`` (CUDA, packed, no attention dropout).
                                           Same function; dropout draws differ.
``fused_adamw``        ``--fused-adamw``   AdamW's single fused CUDA kernel (default on; the
                                           same update; a CPU run uses the plain loop)
``compile_encoder``    ``--compile``       ``torch.compile`` of the encoder (off by default:
                                           the first steps compile; every new batch width may
                                           recompile, so pair it with ``--no-dynamic-padding``)
``tf32``               ``--tf32``          TF32 tensor-core matmuls and cuDNN convolutions on
                                           CUDA (~1e-3 relative error): on in every recipe (the
                                           released runs' torch 1.7-1.11 default on Ampere+),
                                           off for ``mmcse train`` (bf16 autocast by default)
``dynamic_padding``    ``--dynamic-padding``  pad each batch to its longest sentence (default);
                                           off: always ``max_seq_length`` (static shapes)
``packing``            ``--packing``       each batch's sentences, both dropout views, end to
                                           end in rows of 64 tokens (:mod:`mmcse.packing`);
                                           the same numbers to fp32 rounding, 1.4-2x fewer
                                           tokens computed. auto (not given): on for a CPU
                                           and for CUDA (both measured faster), else off
                                           (:func:`mmcse.training.resolved.resolve_packing`)
``capture``            ``--capture``       ``auto`` (default: on CUDA, off elsewhere), ``on``,
                                           ``off``: the whole step captured, below
=====================  ==================  ====================================================

All of them are recorded in the run's ``config.json`` like every other field.

Whole-update capture. Eagerly, one step dispatches thousands of small operators (BERT-base,
batch 128: about 3,300 for SimCSE, 7,600 for VisualCSE; ``mmcse bench all --sections train``),
each costing host time, and a host read of a device value stalls the queue. With capture
(:class:`mmcse.training.update.CapturedUpdate`), the whole text update — the student's forward (encoder,
both dropout views, every active loss term), its gradient (``torch.func`` over views of one flat
parameter buffer, so no per-parameter gradient accumulation runs outside), clipping, AdamW with
its step counts, ε and lr schedule on the device — is one function, compiled by ``torch.compile``
into one graph per batch kind, and on CUDA (``mode="reduce-overhead"``) recorded once and replayed
as a CUDA graph. VisualCSE/AudioCSE's image/audio update is captured the same way, its views made
inside the graph from parameters drawn on the host. A captured step then dispatches a few dozen
operators outside its graphs and reads nothing back (``tests/training/test_whole_update.py``
checks both for every method on CPU; measured on an H200: BENCHMARKS.md). On CPU there is
nothing to replay, so ``auto`` leaves CPU runs eager.

* Static shapes: capture pads every batch to ``max_seq_length`` (``dynamic_padding`` off; MCSEO's
  object–phrase pairs to the corpus's most pairs per caption). Packed (auto on a CPU,
  ``--packing`` on CUDA), each batch kind gets a fixed number of rows, the most any batch of the run's schedule needs (fixed at
  set-up, logged): one packed shape per batch kind, so still one graph per kind (checked on CPU
  with the ``aot_eager`` backend by ``tests/training/test_capture.py``/``test_whole_update.py``,
  which run packed by default; not yet measured on a GPU). A kept last partial batch of a
  corpus has fewer rows: it compiles one more graph for its kind, once per run (``dynamic=False``
  keeps that from becoming a shape-generic graph). So a run compiles at most two graphs per batch
  kind (the auxiliary VisualCSE/AudioCSE step: one more, as its batch is fixed).
* Not captured whole (``capture_mode`` ``"forward"``): DDP runs (the gradient all-reduce runs in
  autograd hooks) and fp16 on CUDA (the GradScaler's skip of an overflowing step is a host
  decision). There the student's forward and backward are compiled and the update stays eager.
* Compile cost: the whole update compiles in 47–77 s cold at BERT-base on an H200 (the forward/
  backward alone: 25 s), 7 s warm — a later run of the same method (a recipe's next seed, an
  ablation's next row, in this process or a new one) reuses inductor's on-disk caches
  (``TORCHINDUCTOR_CACHE_DIR``, default ``/tmp/torchinductor_$USER``: keep it between runs);
  ``tests/training/test_compile_cache.py`` checks that nothing run-specific (a path, a seed)
  keeps a second process from hitting them, nor a recipe's hyperparameters: the peak lr, the
  warm-up, the run's length and the term weights are device scalars read by the step
  (:meth:`mmcse.training.lr.LinearSchedule.on_device`, ``Student.term_weights``), not constants traced
  into it, so recipes of one method on other corpora or with another lr share the graph.
  Compiling one BERT layer and reusing it (``torch.compiler.nested_compile_region``) would cut
  the cold compile, but torch 2.14 cannot take a gradient inside the graph through such
  regions (BENCHMARKS.md, "Compile: what else was tried").
* Dropout: the same Bernoulli(p) masks in distribution, but compiled code draws them from
  inductor's own Philox stream, so a captured run is not bit-equal to an eager run of the same
  seed (two captured runs of one seed are). With ``torch._inductor.config.fallback_random = True``
  (or the ``aot_eager`` backend the tests use) dropout calls the eager kernels and the step's
  loss and parameters equal eager to float rounding. Not a change of any method's maths.
* Under DDP (``torchrun``) the student inside DDP is compiled, not DDP itself: DDP's gradient
  all-reduce and its search for unused parameters stay eager, and the all-gathers of the
  in-batch negatives are traced into the graph (as functional collectives). Tested with two gloo
  processes on CPU; NCCL with CUDA graphs has not been run here.
"""

from __future__ import annotations

import logging

import torch
import torch._dynamo
from torch import nn

from mmcse.precision import set_fp32_arithmetic, tf32_settings
from mmcse.training.config import TrainConfig

log = logging.getLogger(__name__)

#: ``torch.compile`` arguments of a captured step, by device type (tests swap in ``aot_eager``:
#: the same graphs and autograd, without inductor's slow CPU code generation)
CAPTURE_COMPILE: dict[str, dict] = {
    "cuda": {"backend": "inductor", "mode": "reduce-overhead"},
    "cpu": {"backend": "inductor"},
}


def fused_adamw(cfg: TrainConfig, device: torch.device) -> bool | None:
    """The ``fused=`` argument of AdamW: True on CUDA when asked for, else PyTorch's default."""
    return True if cfg.fused_adamw and device.type == "cuda" else None


def set_matmul_precision(
    cfg: TrainConfig, device: torch.device, apply=set_fp32_arithmetic
) -> dict[str, bool] | None:
    """TF32 matmuls and cuDNN convolutions on CUDA when ``cfg.tf32``, full fp32 otherwise
    (:func:`mmcse.precision.tf32_settings`); nothing off CUDA. Returns what was set; ``apply``:
    the device adapter (a stand-in in the CPU tests)."""
    settings = tf32_settings(device, cfg.tf32)
    if settings is not None:
        apply(settings)
    return settings


def compile_encoder(cfg: TrainConfig, encoder: torch.nn.Module) -> None:
    """``torch.compile`` the HF backbone in place (its state-dict keys stay unchanged, so
    checkpoints are ordinary HF directories)."""
    if cfg.compile_encoder:
        encoder.backbone.compile()


def apply_fast_paths(
    cfg: TrainConfig, encoder: torch.nn.Module, device: torch.device, captured: bool = False
) -> None:
    """Everything except the optimizer's ``fused=`` (see :func:`fused_adamw`) and the capture
    (:func:`capture`); a captured step holds the encoder already, so ``--compile`` is moot."""
    set_matmul_precision(cfg, device)
    if captured and cfg.compile_encoder:
        log.info("--compile is part of --capture: the encoder is compiled with the whole step")
    elif not captured:
        compile_encoder(cfg, encoder)


def capture_enabled(cfg: TrainConfig, device: torch.device) -> bool:
    """``cfg.capture`` resolved: ``auto`` captures on CUDA only (on CPU it would only fuse
    kernels, after minutes of compiling)."""
    return cfg.capture in ("on", "forward") or (cfg.capture == "auto" and device.type == "cuda")


#: what ``capture_mode`` resolves to: no capture; the student's forward/backward compiled with
#: the update eager (DDP, fp16); the whole update as one graph (:class:`mmcse.training.update.CapturedUpdate`)
CAPTURE_MODES = ("off", "forward", "whole")


def capture_mode(cfg: TrainConfig, device: torch.device, distributed: bool) -> str:
    """One of :data:`CAPTURE_MODES`. The whole update is captured unless DDP (its gradient
    all-reduce runs in autograd hooks) or fp16 on CUDA (the GradScaler's skip of an overflowing
    step is a host decision) needs the eager update, or ``--capture forward`` asks for it (what
    ``mmcse bench all --capture forward,whole`` compares)."""
    if not capture_enabled(cfg, device):
        return "off"
    if (
        cfg.capture == "forward"
        or distributed
        or (cfg.precision == "fp16" and device.type == "cuda")
    ):
        return "forward"
    return "whole"


def compile_options(device: torch.device) -> dict:
    return dict(CAPTURE_COMPILE.get(device.type, CAPTURE_COMPILE["cpu"]))


def capture(module: nn.Module, device: torch.device) -> None:
    """Compile ``module``'s call (forward, hence its backward) in place, for static shapes:
    every new shape is its own graph, never a shape-generic one. State-dict keys are unchanged."""
    module.compile(dynamic=False, **compile_options(device))


def capture_fn(fn, device: torch.device):
    """``fn`` compiled for static shapes, as :func:`capture` compiles a module."""
    return torch.compile(fn, dynamic=False, **compile_options(device))


def fresh_capture_cache() -> None:
    """Forget the graphs of earlier runs in this process (a recipe's seeds, an ablation's
    variants run one after the other): every compiled module shares one Dynamo cache (that of
    ``nn.Module.__call__``), and past 8 graphs Dynamo falls back to eager. Recompiling a graph
    seen before is quick: inductor keeps compiled graphs on disk."""
    torch._dynamo.reset()


def begin_captured_step(device: torch.device) -> None:
    """Tell CUDA-graph replay that a new step starts (the last step's outputs are dead)."""
    if device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # pragma: cuda
