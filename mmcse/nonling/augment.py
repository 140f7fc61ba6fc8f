"""Image views for VisualCSE, made from cached ``uint8`` tensors on the training device.

The authors' pipeline (SupCon's, applied by ``TwoCropTransform`` to each PIL image):
``RandomResizedCrop(224, scale=(0.2, 1))``, horizontal flip (p = 0.5),
``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p = 0.8, grayscale with p = 0.2, then ImageNet mean/std
normalisation (the authors use ImageNet's statistics although the in21k ViT was trained with
0.5/0.5; we follow their code). Here the same ``torchvision.transforms.v2`` ops run on tensors
already on the device (GPU when there is one), one draw of parameters per image, so nothing is
decoded during training. The crop is taken from the cached (resized, centre-cropped) image
rather than the original file: the only difference from the authors' input pipeline.

Randomness comes from one integer seed per call (the CPU generator is forked, so global RNG state
is untouched and a step is reproducible from its seed alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ViewAugmentation:
    """SupCon/VisualCSE view augmentation settings (the defaults are the authors')."""

    size: int = 224
    scale: tuple[float, float] = (0.2, 1.0)
    flip_p: float = 0.5
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)
    jitter_p: float = 0.8
    grayscale_p: float = 0.2
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def transform(self):
        """The per-image ``v2`` pipeline on float 0–1 tensors (normalisation is batched)."""
        from torchvision.transforms import v2

        return v2.Compose(
            [
                v2.RandomResizedCrop(self.size, scale=self.scale, antialias=True),
                v2.RandomHorizontalFlip(self.flip_p),
                v2.RandomApply([v2.ColorJitter(*self.jitter)], p=self.jitter_p),
                v2.RandomGrayscale(self.grayscale_p),
            ]
        )


def augment(images: Tensor, seed: int, spec: ViewAugmentation = ViewAugmentation()) -> Tensor:
    """One random view of each ``uint8`` image ``[B, 3, H, W]`` → normalised float32
    ``[B, 3, size, size]`` on the same device; the same ``seed`` gives the same views."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(
            f"expected uint8 images [B, 3, H, W], got {images.dtype} {list(images.shape)}"
        )
    transform = spec.transform()
    pixels = images.float().div_(255.0)
    with torch.random.fork_rng(devices=[]):  # v2 draws its parameters from the CPU generator
        torch.default_generator.manual_seed(seed)
        views = torch.stack([transform(image) for image in pixels])
    mean = torch.tensor(spec.mean, device=views.device).view(1, 3, 1, 1)
    std = torch.tensor(spec.std, device=views.device).view(1, 3, 1, 1)
    return (views - mean) / std


def two_views(
    images: Tensor, seed: int, spec: ViewAugmentation = ViewAugmentation()
) -> tuple[Tensor, Tensor]:
    """Two independent views of each image (Algorithm 1's ``transform(img)`` twice)."""
    views = augment(torch.cat([images, images]), seed, spec)
    return views[: images.shape[0]], views[images.shape[0] :]
