"""What every dataset loader returns, the caption policies, and shared parsing helpers.

A loader turns files on disk into :class:`DatasetRecords`: image records (an image id, its path and
the image's captions in their original order) and/or plain sentences. Ids are stable: an image id
is the file stem (or the dataset's own id, e.g. the COCO id), and a caption id is
``f"{image_id}#{k}"`` with ``k`` the caption's index in the image's *original* list, so a caption
keeps its id whichever caption policy picks it. Rows a loader cannot read become
:class:`RecordError` entries (they end up in ``errors.jsonl``), never a crash.
"""

from __future__ import annotations

import logging
import os
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.registry import Registry
from mmcse.textfiles import read_text_lines

DATASETS = Registry("dataset")
logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class SplitInfo:
    """How a loader chose ``--split`` (checked by :func:`check_split`): by the split field its
    entries carry (``marks``: value → entries, ``""`` for unmarked ones), by a per-split file or
    list (``listed_by``), or -- neither -- not at all: the file carries no split, every entry
    was taken."""

    marks: dict[str, int] = field(default_factory=dict)
    listed_by: Path | None = None


@dataclass
class DatasetRecords:
    dataset: str
    split: str
    images: list[ImageRecord] = field(default_factory=list)
    sentences: list[Sentence] = field(default_factory=list)
    errors: list[RecordError] = field(default_factory=list)
    #: where the captions came from (file name / format), recorded in the manifest extra
    source: str = ""
    split_info: SplitInfo = field(default_factory=SplitInfo)


@dataclass(frozen=True)
class DataSource:
    """Where a dataset lives locally. Which fields a loader needs is in its docstring."""

    images: Path | None = None  # image root folder
    captions: Path | None = None  # caption/annotation file or folder
    split_file: Path | None = None  # list of image file names (or ids) in the split
    text: Path | str | None = None  # sentence file (text corpora; hf:NAME too)
    text_field: str | None = None  # the column of ``text`` / ``captions`` holding the text
    bad_lines: str = "skip"  # the read policy (mmcse.corpusfiles.BAD_LINES)


Loader = Callable[[DataSource, str], DatasetRecords]


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    return DATASETS.register(name)


def load_dataset(name: str, source: DataSource, split: str) -> DatasetRecords:
    """The records of ``name``; image paths escaping ``source.images`` become errors."""
    loader = DATASETS.get(name)
    where = source.captions or source.text or source.images
    try:
        records = loader(source, split)
    except FileNotFoundError:
        raise  # the loaders' own message names the missing path and its flag
    except OSError as exc:
        raise MmcseError(f"{exc.filename or where}: cannot read ({exc.strerror})") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise MmcseError(
            f"{where}: cannot read it as {name} data ({type(exc).__name__}: {detail})"
        ) from None
    if source.images is not None and records.images:
        records = confine_images(records, source.images)
    check_split(records, split, where)
    if not records.images and not records.sentences:
        raise MmcseError(no_records_message(name, split, where, records.errors))
    return records


def no_records_message(name: str, split: str, where: Path | None, errors: list) -> str:
    """Why a dataset came out empty: the file read and, if entries were unreadable, the first
    of them (which file, which entry, why), so an empty result is never a mystery."""
    message = f"{where}: no {name} records found for split {split!r}"
    if errors:
        first = errors[0]
        located = first.id if first.path == str(where) else f"{first.path} {first.id}"
        message += f"; {len(errors)} entries left out, the first: {located}: {first.reason}"
    return message + " (check the paths and split)"


#: split names by family: a file or entry naming one of these belongs to that split
SPLIT_FAMILIES = {
    "train": ("train", "restval"),
    "val": ("val", "dev", "valid", "validation"),
    "test": ("test",),
}
HELD_OUT = ("val", "test")


def split_family(name: str) -> str | None:
    """``"dev"`` → ``"val"``, ``"restval"`` → ``"train"``; None for a name of no family."""
    lowered = name.lower()
    return next((family for family, names in SPLIT_FAMILIES.items() if lowered in names), None)


def named_split(path: Path) -> str | None:
    """The split family a file's name says when it names exactly one (``captions_val2017.json``,
    ``coco_test.json``, ``Flickr_8k.trainImages.txt``), else None."""
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", path.name)
    families = {split_family(word) for word in words} - {None}
    return families.pop() if len(families) == 1 else None


def check_split(records: DatasetRecords, split: str, where: Path | None) -> None:
    """Refuse a ``--split`` the captions contradict, warn when nothing marks it held out.

    Refused: entries carry split fields and none is ``split`` (``marked: train 3``); the file
    or list that chose the images is named for another split (``captions_train2017.json`` with
    ``--split val``). Warned: a held-out split (val, test) taken from a file with no split
    information, whose every entry is then used. Splits of no family (``all``) are not checked.
    """
    family = split_family(split)
    info = records.split_info
    if family is None or (records.sentences and not records.images):
        return
    if info.marks:
        chosen = sum(n for mark, n in info.marks.items() if split_family(mark) == family)
        marked = ", ".join(f"{mark} {n}" for mark, n in sorted(info.marks.items()) if mark)
        unmarked = info.marks.get("", 0)
        if chosen or not marked:
            return
        if not unmarked:
            raise MmcseError(f"{where}: no entry is marked as split {split!r} (marked: {marked})")
        if family in HELD_OUT:
            logger.warning(
                f"{where}: no entry is marked as split {split!r} (marked: {marked}); its "
                f"{unmarked} unmarked entries are taken as {split!r}"
            )
        return
    named_by = info.listed_by or where
    named = named_split(named_by) if named_by is not None else None
    if named is not None and named != family:
        raise MmcseError(
            f"{named_by}: its name says split {named!r} but --split is {split!r}; give the "
            f"{split} file, or --split {named}"
        )
    if info.listed_by is None and named is None and family in HELD_OUT:
        logger.warning(
            f"{where} carries no split information: all {len(records.images)} images in it are "
            f"taken as split {split!r}, nothing marks them held out (pass --split-file, the "
            f"list of the {split} images)"
        )


def confine_images(records: DatasetRecords, root: Path) -> DatasetRecords:
    """Drop (and log) image records whose path leaves ``root`` (``../``, absolute paths).

    The check is on the path as written, not on resolved links, so an image folder that is
    itself a symlink (or holds links) still works."""
    base = os.path.normpath(os.path.abspath(root))
    kept, errors = [], list(records.errors)
    for record in records.images:
        target = os.path.normpath(os.path.abspath(record.path))
        if target == base or not target.startswith(base + os.sep):
            errors.append(
                RecordError(record.image_id, str(record.path), "image path outside --images")
            )
        else:
            kept.append(record)
    return replace(records, images=kept, errors=errors)


def inside(root: Path, name: str) -> bool:
    """True if ``root / name`` stays inside ``root`` (no absolute path, no ``..`` escape)."""
    base = os.path.normpath(os.path.abspath(root))
    target = os.path.normpath(os.path.abspath(root / name))
    return target.startswith(base + os.sep)


# ---- strict text decoding (shared with Stage 2: mmcse.textfiles) ---------------------------


def read_text(path: Path) -> str:
    """The whole file decoded strictly (BOM-aware); an error names the file and line."""
    lines = []
    for number, text, problem in read_text_lines(path):
        if problem:
            raise MmcseError(f"{path}:{number}: {problem}")
        lines.append(text)
    return "\n".join(lines)


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
    return [line.strip() for line in read_text(path).splitlines() if line.strip()]


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
    for line_no, line, problem in read_text_lines(path):
        if problem:
            errors.append(RecordError(f"line {line_no}", str(path), problem))
            continue
        if not line.strip():
            continue
        key, sep, caption = line.partition("\t")
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
