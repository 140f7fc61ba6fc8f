"""Kaldi-compatible log-mel filterbanks in plain torch (no torchaudio), as SSAST/AST compute them.

AudioCSE (Jian et al., NeurIPS 2022, App. B) feeds the sentence encoder SSAST-style inputs:
``torchaudio.compliance.kaldi.fbank(waveform - mean, htk_compat=True, use_energy=False,
window_type='hanning', num_mel_bins=128, dither=0.0, frame_shift=10)`` padded with zeros or cut
to 1024 frames. This module reproduces that function's maths step by step (Kaldi's
``compute-fbank-feats`` definition), so Stage 1 needs no torchaudio:

1. frames of 25 ms every 10 ms, ``snip_edges`` (only whole frames; ``1 + (n − len) // shift``);
2. per-frame DC offset removal, then pre-emphasis ``x[t] − 0.97·x[t−1]`` (``x[−1] := x[0]``);
3. a window (``hanning`` as SSAST; Kaldi's default ``povey`` = hann^0.85, ``hamming``,
   ``rectangular``), zero-padded to the next power of two (400 → 512 samples at 16 kHz);
4. power spectrum |rfft|², triangular filters equally spaced on the mel scale
   ``1127·ln(1 + f/700)`` between 20 Hz and Nyquist (the Nyquist bin gets weight 0);
5. ``log(max(energy, float32 eps))``.

Dither is fixed at 0 (determinism: the cache is byte-identical across reruns). Inputs are the
waveform on the −1…1 scale (``torchaudio.load``'s convention); :func:`read_wav` produces it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmcse.errors import MmcseError

WINDOWS = ("hanning", "povey", "hamming", "rectangular")


@dataclass(frozen=True)
class FbankConfig:
    """SSAST/AST settings (AudioCSE): 128 mel bins, 25/10 ms frames, 1024 frames per clip."""

    num_mel_bins: int = 128
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    preemphasis: float = 0.97
    window: str = "hanning"
    low_freq: float = 20.0
    high_freq: float = 0.0  # ≤ 0: offset from Nyquist (Kaldi's convention)
    target_frames: int = 1024

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise MmcseError(f"unknown window {self.window!r}; choose one of {', '.join(WINDOWS)}")

    def to_dict(self) -> dict:
        return asdict(self)


def mel_scale(freq: Tensor | float) -> Tensor | float:
    if isinstance(freq, Tensor):
        return 1127.0 * torch.log1p(freq / 700.0)
    return 1127.0 * math.log1p(freq / 700.0)


def mel_banks(
    num_bins: int, padded_window: int, sample_rate: float, low_freq: float, high_freq: float
) -> Tensor:
    """``[num_bins, padded_window // 2 + 1]`` triangular mel filters over the rfft bins."""
    nyquist = 0.5 * sample_rate
    high = high_freq if high_freq > 0 else nyquist + high_freq
    if not 0 <= low_freq < high <= nyquist:
        raise MmcseError(f"mel range {low_freq}–{high} Hz does not fit a {sample_rate} Hz signal")
    mel_low, mel_high = mel_scale(low_freq), mel_scale(high)
    delta = (mel_high - mel_low) / (num_bins + 1)
    edges = mel_low + delta * torch.arange(num_bins + 2, dtype=torch.float64)
    left, center, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    bin_hz = sample_rate / padded_window * torch.arange(padded_window // 2, dtype=torch.float64)
    mel = mel_scale(bin_hz)[None, :]
    rising, falling = (mel - left) / (center - left), (right - mel) / (right - center)
    weights = torch.minimum(rising, falling).clamp(min=0)
    return torch.nn.functional.pad(weights, (0, 1)).float()  # Nyquist bin: weight 0, as Kaldi


def window_function(kind: str, length: int) -> Tensor:
    if kind == "rectangular":
        return torch.ones(length)
    if kind == "hamming":
        return torch.hamming_window(length, periodic=False, alpha=0.54, beta=0.46)
    hann = torch.hann_window(length, periodic=False)
    return hann.pow(0.85) if kind == "povey" else hann


def kaldi_fbank(waveform: Tensor, sample_rate: int, cfg: FbankConfig = FbankConfig()) -> Tensor:
    """Log-mel filterbank ``[frames, num_mel_bins]`` of a mono waveform ``[n]`` (float32)."""
    x = waveform.to(torch.float32).reshape(-1)
    length = int(sample_rate * cfg.frame_length_ms * 0.001)
    shift = int(sample_rate * cfg.frame_shift_ms * 0.001)
    if x.numel() < length:
        return torch.empty(0, cfg.num_mel_bins)
    frames = x.unfold(0, length, shift)  # snip_edges: whole frames only
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = torch.cat([frames[:, :1], frames[:, :-1]], dim=1)
    frames = (frames - cfg.preemphasis * previous) * window_function(cfg.window, length)
    padded = 1 << (length - 1).bit_length()
    power = torch.fft.rfft(frames, n=padded).abs().pow(2)
    banks = mel_banks(cfg.num_mel_bins, padded, sample_rate, cfg.low_freq, cfg.high_freq)
    energies = power @ banks.T
    return energies.clamp(min=torch.finfo(torch.float32).eps).log()


def pad_or_cut(fbank: Tensor, target_frames: int) -> Tensor:
    """Zero-pad at the end or truncate to ``target_frames`` rows (SSAST's ``target_length``)."""
    missing = target_frames - fbank.shape[0]
    if missing > 0:
        return torch.nn.functional.pad(fbank, (0, 0, 0, missing))
    return fbank[:target_frames]


def ssast_fbank(waveform: Tensor, sample_rate: int, cfg: FbankConfig = FbankConfig()) -> Tensor:
    """SSAST's ``_wav2fbank`` without mixup: remove the mean, fbank, pad/cut → ``[T, F]``."""
    waveform = waveform.to(torch.float32)
    return pad_or_cut(kaldi_fbank(waveform - waveform.mean(), sample_rate, cfg), cfg.target_frames)


def read_wav(path: str | Path) -> tuple[Tensor, int]:
    """A WAV file as a mono float32 waveform on the −1…1 scale (first channel) and its rate."""
    from scipy.io import wavfile

    try:
        rate, data = wavfile.read(str(path))
    except (ValueError, OSError) as exc:
        raise MmcseError(f"{path}: not a readable WAV file ({exc})") from None
    if data.ndim == 2:
        data = data[:, 0]  # kaldi.fbank reads channel 0
    if data.dtype == np.uint8:
        samples = (data.astype(np.float32) - 128.0) / 128.0
    elif np.issubdtype(data.dtype, np.integer):
        samples = data.astype(np.float32) / float(-np.iinfo(data.dtype).min)
    else:
        samples = data.astype(np.float32)
    return torch.from_numpy(samples), int(rate)
