"""Caption file formats shared by several datasets: Karpathy JSON and Hugging Face parquet exports."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import ImageRecord, RecordError, SplitInfo, inside

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
) -> tuple[list[ImageRecord], list[RecordError], SplitInfo]:
    """``dataset_{flickr30k,coco}.json``: ``images[*]`` with ``filename``, ``split``, ``sentences``."""
    wanted = karpathy_splits(split)
    data = read_json(path)
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise MmcseError(f"{path}: not a Karpathy split file (no 'images' list)")
    records, errors, marks = [], [], Counter()
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            errors.append(RecordError(f"images[{n}]", str(path), not_an_object(entry)))
            continue
        marks[str(entry.get("split") or "")] += 1
        if entry.get("split") not in wanted:
            continue
        try:
            captions = tuple(
                caption_text(s["raw"] if isinstance(s, dict) else None) for s in entry["sentences"]
            )
            records.append(ImageRecord(image_id(entry), image_path(entry), captions))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            errors.append(RecordError(f"images[{n}]", str(path), unreadable(exc)))
    return records, errors, SplitInfo(marks=dict(marks))


def split_marks(rows: list[dict]) -> dict[str, int]:
    """How many rows carry each ``split`` value (``""``: none)."""
    return dict(Counter(str(row.get("split") or "") for row in rows))


def read_json(path: Path):
    """A JSON file (UTF-8/16/32, detected as the JSON spec allows); errors name the file."""
    try:
        return json.loads(path.read_bytes())
    except UnicodeDecodeError as exc:
        raise MmcseError(f"{path}: not valid UTF-8 JSON (bad byte at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise MmcseError(f"{path}: not valid JSON ({exc})") from None


def caption_text(value: object) -> str:
    """A caption's text, stripped; a null, non-string or blank caption is a ``ValueError``."""
    if not isinstance(value, str):
        raise ValueError(f"caption is {value!r}, expected text")
    if not value.strip():
        raise ValueError("caption is blank")
    return value.strip()


def not_an_object(entry: object) -> str:
    """The errors.jsonl reason for an entry that should be a JSON object (e.g. ``null``)."""
    kind = "null" if entry is None else f"a JSON {type(entry).__name__}"
    return f"unreadable entry: {kind}, expected an object"


def unreadable(exc: Exception) -> str:
    """The errors.jsonl reason for an entry a loader could not read."""
    detail = f"missing key {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else exc
    return f"unreadable caption row: {detail}"


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
            return tuple(caption_text(c["raw"] if isinstance(c, dict) else c) for c in items)
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
                if name in missing and image and image.get("bytes") and inside(image_root, name):
                    tmp = image_root / f".{name}.tmp"
                    tmp.write_bytes(image["bytes"])
                    tmp.replace(image_root / name)
