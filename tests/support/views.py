"""The non-linguistic views made in one call, as the papers write them: the references the
trainer's host-drawn, device-applied views (:mod:`mmcse.nonling.task`) are held to."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from mmcse.nonling.augment import ViewAugmentation, apply_params, draw_params, pack_params
from mmcse.nonling.specaugment import SpecAugment, draw_spans, mask_clips


def augment(images: Tensor, seed: int, spec: ViewAugmentation = ViewAugmentation()) -> Tensor:
    """One random view of each ``uint8`` image ``[B, 3, H, W]`` → normalised float32
    ``[B, 3, size, size]`` on the same device; the same ``seed`` gives the same views."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(
            f"expected uint8 images [B, 3, H, W], got {images.dtype} {list(images.shape)}"
        )
    count, _, height, width = images.shape
    params = draw_params(count, height, width, seed, spec)
    packed = torch.from_numpy(pack_params(params, spec)).to(images.device, non_blocking=True)
    return apply_params(images.float().div_(255.0), packed, spec.size)


def two_views(
    images: Tensor, seed: int, spec: ViewAugmentation = ViewAugmentation()
) -> tuple[Tensor, Tensor]:
    """Two independent views of each image (Algorithm 1's ``transform(img)`` twice)."""
    views = augment(torch.cat([images, images]), seed, spec)
    return views[: images.shape[0]], views[images.shape[0] :]


def spec_augment(fbank: Tensor, seed: int, spec: SpecAugment) -> Tensor:
    """Mask every clip of ``fbank`` ``[B, frames, bins]`` with its own draw (seeded by
    ``seed``: the same batch and seed give the same masks on any device)."""
    if not spec.enabled:
        return fbank
    rng = np.random.default_rng(seed)
    clips, frames, bins = fbank.shape
    freq = draw_spans(rng, clips, bins, spec.freq_mask)
    time = draw_spans(rng, clips, frames, spec.time_mask)
    freq_spans, time_spans = (torch.from_numpy(s).to(fbank.device) for s in (freq, time))
    return mask_clips(fbank, freq_spans, time_spans)
