"""What the extraction engine expects of a teacher.

Images are decoded, resized and centre-cropped to ``uint8`` in DataLoader workers (cheap to pin
and copy); the teacher normalises on its own device, so float conversion happens on the GPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImagePreprocess:
    """Resize the short side to ``resize`` (``interpolation``), centre-crop ``crop`` × ``crop``,
    then the teacher normalises with ``mean``/``std`` (on the 0–1 scale)."""

    resize: int = 256
    crop: int = 224
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"

    def to_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class ImageTeacher(Protocol):
    name: str
    dim: int
    preprocess: ImagePreprocess

    def encode_images(self, pixels: Tensor) -> Tensor:
        """``[B, 3, crop, crop]`` uint8 on the teacher's device → ``[B, dim]`` float32."""
        ...

    def producer(self) -> dict:
        """Teacher id, weights sha256 or revision, preprocessing, code version (for the manifest)."""
        ...


@runtime_checkable
class TextTeacher(Protocol):
    name: str
    dim: int

    def encode_texts(self, texts: list[str]) -> Tensor:
        """Sentences → ``[B, dim]`` float32 (the teacher's own pooling)."""
        ...

    def producer(self) -> dict: ...
