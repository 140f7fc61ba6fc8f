"""The ``extract`` and ``text`` sections of ``mmcse bench all``: where Stage-1 time goes — JPEG
decoding, the teacher, or both.

Three image rates from one run, so the bottleneck is visible:

* ``decode``: synthetic Flickr-sized JPEGs (500×375) decoded, resized and cropped by the
  engine's own DataLoader path (:class:`pipeline.images.DecodeDataset`, worker processes);
* ``teacher``: random uint8 crops already on the device through ``encode_images``;
* ``end-to-end``: both, as ``extract-images`` runs them (decode in workers, copy, teacher).

Text teachers (and CLIP's text tower) report sentences/s over synthetic captions. Teachers use
random weights at their real size: speed does not depend on the weights, and nothing is
downloaded. Rates are steady-state: the first batch (worker start-up, allocator and kernel
warm-up) is excluded from the timing.
"""

from __future__ import annotations

import logging
import random
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from mmcse.bench.timing import steady_rate, timed
from pipeline.teachers import build_teacher

logger = logging.getLogger(__name__)

FLICKR_SIZE = (500, 375)  # width, height: the typical Flickr30k/COCO photo
#: vocabulary of the synthetic captions (space-separated)
CAPTION_WORDS = (
    "a man woman child dog people group two young old wearing shirt red blue standing sitting "
    "walking running street water beach grass field holding playing ball front of in on with "
    "at the while next to near small large white black green"
)


def write_synthetic_jpegs(folder: Path, count: int) -> list[str]:
    """Photo-like JPEGs: smooth colour fields plus grain (pure noise would compress, and
    decode, far worse than real photos)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    width, height = FLICKR_SIZE
    paths = []
    for i in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
        smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), np.int16)
        grain = rng.integers(-12, 13, smooth.shape, dtype=np.int16)
        image = Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))
        path = folder / f"{i:06d}.jpg"
        image.save(path, quality=90)
        paths.append(str(path))
    return paths


def synthetic_captions(count: int) -> list[str]:
    rng, words = random.Random(0), CAPTION_WORDS.split()
    return [" ".join(rng.choices(words, k=rng.randint(8, 24))) + " ." for _ in range(count)]


def image_loader(paths: list[str], teacher, batch_size: int, num_workers: int):
    from torch.utils.data import DataLoader

    from pipeline.images import DEFAULT_MAX_PIXELS, DecodeDataset, collate_decoded

    return DataLoader(
        DecodeDataset(paths, teacher.preprocess, DEFAULT_MAX_PIXELS),
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_decoded,
        pin_memory=teacher.device.type == "cuda",
    )


def decode_batches(loader) -> Iterable[int]:
    for _, pixels, _ in loader:
        yield len(pixels)


def teacher_batches(teacher, count: int, batch_size: int) -> Iterable[int]:
    crop = teacher.preprocess.crop
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(
        0, 256, (batch_size, 3, crop, crop), dtype=torch.uint8, generator=generator
    )
    pixels = pixels.to(teacher.device)
    for start in range(0, count, batch_size):
        batch = pixels[: min(batch_size, count - start)]
        teacher.encode_images(batch)
        yield len(batch)


def end_to_end_batches(teacher, loader) -> Iterable[int]:
    for _, pixels, _ in loader:
        teacher.encode_images(pixels.to(teacher.device, non_blocking=True)).cpu()
        yield len(pixels)


def text_rate(teacher, sentences: list[str]) -> float:
    """Sentences/s of one ``encode_texts`` call over all of them (its length-sorted batching
    included), after a one-batch warm-up."""
    teacher.encode_texts(sentences[: teacher.batch_size])
    return len(sentences) / timed(lambda: teacher.encode_texts(sentences), teacher.device)


def run_extract_bench(
    teacher_name: str = "resnet50",
    device: str = "cpu",
    images: int = 64,
    batch_size: int = 16,
    num_workers: int = 2,
    size: str = "real",
    sentences: int = 512,
) -> dict[str, float]:
    """Measure the rates; returns them by name (images/s, sentences/s)."""
    teacher = build_teacher(teacher_name, weights="random", device=device, size=size)
    logger.info(
        f"teacher {teacher_name} (random weights, {size} size, dim {teacher.dim}) on "
        f"{teacher.device}, compute {str(teacher.compute_dtype).removeprefix('torch.')}, "
        f"torch threads {torch.get_num_threads()}"
    )
    rates: dict[str, float] = {}
    if hasattr(teacher, "encode_images"):
        rates.update(image_rates(teacher, images, batch_size, num_workers))
    if hasattr(teacher, "encode_texts"):
        rates["text"] = text_rate(teacher, synthetic_captions(sentences))
    return rates


def image_rates(teacher, images: int, batch_size: int, num_workers: int) -> dict[str, float]:
    width, height = FLICKR_SIZE
    logger.info(
        f"{images} synthetic {width}x{height} JPEGs, batch {batch_size}, {num_workers} decode "
        f"workers, crop {teacher.preprocess.crop}"
    )
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-") as folder:
        paths = write_synthetic_jpegs(Path(folder), images)
        loader = image_loader(paths, teacher, batch_size, num_workers)
        device = teacher.device
        rates = {
            "decode": steady_rate(decode_batches(loader)),
            "teacher": steady_rate(teacher_batches(teacher, images, batch_size), device),
            "end-to-end": steady_rate(end_to_end_batches(teacher, loader), device),
        }
    return rates
