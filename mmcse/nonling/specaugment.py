"""AudioCSE's released SpecAugment masks, drawn per clip and applied to the whole batch at once.

The released AudioCSE trainer (``AudioCSE/src/trainers.py``: ``freqm=48``, ``timem=192``) loads
its clips through SSAST's ``AudioDataset`` (``AudioCSE/src/audio_dataloader.py``), which masks
every training clip once with ``torchaudio.transforms.FrequencyMasking(48)`` and
``TimeMasking(192)`` (``iid_masks=False``, fill 0) before the batch is concatenated with itself
— so both dropout views see the *same* masked clip. The paper (§3.4) says only that dropout
provides the augmentation; ``audio_masks`` on :class:`~mmcse.methods.visualcse.AudioCSE` picks
(docs/fidelity.md, audio views).

One mask along an axis of ``size`` positions with parameter ``F`` (torchaudio's
``mask_along_axis``)::

    width = u₁ · F,   start = u₂ · (size − width),   u₁, u₂ ~ U[0, 1)
    masked positions p:  trunc(start) ≤ p < trunc(start) + trunc(width)

(trunc rounds toward zero, as torch's ``.long()``: ``start`` is negative when ``F`` exceeds the
axis, e.g. the 192-frame time mask on a shorter clip).

Here the uniforms are drawn on the host from a seeded generator (one pair per clip and axis)
and the masks of the whole batch are built by broadcasting comparisons: a fixed handful of
operators per step whatever the batch size, no per-clip Python loop on the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class SpecAugment:
    """Mask parameters: ``freq_mask`` (torchaudio's ``FrequencyMasking``) and ``time_mask``
    (``TimeMasking``); 0 disables that mask. The released AudioCSE: 48 and 192."""

    freq_mask: int = 48
    time_mask: int = 192

    @property
    def enabled(self) -> bool:
        return self.freq_mask > 0 or self.time_mask > 0


def draw_spans(rng: np.random.Generator, clips: int, size: int, param: int) -> np.ndarray:
    """``[clips, 2]`` int64 (start, end) of one mask per clip along an axis of ``size``
    positions, as torchaudio's ``mask_along_axis`` draws it; (0, 0) when ``param`` is 0."""
    if param <= 0:
        return np.zeros((clips, 2), dtype=np.int64)
    u = rng.random((clips, 2))
    width = u[:, 0] * param
    start = (u[:, 1] * (size - width)).astype(np.int64)  # toward zero, as torch's .long()
    return np.stack([start, start + width.astype(np.int64)], axis=1)


def mask_clips(fbank: Tensor, freq_spans: Tensor, time_spans: Tensor) -> Tensor:
    """``fbank`` ``[B, frames, bins]`` with clip b's frames ``time_spans[b]`` and mel bins
    ``freq_spans[b]`` (half-open (start, end) rows) set to 0."""
    frames = torch.arange(fbank.shape[1], device=fbank.device)
    bins = torch.arange(fbank.shape[2], device=fbank.device)
    in_time = (frames >= time_spans[:, :1]) & (frames < time_spans[:, 1:])  # [B, frames]
    in_freq = (bins >= freq_spans[:, :1]) & (bins < freq_spans[:, 1:])  # [B, bins]
    return fbank.masked_fill(in_time[:, :, None] | in_freq[:, None, :], 0.0)
