"""Worker-side image decoding: file → ``uint8 [3, crop, crop]`` (resize short side, centre crop).

Runs in DataLoader workers, so it stays on the CPU and returns ``uint8`` (4× cheaper to pin and
copy than float); the teacher normalises on its own device.

Policy for awkward inputs (valid images are kept, only undecodable ones are errors):

* CMYK, grayscale, palette and alpha images are converted to RGB with PIL's ``convert("RGB")`` and
  kept. Alpha is dropped, not composited — the same as torchvision/open_clip preprocessing, so
  features match what the teachers saw in training. High-bit-depth modes are rescaled to 8 bits
  first (PIL's own conversion clips them): ``I;16*`` and ``I`` (16-bit PNG/TIFF) by 1/257, ``F``
  from [0, 1] (or clipped to [0, 255] when its values exceed 1).
* Truncated or corrupt files, zero-byte files, non-images and missing files raise
  :class:`BadImageError` with a short reason. A decoder *warning* is an error too (PIL's warnings
  other than the harmless palette-transparency and EXIF ones), and a JPEG whose last scan has no
  end marker is "truncated" even where libjpeg would pad it with grey ("premature end").
* Huge images: sizes are checked before anything is decoded. A PNG (or any non-JPEG) whose header
  exceeds ``max_pixels`` is refused. JPEGs are decoded in draft mode (the DCT decodes at 1/2, 1/4
  or 1/8 scale while still covering the resize target), so a 20,000-px JPEG costs about as much
  as a 2,500-px one and is kept when its draft size is within ``max_pixels``; a JPEG header
  beyond ``JPEG_HEADER_FACTOR`` × ``max_pixels`` (a 60000×60000 "bomb") is refused outright.
* EXIF orientation is not applied (as in torchvision/open_clip preprocessing).

Draft decoding is a small deviation from a full decode + resize (a different, block-wise
downscale); ``extra.decode`` in the manifest records which decoder produced a feature set.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as tvf

from pipeline.teachers.base import ImagePreprocess

#: PIL's own warning threshold (≈ 89.5 Mpx, a 9,459² image), applied to the size decoded
DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
#: recorded in the manifest extra as the decoder of a feature set
CPU_DECODER = "pil-draft"
#: a JPEG header may claim up to this many times ``max_pixels`` (draft decoding shrinks it);
#: beyond that (e.g. a 60000x60000 header) the file is refused before any decoding
JPEG_HEADER_FACTOR = 16


class BadImageError(Exception):
    """An image that cannot be decoded; ``reason`` is short and stable (goes into errors.jsonl)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_image(
    path: str | Path, preprocess: ImagePreprocess, max_pixels: int = DEFAULT_MAX_PIXELS
) -> torch.Tensor:
    """Decode, convert to RGB, resize the short side to ``preprocess.resize``, centre-crop."""
    image = open_rgb(path, preprocess.resize, max_pixels)
    interpolation = InterpolationMode[preprocess.interpolation.upper()]
    image = tvf.resize(image, preprocess.resize, interpolation=interpolation)
    image = tvf.center_crop(image, preprocess.crop)
    return tvf.pil_to_tensor(image)


def open_rgb(
    path: str | Path, short_side: int, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Image.Image:
    """The fully loaded RGB image, decoded no larger than needed for ``short_side`` (JPEG draft)."""
    path = Path(path)
    if not path.is_file():
        raise BadImageError("missing file")
    if path.stat().st_size == 0:
        raise BadImageError("empty file")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            image = _load_rgb(path, short_side, max_pixels)
        serious = [str(w.message) for w in caught if not _harmless(str(w.message))]
        if serious:
            raise BadImageError(f"corrupt image: decoder warning: {_first_line(serious[0])}")
        return image
    except BadImageError:
        raise
    except UnidentifiedImageError:
        raise BadImageError("not a readable image") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise BadImageError(f"corrupt image: {_first_line(exc)}") from None


_HARMLESS_WARNINGS = ("Palette images with Transparency", "EXIF", "Exif")


def _harmless(message: str) -> bool:
    return any(marker in message for marker in _HARMLESS_WARNINGS)


def _load_rgb(path: Path, short_side: int, max_pixels: int) -> Image.Image:
    previous_limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # our own limit below, on the header, replaces PIL's
    try:
        with Image.open(path) as image:
            width, height = image.size
            header_limit = max_pixels * (JPEG_HEADER_FACTOR if image.format == "JPEG" else 1)
            if width * height > header_limit:
                raise BadImageError(
                    f"image too large: {width}x{height} in the header = "
                    f"{width * height / 1e6:.1f} Mpx > {header_limit / 1e6:.1f} Mpx limit "
                    "(--max-pixels); not decoded"
                )
            if image.format == "JPEG":
                image.draft("RGB", _draft_size(image.size, short_side))
                draft_width, draft_height = image.size  # draft() sets the scale, decodes nothing
                if draft_width * draft_height > max_pixels:
                    raise BadImageError(
                        f"image too large: {width}x{height} decodes at {draft_width}x"
                        f"{draft_height} > {max_pixels / 1e6:.1f} Mpx limit (--max-pixels)"
                    )
            if image.format == "JPEG" and not jpeg_intact(path, width, height):
                raise BadImageError("corrupt image: truncated JPEG (premature end of data)")
            image.load()
            return to_rgb(image)
    finally:
        Image.MAX_IMAGE_PIXELS = previous_limit


def to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB; high-bit-depth modes are rescaled first (``convert`` would clip them)."""
    if image.mode.startswith("I;16") or image.mode == "I":
        values = np.asarray(image, dtype=np.float64) / 257.0
        image = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        values = np.asarray(image, dtype=np.float64)
        if not np.isfinite(values).all():
            raise BadImageError("corrupt image: NaN or Inf pixel values")
        scale = 255.0 if values.size and values.max() <= 1.0 else 1.0
        image = Image.fromarray(np.clip(np.rint(values * scale), 0, 255).astype(np.uint8), "L")
    return image.convert("RGB")


def jpeg_intact(path: Path, width: int, height: int) -> bool:
    """False for a JPEG that libjpeg would finish with a "premature end" warning (and grey
    padding), which PIL does not report: checked before decoding.

    * its last scan must end with an EOI marker (0xFFD9 after the last SOS; scan data
      byte-stuffs 0xFF, and an EXIF thumbnail's EOI comes before the main image's SOS);
    * the scan data must hold at least one bit per 8×8 luma block (every block codes at least
      a DC value), so a header claiming far more pixels than the data can hold is refused."""
    data = path.read_bytes()
    first_scan, last_scan = data.find(b"\xff\xda"), data.rfind(b"\xff\xda")
    if last_scan < 0 or data.rfind(b"\xff\xd9") < last_scan:
        return False
    blocks = -(-width // 8) * -(-height // 8)
    return (len(data) - first_scan) * 8 >= blocks


def _draft_size(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """The smallest size draft may decode to: short side still ≥ the resize target."""
    width, height = size
    scale = short_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---- DataLoader side -------------------------------------------------------------------------

#: recorded in the manifest extra for sets decoded with ``--decode gpu``
GPU_DECODER = "nvjpeg"
_JPEG_MAGIC = b"\xff\xd8\xff"


class DecodeDataset(torch.utils.data.Dataset):
    """Row ``i`` → ``(i, pixels or None, reason or None)``: bad images come back as data, so one
    broken file never kills a worker.

    With ``decode="gpu"`` a JPEG within ``max_pixels`` is returned as its raw bytes (1-D uint8)
    for nvJPEG on the main process; everything else is decoded here as usual.
    """

    def __init__(
        self, paths: list[str], preprocess: ImagePreprocess, max_pixels: int, decode: str = "cpu"
    ) -> None:
        self.paths = paths
        self.preprocess = preprocess
        self.max_pixels = max_pixels
        self.decode = decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, row: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            if self.decode == "gpu" and self._is_small_jpeg(self.paths[row]):
                return (
                    row,
                    torch.frombuffer(
                        bytearray(Path(self.paths[row]).read_bytes()), dtype=torch.uint8
                    ),
                    None,
                )
            return row, decode_image(self.paths[row], self.preprocess, self.max_pixels), None
        except BadImageError as exc:
            return row, None, exc.reason

    def decode_on_cpu(self, row: int) -> torch.Tensor:
        return decode_image(self.paths[row], self.preprocess, self.max_pixels)

    def _is_small_jpeg(self, path: str) -> bool:
        try:
            with open(path, "rb") as f:
                if f.read(3) != _JPEG_MAGIC:
                    return False
            with Image.open(path) as image:  # header only
                small = image.width * image.height <= self.max_pixels  # nvJPEG: no draft
            return small and jpeg_intact(
                Path(path), image.width, image.height
            )  # else the CPU path names the problem
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
            return False  # let the CPU path produce the precise error


def collate_decoded(items: list[tuple[int, torch.Tensor | None, str | None]]):
    """``(rows, decoded, reasons)``: ``decoded`` is a stacked uint8 batch of the good rows (CPU
    decode) or a list of ``(row, tensor)`` when raw JPEG bytes are among them (GPU decode)."""
    rows = [row for row, _, _ in items]
    reasons = {row: reason for row, _, reason in items if reason is not None}
    good = [(row, pixels) for row, pixels, _ in items if pixels is not None]
    if any(pixels.dim() == 1 for _, pixels in good):
        return rows, good, reasons
    if not good:
        return rows, torch.empty(0, dtype=torch.uint8), reasons
    return rows, torch.stack([pixels for _, pixels in good]), reasons


def gpu_decode_batch(
    decoded, rows: list[int], dataset: DecodeDataset, device: torch.device
) -> tuple[torch.Tensor, dict[int, str]]:
    """nvJPEG-decode the raw JPEGs of a batch on ``device``, resize + crop there, and stack with
    the rows the workers already decoded. A JPEG nvJPEG rejects is retried on the CPU decoder,
    so only files no decoder can read are reported."""
    if isinstance(decoded, torch.Tensor):
        return decoded.to(device, non_blocking=True), {}
    from torchvision.io import ImageReadMode, decode_jpeg

    ready: dict[int, torch.Tensor] = {}
    reasons: dict[int, str] = {}
    raw = [(row, data) for row, data in decoded if data.dim() == 1]
    ready.update({row: px.to(device, non_blocking=True) for row, px in decoded if px.dim() == 3})
    try:
        images = decode_jpeg([d for _, d in raw], mode=ImageReadMode.RGB, device=device)
        ready.update(
            {
                row: _crop_on_device(img, dataset.preprocess)
                for (row, _), img in zip(raw, images, strict=True)
            }
        )
    except RuntimeError:  # one bad file fails the whole batch call: retry one by one
        for row, _ in raw:
            try:
                ready[row] = dataset.decode_on_cpu(row).to(device)
            except BadImageError as exc:
                reasons[row] = exc.reason
    order = [row for row in rows if row in ready]
    pixels = (
        torch.stack([ready[row] for row in order]) if order else torch.empty(0, dtype=torch.uint8)
    )
    return pixels, reasons


def _crop_on_device(image: torch.Tensor, preprocess: ImagePreprocess) -> torch.Tensor:
    interpolation = InterpolationMode[preprocess.interpolation.upper()]
    image = tvf.resize(image, preprocess.resize, interpolation=interpolation, antialias=True)
    return tvf.center_crop(image, preprocess.crop)
