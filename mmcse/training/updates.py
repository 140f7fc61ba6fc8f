"""The updates a training step runs, in order, and their state in ``last/``.

:func:`build_updates` builds them once, both through :func:`mmcse.training.update.build_update`
(AdamW, clipping, the lr schedule and the loss scaler for the run's capture mode):

1. VisualCSE/AudioCSE's image (audio) update, when the method has an auxiliary task
   (:class:`AuxiliaryUpdate`): a batch of the task's own examples, its views, the task's forward
   (:mod:`mmcse.nonling.task`), and its own AdamW — the task's lr, weight decay and clipping
   (Table C.1), the run's ε, decay style and gradient clearing (the released trainer builds
   both optimizers with the same ``adam_epsilon``, both ``transformers.AdamW``,
   ``trainers.py:504``, and clears both with ``model.zero_grad()``) — over the parameters of
   :func:`auxiliary_parameters` (released: every parameter of the model), at a cosine lr over
   the run without warm-up. Under several
   processes each rank samples its own batch and the gradients are averaged across ranks before
   the update (the authors' image step is single-process); under fp16 its own loss scaler, as the
   released ``image_scaler``.
2. The text update (:class:`TextUpdate`): both dropout views of the batch, every active term of
   the method, AdamW over the student's trained modules at HF's linear schedule with warm-up.

The auxiliary update runs first, the released trainer's order (Algorithm 1 lists it second: the
order of two alternating updates only shifts by one).

:class:`Updates` is what the run's record saves and restores: ``state_dict()`` holds the keys
``trainer_state.pt`` has held since before the updates moved here (``optimizer``, ``scheduler``,
``grad_scaler`` of the text update; ``aux``: ``steps_taken``, ``optimizer`` and ``scaler`` of the
auxiliary one, or None), so a ``last/`` of an earlier run resumes
(``tests/training/test_pre30_checkpoints.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.precision import grad_scaler_for
from mmcse.training.adamw import AdamWSettings, FlatParameters, adamw_groups, decay_exempt
from mmcse.training.fastpath import (
    begin_captured_step,
    capture,
    capture_fn,
    fresh_capture_cache,
    fused_adamw,
)
from mmcse.training.lr import CosineSchedule, LinearSchedule
from mmcse.training.update import CapturedUpdate, EagerUpdate, build_update, lambda_lr_state

#: one update's terms: ``(names, values stacked on the device)``
Part = tuple[tuple[str, ...], Tensor]


def stacked(terms: dict[str, Tensor]) -> Part:
    """An eager update's terms as the captured one returns them: names, values on the device."""
    return tuple(terms), torch.stack([v.detach().float() for v in terms.values()])


class TextUpdate:
    """The text update of a step on the trainer's batch: one captured call, or the student's
    forward (compiled under ``forward`` capture, inside DDP under several processes) and the
    eager update."""

    def __init__(self, core: EagerUpdate | CapturedUpdate, student: nn.Module, model: nn.Module,
                 autocast: Callable, device: torch.device, capture: str) -> None:  # fmt: skip
        self.core, self.student, self.model = core, student, model
        self.autocast, self.device, self.capture = autocast, device, capture

    def step(self, batch) -> tuple[Part, dict[str, float]]:
        self.student.train()
        if self.core.captured:
            return self.core.step(batch.kind, batch), {}
        self.core.zero_grad()  # before the forward: no grad outlives its step
        if self.capture == "forward":
            begin_captured_step(self.device)
        with self.autocast():
            terms = self.model(batch)
        self.core.apply(terms["loss"])
        return stacked(terms), {}


class AuxiliaryUpdate:
    """The auxiliary task's update (see the module docstring) on the task's own batch of step
    its update count (``core.steps``); the trainer's batch is not read."""

    def __init__(self, task: Any, core: EagerUpdate | CapturedUpdate, device: torch.device) -> None:
        self.task, self.core, self.device = task, core, device
        self.prefix = task.settings.modality

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return None if self.core.captured else self.core.scaler

    def step(self, batch=None) -> tuple[Part, dict[str, float]]:
        """``((names, values on the device), {"<modality>_lr": lr})``: the logged terms already
        × ω, and the lr this update ran at."""
        index, lr = self.core.steps, self.core.lr()
        self.task.train()
        inputs = self.task.inputs(index)
        if self.core.captured:
            names, values = self.core.step(self.prefix, *inputs)
        else:
            names, values = self._eager(inputs)
        return (tuple(f"{self.prefix}_{k}" for k in names), values), {f"{self.prefix}_lr": lr}

    def _eager(self, inputs: tuple) -> Part:
        self.core.zero_grad()
        if self.task.captured:  # its forward compiled: the last replay's outputs are dead
            begin_captured_step(self.device)
        with self.task.autocast():
            terms = self.task.viewed(*inputs)  # each term × ω
        # no isfinite(total) here: it would wait for the device every step; the trainer checks
        # every logged term once per logging window (mmcse.training.metrics.LossWindow.flush)
        self.core.apply(sum(terms.values()))
        self.core.zero_grad()  # the released order: cleared before the text update runs
        return stacked(terms)

    def state_dict(self) -> dict[str, Any]:
        """``steps_taken``, ``optimizer`` (torch's AdamW layout) and ``scaler``: the layout of
        ``trainer_state.pt["aux"]``."""
        state = self.core.state_dict()
        return {
            "steps_taken": self.core.steps,
            "optimizer": state["optimizer"],
            "scaler": state["grad_scaler"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        steps = state["steps_taken"]
        if state["optimizer"] is not None:
            self._check_scope(state["optimizer"])
            groups = len(state["optimizer"]["param_groups"])
            lr = self.core.settings.lr
            self.core.load_state_dict({
                "optimizer": state["optimizer"],
                "scheduler": lambda_lr_state(groups, lr, steps, lr),  # the count is all it kept
                "grad_scaler": state.get("scaler"),  # absent from runs saved before the scaler
            })  # fmt: skip
        elif state.get("scaler") and not self.core.captured:
            self.core.scaler.load_state_dict(state["scaler"])
        self.core.set_steps(steps)

    def _check_scope(self, saved: dict) -> None:
        """A last/ saved over other parameters (before issue 41 the update covered the encoder
        and the task's heads only) is refused naming the switch that resumes it."""
        saved_count = parameter_count(saved)
        own = parameter_count(self.core.state_dict()["optimizer"])
        if saved_count != own:
            scope = self.task.settings.optimizer_scope
            other = "task" if scope == "model" else "model"
            raise MmcseError(
                f"last/'s {self.prefix} optimizer covers {saved_count} parameters, this run's "
                f"{own} ({self.prefix}_optimizer_scope={scope}): resume with --method-arg "
                f"{self.prefix}_optimizer_scope={other}"
            )


def parameter_count(optimizer_state: dict) -> int:
    return sum(len(group["params"]) for group in optimizer_state["param_groups"])


class Updates:
    """The run's updates in the order a step runs them (auxiliary first); what ``last/`` saves of
    them (:meth:`state_dict`) and restores (:meth:`load_state_dict`)."""

    def __init__(self, text: TextUpdate, auxiliary: AuxiliaryUpdate | None = None) -> None:
        self.text, self.auxiliary = text, auxiliary

    def __iter__(self) -> Iterator[TextUpdate | AuxiliaryUpdate]:
        if self.auxiliary is not None:
            yield self.auxiliary
        yield self.text

    @property
    def captured(self) -> bool:
        return self.text.core.captured

    def state_dict(self) -> dict[str, Any]:
        """``optimizer``, ``scheduler``, ``grad_scaler`` (the text update's) and ``aux``."""
        aux = None if self.auxiliary is None else self.auxiliary.state_dict()
        return {**self.text.core.state_dict(), "aux": aux}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read those keys of a whole trainer state (``trainer_state.pt``)."""
        self.text.core.load_state_dict(state)
        if self.auxiliary is not None and state.get("aux") is not None:
            self.auxiliary.load_state_dict(state["aux"])

    def extend_schedule(self, total: int) -> float:
        """A finished run extended to ``total`` steps: each lr schedule recomputed for the new
        total from the step it is at; the text lr the run continues at."""
        if self.auxiliary is not None:
            self.auxiliary.core.extend_schedule(total)
        return self.text.core.extend_schedule(total)

    def lr(self) -> float:
        """The text update's lr for its next step (the logged ``lr``)."""
        return self.text.core.lr()


def auxiliary_settings(task: Any, cfg: Any) -> AdamWSettings:
    """The auxiliary update's AdamW: the task's lr, weight decay and clipping, the run's ε,
    decay style and gradient clearing (``zero_grad``)."""
    s = task.settings
    return AdamWSettings(
        lr=s.lr, weight_decay=s.weight_decay, eps=cfg.adam_eps, eps_style=cfg.adam_eps_style,
        max_grad_norm=s.max_grad_norm, decay_style=cfg.weight_decay_style,
        zero_grad=cfg.zero_grad,
    )  # fmt: skip


def auxiliary_modules(task: Any, student: Any = None) -> list[nn.Module]:
    """What the auxiliary AdamW covers, by the task's ``optimizer_scope``: ``model`` — the
    released image/audio optimizer's ``self.model.named_parameters()``: the encoder, the
    student's text heads (``student``; e.g. SimCSE's MLP) and the task's heads; ``task`` — the
    encoder and the task's heads. Under ``zero_grad="zeros"`` a parameter the task's loss does
    not reach (the word embeddings, the text heads) steps on a zero gradient once it has had one:
    its moments stay 0, so only weight decay moves it."""
    text_heads = list(student.heads.values()) if student is not None else []
    if task.settings.optimizer_scope == "task":
        text_heads = []
    return [task.encoder, *text_heads, task.heads]


def auxiliary_decays_unreached(method: Any, cfg: Any) -> bool:
    """Whether the auxiliary update decays parameters its loss does not reach (weight decay >
    0 over zeroed gradients): then it stays eager, as the captured update steps only what its
    batches reach (:class:`mmcse.training.update.CapturedUpdate`)."""
    settings = getattr(method, "nonlinguistic_settings", None)
    if settings is None or settings().weight == 0:
        return False
    return settings().weight_decay > 0 and cfg.zero_grad == "zeros"


def auxiliary_update(
    task: Any, cfg: Any, device: torch.device | str, total: int | None = None,
    capture: str = "off", whole: dict | None = None, student: Any = None,
) -> AuxiliaryUpdate:  # fmt: skip
    """The auxiliary task's update over :func:`auxiliary_modules` (one AdamW group), its cosine
    lr spanning ``total`` steps (None: constant). ``whole``: see :func:`build_update`
    (``module`` and ``loss_of`` are the task's)."""
    device = torch.device(device)
    modules = auxiliary_modules(task, student)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())  # each once
    settings = auxiliary_settings(task, cfg)
    if capture == "whole":
        whole = {**(whole or {}), "module": task.viewed, "autocast": task.autocast,
                 "loss_of": lambda terms: sum(terms.values())}  # fmt: skip
    core = build_update(
        capture, [params], settings, CosineSchedule(total), device=device,
        exempt=frozenset().union(*(decay_exempt(m) for m in modules)),
        scaler=grad_scaler_for(device, cfg.precision), average=True, whole=whole,
    )  # fmt: skip
    return AuxiliaryUpdate(task, core, device)


def build_updates(
    cfg: Any, student: nn.Module, model: nn.Module, task: Any, device: torch.device,
    capture_mode: str, total: int, autocast: Callable,
) -> Updates:  # fmt: skip
    """The text update and, for VisualCSE/AudioCSE, the auxiliary one (``task``), for the run's
    capture mode: one flat parameter buffer shared by both when the whole update is captured;
    under ``forward`` both forwards compiled."""
    groups = adamw_groups(student.trained_modules())
    settings = AdamWSettings(
        lr=cfg.learning_rate, weight_decay=cfg.weight_decay, eps=cfg.adam_eps,
        eps_style=cfg.adam_eps_style, max_grad_norm=cfg.grad_clip,
        decay_style=cfg.weight_decay_style, zero_grad=cfg.zero_grad,
    )  # fmt: skip
    whole = None
    if capture_mode == "forward" and task is not None:
        task.capture(lambda module: capture(module, device))
    if capture_mode == "whole":
        fresh_capture_cache()
        aux_groups = [list(task.heads.parameters())] if task is not None else []
        flat = FlatParameters(groups + aux_groups)
        whole = {"flat": flat, "compile_fn": partial(capture_fn, device=device)}
    auxiliary = None
    if task is not None:
        auxiliary = auxiliary_update(task, cfg, device, total, capture_mode, whole, student)
    text_whole = None
    if whole is not None:
        text_whole = {**whole, "module": student, "autocast": autocast,
                      "loss_of": lambda terms: terms["loss"]}  # fmt: skip
    core = build_update(
        capture_mode, groups, settings, LinearSchedule(cfg.warmup_steps, total), device=device,
        exempt=decay_exempt(student), scaler=grad_scaler_for(device, cfg.precision),
        fused=fused_adamw(cfg, device), whole=text_whole,
    )  # fmt: skip
    return Updates(TextUpdate(core, student, model, autocast, device, capture_mode), auxiliary)
