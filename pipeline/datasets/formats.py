"""Caption file formats shared by several datasets: Karpathy JSON and Hugging Face parquet exports."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import ImageRecord, RecordError

#: Karpathy's split names; "train" also takes "restval" (the usual 113k COCO train split)
KARPATHY_SPLITS = {"train": ("train", "restval"), "val": ("val",), "test": ("test",)}

CAPTION_COLUMNS = ("sentences", "caption", "captions")


def karpathy_splits(split: str) -> tuple[str, ...]:
    if split not in KARPATHY_SPLITS:
        raise MmcseError(f"Karpathy splits are {', '.join(KARPATHY_SPLITS)}; got {split!r}")
    return KARPATHY_SPLITS[split]


def read_karpathy_json(
    path: Path,
    split: str,
    image_path: Callable[[dict], Path],
    image_id: Callable[[dict], str],
) -> tuple[list[ImageRecord], list[RecordError]]:
    """``dataset_{flickr30k,coco}.json``: ``images[*]`` with ``filename``, ``split``, ``sentences``."""
    wanted = karpathy_splits(split)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["images"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise MmcseError(f"{path}: not a Karpathy split file ({exc})") from None
    records, errors = [], []
    for n, entry in enumerate(entries):
        if entry.get("split") not in wanted:
            continue
        try:
            captions = tuple(s["raw"].strip() for s in entry["sentences"])
            records.append(ImageRecord(image_id(entry), image_path(entry), captions))
        except (KeyError, TypeError, AttributeError):
            errors.append(RecordError(f"images[{n}]", str(path), "unreadable caption row"))
    return records, errors


def parquet_files(path: Path) -> list[Path]:
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise MmcseError(f"{path}: no .parquet files found")
    return files


def read_parquet_rows(path: Path) -> list[dict]:
    """Every row of a parquet export (file or folder) without the heavy ``image`` column."""
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for file in parquet_files(path):
        columns = [c for c in pq.read_schema(file).names if c != "image"]
        rows.extend(pq.read_table(file, columns=columns).to_pylist())
    return rows


def parquet_captions(row: dict) -> tuple[str, ...]:
    """Captions of one parquet row: a list of strings or of ``{"raw": ...}`` dicts."""
    for column in CAPTION_COLUMNS:
        if column in row and row[column] is not None:
            value = row[column]
            items = [value] if isinstance(value, str) else list(value)
            return tuple((c["raw"] if isinstance(c, dict) else c).strip() for c in items)
    raise KeyError("no caption column")


def unpack_parquet_images(path: Path, file_names: set[str], image_root: Path) -> None:
    """Write embedded image bytes (HF ``image`` column) for rows whose file is not on disk yet.

    Lets the parquet route feed the same path-based decoder as every other dataset; files already
    present are left alone, so this is a one-off cost.
    """
    import pyarrow.parquet as pq

    missing = {n for n in file_names if not (image_root / n).exists()}
    if not missing:
        return
    image_root.mkdir(parents=True, exist_ok=True)
    for file in parquet_files(path):
        if "image" not in pq.read_schema(file).names:
            return
        for batch in pq.ParquetFile(file).iter_batches(columns=["filename", "image"]):
            for name, image in zip(
                batch.column("filename").to_pylist(), batch.column("image").to_pylist(), strict=True
            ):
                if name in missing and image and image.get("bytes"):
                    tmp = image_root / f".{name}.tmp"
                    tmp.write_bytes(image["bytes"])
                    tmp.replace(image_root / name)
