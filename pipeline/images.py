"""Worker-side image decoding: file → ``uint8 [3, crop, crop]`` (resize short side, centre crop).

One decoder: Pillow (libjpeg-turbo for JPEG) in the DataLoader workers, on the CPU. It returns
``uint8`` (4× cheaper to pin and copy than float); the teacher normalises on its own device.

Policy for awkward inputs (valid images are kept, only undecodable ones are errors):

* CMYK, grayscale, palette and alpha images are converted to RGB with PIL's ``convert("RGB")`` and
  kept. Alpha is dropped, not composited — the same as torchvision/open_clip preprocessing, so
  features match what the teachers saw in training. High-bit-depth modes are rescaled to 8 bits
  first (PIL's own conversion clips them): ``I;16*`` and ``I`` (16-bit PNG/TIFF) by 1/257, ``F``
  from [0, 1] (or clipped to [0, 255] when its values exceed 1).
* Truncated or corrupt files, zero-byte files, non-images and missing files raise
  :class:`BadImageError` with a short reason. A decoder *warning* is an error too (PIL's warnings
  other than the harmless palette-transparency and EXIF ones).
* A JPEG cut short is "truncated", also where libjpeg would pad it with grey and only warn
  ("premature end of data segment" — a warning Pillow drops): its marker segments are walked to
  the end-of-image marker (none after the last scan: truncated), its scan data must hold at
  least one bit per 8×8 block, and the decode itself proves every scan complete (see
  :func:`load_jpeg`). The checked pixels are exactly those of a plain Pillow decode.
* Huge images: sizes are checked before anything is decoded. A PNG (or any non-JPEG) whose header
  exceeds ``max_pixels`` is refused. JPEGs are decoded in draft mode (the DCT decodes at 1/2, 1/4
  or 1/8 scale while still covering the resize target), so a 20,000-px JPEG costs about as much
  as a 2,500-px one and is kept when its draft size is within ``max_pixels``; a JPEG header
  beyond ``JPEG_HEADER_FACTOR`` × ``max_pixels`` (a 60000x60000 "bomb") is refused outright.
* EXIF orientation is not applied (as in torchvision/open_clip preprocessing).

Draft decoding is a small deviation from a full decode + resize (a different, block-wise
downscale); ``extra.decode`` in the manifest records which decoder produced a feature set.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass
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
            header_limit = max_pixels * (JPEG_HEADER_FACTOR if image.format in JPEG_FORMATS else 1)
            if width * height > header_limit:
                raise BadImageError(
                    f"image too large: {width}x{height} in the header = "
                    f"{width * height / 1e6:.1f} Mpx > {header_limit / 1e6:.1f} Mpx limit "
                    "(--max-pixels); not decoded"
                )
            if image.format not in JPEG_FORMATS:
                image.load()
                return to_rgb(image)
        return to_rgb(load_jpeg(path.read_bytes(), short_side, max_pixels))
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


# ---- JPEG: truncation proven on the decode path ----------------------------------------------

#: the JPEG family Pillow opens (MPO: a JPEG with more frames after it, e.g. phone photos)
JPEG_FORMATS = ("JPEG", "MPO")
TRUNCATED_JPEG = "corrupt image: truncated JPEG (premature end of data)"
#: put after a scan's data. A complete scan skips it as junk before the next marker; a short one
#: has to decode it as entropy-coded data. 8 bytes cover libjpeg-turbo's read-ahead (57 bits);
#: 0xFE (seven one-bits, then a zero) makes long or invalid Huffman codes, so the filler finishes
#: as few missing blocks as possible (measured on coco_mini: best of 0xFE, 0x00, 0x55, 0xAA,
#: stuffed 0xFF).
SCAN_FILLER = b"\xfe" * 8
#: 0xFF and a marker code: not a stuffed zero, a restart marker or a fill byte
_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
#: frame headers of DCT images Pillow decodes (baseline, extended, progressive; Huffman or
#: arithmetic): their scans must cover every coefficient of every component
_DCT_FRAMES = {0xC0: False, 0xC1: False, 0xC2: True, 0xC9: False, 0xCA: True}
_OTHER_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC} - set(_DCT_FRAMES)
_SOS, _EOI = 0xDA, 0xD9


@dataclass(frozen=True)
class JpegLayout:
    """Where a JPEG's parts lie: every scan's entropy-coded data (start, end), the end-of-image
    marker, the frame's size and whether it is progressive."""

    scans: tuple[tuple[int, int], ...]
    end: int  # offset of the EOI marker
    width: int
    height: int
    progressive: bool


def jpeg_layout(data: bytes) -> JpegLayout:
    """Walk the marker segments to the end-of-image marker. :class:`BadImageError` when the
    data ends first, a segment is malformed, or the scans leave a coefficient of a component
    unfinished (a progressive file missing its last scans). Junk between segments is skipped,
    as libjpeg does."""
    pos, scans, frame, unfinished = 2, [], None, {}
    while True:
        pos = data.find(b"\xff", pos)
        while 0 <= pos < len(data) - 1 and data[pos + 1] == 0xFF:
            pos += 1  # fill bytes before a marker
        if pos < 0 or pos + 1 >= len(data):
            raise BadImageError(TRUNCATED_JPEG)
        code = data[pos + 1]
        if code == _EOI:
            break
        if code in (0x00, 0x01) or 0xD0 <= code <= 0xD7:  # no length: stuffing, TEM, RSTn
            pos += 2
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        segment = data[pos + 4 : pos + 2 + length]
        if length < 2 or len(segment) < length - 2:
            raise BadImageError(TRUNCATED_JPEG if length >= 2 else "corrupt image: bad JPEG marker")
        pos += 2 + length
        if (code in _DCT_FRAMES or code in _OTHER_FRAMES) and frame is None:
            frame, unfinished = _frame(segment, code)
        elif code == _SOS:
            _cover(unfinished, segment)
            scans.append((pos, _scan_end(data, pos)))
            pos = scans[-1][1]
    if frame is None or not scans:
        raise BadImageError("corrupt image: JPEG without a frame header or scan")
    if any(unfinished.values()):
        raise BadImageError("corrupt image: truncated JPEG (its last scans are missing)")
    return JpegLayout(tuple(scans), pos, *frame)


def _scan_end(data: bytes, start: int) -> int:
    """Where the entropy-coded data starting at ``start`` ends: at the next marker, before the
    fill bytes (0xFF) that may precede it."""
    marker = _MARKER.search(data, start)
    end = marker.start() if marker else len(data)
    while end > start and data[end - 1] == 0xFF:
        end -= 1
    return end


def _frame(segment: bytes, code: int) -> tuple[tuple[int, int, bool], dict[int, set[int]]]:
    """``(width, height, progressive)`` of a frame header, and for a DCT frame the coefficients
    (0..63) every component still needs a final scan for."""
    if len(segment) < 6 or len(segment) < 6 + 3 * segment[5]:
        raise BadImageError("corrupt image: bad JPEG frame header")
    height, width = int.from_bytes(segment[1:3], "big"), int.from_bytes(segment[3:5], "big")
    components = [segment[6 + 3 * i] for i in range(segment[5])]
    unfinished = {c: set(range(64)) for c in components} if code in _DCT_FRAMES else {}
    return (width, height, _DCT_FRAMES.get(code, False)), unfinished


def _cover(unfinished: dict[int, set[int]], segment: bytes) -> None:
    """Strike the coefficients a scan header finishes (its spectral band at full precision)."""
    count = segment[0] if segment else 0
    if len(segment) < 4 + 2 * count:
        raise BadImageError("corrupt image: bad JPEG scan header")
    band_start, band_end, point = segment[1 + 2 * count : 4 + 2 * count]
    if point & 0x0F == 0:  # Al = 0: the last successive-approximation step
        for component in segment[1 : 1 + 2 * count : 2]:
            unfinished.get(component, set()).difference_update(range(band_start, band_end + 1))


def load_jpeg(data: bytes, short_side: int, max_pixels: int) -> Image.Image:
    """The loaded JPEG (draft-decoded for ``short_side``), or :class:`BadImageError` if a scan
    ends before its last block — which libjpeg would pad with grey and only warn about.

    A single-scan JPEG is decoded from its bytes cut right after the scan data, followed by
    :data:`SCAN_FILLER` and no end marker: a complete scan never reads the filler as data and
    finishes; a short one decodes it, then runs out of data, which Pillow reports as truncated.
    One decode, the pixels of a plain decode. The filler can finish a block or two of a scan
    that lacks only those (on coco_mini every cut of 24 bytes or more is caught). A multi-scan
    (progressive) JPEG needs its end marker to be decoded at all, so it is decoded a second time
    with the filler after every scan: a short scan decodes the filler instead of zero bits and
    the pixels differ. That compare sees what the decode uses: drafted to 1/2–1/8 scale, a
    progressive file whose cut lost only coefficients the scaled DCT drops passes, with the
    pixels a complete file gives at that scale. Scans missing as a whole are caught by
    :func:`jpeg_layout`."""
    layout = jpeg_layout(data)
    blocks = -(-layout.width // 8) * -(-layout.height // 8)
    if (layout.end - layout.scans[0][0]) * 8 < blocks:  # not even one bit per block
        raise BadImageError(TRUNCATED_JPEG)
    if len(layout.scans) == 1 and not layout.progressive:
        return _decode_jpeg(data[: layout.scans[0][1]] + SCAN_FILLER, short_side, max_pixels)
    image = _decode_jpeg(data[: layout.end + 2], short_side, max_pixels)
    bounds = [0, *(end for _, end in layout.scans), layout.end + 2]
    parts = [data[start:stop] for start, stop in zip(bounds, bounds[1:], strict=False)]
    check = _decode_jpeg(SCAN_FILLER.join(parts), short_side, max_pixels)
    if not np.array_equal(np.asarray(image), np.asarray(check)):
        raise BadImageError(TRUNCATED_JPEG)
    return image


def _decode_jpeg(data: bytes, short_side: int, max_pixels: int) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    image.draft("RGB", _draft_size(image.size, short_side))
    draft_width, draft_height = image.size  # draft() sets the scale, decodes nothing
    if draft_width * draft_height > max_pixels:
        raise BadImageError(
            f"image too large: {width}x{height} decodes at {draft_width}x"
            f"{draft_height} > {max_pixels / 1e6:.1f} Mpx limit (--max-pixels)"
        )
    try:
        image.load()
    except OSError as exc:
        if str(exc).startswith(("image file is truncated", "Truncated File Read")):
            raise BadImageError(TRUNCATED_JPEG) from None
        raise
    return image


def _draft_size(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """The smallest size draft may decode to: short side still ≥ the resize target."""
    width, height = size
    scale = short_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# ---- DataLoader side -------------------------------------------------------------------------


class DecodeDataset(torch.utils.data.Dataset):
    """Row ``i`` → ``(i, pixels or None, reason or None)``: bad images come back as data, so one
    broken file never kills a worker."""

    def __init__(self, paths: list[str], preprocess: ImagePreprocess, max_pixels: int) -> None:
        self.paths = paths
        self.preprocess = preprocess
        self.max_pixels = max_pixels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, row: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            return row, decode_image(self.paths[row], self.preprocess, self.max_pixels), None
        except BadImageError as exc:
            return row, None, exc.reason


def collate_decoded(items: list[tuple[int, torch.Tensor | None, str | None]]):
    """``(rows, pixels, reasons)``: ``pixels`` is the stacked uint8 batch of the good rows."""
    rows = [row for row, _, _ in items]
    reasons = {row: reason for row, _, reason in items if reason is not None}
    good = [pixels for _, pixels, _ in items if pixels is not None]
    if not good:
        return rows, torch.empty(0, dtype=torch.uint8), reasons
    return rows, torch.stack(good), reasons
