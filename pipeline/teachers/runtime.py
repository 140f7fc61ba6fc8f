"""What every teacher shares: device placement, mixed precision, batching and provenance.

A concrete teacher builds its modules and implements ``_embed_images`` (normalised float pixels
→ embeddings) and/or ``_embed_tokens`` (one tokenised batch → embeddings); the classes here turn
those into the :class:`~pipeline.teachers.base.ImageTeacher` / ``TextTeacher`` protocol.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

import mmcse
from mmcse.errors import BadValueError
from pipeline.teachers.base import ImagePreprocess

SIZES = ("real", "tiny")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """Compute dtype: ``None`` → bf16 on CUDA (fp16 where bf16 is missing), fp32 on CPU
    (CPU autocast is slower than fp32 for these models)."""
    if dtype is None:
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if isinstance(dtype, torch.dtype):
        return dtype
    name = DTYPE_ALIASES.get(dtype, dtype)
    if name not in DTYPES:
        raise BadValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class WeightsInfo:
    """Provenance of a teacher's weights, recorded in every feature set it writes."""

    kind: str  # "default" | "random" | "path"
    source: str  # hub id, URL, local path, or the architecture for random init
    sha256: str  # of the weight files; "random" for random init
    seed: int | None = None  # random init only

    def to_dict(self) -> dict:
        info = {"weights": self.kind, "weights_source": self.source, "weights_sha256": self.sha256}
        if self.seed is not None:
            info["seed"] = self.seed
        return info


@contextmanager
def seeded(seed: int):
    """Random init that is reproducible and leaves the caller's global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class Teacher:
    """Frozen modules in eval mode + the provenance of their weights."""

    backend = "torch"

    def __init__(
        self,
        name: str,
        dim: int,
        modules: nn.Module,
        weights: WeightsInfo,
        size: str = "real",
        dtype: str | torch.dtype | None = None,
    ) -> None:
        self.name = name
        self.dim = dim
        self.size = size
        self.weights = weights
        self.modules = modules.eval().requires_grad_(False)
        self._dtype_request = dtype
        self.device = torch.device("cpu")
        self.compute_dtype = resolve_dtype(dtype, self.device)

    def to(self, device: str | torch.device) -> Teacher:
        self.device = torch.device(device)
        self.compute_dtype = resolve_dtype(self._dtype_request, self.device)
        self.modules.to(self.device)
        return self

    def autocast(self):
        if self.compute_dtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def producer(self) -> dict:
        return {
            "teacher": self.name,
            "backend": self.backend,
            "size": self.size,
            "dim": self.dim,
            **self.weights.to_dict(),
            "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
            "code_version": mmcse.__version__,
        }


class ImageEncoding(Teacher):
    """``encode_images``: uint8 crops on the teacher's device → float32 embeddings."""

    image_pooling: str  # how the image becomes one vector (recorded in the manifest)

    def __init__(self, *args, preprocess: ImagePreprocess, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.preprocess = preprocess

    def to(self, device: str | torch.device) -> Teacher:
        super().to(device)
        if self.device.type == "cuda":  # NHWC convolutions run on tensor cores
            self.modules.to(memory_format=torch.channels_last)
        return self

    def _embed_images(self, pixels: Tensor) -> Tensor:
        raise NotImplementedError

    def encode_images(self, pixels: Tensor) -> Tensor:
        crop = self.preprocess.crop
        if pixels.dtype != torch.uint8 or pixels.dim() != 4 or pixels.shape[1:] != (3, crop, crop):
            raise ValueError(
                f"{self.name} takes uint8 [B, 3, {crop}, {crop}] pixels, got "
                f"{pixels.dtype} {list(pixels.shape)}"
            )
        mean = torch.tensor(self.preprocess.mean, device=self.device).view(1, 3, 1, 1)
        std = torch.tensor(self.preprocess.std, device=self.device).view(1, 3, 1, 1)
        with torch.inference_mode():
            x = pixels.to(self.device, non_blocking=True).float().div_(255).sub_(mean).div_(std)
            if self.device.type == "cuda":
                x = x.contiguous(memory_format=torch.channels_last)
            with self.autocast():
                return self._embed_images(x).float()

    def producer(self) -> dict:
        return {
            **super().producer(),
            "preprocessing": self.preprocess.to_dict(),
            "image_pooling": self.image_pooling,
        }


class TextEncoding(Teacher):
    """``encode_texts``: sentences → float32 embeddings on CPU, in input order.

    Sentences are batched longest-first, so each batch pads only to its own longest sentence."""

    max_length: int
    pooling: str
    tokenizer_source: str | None  # recorded: features depend on the tokenizer too

    def __init__(self, *args, batch_size: int = 128, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch_size = batch_size

    def _tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        return self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )

    def _embed_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def encode_texts(self, texts: list[str]) -> Tensor:
        if isinstance(texts, str):
            raise ValueError("encode_texts takes a list of sentences, not one string")
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        out = torch.empty(len(texts), self.dim)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                batch = self._tokenize([texts[i] for i in rows])
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                with self.autocast():
                    out[rows] = self._embed_tokens(batch).float().cpu()
        return out

    def producer(self) -> dict:
        return {
            **super().producer(),
            "pooling": self.pooling,
            "max_length": self.max_length,
            "tokenizer": self.tokenizer_source,
        }
