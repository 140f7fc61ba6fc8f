"""The non-linguistic half of VisualCSE/AudioCSE's alternating optimisation (Algorithm 1).

Jian et al. (NeurIPS 2022) train one sentence encoder on two unpaired contrastive tasks. Each
training step first takes one image (audio) step — a batch of 48 cached examples, two views,
patch embedding → the student's transformer layers → [CLS] → the task's own MLP → the released
``--new_supcon`` objective (or SupCon, SimCLR), scaled by ω, then *its own* AdamW step over all parameters (encoder included, at a much
smaller lr: Table C.1) — and then the ordinary SimCSE text step. The trainer owns the text step
and calls :meth:`NonLinguisticTask.step` before each one (the authors' code runs the image step
first; Algorithm 1 lists it second — the order of two alternating steps only shifts by one).

How tokens enter the encoder. The authors' code calls ``bert.encoder(patch_tokens)`` directly
(:func:`encode_tokens` does the same): BERT's word/position/token-type embeddings and their
LayerNorm are bypassed, the patch embedding supplies [CLS] and positions, and no attention mask
is needed (every token is real). Calling the HF model with ``inputs_embeds`` instead would add
BERT's position and token-type embeddings and renormalise, which is a different model.

The image step follows the authors' trainer: ``transformers.AdamW`` (weight decay 0 in all
released runs) with the text optimizer's ε (``adam_epsilon``, the same argument) placed as
transformers places it, before the bias correction (:func:`mmcse.optim.set_transformers_eps`;
``adam_eps_style="torch"`` is torch's placement, for both optimizers), gradient clipping at 1.0
over every parameter, and — when ``total_steps`` is known — their cosine decay of the image lr
without warm-up; otherwise the lr is constant. Under several processes each
rank samples its own batch and gradients are averaged across ranks before the update, so replicas
stay identical (the authors' image step is single-process).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from mmcse import distributed as dist
from mmcse.cache import FeatureSet
from mmcse.cache.kinds import AUDIO_FBANK_KIND, IMAGE_TENSOR_KIND, class_of  # noqa: F401
from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.nonling.augment import ViewAugmentation, apply_params, draw_params, pack_params
from mmcse.nonling.patch_embed import AudioPatchEmbedding, ImagePatchEmbedding
from mmcse.nonling.specaugment import SpecAugment, draw_spans, mask_clips
from mmcse.optim import DECAY_STYLES, EPS_STYLES, set_transformers_eps
from mmcse.precision import autocast_context, grad_scaler_for
from mmcse.registry import LOSSES
from mmcse.update import (
    AdamWSettings,
    CapturedUpdate,
    FlatParameters,
    decay_after_update_,
    decay_exempt,
)

IMAGE_KIND = IMAGE_TENSOR_KIND  # the cache contract's names (mmcse.cache.kinds)
AUDIO_KIND = AUDIO_FBANK_KIND
#: registered losses the task can run; the first is the released code's (``--new_supcon``)
OBJECTIVES = ("class_rank_cross_entropy", "supcon", "simclr")
#: objectives that read class labels (an unlabelled set can only run ``simclr``)
LABELLED_OBJECTIVES = ("class_rank_cross_entropy", "supcon")


@dataclass(frozen=True)
class NonLinguisticSettings:
    """What a method tells the task (VisualCSE/AudioCSE fill it from their fields).

    Attributes:
        kind: the cache kind (and ``--feature`` role) of the examples: ``image_tensor`` or
            ``audio_fbank``.
        weight: ω in ℒ = ℒ_text + ω·ℒ_image (eq. 1); 0 disables the task.
        lr, batch_size, temperature, objective, weight_decay, max_grad_norm: the image step's
            optimisation (Table C.1; ``objective``: one of :data:`OBJECTIVES`).
        image_size: crop size of the image views (ViT's 224).
        patch_size: audio patch size (the image patch size is ViT's 16).
        init: image patch embedding init: ``auto``, ``random`` or a ViT dir / hub id.
        freq_mask, time_mask: audio SpecAugment mask parameters
            (:mod:`mmcse.nonling.specaugment`; 0 = no mask).
        position_embeddings: learned position embeddings in the audio patch embedding (False:
            none, the released audio path; :mod:`mmcse.nonling.patch_embed`). Images always
            have ViT's.
    """

    kind: str
    weight: float
    lr: float
    batch_size: int
    temperature: float = 0.07
    objective: str = OBJECTIVES[0]
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    image_size: int = 224
    patch_size: int = 24
    init: str = "auto"
    freq_mask: int = 0
    time_mask: int = 0
    position_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (IMAGE_KIND, AUDIO_KIND):
            raise ValueError(f"kind must be {IMAGE_KIND!r} or {AUDIO_KIND!r}, not {self.kind!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, not {self.objective!r}")
        if min(self.freq_mask, self.time_mask) < 0:
            raise ValueError("SpecAugment mask parameters must be 0 (off) or positive")
        if self.batch_size < 2:
            raise ValueError("the non-linguistic batch size must be at least 2 (negatives)")

    @property
    def modality(self) -> str:
        return "image" if self.kind == IMAGE_KIND else "audio"


def encode_tokens(backbone: nn.Module, tokens: Tensor) -> Tensor:
    """[CLS] (last layer, position 0) of token embeddings run through the transformer layers
    only, bypassing the text embedding layer, as the authors' ``bert.encoder(input_embeds)``."""
    layers = getattr(backbone, "encoder", None)
    if layers is None:
        raise MmcseError(
            f"{type(backbone).__name__} has no .encoder stack; VisualCSE/AudioCSE need a "
            "BERT-like student (BERT, RoBERTa, MiniLM, ...)"
        )
    out = layers(tokens)
    states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return states[:, 0]


class NonLinguisticTask:
    """One image (or audio) contrastive step on the shared encoder; see the module docstring.

    Its own modules (:attr:`heads`: the patch embedding and the loss's MLP head) train with it
    and belong in the checkpoint (:meth:`state_dict`); they are not part of the sentence encoder.
    """

    def __init__(
        self,
        encoder: nn.Module,
        method_cfg: Any,
        feature_set_path: str | Path,
        device: torch.device | str,
        *,
        seed: int = 42,
        total_steps: int | None = None,
        precision: str = "auto",
        adam_eps: float = 1e-8,
        adam_eps_style: str = "transformers",
        weight_decay_style: str = "transformers",
    ) -> None:
        """``adam_eps``, ``adam_eps_style``, ``weight_decay_style``: the run's (``TrainConfig``):
        the released trainer builds both optimizers with the same ``adam_epsilon``, both
        ``transformers.AdamW``, both sparing biases and LayerNorm weights from decay
        (``trainers.py:504``)."""
        if adam_eps_style not in EPS_STYLES:
            raise ValueError(f"adam_eps_style must be one of {EPS_STYLES}, not {adam_eps_style!r}")
        if weight_decay_style not in DECAY_STYLES:
            raise ValueError(f"weight_decay_style must be one of {DECAY_STYLES}")
        self.settings: NonLinguisticSettings = method_cfg.nonlinguistic_settings()
        self.adam_eps, self.adam_eps_style = adam_eps, adam_eps_style
        self.weight_decay_style = weight_decay_style
        self.decayed: list[nn.Parameter] = []  # what transformers' decay shrinks (eager step)
        self.encoder = encoder
        self.device = torch.device(device)
        self.seed, self.total_steps, self.precision = seed, total_steps, precision
        self.examples = FeatureSet.open(feature_set_path)
        self._check_examples()
        self.labels = self._labels()
        hidden = encoder.backbone.config.hidden_size
        self.loss = LOSSES.get(self.settings.objective)(temperature=self.settings.temperature)
        # BERT init: the authors' image_mlp is built in cl_init, before init_weights()
        mlp = MLPHead(hidden, hidden, init="bert")  # before the patch embedding: seeded init order
        self.heads = nn.ModuleDict({"patch_embed": self._patch_embedding(hidden), "mlp": mlp})
        self.heads.to(self.device)
        self.optimizer: torch.optim.Optimizer | None = None
        # the run's precision policy; under fp16 its own loss scaler, as the released trainer's
        # image_scaler (autocast(dtype=float16) + image_scaler; else a no-op)
        self.scaler = grad_scaler_for(self.device, precision)
        self.views = ViewAugmentation(size=self.settings.image_size)
        self.masks = SpecAugment(self.settings.freq_mask, self.settings.time_mask)
        self.steps_taken = 0
        self.step_forward = _TaskForward(encoder, self.heads, self.loss, self.settings.modality)
        # the views made from the raw examples, then step_forward: one module for both steps
        self.viewed = _ViewedTask(self.step_forward, self.settings, self.views.size)
        self.captured = False
        self.whole: CapturedUpdate | None = None  # the whole update captured (capture_whole)

    # -- setup ---------------------------------------------------------------------------------
    def _check_examples(self) -> None:
        kind, shape = self.examples.manifest.kind, tuple(self.examples.shape)
        where = self.examples.path
        if kind != self.settings.kind:
            raise MmcseError(
                f"{where} holds {kind!r} rows; this method needs {self.settings.kind!r}"
            )
        if kind == IMAGE_KIND and (len(shape) != 3 or shape[0] != 3 or min(shape[1:]) < 1):
            raise MmcseError(f"{where}: image rows must be [3, H, W], not {list(shape)}")
        if kind == AUDIO_KIND and len(shape) != 2:
            raise MmcseError(f"{where}: fbank rows must be [frames, mel bins], not {list(shape)}")
        if len(self.examples) < self.settings.batch_size:
            raise MmcseError(
                f"{where} has {len(self.examples)} examples, fewer than one batch of "
                f"{self.settings.batch_size}; lower the batch size"
            )

    def _labels(self) -> np.ndarray | None:
        """Class index per row, from the ids (see :func:`class_of`); None when the set has no
        classes (then only ``simclr`` is possible)."""
        classes = self.examples.manifest.extra.get("classes")
        if not classes:
            if self.settings.objective in LABELLED_OBJECTIVES:
                raise MmcseError(
                    f"{self.examples.path} records no classes; use objective simclr for "
                    "unlabelled examples"
                )
            return None
        index = {name: i for i, name in enumerate(classes)}
        names = [class_of(i) for i in self.examples.ids]
        unknown = sorted(set(names) - set(index))
        if unknown:
            raise MmcseError(f"{self.examples.path}: ids of unlisted classes {unknown[:3]}")
        return np.fromiter((index[n] for n in names), dtype=np.int64, count=len(names))

    def _patch_embedding(self, hidden: int) -> nn.Module:
        if self.settings.kind == IMAGE_KIND:
            return ImagePatchEmbedding.create(hidden, self.settings.image_size, self.settings.init)
        frames, bins = self.examples.shape
        return AudioPatchEmbedding(
            hidden, frames, bins, self.settings.patch_size, self.settings.position_embeddings
        )

    # -- public API ----------------------------------------------------------------------------
    def parameters(self):
        """The task's own parameters (patch embedding + MLP head), not the encoder's."""
        return self.heads.parameters()

    def make_optimizer(self, encoder: nn.Module) -> torch.optim.Optimizer:
        """AdamW over the encoder and the task's modules at the task's lr (Table C.1); its ε
        is set before every step when ``adam_eps_style`` is ``transformers`` (:meth:`step`)."""
        params = [*encoder.parameters(), *self.heads.parameters()]
        decay = self._adamw_settings()
        self.optimizer = torch.optim.AdamW(
            params, lr=self.settings.lr, weight_decay=decay.torch_weight_decay, eps=self.adam_eps
        )
        if decay.decay_after > 0:
            exempt = decay_exempt(encoder) | decay_exempt(self.heads)
            self.decayed = [p for p in params if id(p) not in exempt]
        return self.optimizer

    def _adamw_settings(self) -> AdamWSettings:
        s = self.settings
        return AdamWSettings(
            lr=s.lr, weight_decay=s.weight_decay, eps=self.adam_eps,
            eps_style=self.adam_eps_style, max_grad_norm=s.max_grad_norm,
            decay_style=self.weight_decay_style,
        )  # fmt: skip

    @property
    def fingerprint(self) -> dict[str, str]:
        """``{kind: fingerprint}`` of the examples, for the run's record."""
        return {self.settings.kind: self.examples.fingerprint}

    def capture(self, compile_module: Callable[[nn.Module], None]) -> None:
        """Compile the step's forward (patch embedding → encoder → head → loss; hence its
        backward) with ``compile_module`` (the trainer's whole-step capture). The view
        augmentation stays eager; the batch size is fixed, so it compiles once."""
        compile_module(self.step_forward)
        self.captured = True

    def capture_whole(self, flat: FlatParameters, compile_fn: Callable) -> None:
        """Capture the whole step — the views from the raw examples and their drawn parameters,
        patch embedding → encoder → head → loss, its gradient, clipping and this task's AdamW
        with its cosine lr — as one function (:class:`mmcse.update.CapturedUpdate`); ``flat``
        holds the encoder's and this task's parameters (the trainer's, shared with the text
        update). Not under fp16: the loss scaler's skip is a host decision (the forward is
        captured instead, :meth:`capture`)."""
        groups = [[*self.encoder.parameters(), *self.heads.parameters()]]
        # the run's length as an input of the captured step, not a traced constant: runs of
        # another length reuse the compiled graph
        self.total_on_device = torch.tensor(
            float(self.total_steps or 0), dtype=torch.float32, device=flat.data.device
        )
        torch._dynamo.mark_static_address(self.total_on_device)
        self.whole = CapturedUpdate(
            flat, self.viewed, groups, self._adamw_settings(),
            loss_of=lambda terms: sum(terms.values()),
            lr_factor=self._cosine_tensor,
            host_factor=self._cosine,
            autocast=self._autocast,
            compile_fn=compile_fn,
        )  # fmt: skip
        self.captured = True

    def _cosine(self, index: int) -> float:
        """The released image lr's cosine decay over the run, without warm-up (1 when the run's
        length is unknown)."""
        if not self.total_steps:
            return 1.0
        return 0.5 * (1.0 + math.cos(math.pi * min(index, self.total_steps) / self.total_steps))

    def _cosine_tensor(self, index: Tensor) -> Tensor:
        if not self.total_steps:
            return torch.ones_like(index)
        done = torch.minimum(index, self.total_on_device) / self.total_on_device
        return 0.5 * (1.0 + torch.cos(math.pi * done))

    def state_dict(self) -> dict[str, Tensor]:
        return self.heads.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.heads.load_state_dict(state)

    def trainer_state(self) -> dict[str, Any]:
        """What ``--resume`` needs besides :meth:`state_dict`: the step count, the optimizer's
        and the loss scaler's state."""
        if self.whole is not None:
            optimizer = self.whole.state_dict()["optimizer"]
        else:
            optimizer = self.optimizer.state_dict() if self.optimizer else None
        return {
            "steps_taken": self.steps_taken,
            "optimizer": optimizer,
            "scaler": self.scaler.state_dict(),
        }

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.steps_taken = state["steps_taken"]
        if self.whole is not None:
            if state["optimizer"] is not None:
                self.whole.adamw.load_state_dict(state["optimizer"])
            self.whole.scheduler.last_epoch = self.steps_taken
            self.whole.schedule_step.fill_(float(self.steps_taken))
        elif state["optimizer"] is not None:
            self.make_optimizer(self.encoder).load_state_dict(state["optimizer"])
        if state.get("scaler"):  # absent from runs saved before the scaler
            self.scaler.load_state_dict(state["scaler"])

    def step(self) -> tuple[tuple[tuple[str, ...], Tensor] | None, dict[str, float]]:
        """One optimizer step on a seeded batch: ``((names, values stacked on the device), host
        values)`` — the logged terms already × ω, read back by the trainer once per logging
        window, and the lr. ``(None, {})`` when ω = 0."""
        if self.settings.weight == 0:
            return None, {}
        index = self.steps_taken
        self.steps_taken = index + 1
        self.encoder.train()
        self.heads.train()
        if self.whole is not None:
            names, values = self.whole.step(self.settings.modality, *self._raw_inputs(index))
        else:
            names, values = self._eager_step(index)
        prefix = self.settings.modality
        host = {f"{prefix}_lr": self.settings.lr * self._cosine(index)}
        return (tuple(f"{prefix}_{k}" for k in names), values), host

    def batch(self, index: int) -> tuple[Tensor, Tensor | None]:
        """(both views ``[2B, ...]``, the first views first; labels) of step ``index``'s
        examples, as both steps make them (what ``mmcse bench`` explains)."""
        raw, view_params, labels = self._raw_inputs(index)
        return self.viewed.views(raw, view_params), labels

    def _raw_inputs(self, index: int) -> tuple:
        """The examples of step ``index`` and the parameters of their views, drawn on the host
        (the draws of :func:`~mmcse.nonling.augment.augment` and :func:`~mmcse.nonling.
        specaugment.spec_augment` with the step's seed), for :class:`_ViewedTask` to apply."""
        rows = self._batch_rows(index)
        raw = self._to_device(torch.from_numpy(self.examples.take(rows)))
        seed = self._view_seed(index)
        if self.settings.kind == IMAGE_KIND:
            count, _, height, width = raw.shape
            params = draw_params(2 * count, height, width, seed, self.views)
            view_params = self._to_device(torch.from_numpy(pack_params(params, self.views)))
        elif self.masks.enabled:
            rng = np.random.default_rng(seed)
            clips, frames, bins = raw.shape
            freq = draw_spans(rng, clips, bins, self.masks.freq_mask)
            time = draw_spans(rng, clips, frames, self.masks.time_mask)
            view_params = tuple(self._to_device(torch.from_numpy(a)) for a in (freq, time))
        else:
            view_params = None
        return raw, view_params, self._batch_labels(rows)

    def _to_device(self, tensor: Tensor) -> Tensor:
        if self.device.type == "cuda":  # pinned: the copy queues behind the step, no host wait
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _view_seed(self, index: int) -> int:
        return int(np.random.SeedSequence([self.seed, dist.rank(), index]).generate_state(1)[0])

    def _eager_step(self, index: int) -> tuple[tuple[str, ...], Tensor]:
        optimizer = self.optimizer or self.make_optimizer(self.encoder)
        self._set_lr(optimizer, index)
        inputs = self._raw_inputs(index)
        if self.captured and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are dead
        with self._autocast():
            terms = self.viewed(*inputs)  # each term × ω
        total = sum(terms.values())
        # no isfinite(total) here: it would wait for the device every step; the trainer checks
        # every logged term once per logging window (mmcse.training.metrics.LossWindow.flush)
        optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(total).backward()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        average_gradients(params)
        if self.settings.max_grad_norm > 0:
            self.scaler.unscale_(optimizer)  # clip the true gradients (the released order)
            torch.nn.utils.clip_grad_norm_(params, self.settings.max_grad_norm)
        if self.adam_eps_style == "transformers":
            set_transformers_eps(optimizer, self.adam_eps)  # the released transformers.AdamW
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(optimizer)  # skipped when a scaled gradient overflowed (fp16)
        self.scaler.update()
        if scale is None or self.scaler.get_scale() >= scale:  # the step was taken
            stepped = [p for p in self.decayed if p.grad is not None]
            decay_after_update_(
                stepped, optimizer.param_groups[0]["lr"], self.settings.weight_decay
            )
        optimizer.zero_grad(set_to_none=True)
        values = torch.stack([v.detach().float() for v in terms.values()])
        return tuple(terms), values

    # -- internals -----------------------------------------------------------------------------
    def _batch_rows(self, index: int) -> np.ndarray:
        """Rows of step ``index``: epoch-wise permutations seeded by (seed, rank, epoch), last
        incomplete batch dropped, as the authors' shuffled, looping data loader."""
        n, size = len(self.examples), self.settings.batch_size
        per_epoch = n // size
        epoch, position = divmod(index, per_epoch)
        order = np.random.default_rng([self.seed, dist.rank(), epoch]).permutation(n)
        return np.sort(order[position * size : (position + 1) * size])

    def _batch_labels(self, rows: np.ndarray) -> Tensor | None:
        if self.labels is None:
            return None
        return torch.from_numpy(self.labels[rows]).to(self.device)

    def _set_lr(self, optimizer: torch.optim.Optimizer, index: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = self.settings.lr * self._cosine(index)

    def _autocast(self):
        return self.autocast()

    @cached_property
    def autocast(self):
        """The step's autocast contexts (:func:`mmcse.precision.autocast_context`), resolved
        once: inside a captured step no device query may run."""
        return autocast_context(self.device, self.precision)


class _TaskForward(nn.Module):
    """Both views → patch embedding → the encoder's layers → [CLS] → the loss and its head: the
    part of the step that is captured (a module, so it compiles in place like the student)."""

    def __init__(self, encoder: nn.Module, heads: nn.ModuleDict, loss: nn.Module, modality: str):
        super().__init__()
        self.encoder, self.heads, self.loss, self.modality = encoder, heads, loss, modality

    def forward(self, views: Tensor, labels: Tensor | None) -> dict[str, Tensor]:
        cls = encode_tokens(self.encoder.backbone, self.heads["patch_embed"](views))
        view1, view2 = cls.float().chunk(2)
        extras = {} if labels is None else {"labels": labels}
        inputs = LossInputs(view1=view1, view2=view2, batch_kind=self.modality, extras=extras)
        return self.loss(inputs, {"student": self.heads["mlp"]})


class _ViewedTask(nn.Module):
    """The views of a batch made from its raw examples and drawn view parameters, then the task's
    forward, each term × ω: what both the eager step and the whole captured step differentiate
    (the views are :func:`~mmcse.nonling.augment.augment`'s / :func:`~mmcse.nonling.specaugment.
    spec_augment`'s arithmetic, their parameters drawn on the host)."""

    def __init__(self, task: _TaskForward, settings: NonLinguisticSettings, size: int):
        super().__init__()
        self.task, self.settings, self.size = task, settings, size

    def forward(self, raw: Tensor, view_params, labels: Tensor | None) -> dict[str, Tensor]:
        terms = self.task(self.views(raw, view_params), labels)
        return {k: self.settings.weight * v for k, v in terms.items()}

    def views(self, raw: Tensor, view_params) -> Tensor:
        """``[2B, ...]``: both views of the examples ``raw``, the first views first."""
        if self.settings.kind == IMAGE_KIND:
            pixels = torch.cat([raw, raw]).float() / 255.0
            return apply_params(pixels, view_params, self.size)  # = cat(two_views(...))
        # audio: each clip masked once (the released loader; no masks: the paper's reading), then
        # the batch twice — the views differ by dropout only (docs/fidelity.md, audio views)
        clips = raw.float() if view_params is None else mask_clips(raw.float(), *view_params)
        return torch.cat([clips, clips])


def average_gradients(params: list[Tensor]) -> None:
    """Average ``.grad`` across ranks (no-op in one process) so replicas take the same step."""
    if dist.world_size() == 1:
        return
    for p in params:
        if p.grad is not None:
            torch.distributed.all_reduce(p.grad)
            p.grad.div_(dist.world_size())
