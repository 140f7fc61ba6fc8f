"""Flickr30k (Young et al. 2014): 31,783 images × 5 captions.

Needs ``images`` (the folder of ``<id>.jpg``) and ``captions`` in any of these forms:

* Karpathy ``dataset_flickr30k.json`` — carries the splits (train 29,000 / val 1,014 / test 1,000);
* ``results_20130124.token`` (``<file>#k<TAB>caption``) with ``split_file`` (e.g. Flickr30k
  Entities ``train.txt``, 29,783 ids) — without a split file every image in the token file is used;
* a Multi30K ``task2`` folder: line ``i`` of ``{split}.{k}.en`` is caption ``k`` of the image on
  line ``i`` of ``{split}_images.txt`` (``test`` reads ``test_2016``);
* a Hugging Face parquet export (``lmms-lab/flickr30k``: file or folder) with ``split_file``;
  embedded image bytes are unpacked into ``images`` once when the files are not there yet.
"""

from __future__ import annotations

from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    ImageRecord,
    RecordError,
    SplitInfo,
    image_stem,
    parse_token_file,
    read_name_list,
    read_text,
    records_from_split,
    register_dataset,
    require_path,
)
from pipeline.datasets.formats import (
    parquet_captions,
    read_karpathy_json,
    read_parquet_rows,
    unpack_parquet_images,
    unreadable,
)

NAME = "flickr30k"


@register_dataset(NAME)
def load_flickr30k(source: DataSource, split: str) -> DatasetRecords:
    captions = require_path(source.captions, "--captions", NAME)
    is_parquet = captions.suffix == ".parquet" or (
        captions.is_dir() and not any(captions.glob("*_images.txt"))
    )
    if is_parquet:  # the image folder may not exist yet: embedded images are unpacked into it
        if source.images is None:
            raise MmcseError(f"{NAME}: --images (where to find or unpack the images) is required")
        return _parquet(captions, source.images, split, source.split_file)
    images = require_path(source.images, "--images (the Flickr30k image folder)", NAME)
    if captions.is_dir():
        return _multi30k(captions, images, split)
    if captions.suffix == ".json":
        records, errors, split_info = read_karpathy_json(
            captions, split, lambda e: images / e["filename"], lambda e: image_stem(e["filename"])
        )
        return DatasetRecords(
            NAME, split, records, errors=errors, source=captions.name, split_info=split_info
        )
    return _token_file(captions, images, split, source.split_file)


def _token_file(path: Path, images: Path, split: str, split_file: Path | None) -> DatasetRecords:
    captions, file_names, errors = parse_token_file(path)
    if split_file is None:
        names, list_path = sorted(captions), path
    else:
        names, list_path = read_name_list(split_file), split_file
    records, missing = records_from_split(names, captions, file_names, images, list_path)
    split_info = SplitInfo(listed_by=split_file)  # no split file: the token file has no split
    return DatasetRecords(
        NAME, split, records, errors=errors + missing, source=path.name, split_info=split_info
    )


def _multi30k(folder: Path, images: Path, split: str) -> DatasetRecords:
    prefix = "test_2016" if split == "test" and not (folder / "test_images.txt").exists() else split
    list_path = folder / f"{prefix}_images.txt"
    if not list_path.exists():
        known = sorted(p.name.removesuffix("_images.txt") for p in folder.glob("*_images.txt"))
        raise MmcseError(f"{folder}: no split {split!r} (Multi30K splits: {', '.join(known)})")
    names = read_name_list(list_path)
    caption_files = sorted(folder.glob(f"{prefix}.*.en"), key=lambda p: int(p.suffixes[-2][1:]))
    columns = [read_text(p).splitlines() for p in caption_files]
    records, errors = [], []
    for p, column in zip(caption_files, columns, strict=True):
        if len(column) != len(names):
            raise MmcseError(f"{p}: {len(column)} lines but {list_path.name} has {len(names)}")
    for i, name in enumerate(names):
        captions = tuple(column[i].strip() for column in columns)
        if not all(captions):
            errors.append(RecordError(image_stem(name), str(list_path), "unreadable caption row"))
            continue
        records.append(ImageRecord(image_stem(name), images / name, captions))
    return DatasetRecords(
        NAME,
        split,
        records,
        errors=errors,
        source=f"multi30k:{prefix}",
        split_info=SplitInfo(listed_by=list_path),
    )


def _parquet(path: Path, images: Path, split: str, split_file: Path | None) -> DatasetRecords:
    if split_file is None:
        raise MmcseError(f"{NAME}: the parquet export has no splits; pass --split-file")
    wanted = {image_stem(n) for n in read_name_list(split_file)}
    records, errors, names = [], [], set()
    for n, row in enumerate(read_parquet_rows(path)):
        stem = image_stem(str(row.get("filename", "")))
        if stem not in wanted:
            continue
        try:
            records.append(ImageRecord(stem, images / row["filename"], parquet_captions(row)))
            names.add(row["filename"])
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            errors.append(RecordError(f"row {n}", str(path), unreadable(exc)))
    unpack_parquet_images(path, names, images)
    return DatasetRecords(
        NAME,
        split,
        records,
        errors=errors,
        source=f"parquet:{path.name}",
        split_info=SplitInfo(listed_by=split_file),
    )
