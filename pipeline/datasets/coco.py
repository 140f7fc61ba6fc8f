"""MS-COCO captions (Chen et al. 2015): ~123k images × 5 captions.

Needs ``images`` (a root holding ``train2014/``, ``val2014/``, ``train2017/``, ``val2017/`` or the
files themselves) and ``captions`` in any of these forms:

* Karpathy ``dataset_coco.json`` (train = train + restval, 113,287 / val 5,000 / test 5,000);
* COCO ``captions_<split><year>.json`` — a file, or the ``annotations/`` folder, where
  ``--split train`` picks ``captions_train2017.json`` (or 2014);
* the ALBEF/BLIP list format (``[{"image": "val2014/....jpg", "caption": [...]}]``);
* a Hugging Face parquet export such as ``yerevann/coco-karpathy`` (file or folder).

``split_file`` (file names or COCO ids) optionally restricts any of them. The image id is the COCO
id (``391895``), the same whether the files are named the 2014 or the 2017 way, and a Karpathy
path that is not on disk falls back to the 2017 name of the same id.
"""

from __future__ import annotations

import re
from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    ImageRecord,
    RecordError,
    SplitInfo,
    image_stem,
    read_name_list,
    register_dataset,
    require_path,
)
from pipeline.datasets.formats import (
    caption_text,
    karpathy_splits,
    not_an_object,
    parquet_captions,
    read_json,
    read_karpathy_json,
    read_parquet_rows,
    split_marks,
    unreadable,
)

NAME = "coco"


@register_dataset(NAME)
def load_coco(source: DataSource, split: str) -> DatasetRecords:
    images = require_path(source.images, "--images (the COCO image root)", NAME)
    captions = require_path(source.captions, "--captions", NAME)
    chosen_by_name = captions.is_dir() and not any(captions.rglob("*.parquet"))
    if chosen_by_name:
        captions = _annotation_file(captions, split)
    if captions.suffix == ".parquet" or captions.is_dir():
        records, errors, split_info = _parquet(captions, images, split)
    else:
        records, errors, split_info = _json(captions, images, split)
    if chosen_by_name:  # captions_<split><year>.json, picked for --split
        split_info = SplitInfo(listed_by=captions)
    if source.split_file is not None:
        wanted = {_coco_id(n) for n in read_name_list(source.split_file)}
        records = [r for r in records if r.image_id in wanted]
        split_info = SplitInfo(split_info.marks, listed_by=source.split_file)
    return DatasetRecords(
        NAME, split, records, errors=errors, source=captions.name, split_info=split_info
    )


def _annotation_file(folder: Path, split: str) -> Path:
    for year in ("2017", "2014"):
        if (folder / f"captions_{split}{year}.json").exists():
            return folder / f"captions_{split}{year}.json"
    raise MmcseError(f"{folder}: no captions_{split}2017.json or captions_{split}2014.json")


def _json(path: Path, images: Path, split: str) -> tuple[list, list, SplitInfo]:
    """Records, errors and how the split was chosen (the ALBEF list and an official captions
    file carry no split field: their file name is the only split information)."""
    data = read_json(path)
    if isinstance(data, list):
        return (*_albef(data, path, images), SplitInfo())
    if not isinstance(data, dict):
        raise MmcseError(f"{path}: expected a JSON object or list of captions")
    if "annotations" in data:
        return (*_coco_captions(data, path, images), SplitInfo())
    return read_karpathy_json(
        path,
        split,
        lambda e: _image_path(images, e.get("filepath", ""), e["filename"], int(e["cocoid"])),
        lambda e: str(int(e["cocoid"])),
    )


def _coco_captions(data: dict, path: Path, images: Path) -> tuple[list, list]:
    """Official ``captions_*.json``; captions in annotation-id order, images in the set's folder."""
    folder = path.stem.removeprefix("captions_")
    root = images / folder if (images / folder).is_dir() else images
    by_image: dict[int, list[tuple[int, str]]] = {}
    errors = []
    for key in ("annotations", "images"):
        if not isinstance(data.get(key), list):
            raise MmcseError(f"{path}: a COCO captions file needs an {key!r} list")
    for n, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict):
            errors.append(RecordError(f"annotations[{n}]", str(path), not_an_object(ann)))
            continue
        try:
            caption = caption_text(ann["caption"])
            by_image.setdefault(int(ann["image_id"]), []).append((int(ann["id"]), caption))
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(RecordError(f"annotations[{n}]", str(path), unreadable(exc)))
    records = []
    for n, image in enumerate(data["images"]):
        if not isinstance(image, dict):
            errors.append(RecordError(f"images[{n}]", str(path), not_an_object(image)))
            continue
        try:
            image_id, file_name = int(image["id"]), str(image["file_name"])
        except (KeyError, TypeError, ValueError) as exc:
            errors.append(RecordError(f"images[{n}]", str(path), unreadable(exc)))
            continue
        pairs = sorted(by_image.get(image_id, []))
        if pairs:
            captions = tuple(c for _, c in pairs)
            records.append(ImageRecord(str(image_id), root / file_name, captions))
    return records, errors


def _albef(entries: list, path: Path, images: Path) -> tuple[list, list]:
    by_image: dict[str, tuple[Path, list[str]]] = {}
    errors = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            errors.append(RecordError(f"[{n}]", str(path), not_an_object(entry)))
            continue
        try:
            image_id = _coco_id(entry["image"])
            raw = entry["caption"]
            captions = [caption_text(c) for c in ([raw] if not isinstance(raw, list) else raw)]
            relative = Path(entry["image"])
            target = by_image.setdefault(image_id, (_fallback(images, relative, image_id), []))
            target[1].extend(captions)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            errors.append(RecordError(f"[{n}]", str(path), unreadable(exc)))
    records = [ImageRecord(i, p, tuple(c)) for i, (p, c) in by_image.items()]
    return records, errors


def _parquet(path: Path, images: Path, split: str) -> tuple[list, list, SplitInfo]:
    rows = read_parquet_rows(path)
    split_info = SplitInfo()
    if rows and "split" in rows[0]:
        split_info = SplitInfo(marks=split_marks(rows))
        wanted = karpathy_splits(split)
        rows = [r for r in rows if r["split"] in wanted]
    records, errors = [], []
    for n, row in enumerate(rows):
        try:
            coco_id = int(row["cocoid"])
            image_path = _image_path(images, row.get("filepath") or "", row["filename"], coco_id)
            records.append(ImageRecord(str(coco_id), image_path, parquet_captions(row)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            errors.append(RecordError(f"row {n}", str(path), unreadable(exc)))
    return records, errors, split_info


def _coco_id(name: str) -> str:
    """``val2014/COCO_val2014_000000391895.jpg``, ``000000391895.jpg`` or ``391895`` → ``391895``."""
    digits = re.findall(r"\d+", image_stem(Path(name).name))
    if not digits:
        raise ValueError(f"no COCO id in {name!r}")
    return str(int(digits[-1]))


def _image_path(images: Path, folder: str, file_name: str, coco_id: int) -> Path:
    return _fallback(images, Path(folder) / file_name, str(coco_id))


def _fallback(images: Path, relative: Path, coco_id: str) -> Path:
    """The given path if it exists, else the 2017-style name of the same id, else the given path."""
    candidates = [images / relative, images / relative.name]
    name_2017 = f"{int(coco_id):012d}.jpg"
    candidates += [images / folder / name_2017 for folder in ("train2017", "val2017")]
    return next((p for p in candidates if p.exists()), candidates[0])
