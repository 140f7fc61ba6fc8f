"""The parameter update of a training step: AdamW, clipping and the lr schedule, eager or captured.

Both updates step the same AdamW (one group per module that steps together: the encoder, each
head), clip the gradient norm over every trained parameter, and follow an lr schedule
(:mod:`mmcse.training.lr`); they differ in where the work runs.

* :class:`EagerUpdate` (``--capture off``; also under DDP and with ``--precision fp16``, see
  below): ``torch.optim.AdamW`` + :func:`torch.nn.utils.clip_grad_norm_` + ``LambdaLR``, every
  operator dispatched from the host. transformers-style ε is set per group from a host-side
  count of the steps AdamW took (reading the optimizer's device step tensor would wait for the
  GPU every step); a step the fp16 GradScaler skips is not one, as transformers.AdamW, whose
  ``step()`` the scaler then never calls, counts it.
* :class:`CapturedUpdate` (whole-update capture, ``--capture on``/``auto`` on CUDA): every trained
  parameter is a view of one flat fp32 buffer (:class:`FlatParameters`); one function computes
  the loss, its gradient with respect to that buffer (``torch.func.grad_and_value`` over
  ``functional_call``: the backward is part of the traced function, so autograd's per-parameter
  gradient accumulation never runs outside it), clips it, and applies AdamW — moments, per-group
  step counts and the lr schedule are device tensors updated in place. ``torch.compile`` makes
  that one graph per batch kind (and size), replayed as a CUDA graph on CUDA: a step is one
  launch, with no host read of a device value.

What the captured AdamW equals. ``torch.optim.AdamW``'s arithmetic (``lerp`` of the first
moment, bias corrections, ε after the corrected √v, or transformers' ε placement; weight decay as
``weight_decay_style`` says, :mod:`mmcse.training.adamw`), with the same per-parameter skip rule: under
``zero_grad="none"`` a parameter that gets no gradient on a batch kind is not touched on that
kind's steps (its moments do not decay, its step does not count); under ``zero_grad="zeros"`` (the
released runs: torch < 2's ``zero_grad()`` leaves a zero gradient, which transformers.AdamW steps)
a parameter that has had a gradient on any batch steps on every later one, with gradient 0 where
its batch does not reach it. Which parameters a kind reaches is found once per kind by an eager
forward/backward on the first batch of that kind, with the random state restored after it
(:meth:`CapturedUpdate._probe`); under ``zeros`` a kind's layout is rebuilt when another kind
first reaches new parameters. Step counts are kept per contiguous run of parameters that step
together (normally one per group); the bias corrections and ε read them on the device, in fp32
(eager: Python floats), so the two agree to float rounding (tested after 3 steps,
``tests/training/test_whole_update.py``).

Not captured whole (these runs use :class:`EagerUpdate`, with the student's forward/backward
still compiled when capture is on): ``--precision fp16`` (the GradScaler skips an overflowing
step, a decision the host takes) and DDP (its gradient all-reduce runs in autograd hooks).

:func:`build_update` is the one place that builds either, with its AdamW, clipping, schedule and
loss scaler, for each capture mode: the text update and VisualCSE/AudioCSE's image (audio) update
(:mod:`mmcse.training.updates`) both come from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from mmcse import distributed as dist
from mmcse.optim import transformers_eps
from mmcse.training.adamw import (
    AdamWSettings,
    FlatAdamW,
    FlatParameters,
    Segment,
    decay_after_update_,
    decay_exempt,
    read_group_steps,
)

logger = logging.getLogger(__name__)

#: ``clip_grad_norm_``'s guard against a zero norm, kept for equality with it
CLIP_EPS = 1e-6


class EagerUpdate:
    """``torch.optim.AdamW`` + clipping + ``LambdaLR``, dispatched op by op from the host.

    ``exempt``: ids of the parameters spared weight decay (:func:`decay_exempt`; read under
    ``decay_style="transformers"`` only). ``average``: the gradients are averaged across ranks
    before clipping (an update outside DDP, whose replicas must take the same step)."""

    captured = False

    def __init__(
        self,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        schedule: Callable[[int], float],
        fused: bool | None = None,
        scaler: torch.amp.GradScaler | None = None,
        exempt: set[int] | frozenset[int] = frozenset(),
        average: bool = False,
    ) -> None:
        self.settings, self.schedule, self.average = settings, schedule, average
        self.params = [p for g in groups for p in g]
        self.optimizer = torch.optim.AdamW(
            [{"params": g} for g in groups],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.torch_weight_decay,
            eps=settings.eps,
            fused=fused,
        )
        # a function, not the schedule object: LambdaLR saves an object's attributes and
        # would load a checkpoint's run length over the run's own
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: schedule(s))
        self.scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
        #: optimizer steps taken by each group, on the host (ε's scaling reads it)
        self.group_steps = [0] * len(groups)
        #: what transformers' decay shrinks after each step it takes
        self.decayed = [p for p in self.params if id(p) not in exempt]

    def zero_grad(self) -> None:
        """Clear the gradients: to None, or (``zero_grad="zeros"``) to zero tensors, which
        AdamW then steps on every batch, as the released runs' ``optimizer.zero_grad()``."""
        self.optimizer.zero_grad(set_to_none=self.settings.zero_grad == "none")

    def apply(self, loss: Tensor) -> None:
        """Backward of ``loss`` (scaled under fp16), clip, AdamW, decay, schedule."""
        self.scaler.scale(loss).backward()
        if self.average:
            average_gradients(self.params)
        if self.settings.max_grad_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
        stepping = [
            any(p.grad is not None for p in g["params"]) for g in self.optimizer.param_groups
        ]
        if self.settings.eps_style == "transformers":
            beta2 = self.settings.betas[1]
            for group, steps in zip(self.optimizer.param_groups, self.group_steps, strict=True):
                group["eps"] = transformers_eps(self.settings.eps, beta2, steps + 1)
        lr = self.lr()
        taken = self._scaled_step()
        if taken:
            stepped = [p for p in self.decayed if p.grad is not None]
            decay_after_update_(stepped, lr, self.settings.decay_after)
        self.scheduler.step()  # also after a skipped step, as the released HF-Trainer loop
        if taken:  # a step the fp16 scaler skipped is no step of AdamW's: ε's count stays
            self.group_steps = [n + int(s) for n, s in zip(self.group_steps, stepping, strict=True)]

    def _scaled_step(self) -> bool:
        """The optimizer step through the loss scaler; False when the scaler skipped it (an
        overflowing fp16 gradient: the scale backs off). The scale is read on the host only when
        the scaler is on — its ``step`` has read the overflow flag there already."""
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= before

    def lr(self) -> float:
        """The lr of the next step."""
        return self.settings.lr * self.schedule(self.steps)

    def extend_schedule(self, total: int) -> float:
        """A finished run extended to ``total`` steps: the schedule recomputed from the step it
        is at (a loaded state holds the lr it ended at, 0); the lr it continues at."""
        self.schedule.retarget(total)
        self.set_steps(self.steps)
        return self.lr()

    @property
    def steps(self) -> int:
        """Updates this one has run (the schedule's position)."""
        return self.scheduler.last_epoch

    def set_steps(self, steps: int) -> None:
        """The schedule at ``steps``: the lr AdamW's groups take next (after a state that
        records only the count, or a changed run length)."""
        self.scheduler.last_epoch = steps
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr()

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self.group_steps = read_group_steps(self.optimizer)
        if self.settings.zero_grad == "zeros":  # what had a gradient before keeps stepping
            for p in self.params:
                if p in self.optimizer.state and p.grad is None:
                    p.grad = torch.zeros_like(p)


@dataclass(frozen=True)
class KindLayout:
    """What a captured step of one batch kind updates and returns (found by the probe)."""

    segments: tuple[Segment, ...]
    keys: tuple[str, ...]  # the terms the step returns, stacked in this order


class CapturedUpdate:
    """The whole update of a step as one captured function (see the module docstring).

    ``module(*inputs)`` returns the step's terms (a dict of scalars); ``loss_of(terms)`` the
    scalar to minimise. ``lr_factor`` is the schedule on the device (its argument: the steps
    this update has taken), ``host_factor`` the same on the host (for the logged lr and the
    state dict). ``compile_fn`` compiles a function (:func:`mmcse.training.fastpath.capture_fn`).
    """

    captured = True

    def __init__(
        self,
        flat: FlatParameters,
        module: nn.Module,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        loss_of: Callable[[dict[str, Tensor]], Tensor],
        lr_factor: Callable[[Tensor], Tensor],
        host_factor: Callable[[int], float],
        autocast: Callable[[], object],
        compile_fn: Callable[[Callable], Callable],
    ) -> None:
        self.flat, self.module, self.settings = flat, module, settings
        self.loss_of, self.lr_factor, self.autocast = loss_of, lr_factor, autocast
        self.trained = [p for g in groups for p in g]
        self.adamw = FlatAdamW(flat, self.trained, settings, decay_exempt(module))
        self.layout = flat.layout(module)
        self.names = {id(p): name for name, p in module.named_parameters()}
        self.buffers = dict(module.named_buffers())
        self.host_factor = host_factor
        #: the number of parameters of each AdamW group (the state dict's param groups)
        self.group_sizes = [len(g) for g in groups]
        #: updates run, on the host (the logged lr and the state dict's schedule)
        self.steps = 0
        device = flat.data.device
        self.schedule_step = torch.zeros((), dtype=torch.float32, device=device)
        #: the peak lr as an input of the captured step, not a constant traced into it (a run
        #: with another lr reuses the compiled graph); fp32, as a Python float times an fp32
        #: tensor is computed
        self.peak_lr = torch.tensor(settings.lr, dtype=torch.float32, device=device)
        self.layouts: dict[str, KindLayout] = {}
        #: per batch kind: (the parameters it reaches, its terms), from its probe
        self.reached: dict[str, tuple[set[int], tuple[str, ...]]] = {}
        #: ``zero_grad="zeros"``: every parameter that has had a gradient (they all step)
        self.had_gradient: set[int] = set()
        for state in (flat.data, self.adamw.exp_avg, self.adamw.exp_avg_sq, self.adamw.steps,
                      self.schedule_step, self.peak_lr):  # fmt: skip
            torch._dynamo.mark_static_address(state)  # CUDA graphs update them in place
        if self.adamw.decay_rate is not None:  # read every step: no copy into the graph
            torch._dynamo.mark_static_address(self.adamw.decay_rate)
        self._compiled = compile_fn(self._whole_step)

    # -- the step ----------------------------------------------------------------------------
    def step(self, kind: str, *inputs) -> tuple[tuple[str, ...], Tensor]:
        """One update on ``inputs`` of batch kind ``kind``: (term names, their values stacked
        on the device, in fp32)."""
        layout = self.layouts.get(kind) or self._layout(kind, inputs)
        if self.flat.data.is_cuda:  # the outputs of the last replay are dead (read already)
            torch.compiler.cudagraph_mark_step_begin()  # pragma: cuda
        # a copy: the next replay of any captured graph may reuse the output's memory
        values = self._compiled(layout.segments, layout.keys, *inputs).clone()
        self.adamw.count(layout.segments)
        self.steps += 1  # host ints only: the logged lr and the state dict
        return layout.keys, values

    def _whole_step(self, segments, keys, *inputs) -> Tensor:
        """Loss, gradient, clipping, AdamW and the schedule: the function that is captured.

        The gradient is taken with respect to each parameter's view of the flat buffer (not the
        buffer itself, whose gradient would be assembled from a zero-filled copy per
        parameter), then each segment's gradients are joined into one flat run."""
        grads, terms = self._gradients(self.flat.views(self.flat.data, self.layout), inputs)
        flat_grads = [
            torch.cat([grads[n].reshape(-1) for n in seg.names]) if len(seg.names) > 1
            else grads[seg.names[0]].reshape(-1)
            for seg in segments
        ]  # fmt: skip
        max_norm = self.settings.max_grad_norm
        if max_norm > 0:
            norm = torch.stack([g.float().square().sum() for g in flat_grads]).sum().sqrt()
            scale = (max_norm / (norm + CLIP_EPS)).clamp(max=1.0)
            flat_grads = [g * scale for g in flat_grads]
        lr = self.peak_lr * self.lr_factor(self.schedule_step)
        self.adamw.step_(flat_grads, segments, lr)
        self.schedule_step.add_(1)
        return torch.stack([terms[k].detach().float() for k in keys])

    def _gradients(self, params: dict, inputs: tuple) -> tuple[dict, dict]:
        """(each parameter view's gradient of the loss, the step's terms), by ``torch.func``.
        (``torch.autograd.grad`` traced with Dynamo's ``trace_autograd_ops`` gives the same
        update: BENCHMARKS.md, "Compile: what else was tried".)"""
        # the buffers go in as arguments: a grad transform may mutate (BatchNorm's statistics)
        # only what it is given
        loss_and_grad = grad_and_value(self._loss, has_aux=True)
        grads, (_, terms) = loss_and_grad(params, self.buffers, inputs)
        return grads, terms

    def _loss(self, params: dict, buffers: dict, inputs: tuple) -> tuple[Tensor, dict]:
        with self.autocast():
            terms = functional_call(self.module, (params, buffers), inputs)
        return self.loss_of(terms), terms

    def _layout(self, kind: str, inputs: tuple) -> KindLayout:
        """What a step of ``kind`` updates: the parameters it reaches (:meth:`_probe`, once per
        kind) — under ``zero_grad="zeros"`` with every parameter that has had a gradient, and
        the other kinds' layouts rebuilt when this kind reaches new ones."""
        if kind not in self.reached:
            self.reached[kind] = self._probe(inputs)
        active, keys = self.reached[kind]
        if self.settings.zero_grad == "zeros":
            if not active <= self.had_gradient:
                self.had_gradient |= active
                self.layouts.clear()  # they step these too from now on
            active = active | self.had_gradient
        layout = KindLayout(self.adamw.segments(active, self.names), keys)
        self.layouts[kind] = layout
        logger.debug("captured update, %s batches: %d segments", kind, len(layout.segments))
        return layout

    def _probe(self, inputs: tuple) -> tuple[set[int], tuple[str, ...]]:
        """(ids of the parameters a step on ``inputs`` gives a gradient, the terms it returns):
        one eager forward/backward, the random state and the module's buffers (e.g. BatchNorm
        statistics) restored after it, so the run's draws are unchanged."""
        buffers = {k: b.clone() for k, b in self.module.named_buffers()}
        device = self.flat.data.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with self.autocast():
                terms = self.module(*inputs)
            grads = torch.autograd.grad(self.loss_of(terms), self.trained, allow_unused=True)
        for key, buffer in self.module.named_buffers():
            buffer.copy_(buffers[key])
        active = {id(p) for p, g in zip(self.trained, grads, strict=True) if g is not None}
        return active, tuple(terms)

    # -- bookkeeping -------------------------------------------------------------------------
    def lr(self) -> float:
        return self.settings.lr * self.host_factor(self.steps)

    def extend_schedule(self, total: int) -> float:
        """A finished run extended to ``total`` steps (the device schedule reads it too); the lr
        it continues at."""
        self.host_factor.retarget(total)
        return self.lr()

    def set_steps(self, steps: int) -> None:
        """The schedule at ``steps`` (a state that records only the count)."""
        self.steps = steps
        self.schedule_step.fill_(float(steps))

    def state_dict(self) -> dict:
        """``torch.optim.AdamW`` + ``LambdaLR``'s layout, as :class:`EagerUpdate` writes it: a
        ``last/`` resumes with either update."""
        lr = self.lr()
        return {
            "optimizer": self.adamw.state_dict(
                adamw_param_groups(self.group_sizes, self.settings, lr)
            ),
            "scheduler": lambda_lr_state(len(self.group_sizes), self.settings.lr, self.steps, lr),
            "grad_scaler": {},
        }

    def load_state_dict(self, state: dict) -> None:
        self.adamw.load_state_dict(state["optimizer"])
        self.set_steps(int(state["scheduler"]["last_epoch"]))
        if self.settings.zero_grad == "zeros":  # what stepped before keeps stepping
            self.had_gradient = set(self.adamw.loaded_steps)
            self.layouts.clear()


def adamw_param_groups(sizes: list[int], settings: AdamWSettings, lr: float) -> list[dict]:
    """``torch.optim.AdamW.state_dict()["param_groups"]`` of groups of ``sizes`` parameters at
    ``lr`` under a ``LambdaLR`` (its ``initial_lr``), parameters numbered across groups."""
    groups, start = [], 0
    for size in sizes:
        groups.append({
            "lr": lr, "betas": settings.betas, "eps": settings.eps,
            "weight_decay": settings.torch_weight_decay, "amsgrad": False, "maximize": False,
            "foreach": None, "capturable": False, "differentiable": False, "fused": None,
            "decoupled_weight_decay": True, "initial_lr": settings.lr,
            "params": list(range(start, start + size)),
        })  # fmt: skip
        start += size
    return groups


def lambda_lr_state(groups: int, base_lr: float, steps: int, lr: float) -> dict:
    """``LambdaLR.state_dict()`` after ``steps`` steps of a schedule now at ``lr``."""
    return {
        "base_lrs": [base_lr] * groups, "last_epoch": steps, "_step_count": steps + 1,
        "_is_initial": False, "_get_lr_called_within_step": False, "_last_lr": [lr] * groups,
        "lr_lambdas": [None] * groups,
    }  # fmt: skip


def average_gradients(params: list[Tensor]) -> None:
    """Average ``.grad`` across ranks (no-op in one process) so replicas take the same step."""
    if dist.world_size() == 1:
        return
    for p in params:
        if p.grad is not None:
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(dist.world_size())


def build_update(
    capture: str,
    groups: list[list[nn.Parameter]],
    settings: AdamWSettings,
    schedule,
    *,
    device: torch.device,
    exempt: set[int] | frozenset[int] = frozenset(),
    scaler: torch.amp.GradScaler | None = None,
    fused: bool | None = None,
    average: bool = False,
    whole: dict | None = None,
) -> EagerUpdate | CapturedUpdate:
    """The one place an update is built: AdamW over ``groups`` with ``settings`` (clipping at
    ``settings.max_grad_norm``), following ``schedule`` (:mod:`mmcse.training.lr`), for capture
    mode ``capture`` (:data:`mmcse.training.fastpath.CAPTURE_MODES`).

    ``off``/``forward``: :class:`EagerUpdate` with the loss ``scaler`` (fp16), ``fused`` AdamW,
    gradients ``average``-d across ranks when no DDP does it. ``whole``: :class:`CapturedUpdate`;
    ``whole`` then names what it differentiates — ``flat`` (the shared
    :class:`~mmcse.training.adamw.FlatParameters`), ``module``, ``loss_of``, ``autocast`` and
    ``compile_fn`` — and the schedule runs on the device."""
    if capture != "whole":
        return EagerUpdate(
            groups, settings, schedule, fused=fused, scaler=scaler, exempt=exempt,
            average=average,
        )  # fmt: skip
    assert whole is not None, "a captured update needs what it differentiates"
    return CapturedUpdate(
        whole["flat"], whole["module"], groups, settings,
        loss_of=whole["loss_of"],
        lr_factor=schedule.on_device(device),
        host_factor=schedule,
        autocast=whole["autocast"],
        compile_fn=whole["compile_fn"],
    )  # fmt: skip
