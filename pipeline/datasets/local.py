"""Any folder of images with a captions file with ``image`` and ``caption`` columns, in any
format :mod:`mmcse.corpusfiles` reads: JSON lines, CSV/TSV with a header, Parquet, a ``datasets``
dataset (``text_field``, ``--text-field``, names another caption column).

``image`` is a file name relative to ``images``; an image may appear on several rows (one caption
each, kept in file order). An optional ``split`` column restricts rows to ``--split``. A row that
cannot be read or whose caption is blank or over-long follows the read policy (left out and
reported, or, with ``--bad-lines refuse``, the file refused); a row with a missing image name or
whose image leaves ``images`` (``../``, absolute paths) is reported and skipped: errors name the
caption file and line (row, for CSV and tables).
"""

from __future__ import annotations

from pathlib import Path

from mmcse import corpusfiles
from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    ImageRecord,
    RecordError,
    SplitInfo,
    image_stem,
    inside,
    register_dataset,
    require_path,
)
from pipeline.datasets.formats import split_marks

NAME = "local"


@register_dataset(NAME)
def load_local(source: DataSource, split: str) -> DatasetRecords:
    images = require_path(source.images, "--images (the image folder)", NAME)
    captions = require_path(source.captions, "--captions (JSONL, CSV, TSV, Parquet, ...)", NAME)
    table = corpusfiles.read_records(captions, split)
    caption_column = _caption_column(table, source.text_field)
    bad = [
        (row, reason)
        for row in range(table.num_rows)
        if (reason := _caption_problem(table, row, caption_column))
    ]
    corpusfiles.apply_policy(table, bad, source.bad_lines, "caption")
    unreadable = dict(bad)
    splits = table.columns.get("split", [None] * table.num_rows)
    marks = split_marks([{"split": s} for row, s in enumerate(splits) if row not in unreadable])
    by_image: dict[str, tuple[str, list[str]]] = {}
    errors = []
    for row in range(table.num_rows):
        where = table.where(row)
        if row in unreadable:
            errors.append(RecordError(where, str(captions), unreadable[row]))
            continue
        if splits[row] not in (None, "", split):
            continue
        name, caption = table.columns["image"][row], table.columns[caption_column][row]
        reason = _row_problem(name, images)
        if reason:
            errors.append(RecordError(where, str(captions), reason))
            continue
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


def _caption_column(table: corpusfiles.Records, text_field: str | None) -> str:
    """``--text-field`` if given, else ``caption``; the ``image`` column is required."""
    if "image" not in table.columns:
        raise MmcseError(
            f"{table.source}: needs an 'image' column (a file name under --images) and a caption "
            f"column; its columns: {', '.join(table.columns) or 'none'}"
        )
    if text_field is None and "caption" not in table.columns:
        raise MmcseError(
            f"{table.source}: no 'caption' column; name the one holding the captions with "
            f"--text-field (its columns: {', '.join(table.columns)})"
        )
    return corpusfiles.text_column(table, text_field or "caption")


def _caption_problem(table: corpusfiles.Records, row: int, column: str) -> str | None:
    """The read policy's problems: an unreadable row, a blank or over-long caption."""
    return table.problems.get(row) or corpusfiles.row_problem(table.columns[column][row])


def _row_problem(name: object, images: Path) -> str | None:
    if not isinstance(name, str) or not name.strip():
        return f"unreadable caption row: 'image' is {name!r}, expected a file name"
    if not inside(images, name):  # refused before anything is opened: ``../``, absolute paths
        return f"image path outside --images: {name!r} leaves {images}"
    return None
