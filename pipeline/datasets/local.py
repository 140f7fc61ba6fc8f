"""Any folder of images with a captions file: JSONL, CSV or TSV with ``image`` and ``caption``.

``image`` is a file name relative to ``images``; an image may appear on several rows (one caption
each, kept in file order). An optional ``split`` column restricts rows to ``--split``. Rows with a
missing image name or empty caption are reported as unreadable and skipped, and so are rows whose
image leaves ``images`` (``../``, absolute paths): errors name the caption file and line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    ImageRecord,
    RecordError,
    SplitInfo,
    image_stem,
    inside,
    read_text,
    read_text_lines,
    register_dataset,
    require_path,
)
from pipeline.datasets.formats import split_marks

NAME = "local"
DELIMITERS = {".csv": ",", ".tsv": "\t"}


@register_dataset(NAME)
def load_local(source: DataSource, split: str) -> DatasetRecords:
    images = require_path(source.images, "--images (the image folder)", NAME)
    captions = require_path(source.captions, "--captions (JSONL, CSV or TSV)", NAME)
    rows = _read_rows(captions)
    by_image: dict[str, tuple[str, list[str]]] = {}
    errors = []
    marks = split_marks([row for _, row, _ in rows if row is not None])
    for line_no, row, problem in rows:
        if row is None:
            errors.append(RecordError(f"line {line_no}", str(captions), problem))
            continue
        if row.get("split") not in (None, "", split):
            continue
        reason = _row_problem(row.get("image"), row.get("caption"), images)
        if reason:
            errors.append(RecordError(f"line {line_no}", str(captions), reason))
            continue
        name, caption = row["image"], row["caption"]
        stem = image_stem(Path(name).name)
        stored_name, texts = by_image.setdefault(stem, (name, []))
        if stored_name != name:
            errors.append(RecordError(stem, str(captions), f"two files share the id: {name}"))
            continue
        texts.append(caption.strip())
    records = [ImageRecord(i, images / name, tuple(c)) for i, (name, c) in by_image.items()]
    split_info = SplitInfo(marks=marks if set(marks) != {""} else {})  # no split column: none
    return DatasetRecords(
        NAME, split, records, errors=errors, source=captions.name, split_info=split_info
    )


def _read_rows(path: Path) -> list[tuple[int, dict | None, str]]:
    """``(line number, row or None if unparsable, why)`` for every data line."""
    if path.suffix == ".jsonl":
        rows = []
        for n, line, problem in read_text_lines(path):
            if problem:
                rows.append((n, None, problem))
            elif line.strip():
                rows.append((n, _json_row(line), "not a JSON object"))
        return rows
    if path.suffix not in DELIMITERS:
        raise MmcseError(f"{path}: captions must be .jsonl, .csv or .tsv")
    reader = csv.DictReader(io.StringIO(read_text(path)), delimiter=DELIMITERS[path.suffix])
    if not {"image", "caption"} <= set(reader.fieldnames or ()):
        raise MmcseError(f"{path}: needs 'image' and 'caption' columns")
    return [(reader.line_num, row, "unreadable row") for row in reader]


def _row_problem(name: object, caption: object, images: Path) -> str | None:
    if not isinstance(name, str) or not name.strip():
        return f"unreadable caption row: 'image' is {name!r}, expected a file name"
    if not inside(images, name):  # refused before anything is opened: ``../``, absolute paths
        return f"image path outside --images: {name!r} leaves {images}"
    if not isinstance(caption, str) or not caption.strip():
        return f"unreadable caption row: 'caption' is {caption!r}, expected text"
    return None


def _json_row(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) else None
