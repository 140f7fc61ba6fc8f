"""Image views for VisualCSE, made from cached ``uint8`` tensors on the training device.

The authors' pipeline (SupCon's, applied by ``TwoCropTransform`` to each PIL image):
``RandomResizedCrop(224, scale=(0.2, 1))``, horizontal flip (p = 0.5),
``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p = 0.8, grayscale with p = 0.2, then ImageNet mean/std
normalisation (the authors use ImageNet's statistics although the in21k ViT was trained with
0.5/0.5; we follow their code).

Here the parameters of every view are drawn on the host (:func:`draw_params`: torchvision's
sampling procedures, vectorised in numpy) and applied to the whole batch at once on the device
(:func:`apply_params`), with a number of operators that does not grow with the batch: on a GPU
every operator is a kernel launch, and a per-image loop made the image step ~20x a SimCSE
step's launches. One host→device copy per call carries every parameter; there is no host sync.

* crop + resize: one pair of batched matmuls with per-image resampling matrices that are
  PyTorch's antialiased bilinear weights (the triangle filter widened by the downscale factor,
  as ``resized_crop(..., antialias=True)`` and PIL's bilinear resize use); the flip is the
  column-reversed matrix. Matmuls follow the process's fp32 matmul precision (TF32 only under
  ``--tf32``); autocast is off inside.
* colour jitter: brightness, contrast and saturation are the same clamped blend
  ``clamp(f·x + (1 − f)·target)`` with target 0, the grey mean or the grey image; ColorJitter's
  per-image random order of the four ops is kept with three blend slots before one hue step and
  three after (each image fills its slots with its own ops before/after hue, the rest are
  identity blends, f = 1), so the order is exact with one hue pass for the whole batch.
* hue: a batched RGB→HSV→RGB round trip with a per-image shift; grayscale and flip are masks.

What differs from the authors' views: the crop is taken from the Stage-1 cached image (resized,
centre-cropped) rather than the original file, and the kernels are torchvision's float tensor
ops, not its PIL ops on ``uint8`` (no rounding to 8 bits between ops; PIL's contrast uses an
integer grey mean). The batched pixels equal torchvision's per-image tensor ops
(``resized_crop(antialias=True)``, ``hflip``, ``adjust_*``, ``rgb_to_grayscale``) to float
rounding (tests/nonling/test_augment.py). The random stream is numpy's, not torch's: the same
distributions, other draws for a given seed.

Randomness comes from one integer seed per call (a private numpy generator, so global RNG state
is untouched and a step is reproducible from its seed alone).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
CROP_ATTEMPTS = 10  # RandomResizedCrop's tries before its central-crop fallback
BRIGHTNESS, CONTRAST, SATURATION, HUE = range(4)  # ColorJitter's op indices (its fn_idx)
IDENTITY = -1
BLEND_SLOTS = 3  # blend ops an image can have on either side of its hue step


@dataclass(frozen=True)
class ViewAugmentation:
    """SupCon/VisualCSE view augmentation settings (the defaults are the authors')."""

    size: int = 224
    scale: tuple[float, float] = (0.2, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)
    jitter_p: float = 0.8
    grayscale_p: float = 0.2
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def jitter_ranges(self) -> list[tuple[float, float] | None]:
        """ColorJitter's factor ranges (brightness, contrast, saturation, hue); None = op off."""
        ranges = []
        for index, strength in enumerate(self.jitter):
            if strength < 0:
                raise ValueError(f"jitter strengths must be non-negative, got {self.jitter}")
            if index == HUE:
                if strength > 0.5:
                    raise ValueError(f"hue jitter must be at most 0.5, got {strength}")
                ranges.append((-strength, strength) if strength else None)
            else:
                ranges.append((max(1.0 - strength, 0.0), 1.0 + strength) if strength else None)
        return ranges


@dataclass(frozen=True)
class ViewParams:
    """Per-image draws of one batch of views (host arrays, ``B`` rows).

    Attributes:
        boxes: ``[B, 4]`` crop boxes ``(top, left, height, width)`` in input pixels.
        flip: ``[B]`` horizontal flip.
        jitter: ``[B]`` whether ColorJitter applies (RandomApply).
        factors: ``[B, 4]`` brightness, contrast, saturation, hue factors (identity values, 1 or
            0, for an op whose strength is 0).
        order: ``[B, 4]`` ColorJitter's op order (a permutation of 0..3 per row).
        grayscale: ``[B]`` RandomGrayscale.
    """

    boxes: np.ndarray
    flip: np.ndarray
    jitter: np.ndarray
    factors: np.ndarray
    order: np.ndarray
    grayscale: np.ndarray


def draw_crops(
    rng: np.random.Generator,
    count: int,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> np.ndarray:
    """``[count, 4]`` boxes by RandomResizedCrop's procedure: up to ten (area, log-ratio) draws,
    the first that fits wins, at a uniform position; none fits → the central-crop fallback."""
    area = height * width
    target = area * rng.uniform(scale[0], scale[1], (count, CROP_ATTEMPTS))
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), (count, CROP_ATTEMPTS)))
    widths = np.rint(np.sqrt(target * aspect)).astype(np.int64)  # rint: Python's round()
    heights = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (widths > 0) & (widths <= width) & (heights > 0) & (heights <= height)
    rows, first = np.arange(count), fits.argmax(axis=1)
    found = fits[rows, first]
    fallback_h, fallback_w = central_crop(height, width, ratio)
    h = np.where(found, heights[rows, first], fallback_h)
    w = np.where(found, widths[rows, first], fallback_w)
    top = np.where(found, rng.integers(0, height - h + 1), (height - h) // 2)
    left = np.where(found, rng.integers(0, width - w + 1), (width - w) // 2)
    return np.stack([top, left, h, w], axis=1)


def central_crop(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """RandomResizedCrop's fallback size: the whole image clipped to the ratio range."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        return int(round(width / min(ratio))), width
    if in_ratio > max(ratio):
        return height, int(round(height * max(ratio)))
    return height, width


def draw_params(
    count: int, height: int, width: int, seed: int, spec: ViewAugmentation = ViewAugmentation()
) -> ViewParams:
    """Independent draws for ``count`` views of ``height × width`` images, reproducible from
    ``seed`` (a private generator: global RNG state is untouched)."""
    rng = np.random.default_rng(seed)
    boxes = draw_crops(rng, count, height, width, spec.scale, spec.ratio)
    flip = rng.random(count) < spec.flip_p
    jitter = rng.random(count) < spec.jitter_p
    factors = np.empty((count, 4))
    for op, bounds in enumerate(spec.jitter_ranges()):
        identity = 0.0 if op == HUE else 1.0
        factors[:, op] = identity if bounds is None else rng.uniform(*bounds, count)
    order = rng.permuted(np.tile(np.arange(4), (count, 1)), axis=1)
    grayscale = rng.random(count) < spec.grayscale_p
    return ViewParams(boxes, flip, jitter, factors, order, grayscale)


# -- the device side ---------------------------------------------------------------------------
# Columns of the one parameter tensor sent to the device (see pack_params).
_SLOTS = 2 * BLEND_SLOTS
_COLUMNS: dict[str, int] = {
    "box": 4,
    "flip": 1,
    "grayscale": 1,
    "hue_on": 1,
    "hue_shift": 1,
    "gray_weights": 3,
    "factor": _SLOTS,
    "saturation_weight": _SLOTS,
    "contrast_weight": _SLOTS,
    "mean": 3,
    "std": 3,
}
_ENDS = list(itertools.accumulate(_COLUMNS.values()))
_AT = {name: slice(end - _COLUMNS[name], end) for name, end in zip(_COLUMNS, _ENDS, strict=True)}
PACKED_COLUMNS = _ENDS[-1]


def jitter_slots(params: ViewParams) -> np.ndarray:
    """``[B, 6]`` blend op per slot: the image's ops before hue in slots 0–2, after hue in 3–5,
    ``IDENTITY`` elsewhere (and everywhere when jitter is off)."""
    order = params.order
    position = np.arange(4)[None, :]
    hue_at = (order == HUE).argmax(axis=1)[:, None]
    slot = np.where(position < hue_at, position, BLEND_SLOTS + position - hue_at - 1)
    keep = (position != hue_at) & params.jitter[:, None]
    slots = np.full((len(order), _SLOTS), IDENTITY)
    slots[np.nonzero(keep)[0], slot[keep]] = order[keep]
    return slots


def pack_params(params: ViewParams, spec: ViewAugmentation) -> np.ndarray:
    """Every per-image value the device needs, as one ``float32 [B, PACKED_COLUMNS]`` array
    (one host→device copy).

    A blend slot computes ``clamp(f·x + w_s·gray + w_c·mean(gray))``: brightness has
    ``w_s = w_c = 0``, saturation ``w_s = 1 − f``, contrast ``w_c = 1 − f``, identity ``f = 1``.
    """
    slots = jitter_slots(params)
    factor = np.where(
        slots != IDENTITY, np.take_along_axis(params.factors, np.maximum(slots, 0), 1), 1.0
    )
    complement = 1.0 - factor  # in float64, as torchvision's blend computes it
    hue_on = params.jitter & (spec.jitter_ranges()[HUE] is not None)
    values = {
        "box": params.boxes,
        "flip": params.flip[:, None],
        "grayscale": params.grayscale[:, None],
        "hue_on": hue_on[:, None],
        "hue_shift": np.where(hue_on, params.factors[:, HUE], 0.0)[:, None],
        "gray_weights": GRAY_WEIGHTS,
        "factor": factor,
        "saturation_weight": np.where(slots == SATURATION, complement, 0.0),
        "contrast_weight": np.where(slots == CONTRAST, complement, 0.0),
        "mean": spec.mean,
        "std": spec.std,
    }
    packed = np.zeros((len(slots), PACKED_COLUMNS))
    for name, value in values.items():
        packed[:, _AT[name]] = value
    return packed.astype(np.float32)


def resample_weights(start: Tensor, length: Tensor, in_size: int, out_size: int) -> Tensor:
    """``[B, out_size, in_size]`` rows resizing each image's span ``[start, start + length)`` to
    ``out_size`` pixels with PyTorch's antialiased bilinear filter: output pixel ``i`` centred at
    ``c = scale·(i + ½)`` in the span (``scale = length / out_size``) weighs input pixel ``j`` by
    ``max(0, 1 − |j + ½ − c| / max(scale, 1))``, renormalised over the pixels inside the span."""
    scale = (length / out_size)[:, None, None]
    centre = scale * (torch.arange(out_size, device=start.device)[None, :, None] + 0.5)
    position = torch.arange(in_size, device=start.device)[None, None, :] - start[:, None, None]
    weights = (1 - ((position - centre + 0.5) / scale.clamp(min=1.0)).abs()).clamp_(min=0)
    weights = weights.masked_fill_((position < 0) | (position >= length[:, None, None]), 0.0)
    return weights / weights.sum(-1, keepdim=True)


def grayscale(pixels: Tensor, weights: Tensor) -> Tensor:
    """``[B, 1, H, W]`` luma; ``weights`` ``[B, 3, 1, 1]``: torchvision's :data:`GRAY_WEIGHTS`."""
    return (pixels * weights).sum(1, keepdim=True)


def blend(pixels: Tensor, weights: Tensor, factor: Tensor, sat: Tensor, con: Tensor) -> Tensor:
    """One jitter slot, ``clamp(f·x + w_s·gray + w_c·mean(gray))`` per image (see
    :func:`pack_params`)."""
    gray = grayscale(pixels, weights)
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)
    return (pixels * factor).addcmul_(gray, sat).addcmul_(mean, con).clamp_(0.0, 1.0)


def shift_hue(pixels: Tensor, shift: Tensor) -> Tensor:
    """Rotate each image's hue by ``shift`` (``[B, 1, 1]``, in turns) through HSV, as
    torchvision's ``adjust_hue`` does for one image."""
    r, g, _ = pixels.unbind(1)
    low, value = torch.aminmax(pixels, dim=1)
    flat = value == low  # grey pixels: hue and saturation 0 (and no division by zero)
    spread = value - low
    saturation = spread / value.masked_fill(flat, 1.0)
    distance = (value.unsqueeze(1) - pixels) / spread.masked_fill(flat, 1.0).unsqueeze(1)
    dr, dg, db = distance.unbind(1)
    hue = torch.where(value == r, db - dg, torch.where(value == g, 2.0 + dr - db, 4.0 + dg - dr))
    hue = (hue * (1.0 / 6.0) + 1.0).fmod_(1.0).add_(shift).remainder_(1.0)
    # back to RGB: channel n ∈ (5, 3, 1) for (r, g, b) is v − v·s·clamp(min(k, 4 − k), 0, 1)
    # with k = (n + 6h) mod 6, the closed form of the six-sector table
    channel = torch.arange(5.0, 0.0, -2.0, device=pixels.device).view(1, 3, 1, 1)
    k = (channel + 6.0 * hue.unsqueeze(1)).remainder_(6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    v = value.unsqueeze(1)
    return v - v * saturation.unsqueeze(1) * ramp


def apply_params(pixels: Tensor, packed: Tensor, size: int) -> Tensor:
    """Views ``[B, 3, size, size]`` of float 0–1 ``pixels`` ``[B, 3, H, W]`` with the per-image
    parameters ``packed`` (:func:`pack_params`, on the same device), normalised."""
    height, width = pixels.shape[-2:]
    with torch.autocast(pixels.device.type, enabled=False):  # resampling stays fp32
        box = packed[:, _AT["box"]]
        rows = resample_weights(box[:, 0], box[:, 2], height, size)
        cols = resample_weights(box[:, 1], box[:, 3], width, size)
        cols = torch.where(packed[:, _AT["flip"], None] > 0.5, cols.flip(1), cols)  # hflip
        views = rows.unsqueeze(1) @ pixels @ cols.transpose(1, 2).unsqueeze(1)
        per_image = packed[:, :, None, None]  # [B, columns, 1, 1]: broadcasts over [B, C, H, W]
        column = {name: per_image[:, at] for name, at in _AT.items()}
        weights = column["gray_weights"]
        for slot in range(_SLOTS):
            if slot == BLEND_SLOTS:
                hued = shift_hue(views, column["hue_shift"][:, 0])
                views = torch.where(column["hue_on"] > 0.5, hued, views)
            at = slice(slot, slot + 1)
            views = blend(
                views,
                weights,
                column["factor"][:, at],
                column["saturation_weight"][:, at],
                column["contrast_weight"][:, at],
            )
        views = torch.where(column["grayscale"] > 0.5, grayscale(views, weights), views)
        return (views - column["mean"]) / column["std"]
