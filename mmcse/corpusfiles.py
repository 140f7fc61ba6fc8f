"""Sentence and caption files in the formats researchers keep, read one way by both stages.

Accepted (:data:`FORMATS`): plain text (one sentence a line), JSON lines (one object a line),
CSV/TSV with a header, Parquet (a file or a folder of them), and a Hugging Face ``datasets``
dataset: a ``save_to_disk`` folder, or ``hf:NAME[:CONFIG[:SPLIT]]`` read from the local
``datasets`` cache, offline. The reader is chosen by extension and content together: a file
whose extension and bytes disagree (a ``.parquet`` that is not Parquet, Parquet bytes named
``.txt``) is refused, and a ``.txt`` file whose first line is a JSON object is read as JSON
lines, never as sentences with their JSON syntax. Anything else is one error naming the formats.
CSV and Parquet are read by ``pyarrow``, datasets by ``datasets``, JSON by the standard library.

The one read policy (:data:`BAD_LINES`): a row that is undecodable (invalid UTF-8, not JSON, a
CSV row of the wrong width), blank, or over-long (more than :data:`MAX_SENTENCE_CHARS`
characters: no sentence is that long; a file without line breaks is) is either left out and
reported (``skip``, the default) or refuses the whole file (``refuse``), naming the row.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.textfiles import read_text_lines, text_encoding

FORMATS = (
    "plain text (one sentence a line, .txt), JSON lines (.jsonl), CSV/TSV with a header "
    "(.csv, .tsv), Parquet (.parquet), a Hugging Face datasets folder (save_to_disk) or "
    "hf:NAME[:CONFIG[:SPLIT]] from the local datasets cache"
)
#: what a bad row does: left out and reported, or the whole file refused
BAD_LINES = ("skip", "refuse")
#: more characters than any sentence has (Wiki1M's longest line: ~2,000); a longer "line" is a
#: file without line breaks or a stray blob, and would be truncated to --max-seq-length anyway
MAX_SENTENCE_CHARS = 10_000
HF_PREFIX = "hf:"
#: column names taken as the text when several columns hold strings and exactly one is named so
TEXT_NAMES = ("text", "sentence", "sentences", "caption", "content", "raw")

TEXT_SUFFIXES = ("", ".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
DELIMITERS = {".csv": ",", ".tsv": "\t"}
PARQUET_SUFFIXES = (".parquet", ".pq")
HF_FOLDER_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
_MAGIC = {b"PAR1": "a Parquet file", b"\x1f\x8b": "gzip-compressed", b"PK\x03\x04": "a zip file"}


@dataclass
class Records:
    """The rows of one file: its columns (values aligned by row, None where a row has none)
    and the rows that could not be read at all (``problems``: row index → why)."""

    source: str
    format: str
    columns: dict[str, list] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    num_rows: int = 0
    by_line: bool = False  # row i is line i + 1 of the file (text, JSON lines), else "row i + 1"
    fingerprint: str = ""

    def where(self, row: int) -> str:
        return f"line {row + 1}" if self.by_line else f"row {row + 1}"


@dataclass
class Sentences:
    """The sentences a policy keeps: their row indices and texts, and what it left out."""

    records: Records
    text_field: str
    rows: list[int]
    texts: list[str]
    dropped: list[tuple[int, str]]  # (row index, why), in file order

    def dropped_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for _, reason in self.dropped:
            key = reason_kind(reason)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def summary(self) -> str:
        """``'3 left out (2 blank, 1 undecodable)'`` or ``''`` when nothing was."""
        if not self.dropped:
            return ""
        kinds = ", ".join(f"{n} {kind}" for kind, n in self.dropped_by_reason().items())
        return f"{len(self.dropped)} left out ({kinds})"


def reason_kind(reason: str) -> str:
    """The kind a reason counts under in a summary: blank, over-long or undecodable."""
    for kind in ("blank", "over-long"):
        if reason.startswith(kind):
            return kind
    return "undecodable"


def is_hf_name(value: str | Path) -> bool:
    return str(value).startswith(HF_PREFIX)


def exists(value: str | Path) -> bool:
    """A corpus given as a path exists; an ``hf:`` name is looked up when read."""
    return is_hf_name(value) or Path(value).exists()


# ---- choosing the reader -------------------------------------------------------------------


def refused(source: str | Path, why: str) -> MmcseError:
    return MmcseError(f"{source}: {why}; accepted: {FORMATS}")


def detect_format(path: Path) -> str:
    """``text``, ``jsonl``, ``csv``, ``tsv``, ``parquet`` or ``hf-folder``, from the extension
    and the first bytes together; anything else (or a disagreement) is refused."""
    if path.is_dir():
        if any((path / name).exists() for name in HF_FOLDER_FILES):
            return "hf-folder"
        if any(path.rglob("*.parquet")):
            return "parquet"
        raise refused(path, "a folder that is neither a corpus table nor a datasets folder")
    with path.open("rb") as file:
        head = file.read(4096)
    suffix = path.suffix.lower()
    magic = next((what for m, what in _MAGIC.items() if head.startswith(m)), None)
    if suffix in PARQUET_SUFFIXES:
        if magic != "a Parquet file":
            raise refused(path, "named Parquet but not a Parquet file (no PAR1 header)")
        return "parquet"
    if magic is not None:
        raise refused(path, f"is {magic}, which its name ({suffix or 'no suffix'}) does not say")
    if suffix in DELIMITERS:
        return suffix[1:]
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in TEXT_SUFFIXES or not path.suffix:
        return "jsonl" if _first_line_is_object(path, head) else "text"
    raise refused(path, f"{suffix} is not a format mmcse reads")


def _first_line_is_object(path: Path, head: bytes) -> bool:
    encoding = text_encoding(path, head)
    text = head.decode(encoding, errors="ignore").lstrip("\ufeff")
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def read_records(source: str | Path, split: str = "train") -> Records:
    """Every row of ``source`` (a file, a folder or an ``hf:`` name) in any accepted format;
    ``split`` picks the split of a ``datasets`` dataset that has several."""
    if is_hf_name(source):
        return _read_hf_cache(str(source), split)
    path = Path(source)
    if not path.exists():
        raise MmcseError(f"{path}: no such file or folder")
    readers: dict[str, Callable[[Path], Records]] = {
        "text": _read_text,
        "jsonl": _read_jsonl,
        "csv": _read_csv,
        "tsv": _read_csv,
        "parquet": _read_parquet,
        "hf-folder": lambda p: _read_hf_folder(p, split),
    }
    return readers[detect_format(path)](path)


# ---- the readers ---------------------------------------------------------------------------


def _read_text(path: Path) -> Records:
    lines, problems = [], {}
    for number, text, problem in read_text_lines(path):
        lines.append(text)
        if problem:
            problems[number - 1] = f"undecodable: {problem}"
    return Records(
        str(path), "plain text", {"text": lines}, problems, len(lines), True, _file_hash(path)
    )


def _read_jsonl(path: Path) -> Records:
    rows: list[dict | None] = []
    problems: dict[int, str] = {}
    seen_object = False
    for number, line, problem in read_text_lines(path):
        row = None
        if problem is not None:
            problem = f"undecodable: {problem}"
        elif line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                problem = f"undecodable: not valid JSON ({exc.msg} at column {exc.colno})"
            else:
                if not isinstance(row, dict):
                    problem, row = f"undecodable: a JSON {type(row).__name__}, not an object", None
            if problem and not seen_object:  # a JSON array, a text file named .jsonl
                raise refused(path, f"line {number} is not a JSON object, so not JSON lines")
            seen_object = seen_object or row is not None
        if problem is not None:
            problems[number - 1] = problem
        rows.append(row)
    names = list(dict.fromkeys(key for row in rows if row for key in row))
    columns = {name: [row.get(name) if row else None for row in rows] for name in names}
    return Records(str(path), "JSON lines", columns, problems, len(rows), True, _file_hash(path))


def _read_csv(path: Path) -> Records:
    """A header row, then data rows; values read as bytes and decoded strictly per row, so one
    undecodable value is that row's problem, not the file's."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    encoding = text_encoding(path, path.read_bytes()[:4096])
    bad: list[tuple[int | None, str]] = []

    def invalid_row(row) -> str:
        bad.append((row.number, f"{row.actual_columns} fields, expected {row.expected_columns}"))
        return "skip"

    read = pacsv.ReadOptions(encoding="utf8" if encoding.startswith("utf-8") else encoding)
    parse = pacsv.ParseOptions(
        delimiter=DELIMITERS[path.suffix.lower()], invalid_row_handler=invalid_row
    )
    try:
        names = pacsv.open_csv(path, read_options=read, parse_options=parse).schema.names
        convert = pacsv.ConvertOptions(column_types={name: pa.binary() for name in names})
        table = pacsv.read_csv(path, read, parse, convert)
    except pa.ArrowInvalid as exc:
        raise refused(path, f"not readable as {path.suffix[1:].upper()} ({exc})") from None
    columns, problems = {}, {}
    for name in names:
        values = []
        for index, raw in enumerate(table.column(name).to_pylist()):
            values.append(_decoded(raw, index, problems))
        columns[name] = values
    records = Records(str(path), path.suffix[1:].upper(), columns, problems, table.num_rows)
    records.fingerprint = _file_hash(path)
    if bad:  # rows the parser skipped: reported against the file, after the readable rows
        for number, why in bad:
            problems[records.num_rows] = f"undecodable: line {number}: {why}" if number else why
            for values in columns.values():
                values.append(None)
            records.num_rows += 1
    return records


def _decoded(raw: bytes | None, index: int, problems: dict[int, str]) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.setdefault(index, f"undecodable: invalid UTF-8 at byte {exc.start} of a value")
        return None


def _read_parquet(path: Path) -> Records:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    try:
        tables = [pq.read_table(f) for f in files]
        table = pa.concat_tables(tables, promote_options="default") if tables else None
    except (pa.ArrowInvalid, OSError) as exc:
        raise refused(path, f"not readable as Parquet ({exc})") from None
    return _records_of_table(str(path), "Parquet", table, _files_hash(files))


def _records_of_table(source: str, format: str, table, fingerprint: str) -> Records:
    """A pyarrow table's scalar columns (nested ones, e.g. images, are left unread)."""
    import pyarrow as pa

    columns: dict[str, list] = {}
    problems: dict[int, str] = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            columns[name] = [_decoded(v, i, problems) for i, v in enumerate(column.to_pylist())]
        elif pa.types.is_nested(column.type) or pa.types.is_struct(column.type):
            if name != "image":  # caption lists ("sentences") are read, images never
                columns[name] = column.to_pylist()
        else:
            columns[name] = column.to_pylist()
    return Records(source, format, columns, problems, table.num_rows, False, fingerprint)


def _read_hf_folder(path: Path, split: str) -> Records:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise refused(path, f"not a readable datasets folder ({exc})") from None
    dataset = _one_split(loaded, split, path)
    return _records_of_dataset(str(path), dataset)


def _read_hf_cache(source: str, default_split: str) -> Records:
    """``hf:NAME[:CONFIG[:SPLIT]]`` from the local ``datasets`` cache, never the network."""
    name, config, split = (source[len(HF_PREFIX) :].split(":") + ["", ""])[:3]
    if not name:
        raise MmcseError(f"{source}: give a dataset name, hf:NAME[:CONFIG[:SPLIT]]")
    import datasets

    with _offline():
        try:
            dataset = datasets.load_dataset(name, config or None, split=split or default_split)
        except Exception as exc:  # the datasets library raises many kinds when not cached
            raise MmcseError(
                f"{source}: not in the local datasets cache ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); mmcse reads datasets offline: "
                "load it once with datasets.load_dataset on a machine online, or give a "
                "save_to_disk folder"
            ) from None
    return _records_of_dataset(source, dataset)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    import datasets.config
    import huggingface_hub.constants as hub

    saved = datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE
    datasets.config.HF_DATASETS_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_DATASETS_OFFLINE, hub.HF_HUB_OFFLINE = saved


def _one_split(loaded, split: str, source) -> object:
    """A ``Dataset``; a ``DatasetDict`` gives its ``split``, an error listing its splits else."""
    import datasets

    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise MmcseError(
                f"{source}: has no split {split!r} (its splits: {', '.join(loaded)}); give --split"
            )
        return loaded[split]
    return loaded


def _records_of_dataset(source: str, dataset) -> Records:
    table = dataset.with_format("arrow")[:]  # the rows as the dataset sees them (indices too)
    return _records_of_table(source, "datasets", table, str(dataset._fingerprint))


def _file_hash(path: Path) -> str:
    from mmcse.files import sha256_file

    return sha256_file(path)


def _files_hash(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{_file_hash(file)}\n".encode())
    return digest.hexdigest()


# ---- the text column and the read policy ---------------------------------------------------


def text_column(records: Records, text_field: str | None, flag: str = "--text-field") -> str:
    """The column holding the text: ``text_field`` when given (it must exist), else the one
    obvious candidate (the only column holding strings, or the only one of those named as in
    :data:`TEXT_NAMES`); otherwise one error listing the candidates."""
    names = list(records.columns)
    if text_field:
        if text_field not in records.columns:
            raise MmcseError(
                f"{records.source}: no column {text_field!r} ({flag}); its columns: "
                f"{', '.join(names) or 'none'}"
            )
        return text_field
    candidates = [n for n in names if _holds_strings(records.columns[n])]
    if len(candidates) == 1:
        return candidates[0]
    named = [n for n in candidates if n.lower() in TEXT_NAMES]
    if len(named) == 1:
        return named[0]
    raise MmcseError(
        f"{records.source}: which column holds the text? give {flag} NAME (candidates: "
        f"{', '.join(candidates or names) or 'none: the file has no columns'})"
    )


def _holds_strings(values: list) -> bool:
    seen = [v for v in values[:1000] if v is not None]
    return bool(seen) and all(isinstance(v, str) for v in seen)


def row_problem(value: object) -> str | None:
    """Why a value is not a sentence (blank, over-long, not text), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "blank"
    if not isinstance(value, str):
        return f"undecodable: {type(value).__name__} {value!r:.40}, expected text"
    if len(value) > MAX_SENTENCE_CHARS:
        return f"over-long: {len(value):,} characters (more than {MAX_SENTENCE_CHARS:,})"
    return None


def apply_policy(records: Records, bad: list[tuple[int, str]], bad_lines: str, what: str) -> None:
    """``refuse``: the first bad row is an error naming it and the way to skip instead."""
    if bad_lines not in BAD_LINES:
        raise MmcseError(f"--bad-lines must be one of {', '.join(BAD_LINES)}, not {bad_lines!r}")
    if bad and bad_lines == "refuse":
        row, reason = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise MmcseError(
            f"{records.source}: {records.where(row)}: {reason}{more}; --bad-lines refuse "
            f"refuses a {what} file with such a row (--bad-lines skip leaves them out and "
            "reports them)"
        )


def read_sentences(
    source: str | Path,
    text_field: str | None = None,
    bad_lines: str = "skip",
    split: str = "train",
) -> Sentences:
    """The sentences of ``source`` in any accepted format, under the read policy."""
    records = read_records(source, split)
    name = text_column(records, text_field)
    kept_rows, texts, dropped = [], [], []
    for row, value in enumerate(records.columns[name]):
        problem = records.problems.get(row) or row_problem(value)
        if problem:
            dropped.append((row, problem))
        else:
            kept_rows.append(row)
            texts.append(value.strip())
    apply_policy(records, dropped, bad_lines, "sentence")
    return Sentences(records, name, kept_rows, texts, dropped)
