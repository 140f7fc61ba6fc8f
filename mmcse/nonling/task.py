"""The non-linguistic half of VisualCSE/AudioCSE's alternating optimisation (Algorithm 1).

Jian et al. (NeurIPS 2022) train one sentence encoder on two unpaired contrastive tasks. Each
training step first takes one image (audio) update — a batch of 48 cached examples, two views,
patch embedding → the student's transformer layers → [CLS] → the task's own MLP → the released
``--new_supcon`` objective (or SupCon, SimCLR), scaled by ω, then *its own* AdamW step over all
parameters (encoder included, at a much smaller lr: Table C.1) — and then the ordinary SimCSE
text update. This module is the task: its examples, their batches, views and labels, its heads
and its forward (:class:`NonLinguisticTask`). The update that steps it — its AdamW, clipping,
cosine lr and loss scaler, eager or captured — is the trainer's
(:class:`mmcse.training.updates.AuxiliaryUpdate`), run before the text update.

How tokens enter the encoder. The authors' code calls ``bert.encoder(patch_tokens)`` directly
(:func:`encode_tokens` does the same): BERT's word/position/token-type embeddings and their
LayerNorm are bypassed, the patch embedding supplies [CLS] and positions, and no attention mask
is needed (every token is real). Calling the HF model with ``inputs_embeds`` instead would add
BERT's position and token-type embeddings and renormalise, which is a different model.

The image update follows the authors' trainer: ``transformers.AdamW`` (weight decay 0 in all
released runs) with the text optimizer's ε (``adam_epsilon``, the same argument) placed as
transformers places it, before the bias correction (``adam_eps_style="torch"`` is torch's
placement, for both optimizers), gradient clipping at 1.0 over every parameter, and their cosine
decay of the image lr over the run, without warm-up (:mod:`mmcse.training.updates`). Under
several processes each rank samples its own batch (:meth:`NonLinguisticTask.inputs`: seeded by
rank) and the update averages the gradients across ranks.
"""

from __future__ import annotations

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
from mmcse.precision import autocast_context
from mmcse.registry import LOSSES

IMAGE_KIND = IMAGE_TENSOR_KIND  # the cache contract's names (mmcse.cache.kinds)
AUDIO_KIND = AUDIO_FBANK_KIND
#: registered losses the task can run; the first is the released code's (``--new_supcon``)
OBJECTIVES = ("class_rank_cross_entropy", "supcon", "simclr")
#: what the task's own AdamW covers (:func:`mmcse.training.updates.auxiliary_parameters`):
#: ``model``, every parameter of the model (the released image/audio optimizer); ``task``, the
#: encoder and the task's heads
OPTIMIZER_SCOPES = ("model", "task")
#: objectives that read class labels (an unlabelled set can only run ``simclr``)
LABELLED_OBJECTIVES = ("class_rank_cross_entropy", "supcon")


@dataclass(frozen=True)
class NonLinguisticSettings:
    """What a method tells the task (VisualCSE/AudioCSE fill it from their fields).

    Attributes:
        kind: the cache kind (and ``--feature`` role) of the examples: ``image_tensor`` or
            ``audio_fbank``.
        weight: ω in ℒ = ℒ_text + ω·ℒ_image (eq. 1); 0 disables the task.
        lr, batch_size, temperature, objective, weight_decay, max_grad_norm: the image update's
            optimisation (Table C.1; ``objective``: one of :data:`OBJECTIVES`; the update reads
            ``lr``, ``weight_decay`` and ``max_grad_norm``).
        optimizer_scope: what the update's AdamW covers, one of :data:`OPTIMIZER_SCOPES`.
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
    optimizer_scope: str = OPTIMIZER_SCOPES[0]  # released: image_optimizer over the model
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
        if self.optimizer_scope not in OPTIMIZER_SCOPES:
            raise ValueError(
                f"optimizer scope must be one of {OPTIMIZER_SCOPES}, not {self.optimizer_scope!r}"
            )
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
    """The image (or audio) contrastive task on the shared encoder; see the module docstring.

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
        precision: str = "auto",
    ) -> None:
        self.settings: NonLinguisticSettings = method_cfg.nonlinguistic_settings()
        self.encoder = encoder
        self.device = torch.device(device)
        self.seed, self.precision = seed, precision
        self.examples = FeatureSet.open(feature_set_path)
        self._check_examples()
        self.labels = self._labels()
        hidden = encoder.backbone.config.hidden_size
        self.loss = LOSSES.get(self.settings.objective)(temperature=self.settings.temperature)
        # BERT init: the authors' image_mlp is built in cl_init, before init_weights()
        mlp = MLPHead(hidden, hidden, init="bert")  # before the patch embedding: seeded init order
        self.heads = nn.ModuleDict({"patch_embed": self._patch_embedding(hidden), "mlp": mlp})
        self.heads.to(self.device)
        self.views = ViewAugmentation(size=self.settings.image_size)
        self.masks = SpecAugment(self.settings.freq_mask, self.settings.time_mask)
        self.step_forward = _TaskForward(encoder, self.heads, self.loss, self.settings.modality)
        # the views made from the raw examples, then step_forward: what the update
        # differentiates, eager or captured
        self.viewed = _ViewedTask(self.step_forward, self.settings, self.views.size)
        self.captured = False  # its forward compiled (capture)

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

    def train(self) -> None:
        """Training mode (dropout) for the encoder and the task's heads."""
        self.encoder.train()
        self.heads.train()

    def state_dict(self) -> dict[str, Tensor]:
        return self.heads.state_dict()

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.heads.load_state_dict(state)

    def batch(self, index: int) -> tuple[Tensor, Tensor | None]:
        """(both views ``[2B, ...]``, the first views first; labels) of step ``index``'s
        examples, as both steps make them (what ``mmcse bench`` explains)."""
        raw, view_params, labels = self.inputs(index)
        return self.viewed.views(raw, view_params), labels

    def inputs(self, index: int) -> tuple:
        """What :attr:`viewed` takes for step ``index``: its examples and the parameters of their
        views, drawn on the host (:func:`~mmcse.nonling.augment.draw_params` and
        :func:`~mmcse.nonling.specaugment.draw_spans` with the step's seed), and their
        labels."""
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
        return self._to_device(torch.from_numpy(self.labels[rows]))

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
    (the views are :func:`~mmcse.nonling.augment.apply_params`' / :func:`~mmcse.nonling.
    specaugment.mask_clips`' arithmetic, their parameters drawn on the host)."""

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
            return apply_params(pixels, view_params, self.size)  # both views, drawn apart
        # audio: each clip masked once (the released loader; no masks: the paper's reading), then
        # the batch twice — the views differ by dropout only (docs/fidelity.md, audio views)
        clips = raw.float() if view_params is None else mask_clips(raw.float(), *view_params)
        return torch.cat([clips, clips])
