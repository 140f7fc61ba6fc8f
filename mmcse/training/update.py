"""The parameter update of a training step: AdamW, clipping and the lr schedule, eager or captured.

Both updates have one interface, ``step(kind, inputs) → (term names, their values on the
device)``, and are given what they differentiate as data (:class:`Forward`: the module, the loss
of its terms, the autocast). Both step the same AdamW (one group per module that steps together:
the encoder, each head; its readings — ε placement, decay style, gradient clearing — are
:class:`~mmcse.training.adamw.AdamWSettings`' for both), clip the gradient norm over every
trained parameter, and follow an lr schedule (:mod:`mmcse.training.lr`); they differ only in
where the work runs.

* :class:`EagerUpdate` (``--capture off``; also under DDP and with ``--precision fp16``, see
  below): :class:`~mmcse.training.adamw.EagerAdamW` (``torch.optim.AdamW`` with the settings'
  ε placement, decay and gradient clearing, its step counts on the host) +
  :func:`torch.nn.utils.clip_grad_norm_` + ``LambdaLR``, every operator dispatched from the
  host, in the released loop's order: clear the gradients, the forward under autocast,
  backward, clip, AdamW (through the fp16 loss scaler), schedule.
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
loss scaler — captured when given the run's :class:`WholeUpdateSettings` — : the text update and
VisualCSE/AudioCSE's image (audio) update (:mod:`mmcse.training.updates`) both come from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from mmcse import distributed as dist
from mmcse.training.adamw import (
    AdamWSettings,
    EagerAdamW,
    FlatAdamW,
    FlatParameters,
    Segment,
    decay_exempt,
)
from mmcse.training.fastpath import begin_captured_step
from mmcse.training.lr import CosineSchedule, LinearSchedule

logger = logging.getLogger(__name__)

#: ``clip_grad_norm_``'s guard against a zero norm, kept for equality with it
CLIP_EPS = 1e-6

#: one update's terms: ``(names, values stacked on the device, fp32)``
Part = tuple[tuple[str, ...], Tensor]


@dataclass(frozen=True)
class Forward:
    """What an update differentiates, for either engine: ``module(*inputs)`` returns the step's
    terms (a dict of scalars), ``loss_of(terms)`` the scalar to minimise, computed under
    ``autocast()``. ``compiled_on``: the device its compiled forward replays on (``forward``
    capture: the last replay's outputs are dead when a step begins); None when it runs eagerly."""

    module: Callable[..., dict[str, Tensor]]
    loss_of: Callable[[dict[str, Tensor]], Tensor]
    autocast: Callable[[], AbstractContextManager]
    compiled_on: torch.device | None = None

    def terms(self, inputs: tuple) -> dict[str, Tensor]:
        """The step's terms on ``inputs`` (eagerly; the captured update traces ``module``)."""
        if self.compiled_on is not None:
            begin_captured_step(self.compiled_on)
        with self.autocast():
            return self.module(*inputs)


@dataclass(frozen=True)
class WholeUpdateSettings:
    """What every captured update of a run shares: the flat parameter buffer (the text and the
    auxiliary update's parameters, :class:`~mmcse.training.adamw.FlatParameters`) and the
    function that compiles a step (:func:`mmcse.training.fastpath.capture_fn`)."""

    flat: FlatParameters
    compile_fn: Callable[[Callable], Callable]


class EagerUpdate:
    """:class:`~mmcse.training.adamw.EagerAdamW` + clipping + ``LambdaLR``, dispatched op by op
    from the host.

    ``forward``: what :meth:`step` differentiates. ``exempt``: ids of the parameters spared
    weight decay (:func:`decay_exempt`; read under ``decay_style="transformers"`` only).
    ``average``: the gradients are averaged across ranks before clipping (an update outside DDP,
    whose replicas must take the same step). ``clear_after``: the gradients are cleared after
    the step too (the released image step's order: cleared before the text update runs)."""

    def __init__(
        self,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        schedule: Callable[[int], float],
        forward: Forward,
        fused: bool | None = None,
        scaler: torch.amp.GradScaler | None = None,
        exempt: set[int] | frozenset[int] = frozenset(),
        average: bool = False,
        clear_after: bool = False,
    ) -> None:
        self.settings, self.schedule, self.average = settings, schedule, average
        self.forward, self.clear_after = forward, clear_after
        self.params = [p for g in groups for p in g]
        self.optimizer = EagerAdamW(groups, settings, exempt, fused)
        # a function, not the schedule object: LambdaLR saves an object's attributes and
        # would load a checkpoint's run length over the run's own
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: schedule(s))
        self.scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)

    def step(self, kind: str, inputs: tuple) -> Part:
        """One update on ``inputs`` (``kind``: their batch kind, which only the captured engine
        reads): clear, forward, backward, clip, AdamW, schedule; the step's terms."""
        self.optimizer.zero_grad()  # before the forward: no grad outlives its step
        terms = self.forward.terms(inputs)
        # no isfinite(loss): a wait for the device per step (LossWindow.flush checks per window)
        self.scaler.scale(self.forward.loss_of(terms)).backward()
        if self.average:
            average_gradients(self.params)
        if self.settings.max_grad_norm > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
        self.scaler.step(self.optimizer)  # not called on an overflowing fp16 gradient
        self.scaler.update()
        self.scheduler.step()  # also after a skipped step, as the released HF-Trainer loop
        if self.clear_after:
            self.optimizer.zero_grad()
        # as the captured update returns them: the names, the values stacked on the device
        return tuple(terms), torch.stack([v.detach().float() for v in terms.values()])

    def lr(self) -> float:
        """The lr of the next step (LambdaLR's: the peak lr × the schedule's factor)."""
        return self.optimizer.param_groups[0]["lr"]

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
            group["lr"] = self.settings.lr * self.schedule(steps)

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


@dataclass(frozen=True)
class KindLayout:
    """What a captured step of one batch kind updates and returns (found by the probe)."""

    segments: tuple[Segment, ...]
    keys: tuple[str, ...]  # the terms the step returns, stacked in this order


def joined(grads: dict[str, Tensor], names: tuple[str, ...]) -> Tensor:
    """The gradients of ``names`` as one flat run (a segment's, in buffer order)."""
    if len(names) == 1:
        return grads[names[0]].reshape(-1)
    return torch.cat([grads[n].reshape(-1) for n in names])


class CapturedUpdate:
    """The whole update of a step as one captured function (see the module docstring).

    ``forward``: what it differentiates (its ``module`` an ``nn.Module``, called functionally
    over the flat buffer's views). ``lr_factor`` is the schedule on the device (its argument:
    the steps this update has taken), ``host_factor`` the same on the host (for the logged lr
    and the state dict). ``whole``: the run's flat buffer and the compiler
    (:class:`WholeUpdateSettings`).
    """

    #: no loss scaler: fp16 runs take the eager update
    scaler = None

    def __init__(
        self,
        whole: WholeUpdateSettings,
        forward: Forward,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        lr_factor: Callable[[Tensor], Tensor],
        host_factor: Callable[[int], float],
    ) -> None:
        self.flat, self.forward, self.settings = whole.flat, forward, settings
        module = self.module = forward.module
        self.lr_factor, self.host_factor = lr_factor, host_factor
        self.trained = [p for g in groups for p in g]
        self.adamw = FlatAdamW(self.flat, self.trained, settings, decay_exempt(module))
        self.layout = self.flat.layout(module)
        self.names = {id(p): name for name, p in module.named_parameters()}
        self.buffers = dict(module.named_buffers())
        #: the number of parameters of each AdamW group (the state dict's param groups)
        self.group_sizes = [len(g) for g in groups]
        #: updates run, on the host (the logged lr and the state dict's schedule)
        self.steps = 0
        device = self.flat.data.device
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
        adamw = self.adamw
        in_place = [self.flat.data, adamw.exp_avg, adamw.exp_avg_sq, adamw.steps]
        in_place += [self.schedule_step, self.peak_lr]
        if adamw.decay_rate is not None:  # read every step: no copy into the graph
            in_place.append(adamw.decay_rate)
        for state in in_place:
            torch._dynamo.mark_static_address(state)  # CUDA graphs update them in place
        self._compiled = whole.compile_fn(self._whole_step)

    # -- the step ----------------------------------------------------------------------------
    def step(self, kind: str, inputs: tuple) -> Part:
        """One update on ``inputs`` of batch kind ``kind``: (term names, their values stacked
        on the device, in fp32)."""
        layout = self.layouts.get(kind) or self._layout(kind, inputs)
        begin_captured_step(self.flat.data.device)  # the last replay's outputs are read already
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
        flat_grads = [joined(grads, seg.names) for seg in segments]
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
        with self.forward.autocast():
            terms = functional_call(self.module, (params, buffers), inputs)
        return self.forward.loss_of(terms), terms

    def _layout(self, kind: str, inputs: tuple) -> KindLayout:
        """What a step of ``kind`` updates: the parameters it reaches (:meth:`_probe`, once per
        kind) — under ``zero_grad="zeros"`` with every parameter that has had a gradient, and
        the other kinds' layouts rebuilt when this kind reaches new ones."""
        if kind not in self.reached:
            self.reached[kind] = self._probe(inputs)
        active, keys = self.reached[kind]
        if self.settings.steps_once_reached:
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
            with self.forward.autocast():
                terms = self.module(*inputs)
            loss = self.forward.loss_of(terms)
            grads = torch.autograd.grad(loss, self.trained, allow_unused=True)
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
        if self.settings.steps_once_reached:  # what stepped before keeps stepping
            self.had_gradient = set(self.adamw.loaded_steps)
            self.layouts.clear()


def adamw_param_groups(sizes: list[int], settings: AdamWSettings, lr: float) -> list[dict]:
    """``torch.optim.AdamW.state_dict()["param_groups"]`` of groups of ``sizes`` parameters at
    ``lr`` under a ``LambdaLR`` (its ``initial_lr``), parameters numbered across groups."""
    groups, start = [], 0
    for size in sizes:
        group = {
            "lr": lr,
            "betas": settings.betas,
            "eps": settings.eps,
            "weight_decay": settings.torch_weight_decay,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": None,
            "decoupled_weight_decay": True,
            "initial_lr": settings.lr,
            "params": list(range(start, start + size)),
        }
        groups.append(group)
        start += size
    return groups


def lambda_lr_state(groups: int, base_lr: float, steps: int, lr: float) -> dict:
    """``LambdaLR.state_dict()`` after ``steps`` steps of a schedule now at ``lr``."""
    return {
        "base_lrs": [base_lr] * groups,
        "last_epoch": steps,
        "_step_count": steps + 1,
        "_is_initial": False,
        "_get_lr_called_within_step": False,
        "_last_lr": [lr] * groups,
        "lr_lambdas": [None] * groups,
    }


def average_gradients(params: list[Tensor]) -> None:
    """Average ``.grad`` across ranks (no-op in one process) so replicas take the same step."""
    if dist.world_size() == 1:
        return
    for p in params:
        if p.grad is not None:
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(dist.world_size())


def build_update(
    groups: list[list[nn.Parameter]],
    settings: AdamWSettings,
    schedule: LinearSchedule | CosineSchedule,
    forward: Forward,
    *,
    device: torch.device,
    whole: WholeUpdateSettings | None = None,
    exempt: set[int] | frozenset[int] = frozenset(),
    scaler: torch.amp.GradScaler | None = None,
    fused: bool | None = None,
    average: bool = False,
    clear_after: bool = False,
) -> EagerUpdate | CapturedUpdate:
    """The one place an update is built: AdamW over ``groups`` with ``settings`` (clipping at
    ``settings.max_grad_norm``), following ``schedule`` (:mod:`mmcse.training.lr`), stepping on
    ``forward``'s loss.

    ``whole`` given (whole-update capture): :class:`CapturedUpdate` over that flat buffer, the
    schedule on the device. Else :class:`EagerUpdate` with the loss ``scaler`` (fp16),
    ``fused`` AdamW, gradients ``average``-d across ranks when no DDP does it, and cleared
    after the step too when ``clear_after``."""
    if whole is None:
        return EagerUpdate(
            groups,
            settings,
            schedule,
            forward,
            fused=fused,
            scaler=scaler,
            exempt=exempt,
            average=average,
            clear_after=clear_after,
        )
    return CapturedUpdate(
        whole,
        forward,
        groups,
        settings,
        lr_factor=schedule.on_device(device),
        host_factor=schedule,
    )
