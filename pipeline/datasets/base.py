"""What every dataset loader returns, the caption policies, and shared parsing helpers.

A loader turns files on disk into :class:`DatasetRecords`: image records (an image id, its path and
the image's captions in their original order) and/or plain sentences. Ids are stable: an image id
is the file stem (or the dataset's own id, e.g. the COCO id), and a caption id is
``f"{image_id}#{k}"`` with ``k`` the caption's index in the image's *original* list, so a caption
keeps its id whichever caption policy picks it. Rows a loader cannot read become
:class:`RecordError` entries (they end up in ``errors.jsonl``), never a crash.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.registry import Registry

DATASETS = Registry("dataset")

CAPTION_POLICIES = ("random-one", "all", "longest")


@dataclass(frozen=True)
class ImageRecord:
    image_id: str
    path: Path
    captions: tuple[str, ...]


@dataclass(frozen=True)
class Sentence:
    id: str
    text: str


@dataclass(frozen=True)
class RecordError:
    """A row or file left out: its id (or line reference), path and a human-readable reason."""

    id: str
    path: str
    reason: str

    def to_dict(self) -> dict:
        return {"id": self.id, "path": self.path, "reason": self.reason}


@dataclass
class DatasetRecords:
    dataset: str
    split: str
    images: list[ImageRecord] = field(default_factory=list)
    sentences: list[Sentence] = field(default_factory=list)
    errors: list[RecordError] = field(default_factory=list)
    #: where the captions came from (file name / format), recorded in the manifest extra
    source: str = ""


@dataclass(frozen=True)
class DataSource:
    """Where a dataset lives locally. Which fields a loader needs is in its docstring."""

    images: Path | None = None  # image root folder
    captions: Path | None = None  # caption/annotation file or folder
    split_file: Path | None = None  # list of image file names (or ids) in the split
    text: Path | None = None  # one-sentence-per-line file (text corpora)


Loader = Callable[[DataSource, str], DatasetRecords]


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    return DATASETS.register(name)


def load_dataset(name: str, source: DataSource, split: str) -> DatasetRecords:
    records = DATASETS.get(name)(source, split)
    if not records.images and not records.sentences:
        raise MmcseError(f"{name} split {split!r}: no records found (check the paths and split)")
    return records


def caption_id(image_id: str, k: int) -> str:
    return f"{image_id}#{k}"


def select_captions(record: ImageRecord, policy: str, seed: int) -> list[tuple[int, str]]:
    """The ``(k, caption)`` pairs a policy keeps for one image.

    ``random-one`` (MCSE) draws with a per-image generator seeded by ``(seed, image_id)``, so the
    choice does not depend on the order, sharding or subset of images. ``longest`` (MCSEO) keeps
    the longest caption by characters (first on ties); ``all`` (KDMCSE, DALR) keeps every caption.
    """
    indexed = list(enumerate(record.captions))
    if not indexed:
        return []
    if policy == "all":
        return indexed
    if policy == "longest":
        return [max(indexed, key=lambda kc: (len(kc[1]), -kc[0]))]
    if policy == "random-one":
        return [random.Random(f"{seed}:{record.image_id}").choice(indexed)]
    raise MmcseError(f"unknown caption policy {policy!r}; known: {', '.join(CAPTION_POLICIES)}")


def require_path(path: Path | None, what: str, dataset: str) -> Path:
    if path is None:
        raise MmcseError(f"{dataset}: {what} is required")
    if not path.exists():
        raise FileNotFoundError(f"{dataset}: {what} {path} does not exist")
    return path


def read_name_list(path: Path) -> list[str]:
    """A split list: one image file name or id per line (blank lines ignored)."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def image_stem(name: str) -> str:
    """``1000092795.jpg`` → ``1000092795``; an id without extension is returned unchanged."""
    return Path(name).stem if Path(name).suffix.lower() in IMAGE_SUFFIXES else name


IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def parse_token_file(path: Path) -> tuple[dict[str, list[str]], dict[str, str], list[RecordError]]:
    """Flickr ``*.token`` files: ``<file>.jpg#<k>\\t<caption>`` per line.

    Returns captions by image stem (in file order of ``k``), the file name per stem, and the rows
    that could not be parsed. Flickr8k's quirk ``2258277193_586949ec62.jpg.1#0`` is read as the
    ``.jpg`` file it names.
    """
    captions: dict[str, list[tuple[int, str]]] = {}
    file_names: dict[str, str] = {}
    errors: list[RecordError] = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            key, sep, caption = line.rstrip("\n").partition("\t")
            name, hash_sep, k = key.partition("#")
            if not sep or not hash_sep or not k.strip().isdigit() or not caption.strip():
                errors.append(RecordError(f"line {line_no}", str(path), "unreadable caption row"))
                continue
            name = name.split(".jpg")[0] + ".jpg" if ".jpg" in name else name
            stem = image_stem(name)
            file_names[stem] = name
            captions.setdefault(stem, []).append((int(k), caption.strip()))
    ordered = {stem: [c for _, c in sorted(pairs)] for stem, pairs in captions.items()}
    return ordered, file_names, errors


def records_from_split(
    split_names: Iterable[str],
    captions: dict[str, list[str]],
    file_names: dict[str, str],
    image_root: Path,
    split_path: Path,
) -> tuple[list[ImageRecord], list[RecordError]]:
    """Image records for the names in a split list; names without captions become errors."""
    records, errors = [], []
    for name in split_names:
        stem = image_stem(name)
        if stem not in captions:
            errors.append(RecordError(stem, str(split_path), "no captions for this image"))
            continue
        file_name = file_names.get(stem, name if Path(name).suffix else f"{name}.jpg")
        records.append(ImageRecord(stem, image_root / file_name, tuple(captions[stem])))
    return records, errors
