"""AudioCSE's released SpecAugment (:mod:`mmcse.nonling.specaugment`) against torchaudio's
``mask_along_axis`` written out per clip, its draw statistics, its place in the audio step, and
the image/audio step's precision (fp16 autocast with its own loss scaler, as released)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.views import spec_augment

from mmcse.nonling.specaugment import SpecAugment, draw_spans, mask_clips
from mmcse.precision import autocast_dtype


def torchaudio_mask(spec: torch.Tensor, param: int, axis: int, u1: float, u2: float):
    """torchaudio.functional.mask_along_axis (p = 1, fill 0) for one 2-D clip, its two
    ``torch.rand(1)`` draws given: value = u1·F, min = u2·(size − value), [min.long(),
    min.long() + value.long())."""
    value = torch.tensor(u1, dtype=torch.float64) * param
    min_value = torch.tensor(u2, dtype=torch.float64) * (spec.size(axis) - value)
    start, end = int(min_value.long()), int(min_value.long() + value.long())
    out = spec.clone()
    for p in range(spec.size(axis)):
        if start <= p < end:
            if axis == 0:
                out[p, :] = 0
            else:
                out[:, p] = 0
    return out


@pytest.mark.parametrize("frames, bins, freq, time", [(40, 16, 6, 12), (30, 8, 48, 192)])
def test_masks_equal_torchaudio_per_clip(frames, bins, freq, time):
    """The batched masks equal the released per-clip FrequencyMasking then TimeMasking on the
    transposed [bins, frames] clip, with the same uniforms — including a mask wider than its
    axis (48 > 8 bins, 192 > 30 frames: a negative start)."""
    fbank = torch.rand(5, frames, bins) + 1.0  # no zeros before masking
    got = spec_augment(fbank, seed=7, spec=SpecAugment(freq, time))
    u = np.random.default_rng(7)
    freq_u, time_u = u.random((5, 2)), u.random((5, 2))  # spec_augment's draw order
    for b in range(5):
        clip = fbank[b].T  # the released [bins, frames] layout
        clip = torchaudio_mask(clip, freq, 0, *freq_u[b])
        clip = torchaudio_mask(clip, time, 1, *time_u[b])
        torch.testing.assert_close(got[b], clip.T, rtol=0, atol=0)


def test_drawn_mask_widths_and_positions_follow_the_released_distribution():
    """Width trunc(U·F) is uniform on {0, …, F−1}; the mask lies inside the axis when F ≤ size."""
    rng = np.random.default_rng(0)
    spans = draw_spans(rng, 40_000, 1024, 192)
    widths = spans[:, 1] - spans[:, 0]
    counts = np.bincount(widths, minlength=192)
    assert counts.shape == (192,) and counts.min() > 0  # every width 0…191, none larger
    expected = len(widths) / 192
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 260  # χ²(191) 99.9th percentile ≈ 262
    assert spans[:, 0].min() >= 0 and spans[:, 1].max() <= 1024
    starts = spans[:, 0] / (1024 - widths)  # start | width ~ U[0, size − width) before trunc
    assert abs(starts.mean() - 0.5) < 0.01


def test_no_masks_is_the_identity_and_mask_clips_fills_zero():
    fbank = torch.rand(3, 10, 4)
    assert spec_augment(fbank, 0, SpecAugment(0, 0)) is fbank
    spans_f = torch.tensor([[1, 3], [0, 0], [2, 4]])
    spans_t = torch.tensor([[0, 0], [5, 7], [9, 10]])
    out = mask_clips(fbank, spans_f, spans_t)
    assert (out[0, :, 1:3] == 0).all() and (out[0, :, [0, 3]] != 0).all()
    assert (out[1, 5:7] == 0).all() and (out[1, :5] != 0).all()
    assert (out[2, 9] == 0).all() and (out[2, :, 2:4] == 0).all()


@pytest.mark.parametrize(
    "device, precision, bf16, want",
    [
        ("cuda", "fp16", True, torch.float16),  # released: autocast(float16) + image_scaler
        ("cuda", "auto", True, torch.bfloat16),
        ("cuda", "bf16", False, None),
        ("cuda", "fp32", True, None),
        ("cpu", "fp16", True, None),
    ],
)
def test_image_step_autocast_follows_the_run_precision(device, precision, bf16, want):
    assert autocast_dtype(device, precision, bf16) == want
