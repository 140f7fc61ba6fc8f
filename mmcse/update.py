"""The parameter update of a training step: AdamW, clipping and the lr schedule, eager or captured.

Both updates step the same AdamW (one group per module that steps together: the encoder, each
head), clip the gradient norm over every trained parameter, and follow HF's linear schedule;
they differ in where the work runs.

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
``weight_decay_style`` says, below), with the same per-parameter skip rule: under
``zero_grad="none"`` a parameter that gets no gradient on a batch kind is not touched on that
kind's steps (its moments do not decay, its step does not count); under ``zero_grad="zeros"`` (the
released runs: torch < 2's ``zero_grad()`` leaves a zero gradient, which transformers.AdamW steps)
a parameter that has had a gradient on any batch steps on every later one, with gradient 0 where
its batch does not reach it. Which parameters a kind reaches is found once per kind by an eager
forward/backward on the first batch of that kind, with the random state restored after it
(:meth:`CapturedUpdate._probe`); under ``zeros`` a kind's plan is rebuilt when another kind
first reaches new parameters. Step
counts are kept per contiguous run of parameters that step together (normally one per group);
the bias corrections and ε read them on the device, in fp32 (eager: Python floats), so the two
agree to float rounding (tested after 3 steps, ``tests/training/test_whole_update.py``).

Weight decay (``weight_decay_style``): ``transformers`` — transformers.AdamW 4.x's decoupled decay
``p ← p − lr·λ·p`` *after* the Adam update, on every parameter but biases and LayerNorm weights
(the released trainers' parameter groups, :func:`decay_exempt`) — or ``torch``: torch's AdamW,
``p ← p·(1 − lr·λ)`` *before* the update, on every parameter.

Not captured whole (these runs use :class:`EagerUpdate`, with the student's forward/backward
still compiled when capture is on): ``--precision fp16`` (the GradScaler skips an overflowing
step, a decision the host takes) and DDP (its gradient all-reduce runs in autograd hooks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from mmcse.optim import DECAY_STYLES, ZERO_GRADS, transformers_eps

logger = logging.getLogger(__name__)

#: ``clip_grad_norm_``'s guard against a zero norm, kept for equality with it
CLIP_EPS = 1e-6


def adamw_groups(modules: list[nn.Module]) -> list[list[nn.Parameter]]:
    """One AdamW group per module whose parameters step together (the encoder, each head):
    parameters of a group share their step count, which ε's scaling needs. A parameter shared
    by two modules joins the first one's group."""
    seen: set[int] = set()
    groups = []
    for module in modules:
        params = [p for p in module.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            groups.append(params)
    return groups


def decay_exempt(module: nn.Module) -> set[int]:
    """Ids of ``module``'s parameters spared weight decay under ``weight_decay_style=
    transformers``: a name containing ``bias``, or a LayerNorm's parameter — the released
    trainers' groups (MCSE/KDMCSE/DALR ``train_mix.py``: ``"bias"``, ``"LayerNorm.bias"``,
    ``"LayerNorm.weight"`` in the name; HF Trainer 4.5: every LayerNorm parameter and every
    ``bias``; the same set for BERT/RoBERTa, whose LayerNorms are named ``LayerNorm``)."""
    exempt = set()
    for prefix, sub in module.named_modules():
        for name, p in sub.named_parameters(recurse=False):
            if "bias" in f"{prefix}.{name}" or isinstance(sub, nn.LayerNorm):
                exempt.add(id(p))
    return exempt


def decay_after_update_(params: list[Tensor], lr: float, weight_decay: float) -> None:
    """transformers.AdamW's decay, after its update: ``p ← p − lr·λ·p`` for each parameter
    that stepped (``params``)."""
    if params and weight_decay > 0:
        with torch.no_grad():
            torch._foreach_mul_(params, 1.0 - lr * weight_decay)


def linear_factor(step: int, warmup: int, total: int) -> float:
    """HF's ``get_linear_schedule_with_warmup``: ``s/w`` for ``s < w``, then ``(T − s)/(T − w)``
    (``s`` = optimizer steps taken: the first step runs at factor 0 when ``w > 0``, as released)."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def linear_factor_tensor(step: Tensor, warmup: Tensor | int, total: Tensor | int) -> Tensor:
    """:func:`linear_factor` on a device step count (inside a captured update); ``warmup`` and
    ``total`` may be device scalars (:class:`LinearScheduleOnDevice`). Whole numbers below 2²⁴
    are exact in fp32, so a tensor gives the same factor as an int."""
    warmup = torch.as_tensor(warmup, dtype=step.dtype, device=step.device)
    total = torch.as_tensor(total, dtype=step.dtype, device=step.device)
    rising = step / warmup.clamp(min=1)
    falling = ((total - step) / (total - warmup).clamp(min=1)).clamp(min=0.0)
    return torch.where(step < warmup, rising, falling)


class LinearScheduleOnDevice:
    """:func:`linear_factor_tensor` with the warm-up and the run's length held as device
    scalars: inputs of a captured step rather than constants traced into it, so runs that differ
    only in length or warm-up (a recipe on another corpus) share one compiled graph and hit
    inductor's on-disk cache (``tests/training/test_compile_cache.py``)."""

    def __init__(self, warmup: int, total: int, device: torch.device) -> None:
        self.warmup = torch.tensor(float(warmup), dtype=torch.float32, device=device)
        self.total = torch.tensor(float(total), dtype=torch.float32, device=device)
        for value in (self.warmup, self.total):
            torch._dynamo.mark_static_address(value)  # CUDA graphs: read in place, not copied

    def __call__(self, step: Tensor) -> Tensor:
        return linear_factor_tensor(step, self.warmup, self.total)


@dataclass(frozen=True)
class AdamWSettings:
    lr: float
    weight_decay: float
    eps: float
    #: ``transformers``: ε added to √v before the bias correction is folded into the step size
    #: (transformers.AdamW, every released trainer here); ``torch``: torch.optim.AdamW's
    eps_style: str = "transformers"
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    #: ``transformers``: decay after the update, biases and LayerNorm weights spared; ``torch``:
    #: torch.optim.AdamW's (every parameter, before the update) — :data:`mmcse.optim.DECAY_STYLES`
    decay_style: str = "transformers"
    #: ``zeros``: a parameter that has had a gradient steps on every later batch (torch < 2's
    #: ``zero_grad()``); ``none``: only on batches that reach it — :data:`mmcse.optim.ZERO_GRADS`
    zero_grad: str = "none"

    def __post_init__(self) -> None:
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"decay_style must be one of {DECAY_STYLES}, not {self.decay_style!r}")
        if self.zero_grad not in ZERO_GRADS:
            raise ValueError(f"zero_grad must be one of {ZERO_GRADS}, not {self.zero_grad!r}")

    @property
    def torch_weight_decay(self) -> float:
        """The decay torch's AdamW applies itself (the ``torch`` style's)."""
        return self.weight_decay if self.decay_style == "torch" else 0.0

    @property
    def decay_after(self) -> float:
        """The decay applied after the update (the ``transformers`` style's)."""
        return self.weight_decay if self.decay_style == "transformers" else 0.0


class EagerUpdate:
    """``torch.optim.AdamW`` + clipping + ``LambdaLR``, dispatched op by op from the host.

    ``exempt``: ids of the parameters spared weight decay (:func:`decay_exempt`; read under
    ``decay_style="transformers"`` only)."""

    captured = False

    def __init__(
        self,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        schedule: Callable[[int], float],
        fused: bool | None = None,
        scaler: torch.amp.GradScaler | None = None,
        exempt: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        self.settings = settings
        self.params = [p for g in groups for p in g]
        self.optimizer = torch.optim.AdamW(
            [{"params": g} for g in groups],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.torch_weight_decay,
            eps=settings.eps,
            fused=fused,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
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
        return self.scheduler.get_last_lr()[0]

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


def read_group_steps(optimizer: torch.optim.Optimizer) -> list[int]:
    """Each group's step count from a loaded optimizer state (once, at a resume)."""
    steps = []
    for group in optimizer.param_groups:
        counts = [int(optimizer.state[p]["step"]) for p in group["params"] if p in optimizer.state]
        steps.append(max(counts, default=0))
    return steps


@dataclass(frozen=True)
class Segment:
    """A contiguous run ``[start, end)`` of the flat buffer (of one AdamW group) whose parameters
    step together on a batch kind, counted by step counter ``counter``; ``names``: those
    parameters' names in the module the update differentiates, in buffer order."""

    counter: int
    start: int
    end: int
    names: tuple[str, ...]


class FlatParameters:
    """Every trained parameter as a view of one flat fp32 buffer, in group order.

    The parameters stay ``nn.Parameter`` objects of their modules (state dicts, evaluation and
    checkpoints see them as before; ``save_pretrained`` writes each one's values, and the heads
    are cloned before safetensors, which refuses shared storage); their storage is ``data``.
    """

    def __init__(self, groups: list[list[nn.Parameter]]) -> None:
        params = [p for g in groups for p in g]
        if len({(p.device, p.dtype) for p in params}) != 1:
            raise ValueError("whole-update capture needs every parameter on one device and dtype")
        total = sum(p.numel() for p in params)
        self.data = torch.empty(total, dtype=params[0].dtype, device=params[0].device)
        self.span: dict[int, tuple[int, int]] = {}  # id(param) → [start, end)
        self.group_of: dict[int, int] = {}
        start = 0
        for index, group in enumerate(groups):
            for p in group:
                end = start + p.numel()
                self.data[start:end].copy_(p.detach().reshape(-1))
                p.data = self.data[start:end].view_as(p)
                self.span[id(p)], self.group_of[id(p)] = (start, end), index
                start = end
        self.params = params

    def layout(self, module: nn.Module) -> list[tuple[str, int, int, torch.Size]]:
        """(name, start, end, shape) of ``module``'s trained parameters (for :meth:`views`)."""
        return [
            (name, *self.span[id(p)], p.shape)
            for name, p in module.named_parameters()
            if id(p) in self.span
        ]

    @staticmethod
    def views(flat: Tensor, layout: list[tuple[str, int, int, torch.Size]]) -> dict[str, Tensor]:
        return {name: flat[start:end].view(shape) for name, start, end, shape in layout}

    def runs(self, active: set[int]) -> list[tuple[tuple[int, ...], int, int]]:
        """Contiguous runs of the ``active`` parameters (ids), split where the group changes:
        ``(ids, start, end)`` each."""
        runs: list[list[nn.Parameter]] = []
        for p in self.params:
            if id(p) not in active:
                runs.append([])
            elif runs and runs[-1] and self.group_of[id(runs[-1][-1])] == self.group_of[id(p)]:
                runs[-1].append(p)
            else:
                runs.append([p])
        return [
            (
                tuple(id(p) for p in run),
                self.span[id(run[0])][0],
                self.span[id(run[-1])][1],
            )
            for run in runs
            if run
        ]


MAX_COUNTERS = 64  # step counters (runs of parameters stepping together); normally one a group


class FlatAdamW:
    """AdamW over a :class:`FlatParameters` buffer, with its state as device tensors, written to
    run inside a captured update (no host value is read). Its state dict is
    ``torch.optim.AdamW``'s, so ``last/`` looks the same whichever update saved it."""

    def __init__(
        self,
        flat: FlatParameters,
        params: list[nn.Parameter],
        settings: AdamWSettings,
        exempt: set[int] | frozenset[int] = frozenset(),
    ) -> None:
        """``params``: what this optimizer trains, in its param-group order (the indices of its
        state dict); a subset of ``flat``'s parameters. ``exempt``: ids of those spared the
        ``transformers`` style's decay (:func:`decay_exempt`)."""
        self.flat, self.params, self.settings = flat, params, settings
        #: the ``transformers`` style's decay per element (λ, or 0 where spared); None without
        self.decay_rate: Tensor | None = None
        if settings.decay_after > 0:
            self.decay_rate = torch.zeros_like(flat.data)
            for p in params:
                if id(p) not in exempt:
                    start, end = flat.span[id(p)]
                    self.decay_rate[start:end] = settings.decay_after
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self.steps = torch.zeros(MAX_COUNTERS, dtype=torch.float32, device=flat.data.device)
        self.counters: dict[tuple, int] = {}
        self.host_steps = [0] * MAX_COUNTERS  # mirror of ``steps`` kept on the host
        self.loaded_steps: dict[int, int] = {}  # id(param) → steps, from a resumed state

    def segments(self, active: set[int], names: dict[int, str]) -> tuple[Segment, ...]:
        """The runs of ``active`` parameters (``names``: id → name), each with its step counter:
        the same parameters count their steps together on every batch kind."""
        out = []
        for key, start, end in self.flat.runs(active):
            if key not in self.counters:
                if len(self.counters) == MAX_COUNTERS:
                    raise RuntimeError(f"more than {MAX_COUNTERS} runs of parameters step apart")
                self.counters[key] = len(self.counters)
                self.start_counter(key, self.counters[key])
            run_names = tuple(names[i] for i in key)
            out.append(Segment(self.counters[key], start, end, run_names))
        return tuple(out)

    def step_(self, grads: list[Tensor], segments: tuple[Segment, ...], lr: Tensor) -> None:
        """One AdamW step of ``segments`` (in place): ``grads[i]`` is segment i's gradient,
        flat; ``lr`` a device scalar."""
        s = self.settings
        beta1, beta2 = s.betas
        for seg, g in zip(segments, grads, strict=True):
            at = slice(seg.start, seg.end)
            p, m, v = self.flat.data[at], self.exp_avg[at], self.exp_avg_sq[at]
            t = self.steps[seg.counter] + 1
            self.steps[seg.counter] = t
            bias1, bias2_sqrt = 1 - beta1**t, (1 - beta2**t).sqrt()
            eps = s.eps / bias2_sqrt if s.eps_style == "transformers" else s.eps
            if s.torch_weight_decay > 0:
                p.mul_(1 - lr * s.torch_weight_decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_((lr / bias1) * m / (v.sqrt() / bias2_sqrt + eps))
            if self.decay_rate is not None:  # transformers.AdamW: after the update
                p.mul_(1 - lr * self.decay_rate[at])

    def count(self, segments: tuple[Segment, ...]) -> None:
        """Mirror one step of ``segments`` on the host (for the state dict)."""
        for seg in segments:
            self.host_steps[seg.counter] += 1

    def state_dict(self, param_groups: list[dict]) -> dict:
        """``torch.optim.AdamW.state_dict()``'s layout (``param_groups`` as the eager one has)."""
        state = {}
        for index, p in enumerate(self.params):
            start, end = self.flat.span[id(p)]
            steps = self._steps_of(p)
            if steps == 0:
                continue  # torch has no state for a parameter that never stepped
            state[index] = {
                "step": torch.tensor(float(steps)),
                "exp_avg": self.exp_avg[start:end].view_as(p).clone(),
                "exp_avg_sq": self.exp_avg_sq[start:end].view_as(p).clone(),
            }
        return {"state": state, "param_groups": param_groups}

    def load_state_dict(self, state: dict) -> None:
        self.exp_avg.zero_()
        self.exp_avg_sq.zero_()
        for index, p in enumerate(self.params):
            entry = state["state"].get(index, state["state"].get(str(index)))
            if entry is None:
                continue
            start, end = self.flat.span[id(p)]
            self.exp_avg[start:end].copy_(entry["exp_avg"].reshape(-1))
            self.exp_avg_sq[start:end].copy_(entry["exp_avg_sq"].reshape(-1))
            self.loaded_steps[id(p)] = int(entry["step"])
        for key, counter in self.counters.items():
            self.start_counter(key, counter)

    def start_counter(self, key: tuple, counter: int) -> None:
        """A new step counter (a run of parameters, ``key`` their ids) starts from the steps a
        resumed state recorded for them (0 in a new run)."""
        steps = max((self.loaded_steps.get(i, 0) for i in key), default=0)
        self.host_steps[counter] = steps
        self.steps[counter] = float(steps)

    def _steps_of(self, p: nn.Parameter) -> int:
        for key, counter in self.counters.items():
            if id(p) in key:
                return self.host_steps[counter]
        return self.loaded_steps.get(id(p), 0)


@dataclass(frozen=True)
class KindPlan:
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
        # never stepped: it holds the param groups and the schedule the state dict records
        self.optimizer = torch.optim.AdamW(
            [{"params": g} for g in groups], lr=settings.lr, eps=settings.eps,
            betas=settings.betas, weight_decay=settings.torch_weight_decay,
        )  # fmt: skip
        self.optimizer._opt_called = True  # (LambdaLR warns of a scheduler stepped first)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, host_factor)
        device = flat.data.device
        self.schedule_step = torch.zeros((), dtype=torch.float32, device=device)
        #: the peak lr as an input of the captured step, not a constant traced into it (a run
        #: with another lr reuses the compiled graph); fp32, as a Python float times an fp32
        #: tensor is computed
        self.peak_lr = torch.tensor(settings.lr, dtype=torch.float32, device=device)
        self.plans: dict[str, KindPlan] = {}
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
        plan = self.plans.get(kind) or self._plan(kind, inputs)
        if self.flat.data.is_cuda:  # the outputs of the last replay are dead (read already)
            torch.compiler.cudagraph_mark_step_begin()
        # a copy: the next replay of any captured graph may reuse the output's memory
        values = self._compiled(plan.segments, plan.keys, *inputs).clone()
        self.adamw.count(plan.segments)
        self.scheduler.step()  # host floats only: the logged lr and the state dict
        return plan.keys, values

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
        update: ``bench/probes/compile_variants.py autograd``.)"""
        # the buffers go in as arguments: a grad transform may mutate (BatchNorm's statistics)
        # only what it is given
        loss_and_grad = grad_and_value(self._loss, has_aux=True)
        grads, (_, terms) = loss_and_grad(params, self.buffers, inputs)
        return grads, terms

    def _loss(self, params: dict, buffers: dict, inputs: tuple) -> tuple[Tensor, dict]:
        with self.autocast():
            terms = functional_call(self.module, (params, buffers), inputs)
        return self.loss_of(terms), terms

    def _plan(self, kind: str, inputs: tuple) -> KindPlan:
        """What a step of ``kind`` updates: the parameters it reaches (:meth:`_probe`, once per
        kind) — under ``zero_grad="zeros"`` with every parameter that has had a gradient, and
        the other kinds' plans rebuilt when this kind reaches new ones."""
        if kind not in self.reached:
            self.reached[kind] = self._probe(inputs)
        active, keys = self.reached[kind]
        if self.settings.zero_grad == "zeros":
            if not active <= self.had_gradient:
                self.had_gradient |= active
                self.plans.clear()  # they step these too from now on
            active = active | self.had_gradient
        plan = KindPlan(self.adamw.segments(active, self.names), keys)
        self.plans[kind] = plan
        logger.debug("captured update, %s batches: %d segments", kind, len(plan.segments))
        return plan

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
        return self.scheduler.get_last_lr()[0]

    def state_dict(self) -> dict:
        groups = self.optimizer.state_dict()["param_groups"]
        return {
            "optimizer": self.adamw.state_dict(groups),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": {},
        }

    def load_state_dict(self, state: dict) -> None:
        self.adamw.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.schedule_step.fill_(float(self.scheduler.last_epoch))
        if self.settings.zero_grad == "zeros":  # what stepped before keeps stepping
            self.had_gradient = set(self.adamw.loaded_steps)
            self.plans.clear()
