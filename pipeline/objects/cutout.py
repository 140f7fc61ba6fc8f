"""Cut a segmented object out of its image, and store masks as COCO run-length encodings.

MCSEO "equips detected objects with transparent backgrounds" (§4.1). A CNN teacher sees RGB, so
the transparent area must become some colour: ``mean`` (the teacher's normalisation mean, which
normalises to zero: the closest an RGB input gets to "no signal"), ``black`` or ``white``. The
choice is recorded in the manifest.

Geometry (the paper does not say): the object is cropped to its mask's bounding box, padded to a
square with the fill colour (so the teacher's centre crop never cuts the object and its aspect
ratio is kept), then resized to the teacher's input size.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from mmcse.errors import BadValueError

BACKGROUNDS = ("mean", "black", "white")


def fill_colour(background: str, mean: tuple[float, float, float]) -> tuple[int, int, int]:
    """RGB ``uint8`` colour for the transparent area."""
    if background == "mean":
        return tuple(round(255 * m) for m in mean)  # type: ignore[return-value]
    if background == "black":
        return (0, 0, 0)
    if background == "white":
        return (255, 255, 255)
    raise BadValueError(f"--background must be one of {', '.join(BACKGROUNDS)}, not {background!r}")


def mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """``(x0, y0, x1, y1)`` (exclusive ends) of a boolean ``[H, W]`` mask; ``None`` if empty."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return None
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def cut_out(
    image: np.ndarray, mask: np.ndarray, size: int, fill: tuple[int, int, int]
) -> torch.Tensor | None:
    """The masked object of ``image`` (``[H, W, 3]`` uint8) on ``fill``, as ``[3, size, size]``
    uint8; ``None`` when the mask is empty."""
    box = mask_bbox(mask)
    if box is None:
        return None
    x0, y0, x1, y1 = box
    crop = image[y0:y1, x0:x1]
    keep = mask[y0:y1, x0:x1, None]
    canvas_side = max(x1 - x0, y1 - y0)
    canvas = np.empty((canvas_side, canvas_side, 3), dtype=np.uint8)
    canvas[:] = fill
    top, left = (canvas_side - crop.shape[0]) // 2, (canvas_side - crop.shape[1]) // 2
    region = canvas[top : top + crop.shape[0], left : left + crop.shape[1]]
    region[:] = np.where(keep, crop, region)
    pixels = torch.from_numpy(canvas).permute(2, 0, 1)[None].float()
    resized = F.interpolate(pixels, size=(size, size), mode="bilinear", antialias=True)
    return resized[0].round().clamp(0, 255).to(torch.uint8)


def box_mask(height: int, width: int, box: list[float]) -> np.ndarray:
    """A rectangular mask (``--masks box``): the box itself, clipped to the image."""
    x0, y0, x1, y1 = (round(v) for v in box)
    mask = np.zeros((height, width), dtype=bool)
    mask[max(y0, 0) : max(min(y1, height), 0), max(x0, 0) : max(min(x1, width), 0)] = True
    return mask


def encode_rle(mask: np.ndarray) -> dict:
    """COCO uncompressed RLE: column-major run lengths, starting with a (possibly empty) run of 0s."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts = [0, *counts]
    return {"size": [int(mask.shape[0]), int(mask.shape[1])], "counts": counts}


def decode_rle(rle: dict) -> np.ndarray:
    """Inverse of :func:`encode_rle`: a boolean ``[H, W]`` mask."""
    height, width = rle["size"]
    values = np.arange(len(rle["counts"])) % 2 == 1
    flat = np.repeat(values, rle["counts"])
    if flat.size != height * width:
        raise ValueError(f"RLE counts cover {flat.size} pixels, size says {height * width}")
    return flat.reshape((height, width), order="F")
