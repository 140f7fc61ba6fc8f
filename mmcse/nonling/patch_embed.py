"""Patch embeddings: turn an image or a spectrogram into tokens the sentence encoder can read.

VisualCSE/AudioCSE (Jian et al., NeurIPS 2022, §3.3, App. B) replace the language model's word
embeddings by a patch embedding for non-linguistic inputs: non-overlapping patches, each
linearly projected (a strided convolution) to the encoder's hidden size, a learned [CLS] token in
front and — for images — learned position embeddings added. The result goes straight into the transformer
layers (:func:`mmcse.nonling.task.encode_tokens`). These modules train with the student and are
saved with the checkpoint, but are not part of the sentence encoder.

* Images: ViT-B/16's embedding layer; 224×224 → 196 patches + [CLS] = 197 tokens. The authors
  initialise it from ``google/vit-base-patch16-224-in21k`` (:meth:`ImagePatchEmbedding.from_vit`);
  a student of another hidden size gets a random one.
* Audio: SSAST's embedding over the ``[frames, mel bins]`` log-mel spectrogram, transposed to
  ``[1, bins, frames]``. The paper's ``1 × 211 × h`` tokens come from the authors' 24×24
  stride-24 patches (128×1024 → 5×42 = 210 + [CLS]): the default here; 16×16 (SSAST's own
  patch size, 512 + 1 tokens) is a setting. **No position embeddings** by default: the released
  audio path (``AudioCSE/src/models.py:397–400``) runs timm's ``patch_embed``, prepends the
  ``cls_token`` and applies ``pos_drop`` (dropout 0: the identity) — it never adds ``pos_embed``.
  ``position_embeddings=True`` (AudioCSE's ``audio_position_embeddings``) adds learned ones, as
  the paper's "embedding layer of SSAST" has. Audio embeddings start random, as in the code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.hub import quiet_transformers

VIT_BY_HIDDEN_SIZE = {
    768: "google/vit-base-patch16-224-in21k",
    1024: "google/vit-large-patch16-224-in21k",
}


class PatchEmbedding(nn.Module):
    """``[B, C, H, W]`` → ``[B, 1 + (H/p)(W/p), hidden]``: conv patches, [CLS], positions.

    Parameter names follow Hugging Face's ``ViTEmbeddings`` (``cls_token``,
    ``position_embeddings``, ``projection``), so ViT weights load by name.
    ``position_embeddings=False``: none (the parameter does not exist).
    """

    def __init__(
        self,
        hidden_size: int,
        in_channels: int,
        input_size: tuple[int, int],
        patch_size: int,
        position_embeddings: bool = True,
    ) -> None:
        super().__init__()
        rows, cols = input_size[0] // patch_size, input_size[1] // patch_size
        if rows == 0 or cols == 0:
            raise MmcseError(
                f"input {input_size} is smaller than one {patch_size}×{patch_size} patch"
            )
        self.input_size, self.patch_size = tuple(input_size), patch_size
        self.num_patches = rows * cols
        self.projection = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.position_embeddings: nn.Parameter | None = None
        if position_embeddings:
            shape = (1, self.num_patches + 1, hidden_size)
            self.position_embeddings = nn.Parameter(torch.zeros(shape))
            nn.init.trunc_normal_(self.position_embeddings, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        if tuple(x.shape[-2:]) != self.input_size:
            raise MmcseError(
                f"expected inputs of size {self.input_size}, got {tuple(x.shape[-2:])}"
            )
        patches = self.projection(x.to(self.projection.weight.dtype)).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), patches], dim=1)
        if self.position_embeddings is None:
            return tokens
        return tokens + self.position_embeddings


class ImagePatchEmbedding(PatchEmbedding):
    """ViT's embedding layer for normalised RGB images ``[B, 3, size, size]``."""

    def __init__(self, hidden_size: int, image_size: int = 224, patch_size: int = 16) -> None:
        super().__init__(hidden_size, 3, (image_size, image_size), patch_size)

    @classmethod
    def create(
        cls, hidden_size: int, image_size: int = 224, init: str = "auto"
    ) -> ImagePatchEmbedding:
        """``init``: ``"auto"`` (the in21k ViT matching ``hidden_size`` if there is one, else
        random), ``"random"``, or a ViT model directory / hub id."""
        source = VIT_BY_HIDDEN_SIZE.get(hidden_size) if init == "auto" else init
        if source in (None, "random"):
            return cls(hidden_size, image_size)
        return cls.from_vit(source, hidden_size, image_size)

    @classmethod
    def from_vit(cls, source: str, hidden_size: int, image_size: int = 224) -> ImagePatchEmbedding:
        """Copy the embedding layer of a Hugging Face ViT (local dir, or hub id when online or
        cached; ``HF_HUB_OFFLINE=1`` restricts it to local/cached copies)."""
        from transformers import ViTModel

        quiet_transformers()
        try:
            vit = ViTModel.from_pretrained(source, add_pooling_layer=False)
        except OSError as exc:
            hint = "" if Path(source).exists() else " (not a local dir; offline or not cached?)"
            raise MmcseError(
                f"cannot load ViT weights from {source!r}{hint}: {exc.__class__.__name__}; "
                "give a local ViT directory or vit_init=random"
            ) from None
        config = vit.config
        if config.hidden_size != hidden_size:
            raise MmcseError(
                f"ViT {source!r} has hidden size {config.hidden_size}, the student "
                f"{hidden_size}; choose a matching ViT or vit_init=random"
            )
        module = cls(hidden_size, image_size, config.patch_size)
        emb = vit.embeddings
        if emb.position_embeddings.shape != module.position_embeddings.shape:
            raise MmcseError(
                f"ViT {source!r} was trained at {config.image_size}px; set image_size to it"
            )
        with torch.no_grad():
            module.cls_token.copy_(emb.cls_token)
            module.position_embeddings.copy_(emb.position_embeddings)
            module.projection.load_state_dict(emb.patch_embeddings.projection.state_dict())
        return module


class AudioPatchEmbedding(PatchEmbedding):
    """SSAST-style embedding for log-mel spectrograms ``[B, frames, mel bins]``; by default
    without position embeddings, as the released audio path (module docstring)."""

    def __init__(
        self,
        hidden_size: int,
        frames: int = 1024,
        mel_bins: int = 128,
        patch_size: int = 24,
        position_embeddings: bool = False,
    ) -> None:
        super().__init__(hidden_size, 1, (mel_bins, frames), patch_size, position_embeddings)

    def forward(self, fbank: Tensor) -> Tensor:
        return super().forward(fbank.unsqueeze(1).transpose(2, 3))  # → [B, 1, bins, frames]
