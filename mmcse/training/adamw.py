"""AdamW as every update here steps it: its settings, its parameter groups and decay rule, and
the flat parameter layout with the AdamW that runs on it inside a captured update.

Weight decay (``weight_decay_style``): ``transformers`` — transformers.AdamW 4.x's decoupled decay
``p ← p − lr·λ·p`` *after* the Adam update, on every parameter but biases and LayerNorm weights
(the released trainers' parameter groups, :func:`decay_exempt`) — or ``torch``: torch's AdamW,
``p ← p·(1 − lr·λ)`` *before* the update, on every parameter.

:class:`EagerAdamW` is ``torch.optim.AdamW`` stepped as :class:`AdamWSettings` say (the eager
update's). :class:`FlatParameters` makes every trained parameter a view of one flat fp32 buffer;
:class:`FlatAdamW` is ``torch.optim.AdamW``'s arithmetic over it with its state as device tensors
(``lerp`` of the first moment, bias corrections, ε after the corrected √v or transformers' ε
placement), and ``torch.optim.AdamW``'s state-dict layout, so ``last/`` looks the same whichever
update saved it. Which update uses them: :mod:`mmcse.training.update`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mmcse.optim import DECAY_STYLES, ZERO_GRADS


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
    def steps_once_reached(self) -> bool:
        """Whether a parameter that has had a gradient steps on every later batch (``zeros``:
        its gradient is cleared to zero, not None) — both engines read this."""
        return self.zero_grad == "zeros"

    def eps_at(self, step: int | Tensor) -> float | Tensor:
        """The ε torch's AdamW adds at a group's (1-based) ``step``, a host count or a device
        tensor: ε/√(1 − β₂ᵗ) for transformers' placement (:mod:`mmcse.optim`), else ε."""
        if self.eps_style != "transformers":
            return self.eps
        correction = 1.0 - self.betas[1] ** step
        return self.eps / (math.sqrt(correction) if isinstance(step, int) else correction.sqrt())

    @property
    def torch_weight_decay(self) -> float:
        """The decay torch's AdamW applies itself (the ``torch`` style's)."""
        return self.weight_decay if self.decay_style == "torch" else 0.0

    @property
    def decay_after(self) -> float:
        """The decay applied after the update (the ``transformers`` style's)."""
        return self.weight_decay if self.decay_style == "transformers" else 0.0


class EagerAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` stepped as ``settings`` (:class:`AdamWSettings`) say: the eager
    update's optimizer, with torch's state dict.

    Around torch's step (its own step hooks, so that hooks others register run once): before
    it, every group's ε for transformers' placement from a host count of the steps that group
    took (reading the device step tensor would wait for the GPU every step); after it,
    transformers' decay ``p ← p − lr·λ·p`` on the parameters that stepped, but those in
    ``exempt`` (:func:`decay_exempt`). A step the fp16 GradScaler skips is none of AdamW's, as
    transformers.AdamW — whose ``step()`` the scaler never calls then — counts it (a fused AdamW
    is called anyway, told by ``found_inf``). :meth:`zero_grad` clears to None, or under
    ``zero_grad="zeros"`` to zeros, as torch < 2 did."""

    def __init__(
        self,
        groups: list[list[nn.Parameter]],
        settings: AdamWSettings,
        exempt: set[int] | frozenset[int] = frozenset(),
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            [{"params": g} for g in groups],
            lr=settings.lr,
            betas=settings.betas,
            weight_decay=settings.torch_weight_decay,
            eps=settings.eps,
            fused=fused,
        )
        self.settings, self.decay = settings, settings.decay_after
        self.clear_to_none = not settings.steps_once_reached
        self.decayed = [p for g in groups for p in g if id(p) not in exempt]
        #: optimizer steps taken by each group, on the host (ε's scaling reads it)
        self.group_steps = [0] * len(groups)
        self.stepping: list[bool] = []  # the groups with a gradient, at this step
        self.register_step_pre_hook(EagerAdamW._before_step)
        self.register_step_post_hook(EagerAdamW._after_step)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(self.clear_to_none if set_to_none is None else set_to_none)

    def _before_step(self, args, kwargs) -> None:
        self.stepping = [any(p.grad is not None for p in g["params"]) for g in self.param_groups]
        for group, steps in zip(self.param_groups, self.group_steps, strict=True):
            group["eps"] = self.settings.eps_at(steps + 1)

    @torch.no_grad()
    def _after_step(self, args, kwargs) -> None:
        found_inf = getattr(self, "found_inf", None)  # the GradScaler's, for a fused AdamW
        if found_inf is not None and found_inf.item():
            return
        stepped = [p for p in self.decayed if p.grad is not None]
        if stepped and self.decay > 0:  # transformers.AdamW's decay, after the update
            torch._foreach_mul_(stepped, 1.0 - self.param_groups[0]["lr"] * self.decay)
        steps = zip(self.group_steps, self.stepping, strict=True)
        self.group_steps = [n + int(s) for n, s in steps]

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, then each group's step count read once; under ``zero_grad="zeros"`` what
        had a gradient before keeps stepping (a zero one)."""
        super().load_state_dict(state_dict)
        self.group_steps = [
            max((int(self.state[p]["step"]) for p in g["params"] if p in self.state), default=0)
            for g in self.param_groups
        ]
        if self.clear_to_none:
            return
        for p in (p for g in self.param_groups for p in g["params"]):
            if p in self.state and p.grad is None:
                p.grad = torch.zeros_like(p)


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
            eps = s.eps_at(t)
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
