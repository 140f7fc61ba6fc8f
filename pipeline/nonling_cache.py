"""Stage 1 for VisualCSE/AudioCSE: cache unpaired images as uint8 tensors and audio as fbanks.

Training then decodes nothing: a step gathers rows of a memory-mapped feature set.

* ``image_tensor`` sets: rows ``[3, S, S]`` uint8 (S = 256 by default: short side resized to S,
  bilinear with antialiasing, centre crop), from any class-per-folder tree (an ImageNet train
  dir or a class subset of it: the exact file list the authors released — shipped,
  :data:`RELEASED_LISTS` — or another list, or a random ``classes × per_class`` subset as the
  paper's 60 × 500) or CIFAR-10/100 python pickle batches
  (32 px, enlarged like the paper's App. F).
* ``audio_fbank`` sets: rows ``[1024, 128]`` (float16 by default) Kaldi log-mel filterbanks of
  the mean-removed waveform, SSAST's preprocessing (:mod:`pipeline.fbank`), from WAV files
  in a class-per-folder tree (e.g. LibriSpeech converted to WAV, class = speaker). A
  ``classes``-subset of it is by default AudioCSE's released rule, the classes with the most
  files (:func:`most_files_classes`); ``by="random"`` draws them at random.

Labels: every id is ``<class>/<name>`` and the manifest's ``extra["classes"]`` lists the class
names in label order (sorted; audio: by default the released first-appearance order,
:func:`numbered_classes`); the trainer derives labels from the ids (:func:`mmcse.cache.kinds.class_of`), so
labels are joined by id like every other cached value and need no second table.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmcse.cache import FeatureSetWriter, Manifest
from mmcse.cache.kinds import AUDIO_FBANK_KIND, IMAGE_TENSOR_KIND, class_of
from mmcse.errors import MmcseError
from pipeline.datasets.base import inside, read_text
from pipeline.fbank import FbankConfig, read_wav, ssast_fbank
from pipeline.images import BadImageError, open_rgb
from pipeline.shards import ShardPlan, run_shards

logger = logging.getLogger(__name__)

FULL_RESOLUTION = 1 << 30  # open_rgb's short side: no draft downscaling

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
AUDIO_SUFFIXES = {".wav"}
PRODUCER = "mmcse.pipeline.nonling_cache"
#: file lists shipped with mmcse, by the name ``--list`` accepts (``pipeline/data/README.md``):
#: ``visualcse`` = the released ``VisualCSE/sampled-Imagenet.txt``, 60 classes × 500 images
RELEASED_LISTS = {"visualcse": Path(__file__).parent / "data" / "visualcse-sampled-imagenet.txt.gz"}
#: how ``class_folder`` picks ``max_classes`` classes: the most files first (AudioCSE's released
#: ``prep_librispeech.py`` + ``trainers.py``: the top-50 speakers), or a seeded random draw
CLASS_PICKS = ("most", "random")
#: how classes are numbered (label i = the i-th): ``walk`` — first met by ``os.walk``, AudioCSE's
#: released ``prep_librispeech.py`` — or ``sorted`` by name (torchvision's ``ImageFolder``)
CLASS_NUMBERINGS = ("walk", "sorted")


@dataclass(frozen=True)
class Example:
    """One item to cache: ``id`` is ``<class>/<name>``; ``source`` a file or decoded pixels."""

    id: str
    source: Path | np.ndarray


# -- listing -----------------------------------------------------------------------------------
def class_folder(
    root: str | Path,
    suffixes: set[str],
    max_classes: int | None = None,
    per_class: int | None = None,
    seed: int = 0,
    by: str = "random",
) -> list[Example]:
    """Files under ``root/<class>/**`` with one of ``suffixes``; optionally ``max_classes``
    classes — ``by="random"``: a seeded random subset; ``"most"``: :func:`most_files_classes` —
    and a seeded random subset of ``per_class`` files each (sorted, reproducible)."""
    root = Path(root)
    if not root.is_dir():
        raise MmcseError(f"{root}: no such folder (expected one sub-folder per class)")
    if by not in CLASS_PICKS:
        raise MmcseError(f"the class pick must be one of {', '.join(CLASS_PICKS)}, not {by!r}")
    rng = np.random.default_rng(seed)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if max_classes is not None and max_classes < len(classes):
        if by == "most":
            classes = sorted(most_files_classes(root, suffixes, max_classes))
        else:
            classes = sorted(rng.choice(classes, size=max_classes, replace=False).tolist())
    examples = []
    for name in classes:
        files = sorted(
            p for p in (root / name).rglob("*") if p.suffix.lower() in suffixes and p.is_file()
        )
        if per_class is not None and per_class < len(files):
            files = sorted(rng.choice(np.array(files, dtype=object), per_class, replace=False))
        examples += [Example(_id_of(root, f), f) for f in files]
    if not examples:
        kinds = ", ".join(sorted(suffixes))
        raise MmcseError(f"{root}: no {kinds} files in class sub-folders")
    return examples


def most_files_classes(root: str | Path, suffixes: set[str], k: int) -> list[str]:
    """The ``k`` classes of ``root/<class>/**`` with the most files, AudioCSE's released rule:
    ``prep_librispeech.py`` counts each speaker's utterances in ``os.walk`` order and sorts
    ``sorted(counts.items(), key=count, reverse=True)`` — stable, so equal counts keep the order
    in which ``os.walk`` first met each class (the file system's listing order, as in the released
    run) — and ``trainers.py:481`` keeps the first ``top_classes`` = 50. A tie across the cut is
    logged, since another file system may list the tied classes in another order."""
    counts = walk_counts(root, suffixes)
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    if k < len(ranked) and ranked[k - 1][1] == ranked[k][1]:
        tied = [name for name, n in ranked if n == ranked[k][1]]
        logger.warning(
            f"{root}: classes {tied} have {ranked[k][1]} files each and straddle the top-{k} "
            "cut; kept in os.walk's listing order, as the released preparation does"
        )
    return [name for name, _ in ranked[:k]]


def walk_counts(root: str | Path, suffixes: set[str]) -> dict[str, int]:
    """Files per class of ``root/<class>/**``, in the order ``os.walk`` first meets each class
    (the dict's order: the file system's listing order, depth first)."""
    root = Path(root)
    counts: dict[str, int] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        parts = Path(folder).relative_to(root).parts
        if not parts or parts[0].startswith("."):
            continue  # files beside the class folders belong to no class
        found = sum(Path(f).suffix.lower() in suffixes for f in files)
        if found:
            counts[parts[0]] = counts.get(parts[0], 0) + found
    return counts


def numbered_classes(
    root: str | Path, suffixes: set[str], examples: Sequence[Example], numbering: str
) -> list[str]:
    """The classes of ``examples`` in label order (class ``i`` = label ``i``): ``sorted`` by
    name, or ``walk`` — AudioCSE's released numbering: ``prep_librispeech.py:35–36, 56, 65``
    lists speakers in the order ``os.walk`` first meets one of their files (``csv``
    ``display_name``), and ``trainers.py:489–494`` numbers the kept top speakers 0, 1, … in that
    order. The class-rank loss is not invariant to the numbering (its target is a class's rank
    among the batch's labels), so the released one is the default of ``extract-audio``."""
    if numbering not in CLASS_NUMBERINGS:
        raise MmcseError(f"the class numbering must be one of {', '.join(CLASS_NUMBERINGS)}")
    present = {class_of(e.id) for e in examples}
    if numbering == "sorted":
        return sorted(present)
    return [name for name in walk_counts(root, suffixes) if name in present]


def listed_files(root: str | Path, list_file: str | Path) -> list[Example]:
    """The files a list names (one path per line; its last two parts are ``class/file``, as in
    the authors' ``sampled-Imagenet.txt``), resolved under ``root``. ``list_file``: a path (gzip
    when it ends in ``.gz``) or a name of :data:`RELEASED_LISTS`."""
    root = Path(root)
    lines = [line.strip() for line in list_text(list_file).splitlines() if line.strip()]
    paths = [root.joinpath(*Path(line).parts[-2:]) for line in lines]
    outside = [line for line, path in zip(lines, paths, strict=True) if not inside(root, path)]
    if outside:
        raise MmcseError(f"{list_file}: {len(outside)} paths leave {root}, e.g. {outside[0]!r}")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MmcseError(f"{len(missing)} listed files are missing under {root}, e.g. {missing[0]}")
    return [Example(_id_of(root, p), p) for p in paths]


def list_text(list_file: str | Path) -> str:
    """The text of a list file, or of the shipped list of that name (:data:`RELEASED_LISTS`)."""
    path = RELEASED_LISTS.get(str(list_file), Path(list_file))
    if not path.is_file():
        shipped = ", ".join(RELEASED_LISTS)
        raise MmcseError(f"{list_file}: no such list file (shipped lists: {shipped})")
    if path.suffix != ".gz":
        return read_text(path)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


def cifar_batches(root: str | Path, split: str = "train") -> list[Example]:
    """CIFAR-10 (``data_batch_*`` / ``test_batch``) or CIFAR-100 (``train`` / ``test``) python
    pickles in ``root``; ids are ``<label name>/<file>-<index>``."""
    root = Path(root)
    if (root / "batches.meta").exists():
        names = _unpickle(root / "batches.meta")[b"label_names"]
        files = sorted(root.glob("data_batch_*")) if split == "train" else [root / "test_batch"]
        label_key = b"labels"
    elif (root / "meta").exists():
        names = _unpickle(root / "meta")[b"fine_label_names"]
        files, label_key = [root / split], b"fine_labels"
    else:
        raise MmcseError(f"{root}: not a CIFAR python folder (no batches.meta or meta)")
    names = [n.decode() for n in names]
    examples = []
    for file in files:
        if not file.is_file():
            raise MmcseError(f"{file}: missing CIFAR batch for split {split!r}")
        batch = _unpickle(file)
        pixels = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        for i, (image, label) in enumerate(zip(pixels, batch[label_key], strict=True)):
            examples.append(
                Example(f"{names[label]}/{file.name}-{i:05d}", image.transpose(1, 2, 0))
            )
    return examples


# -- decoding ----------------------------------------------------------------------------------
def resize_center_crop(image: Any, size: int) -> np.ndarray:
    """A PIL image or HWC uint8 array → ``[3, size, size]`` uint8 (short side to ``size``)."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image = image.convert("RGB")
    scale = size / min(image.size)
    width, height = max(size, round(image.width * scale)), max(size, round(image.height * scale))
    image = image.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (width - size) // 2, (height - size) // 2
    image = image.crop((left, top, left + size, top + size))
    return np.asarray(image, dtype=np.uint8).transpose(2, 0, 1).copy()


def image_row(example: Example, size: int) -> np.ndarray:
    if isinstance(example.source, np.ndarray):
        return resize_center_crop(example.source, size)

    try:  # Stage 1's checked decode (size limits, truncation, 16-bit modes), at full resolution
        image = open_rgb(example.source, FULL_RESOLUTION)
    except BadImageError as exc:
        raise MmcseError(f"{example.source}: {exc.reason} (id {example.id})") from None
    return resize_center_crop(image, size)


def fbank_row(example: Example, cfg: FbankConfig, dtype: str = "float32") -> np.ndarray:
    waveform, rate = read_wav(example.source)
    return ssast_fbank(waveform, rate, cfg).numpy().astype(dtype)


# -- writing -----------------------------------------------------------------------------------
def write_image_tensors(
    examples: Sequence[Example],
    out: str | Path,
    *,
    dataset: str,
    split: str = "train",
    size: int = 256,
    shard_rows: int = 1024,
    workers: int = 2,
) -> Manifest:
    """Cache ``examples`` as an ``image_tensor`` set of ``[3, size, size]`` uint8 rows."""
    writer = FeatureSetWriter(
        out,
        kind=IMAGE_TENSOR_KIND,
        dim=3 * size * size,
        dtype="uint8",
        dataset=dataset,
        split=split,
        shape=[3, size, size],
        producer={
            "teacher": PRODUCER,
            "preprocessing": {
                "resize_short_side": size,
                "center_crop": size,
                "resample": "bilinear",
            },
        },
        extra=_class_extra(examples),
    )
    return _write(writer, examples, partial(image_row, size=size), shard_rows, workers, "images")


def write_audio_fbanks(
    examples: Sequence[Example],
    out: str | Path,
    *,
    dataset: str,
    split: str = "train",
    cfg: FbankConfig = FbankConfig(),
    dtype: str = "float16",
    shard_rows: int = 256,
    workers: int = 2,
    classes: Sequence[str] | None = None,
) -> Manifest:
    """Cache ``examples`` (WAV files) as an ``audio_fbank`` set of ``[frames, bins]`` rows;
    ``classes``: the label order (:func:`numbered_classes`; None: sorted names)."""
    shape = [cfg.target_frames, cfg.num_mel_bins]
    writer = FeatureSetWriter(
        out,
        kind=AUDIO_FBANK_KIND,
        dim=math.prod(shape),
        dtype=dtype,
        dataset=dataset,
        split=split,
        shape=shape,
        producer={
            "teacher": PRODUCER,
            "preprocessing": {"fbank": "kaldi (SSAST)", "dither": 0.0, **cfg.to_dict()},
        },
        extra=_class_extra(examples, classes),
    )
    row = partial(fbank_row, cfg=cfg, dtype=dtype)
    return _write(writer, examples, row, shard_rows, workers, "audio")


class _Rows(torch.utils.data.Dataset):
    """Decodes one example per item in DataLoader workers; failures come back as messages."""

    def __init__(self, examples: Sequence[Example], make_row: Callable[[Example], np.ndarray]):
        self.examples, self.make_row = examples, make_row

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray | None, str]:
        try:
            return i, self.make_row(self.examples[i]), ""
        except (OSError, ValueError, MmcseError) as exc:  # unreadable file: skip, count, report
            return i, None, f"{self.examples[i].id}: {exc}"


def _write(writer, examples, make_row, shard_rows, workers, what) -> Manifest:
    """Shard ``k`` holds examples ``k*shard_rows …``; finished shards are skipped on rerun."""
    if shard_rows < 1:
        raise MmcseError("--shard-rows must be positive")
    plan = ShardPlan(len(examples), shard_rows)
    errors: list[str] = []

    def rows_of(pending: list[int]) -> Iterator[tuple[int, list[int], tuple]]:
        for k in pending:
            part = examples[plan.rows(k).start : plan.rows(k).stop]
            loader = torch.utils.data.DataLoader(
                _Rows(part, make_row), batch_size=None, num_workers=workers, collate_fn=_identity
            )
            for i, row, error in loader:
                yield k, [plan.rows(k)[i]], (part[i].id, row, error)

    def write(k: int, rows: list[tuple]) -> None:
        errors.extend(error for _, row, error in rows if row is None)
        kept = [(id_, row) for id_, row, _ in rows if row is not None]
        if not kept:
            first = f"; first error: {errors[-1]}" if errors else ""
            raise MmcseError(f"no readable {what} in shard {k}{first}")
        writer.write_shard(k, [id_ for id_, _ in kept], np.stack([row for _, row in kept]))

    run_shards(
        plan,
        range(plan.num_shards),
        batch_size=1,
        done=writer.has_shard,
        batches=rows_of,
        write=write,
        desc=f"cache {what}",
        unit=what[:5],
    )
    if errors:
        logger.warning(f"skipped {len(errors)} unreadable {what}, e.g. {errors[0]}")
    return writer.finalize(extra={"examples_listed": len(examples)}, num_shards=plan.num_shards)


def _class_extra(examples: Sequence[Example], classes: Sequence[str] | None = None) -> dict:
    """The manifest's class list (label ``i`` = ``classes[i]``; sorted names unless given)."""
    classes = list(classes) if classes is not None else sorted({class_of(e.id) for e in examples})
    return {"classes": classes, "label_from": "id prefix before the first '/'"}


def _id_of(root: Path, path: Path) -> str:
    relative = path.relative_to(root).with_suffix("")
    if len(relative.parts) < 2:
        raise MmcseError(f"{path}: files must sit in a class sub-folder of {root}")
    return relative.as_posix()


def _unpickle(path: Path) -> dict:
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")


def _identity(x):
    return x
