"""Sentence and caption files in the formats researchers keep, read one way by both stages.

Accepted (:data:`FORMATS`): plain text (one sentence a line), JSON lines (one object a line),
CSV/TSV with a header, Parquet (a file or a folder of them), and a Hugging Face ``datasets``
dataset: a ``save_to_disk`` folder, or ``hf:NAME[:CONFIG[:SPLIT]]`` read from the local
``datasets`` cache, offline. The reader is chosen by extension and content together: a file
whose extension and bytes disagree (a ``.parquet`` that is not Parquet, Parquet bytes named
``.txt``) is refused, a ``.txt`` file whose first line is a JSON object is read as JSON
lines, and a ``.txt`` file that is one JSON document (an array, a pretty-printed object) is
refused: never sentences with their JSON syntax. A compressed file is refused with the command
that decompresses it. Anything else is one error naming the formats. CSV, quoted TSV and Parquet
are read by ``pyarrow``, datasets by ``datasets``, JSON and unquoted TSV by the standard library.

TSV is read as it is written: ``"\t".join`` quotes nothing, so a TSV file is split at tabs and
line breaks only, a ``"`` being text like any other character, unless its header line is
quoted throughout (``csv.QUOTE_ALL``), which makes it a quoted file read as CSV is. CSV is
quoted (RFC 4180). In either quoted form, a value holding a line break (or, in TSV, a tab) is
what a quote left open makes of the lines after it, so the file is refused naming the row; and
the rows read are counted against the file's lines, any difference refused in one line.

The text column is chosen by name, once (:func:`text_column`): ``--text-field``, else the one
column named like text (:data:`TEXT_NAMES`), else the one column holding strings. A value in it
that is not a string is a bad row under the read policy, never a reason to read another column.

The one read policy (:data:`BAD_LINES`): a row that is undecodable (invalid UTF-8, not JSON, a
CSV row of the wrong width), blank, or over-long (more than :data:`MAX_SENTENCE_CHARS`
characters: no sentence is that long; a file without line breaks is) is either left out and
reported (``skip``, the default) or refuses the whole file (``refuse``), naming the row.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.textfiles import check_mostly_utf8, read_text_lines, text_encoding

logger = logging.getLogger(__name__)

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
#: the split of a datasets dataset read when none is named
DEFAULT_SPLIT = "train"
#: a datasets dataset's files are hashed whole up to this many bytes (about a second of sha256);
#: a larger one is fingerprinted by its files' names, sizes and modification times
CONTENT_HASH_BYTES = 1 << 30
#: column names taken as the text when several columns hold strings and exactly one is named so
TEXT_NAMES = ("text", "sentence", "sentences", "caption", "content", "raw")

TEXT_SUFFIXES = ("", ".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
DELIMITERS = {".csv": ",", ".tsv": "\t"}
PARQUET_SUFFIXES = (".parquet", ".pq")
HF_FOLDER_FILES = ("dataset_info.json", "state.json", "dataset_dict.json")
_MAGIC = {b"PAR1": "a Parquet file", b"\x1f\x8b": "gzip-compressed", b"PK\x03\x04": "a zip file"}
#: compressed files, by their magic: the suffix naming them and the command that unpacks them
_UNPACK = {
    "gzip-compressed": (".gz", "gunzip -c {path} > {out}"),
    "a zip file": (".zip", "unzip -d {out} {path}"),
}


@dataclass
class Records:
    """The rows of one file: its columns (values aligned by row, None where a row has none)
    and the rows that could not be read at all (``problems``: row index → why)."""

    source: str
    format: str
    columns: dict[str, list] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)
    num_rows: int = 0
    by_line: bool = False  # row i is line i + first_line of the file, else "row i + 1"
    fingerprint: str = ""
    first_line: int = 1  # the line of row 0 (2 below a header line)

    def where(self, row: int) -> str:
        return f"line {row + self.first_line}" if self.by_line else f"row {row + 1}"


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
    if magic in _UNPACK and suffix == _UNPACK[magic][0]:
        command = _UNPACK[magic][1].format(path=path, out=path.with_suffix(""))
        raise refused(
            path,
            f"is {magic}, as its name says; mmcse reads uncompressed files: unpack it "
            f"(`{command}`) and give the unpacked file",
        )
    if magic is not None:
        raise refused(path, f"is {magic}, which its name ({suffix or 'no suffix'}) does not say")
    if suffix in DELIMITERS:
        return suffix[1:]
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in TEXT_SUFFIXES or not path.suffix:
        if _first_line_is_object(path, head):
            return "jsonl"
        _refuse_one_json_document(path, head)
        return "text"
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


def _refuse_one_json_document(path: Path, head: bytes) -> None:
    """A text file that is one JSON document (an array of records, a pretty-printed object) is
    refused: read line by line it would be ``[``, ``{``, ``"text": ...`` sentences."""
    text = head.decode(text_encoding(path, head), errors="ignore").lstrip("\ufeff").lstrip()
    if not text.startswith(("[", "{")):
        return
    try:
        document = json.loads(path.read_bytes().decode(text_encoding(path, head)).lstrip("\ufeff"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return  # sentences that start with a bracket
    if isinstance(document, list | dict):
        kind = "an array" if isinstance(document, list) else "an object"
        raise refused(
            path,
            f"is one JSON document ({kind}), not one sentence a line; save it as JSON "
            f"lines (one object a line), e.g. `jq -c '.[]' {path} > "
            f"{path.with_suffix('.jsonl')}`",
        )


def read_records(source: str | Path, split: str | None = DEFAULT_SPLIT) -> Records:
    """Every row of ``source`` (a file, a folder or an ``hf:`` name) in any accepted format;
    ``split`` picks the split of a ``datasets`` dataset that has several (None: the caller
    cannot name one, so ``train`` is read and its absence is said without ``--split``)."""
    if is_hf_name(source):
        return _read_hf_cache(str(source), split)
    path = Path(source)
    if not path.exists():
        raise MmcseError(f"{path}: no such file or folder")
    readers: dict[str, Callable[[Path], Records]] = {
        "text": _read_text,
        "jsonl": _read_jsonl,
        "csv": _read_csv,
        "tsv": _read_tsv,
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
                _refuse_one_json_document(path, path.read_bytes()[:4096])
                raise refused(path, f"line {number} is not a JSON object, so not JSON lines")
            seen_object = seen_object or row is not None
        if problem is not None:
            problems[number - 1] = problem
        rows.append(row)
    names = list(dict.fromkeys(key for row in rows if row for key in row))
    columns = {name: [row.get(name) if row else None for row in rows] for name in names}
    return Records(str(path), "JSON lines", columns, problems, len(rows), True, _file_hash(path))


def _read_csv(path: Path) -> Records:
    """A header row, then data rows, quoted as CSV is; values read as bytes and decoded strictly
    per row, so one undecodable value is that row's problem, not the file's. A value holding a
    line break (in TSV, a tab) is refused, and so is a row count that the file's lines do not
    give (:func:`_check_quoted_rows`)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    data = path.read_bytes()
    encoding = text_encoding(path, data[:4096])
    if not data.strip():  # pyarrow refuses it as unreadable; it is empty
        return Records(str(path), path.suffix[1:].upper(), {}, {}, 0, True, _file_hash(path))
    if encoding.startswith("utf-8"):
        check_mostly_utf8(path, data.removeprefix(codecs.BOM_UTF8))
    bad: list[tuple[int | None, str]] = []

    merged: list[str] = []  # rows a quote left open ran into the next lines

    def invalid_row(row) -> str:
        if any(c in row.text for c in "\n\r"):
            merged.append(row.text)
        bad.append((row.number, f"{row.actual_columns} fields, expected {row.expected_columns}"))
        return "skip"

    read = pacsv.ReadOptions(encoding="utf8" if encoding.startswith("utf-8") else encoding)
    parse = pacsv.ParseOptions(
        delimiter=DELIMITERS[path.suffix.lower()], invalid_row_handler=invalid_row
    )
    try:
        names = pacsv.open_csv(path, read_options=read, parse_options=parse).schema.names
        bad.clear()  # the schema's read saw the first rows: read_csv reports them again
        merged.clear()
        convert = pacsv.ConvertOptions(column_types={name: pa.binary() for name in names})
        table = pacsv.read_csv(path, read, parse, convert)
    except pa.ArrowInvalid as exc:
        raise refused(path, f"not readable as {path.suffix[1:].upper()} ({exc})") from None
    if merged:
        raise MmcseError(
            f"{path}: a row runs over a line break inside quotes ({merged[0][:60]!r}...): "
            f"{_OPEN_QUOTE}"
        )
    columns, problems = {}, {}
    for name in names:
        values = []
        for index, raw in enumerate(table.column(name).to_pylist()):
            values.append(_decoded(raw, index, problems))
        columns[name] = values
    records = Records(str(path), path.suffix[1:].upper(), columns, problems, table.num_rows)
    records.fingerprint = _file_hash(path)
    _check_quoted_rows(records, data, encoding, len(bad))
    if bad:  # rows the parser skipped: reported against the file, after the readable rows
        for number, why in bad:
            problems[records.num_rows] = f"undecodable: line {number}: {why}" if number else why
            for values in columns.values():
                values.append(None)
            records.num_rows += 1
    return records


_OPEN_QUOTE = (
    "a quote left open merges the lines after it into one value; close the quote (quote a "
    'value whole, doubling the quotes inside it: "a ""b"" c"), or write the file as TSV '
    "without quote characters"
)


def _check_quoted_rows(records: Records, data: bytes, encoding: str, skipped: int) -> None:
    """Refuse what a quote left open makes of a quoted file: a value holding a line break (in
    TSV, a tab too) — named by its row — or fewer rows than the file has lines."""
    breaks = "\n\r\t" if records.format == "TSV" else "\n\r"
    for name, values in records.columns.items():
        for row, value in enumerate(values):
            if isinstance(value, str) and any(c in value for c in breaks):
                what = "a line break" if "\n" in value or "\r" in value else "a tab"
                raise MmcseError(
                    f"{records.source}: {records.where(row)}: its {name!r} value holds {what} "
                    f"({value[:60]!r}...): {_OPEN_QUOTE}"
                )
    text = data.decode(encoding, errors="replace")
    lines = [line for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n") if line]
    read = records.num_rows + skipped
    if read != len(lines) - 1:
        raise MmcseError(
            f"{records.source}: read {read:,} rows from {len(lines):,} non-empty lines (a "
            f"header and {len(lines) - 1:,} rows): {abs(len(lines) - 1 - read):,} lines are "
            "not where they should be; check the file's quoting"
        )


def _read_tsv(path: Path) -> Records:
    """A TSV file read as it is written: a quoted one (its header quoted throughout) as CSV is,
    any other split at tabs and line breaks only, line by line under the read policy (a row of
    another width is a bad row)."""
    lines = read_text_lines(path)
    header = next(((n, t, p) for n, t, p in lines if p or (t and t.strip())), None)
    if header is None:
        return Records(str(path), "TSV", {}, {}, 0, True, _file_hash(path), 2)
    number, text, problem = header
    if problem:
        raise refused(path, f"line {number}: the header line is unreadable ({problem})")
    if _quoted_throughout(text):
        return _read_csv(path)
    names = text.split("\t")
    if len(set(names)) != len(names):
        raise refused(path, f"line {number}: the header names a column twice ({text!r:.80})")
    rows: list[list[str] | None] = []
    problems: dict[int, str] = {}
    for _, line, problem in lines:
        fields = line.split("\t") if line is not None else None
        if problem:
            problems[len(rows)] = f"undecodable: {problem}"
        elif line.strip() and len(fields) != len(names):
            problems[len(rows)] = f"undecodable: {len(fields)} fields, expected {len(names)}"
        rows.append(fields if len(rows) not in problems and line.strip() else None)
    columns = {name: [r[i] if r else None for r in rows] for i, name in enumerate(names)}
    _note_quoted_values(path, rows)
    return Records(
        str(path), "TSV", columns, problems, len(rows), True, _file_hash(path), number + 1
    )


def _note_quoted_values(path: Path, rows: list[list[str] | None]) -> None:
    """Values of an unquoted TSV wrapped in quotes as a CSV writer quotes (``"a ""b"" c"``) are
    read as written, quotes kept: said once, with how to write such a file."""
    wrapped = [
        v for row in rows if row for v in row if len(v) > 1 and v[0] == v[-1] == '"' and '""' in v
    ]
    if wrapped:
        logger.warning(
            f"{path}: {len(wrapped):,} values are wrapped in quotes as a CSV writer quotes them "
            f"(e.g. {wrapped[0][:60]!r}); an unquoted TSV is read as written, so their quotes "
            "are kept: write the file quoting every value (csv.QUOTE_ALL) to have them read as "
            "quoted"
        )


def _quoted_throughout(header: str) -> bool:
    """A header line whose every name is in quotes: a file written quoting every value."""
    names = header.split("\t")
    return all(len(n) >= 2 and n.startswith('"') and n.endswith('"') for n in names)


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


def _read_hf_folder(path: Path, split: str | None) -> Records:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise refused(path, f"not a readable datasets folder ({exc})") from None
    dataset = _one_split(loaded, split, path)
    files = [f for f in path.rglob("*") if f.is_file()]
    return _records_of_dataset(str(path), dataset, files)


def _read_hf_cache(source: str, default_split: str | None) -> Records:
    """``hf:NAME[:CONFIG[:SPLIT]]`` from the local ``datasets`` cache, never the network."""
    name, config, split = (source[len(HF_PREFIX) :].split(":") + ["", ""])[:3]
    if not name:
        raise MmcseError(f"{source}: give a dataset name, hf:NAME[:CONFIG[:SPLIT]]")
    import datasets

    with _offline():
        try:
            dataset = datasets.load_dataset(
                name, config or None, split=split or default_split or DEFAULT_SPLIT
            )
        except Exception as exc:  # the datasets library raises many kinds when not cached
            raise MmcseError(
                f"{source}: not in the local datasets cache ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); mmcse reads datasets offline: "
                "load it once with datasets.load_dataset on a machine online, or give a "
                "save_to_disk folder"
            ) from None
    files = [Path(f["filename"]) for f in dataset.cache_files]
    return _records_of_dataset(source, dataset, files)


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


def _one_split(loaded, split: str | None, source) -> object:
    """A ``Dataset``; a ``DatasetDict`` gives its ``split`` (None: ``train``, the reader's
    caller having no way to name another), an error listing its splits else."""
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        return loaded
    if (split or DEFAULT_SPLIT) in loaded:
        return loaded[split or DEFAULT_SPLIT]
    splits = ", ".join(loaded)
    if split is not None:
        raise MmcseError(f"{source}: has no split {split!r} (its splits: {splits}); give --split")
    first = next(iter(loaded))
    raise MmcseError(
        f"{source}: has no {DEFAULT_SPLIT!r} split, the one read here (its splits: {splits}); "
        f'save the split to read as a folder of its own, e.g. `python -c "import datasets; '
        f"datasets.load_from_disk('{source}')['{first}'].save_to_disk('{source}-{first}')\"`, "
        "and give that folder"
    )


def _records_of_dataset(source: str, dataset, files: Sequence[Path]) -> Records:
    table = dataset.with_format("arrow")[:]  # the rows as the dataset sees them (indices too)
    fingerprint = dataset_fingerprint(str(dataset._fingerprint), files)
    return _records_of_table(source, "datasets", table, fingerprint)


def dataset_fingerprint(fingerprint: str, files: Sequence[Path]) -> str:
    """A ``datasets`` dataset's fingerprint that sees its files: ``datasets``' own one
    (``state.json``'s) stays when an arrow file is rewritten in place, and token-cache entries
    keyed by it would train the old tokens. Its files are hashed whole, as a sentence file is,
    up to :data:`CONTENT_HASH_BYTES` in all; above that by name, size and modification time."""
    files = sorted(files)
    root = Path(os.path.commonpath(files)) if len(files) > 1 else None
    stats = [file.stat() for file in files]
    whole = sum(stat.st_size for stat in stats) <= CONTENT_HASH_BYTES
    digest = hashlib.sha256(f"{fingerprint}\n".encode())
    for file, stat in zip(files, stats, strict=True):
        content = _file_hash(file) if whole else f"{stat.st_size}:{stat.st_mtime_ns}"
        name = file.relative_to(root) if root else file.name
        digest.update(f"{name}:{content}\n".encode())
    return digest.hexdigest()


def _file_hash(path: Path) -> str:
    from mmcse.files import sha256_file

    return sha256_file(path)


def _files_hash(files: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(f"{file.name}:{_file_hash(file)}\n".encode())
    return digest.hexdigest()


# ---- the text column and the read policy ---------------------------------------------------


def text_column(records: Records, text_field: str | None) -> str:
    """The column holding the text, chosen by name, once: ``text_field`` when given (it must
    exist), else the one column named as in :data:`TEXT_NAMES`, else the one column holding
    strings; otherwise one error listing the candidates. A file without rows is refused as such.
    No value switches the choice: a value in the column that is not a string is a bad row."""
    names = list(records.columns)
    if records.num_rows == 0:
        raise MmcseError(f"{records.source}: {_no_rows(records)}; nothing to read")
    if text_field:
        if text_field not in records.columns:
            raise MmcseError(
                f"{records.source}: no column {text_field!r} (--text-field); its columns: "
                f"{', '.join(names) or 'none'}"
            )
        return text_field
    named = [n for n in names if n.lower() in TEXT_NAMES]
    if len(named) == 1:
        return named[0]
    candidates = named or [n for n in names if _holds_strings(records.columns[n])]
    if len(candidates) == 1:
        return candidates[0]
    raise MmcseError(
        f"{records.source}: which column holds the text? give --text-field NAME (candidates: "
        f"{', '.join(candidates or names) or 'none: the file has no columns'})"
    )


def _no_rows(records: Records) -> str:
    if records.format in ("CSV", "TSV") and records.columns:
        return f"has a header line ({', '.join(records.columns)}) and no rows below it"
    return "has no rows (an empty file)" if records.by_line else "has no rows"


def _holds_strings(values: list) -> bool:
    """Whether any of the first 1,000 values is a string (an id column of strings does too)."""
    return any(isinstance(v, str) for v in values[:1000])


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
    split: str | None = DEFAULT_SPLIT,
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
