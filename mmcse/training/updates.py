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
2. The text update (:attr:`Updates.text`, an :class:`~mmcse.training.update.EagerUpdate` or
   :class:`~mmcse.training.update.CapturedUpdate` of the student's forward): both dropout views
   of the batch, every active term of the method, AdamW over the student's trained modules at
   HF's linear schedule with warm-up.

The auxiliary update runs first, the released trainer's order (Algorithm 1 lists it second: the
order of two alternating updates only shifts by one).

:class:`Updates` is what the run's record saves and restores: ``state_dict()`` holds the keys
``trainer_state.pt`` has held since before the updates moved here (``optimizer``, ``scheduler``,
``grad_scaler`` of the text update; ``aux``: ``steps_taken``, ``optimizer`` and ``scaler`` of the
auxiliary one, or None), so a ``last/`` of an earlier run resumes
(``tests/training/test_pre30_checkpoints.py``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mmcse.errors import MmcseError
from mmcse.precision import grad_scaler_for
from mmcse.training.adamw import AdamWSettings, FlatParameters, adamw_groups, decay_exempt
from mmcse.training.fastpath import capture, capture_fn, fresh_capture_cache, fused_adamw
from mmcse.training.lr import CosineSchedule, LinearSchedule
from mmcse.training.update import (
    CapturedUpdate,
    EagerUpdate,
    Forward,
    Part,
    WholeUpdateSettings,
    build_update,
    lambda_lr_state,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from mmcse.methods import Method
    from mmcse.nonling.task import NonLinguisticTask
    from mmcse.training.config import TrainConfig
    from mmcse.training.student import Student


class AuxiliaryUpdate:
    """The auxiliary task's update (see the module docstring) on the task's own batch of step
    its update count (``core.steps``); the trainer's batch is not read."""

    def __init__(self, task: NonLinguisticTask, core: EagerUpdate | CapturedUpdate) -> None:
        self.task, self.core = task, core
        self.prefix = task.settings.modality

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.core.scaler

    def step(self) -> tuple[Part, dict[str, float]]:
        """``((names, values on the device), {"<modality>_lr": lr})``: the logged terms already
        × ω, and the lr this update ran at."""
        index, lr = self.core.steps, self.core.lr()
        self.task.train()
        names, values = self.core.step(self.prefix, self.task.inputs(index))
        return (tuple(f"{self.prefix}_{k}" for k in names), values), {f"{self.prefix}_lr": lr}

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
            saved = {
                "optimizer": state["optimizer"],
                "scheduler": lambda_lr_state(groups, lr, steps, lr),  # the count is all it kept
                "grad_scaler": state.get("scaler"),  # absent from runs saved before the scaler
            }
            self.core.load_state_dict(saved)
        elif state.get("scaler") and self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
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
    """The run's updates, as a step runs them (:meth:`mmcse.training.loop.Trainer.train_step`: the
    auxiliary one first); what ``last/`` saves of them (:meth:`state_dict`) and restores
    (:meth:`load_state_dict`)."""

    def __init__(
        self, text: EagerUpdate | CapturedUpdate, auxiliary: AuxiliaryUpdate | None = None
    ) -> None:
        self.text, self.auxiliary = text, auxiliary

    def state_dict(self) -> dict[str, Any]:
        """``optimizer``, ``scheduler``, ``grad_scaler`` (the text update's) and ``aux``."""
        aux = None if self.auxiliary is None else self.auxiliary.state_dict()
        return {**self.text.state_dict(), "aux": aux}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Read those keys of a whole trainer state (``trainer_state.pt``)."""
        self.text.load_state_dict(state)
        if self.auxiliary is not None and state.get("aux") is not None:
            self.auxiliary.load_state_dict(state["aux"])

    def extend_schedule(self, total: int) -> float:
        """A finished run extended to ``total`` steps: each lr schedule recomputed for the new
        total from the step it is at; the text lr the run continues at."""
        if self.auxiliary is not None:
            self.auxiliary.core.extend_schedule(total)
        return self.text.extend_schedule(total)


def run_adamw_settings(
    cfg: TrainConfig, lr: float, weight_decay: float, max_grad_norm: float
) -> AdamWSettings:
    """An update's AdamW: its lr, weight decay and clipping, with the run's ε, decay style and
    gradient clearing (``zero_grad``), which every update of a run shares."""
    return AdamWSettings(
        lr=lr,
        weight_decay=weight_decay,
        eps=cfg.adam_eps,
        eps_style=cfg.adam_eps_style,
        max_grad_norm=max_grad_norm,
        decay_style=cfg.weight_decay_style,
        zero_grad=cfg.zero_grad,
    )


def auxiliary_settings(task: NonLinguisticTask, cfg: TrainConfig) -> AdamWSettings:
    """The auxiliary update's AdamW: the task's lr, weight decay and clipping."""
    s = task.settings
    return run_adamw_settings(cfg, s.lr, s.weight_decay, s.max_grad_norm)


def text_settings(cfg: TrainConfig) -> AdamWSettings:
    """The text update's AdamW: the run's lr, weight decay and clipping."""
    return run_adamw_settings(cfg, cfg.learning_rate, cfg.weight_decay, cfg.grad_clip)


def auxiliary_modules(task: NonLinguisticTask, student: Student | None = None) -> list[nn.Module]:
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


def auxiliary_decays_unreached(method: Method, cfg: TrainConfig) -> bool:
    """Whether the auxiliary update decays parameters its loss does not reach (weight decay >
    0 over zeroed gradients): then it stays eager, as the captured update steps only what its
    batches reach (:class:`mmcse.training.update.CapturedUpdate`)."""
    settings = getattr(method, "nonlinguistic_settings", None)
    if settings is None or settings().weight == 0:
        return False
    return settings().weight_decay > 0 and cfg.zero_grad == "zeros"


def task_forward(task: NonLinguisticTask) -> Forward:
    """The auxiliary task's forward: its views and loss, each term × ω, summed."""
    compiled_on = task.device if task.captured else None
    return Forward(task.viewed, lambda terms: sum(terms.values()), task.autocast, compiled_on)


def auxiliary_update(
    task: NonLinguisticTask,
    cfg: TrainConfig,
    device: torch.device | str,
    total: int | None = None,
    whole: WholeUpdateSettings | None = None,
    student: Student | None = None,
) -> AuxiliaryUpdate:
    """The auxiliary task's update over :func:`auxiliary_modules` (one AdamW group), its cosine
    lr spanning ``total`` steps (None: constant); captured over ``whole`` when given."""
    device = torch.device(device)
    modules = auxiliary_modules(task, student)
    params = list({id(p): p for m in modules for p in m.parameters()}.values())  # each once
    core = build_update(
        [params],
        auxiliary_settings(task, cfg),
        CosineSchedule(total),
        task_forward(task),
        device=device,
        whole=whole,
        exempt=frozenset().union(*(decay_exempt(m) for m in modules)),
        scaler=grad_scaler_for(device, cfg.precision),
        average=True,
        clear_after=True,  # the released order: cleared before the text update runs
    )
    return AuxiliaryUpdate(task, core)


def build_updates(
    cfg: TrainConfig,
    student: Student,
    model: nn.Module,
    task: NonLinguisticTask | None,
    device: torch.device,
    capture_mode: str,
    total: int,
    autocast: Callable,
) -> Updates:
    """The text update of ``model`` (the student, inside DDP under several processes) and, for
    VisualCSE/AudioCSE, the auxiliary one (``task``), for the run's capture mode: one flat
    parameter buffer shared by both when the whole update is captured; under ``forward`` both
    forwards compiled."""
    groups = adamw_groups(student.trained_modules())
    whole = None
    if capture_mode == "forward" and task is not None:
        task.capture(lambda module: capture(module, device))
    if capture_mode == "whole":
        fresh_capture_cache()
        aux_groups = [list(task.heads.parameters())] if task is not None else []
        whole = WholeUpdateSettings(
            FlatParameters(groups + aux_groups), partial(capture_fn, device=device)
        )
    auxiliary = None
    if task is not None:
        auxiliary = auxiliary_update(task, cfg, device, total, whole, student)
    compiled_on = device if capture_mode == "forward" else None
    forward = Forward(model, lambda terms: terms["loss"], autocast, compiled_on)
    text = build_update(
        groups,
        text_settings(cfg),
        LinearSchedule(cfg.warmup_steps, total),
        forward,
        device=device,
        whole=whole,
        exempt=decay_exempt(student),
        scaler=grad_scaler_for(device, cfg.precision),
        fused=fused_adamw(cfg, device),
    )
    return Updates(text, auxiliary)
