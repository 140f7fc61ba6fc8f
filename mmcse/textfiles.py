"""Text files read strictly, the same way by both stages (dataset loaders, training corpora).

UTF-8 with or without a byte-order mark, or UTF-16/32 with a BOM. A byte that is not valid in
the file's encoding is reported with its line number and never replaced by U+FFFD. A file
without a BOM that looks like UTF-16/32 (NUL bytes in a quarter of its first bytes, or NULs and
no valid UTF-8) is refused with a hint to convert it; a UTF-8 file with a stray NUL byte is UTF-8
with one bad line, named as such (a line reader skips it like an undecodable line).

A file in another 8-bit encoding (a whole cp1252 file) is not a UTF-8 file with bad lines: when
most of its lines holding non-ASCII bytes are invalid UTF-8 (:func:`check_mostly_utf8`) it is
refused, naming the likely encoding and the ``iconv`` command that converts it, rather than read
with every accented line left out. Converting once (not an ``--encoding`` option) keeps one
meaning for a file's bytes: the fingerprints and token-cache keys hash them, and every reader
of both stages reads the converted file the same way.

Line breaks are ``\n``, ``\r\n`` and a lone ``\r`` (old Mac files), as Python's universal
newlines read them; a ``\r`` never stays inside a line.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from pathlib import Path

from mmcse.errors import MmcseError

_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def text_encoding(path: Path, head: bytes) -> str:
    """``utf-8`` unless a BOM says UTF-8-sig/16/32; a BOM-less UTF-16/32 file is refused."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding
    if _looks_like_utf16_or_32(head[:4096]):
        raise MmcseError(
            f"{path}: holds NUL bytes, so it is not UTF-8 text (UTF-16/32 without a byte-order "
            "mark?); convert it to UTF-8, e.g. `iconv -f UTF-16LE -t UTF-8`"
        )
    return "utf-8"


#: invalid-UTF-8 lines from which a file counts as another encoding (when they are also most of
#: its non-ASCII lines); fewer are bad lines of a UTF-8 file, left out under the read policy
MIN_FOREIGN_LINES = 3


def check_mostly_utf8(path: Path, data: bytes) -> None:
    """An :class:`MmcseError` naming the likely encoding and the command converting it when
    ``data`` (the bytes of ``path``, without a BOM) is mostly not UTF-8: at least
    :data:`MIN_FOREIGN_LINES` of its lines are invalid UTF-8, and they are most of its lines
    holding non-ASCII bytes (a UTF-8 file with a few corrupt lines keeps its valid ones)."""
    try:
        data.decode("utf-8")
        return
    except UnicodeDecodeError:
        pass
    lines = split_lines(data)
    foreign = [line for line in lines if not line.isascii()]
    invalid = [line for line in foreign if not _is_utf8(line)]
    if len(invalid) < MIN_FOREIGN_LINES or 2 * len(invalid) <= len(foreign):
        return
    name, label = _likely_encoding(b"\n".join(invalid))
    raise MmcseError(
        f"{path}: not UTF-8 text: {len(invalid):,} of its {len(lines):,} lines ({len(invalid):,} "
        f"of the {len(foreign):,} holding non-ASCII bytes) are "
        f"invalid UTF-8: it is likely {label}: convert it once, e.g. `iconv -f {name} -t UTF-8 "
        f"{path} > {path.with_stem(path.stem + '.utf8')}`, and read the converted file"
    )


def _is_utf8(line: bytes) -> bool:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _likely_encoding(sample: bytes) -> tuple[str, str]:
    """(iconv name, description) of the 8-bit encoding ``sample`` most likely is: Windows-1252
    when every byte is defined there (the usual case: Excel, old Windows tools), else Latin-1."""
    try:
        sample.decode("cp1252")
    except UnicodeDecodeError:
        return "ISO-8859-1", "Latin-1 (ISO-8859-1) or another 8-bit encoding"
    return "CP1252", "Windows-1252 (cp1252, a superset of Latin-1's printable characters)"


def split_lines(data: bytes) -> list[bytes]:
    """The lines of ``data`` split at ``\n``, ``\r\n`` or a lone ``\r``, endings removed (no
    empty last line for a final line break)."""
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def _looks_like_utf16_or_32(head: bytes) -> bool:
    """UTF-16/32 text puts a NUL beside nearly every Latin character; CJK text in UTF-16 has
    fewer NULs but is not valid UTF-8. A stray NUL in valid UTF-8 is neither."""
    nuls = head.count(0)
    if not nuls:
        return False
    if nuls * 4 >= len(head):
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 3  # not merely a character cut at the head's end
    return False


def nul_problem(line: bytes) -> str | None:
    """Why a UTF-8 line with a NUL byte is not text (no sentence holds one), else None."""
    at = line.find(b"\0")
    return None if at < 0 else f"a NUL byte at byte {at} of the line (UTF-8 text holds none)"


def decode_text(path: Path, data: bytes) -> str:
    """The whole of ``data`` (the bytes of ``path``) decoded strictly, without its BOM; an
    invalid byte is an :class:`MmcseError` naming the file and line."""
    encoding = text_encoding(path, data[:4096])
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].decode(encoding, errors="ignore").count("\n") + 1
        raise MmcseError(
            f"{path}:{line}: not valid {encoding.removesuffix('-sig')} text ({exc.reason}); "
            "convert or fix that line"
        ) from None
    if encoding.startswith("utf-8") and "\0" in text:
        line = text[: text.index("\0")].count("\n") + 1
        raise MmcseError(f"{path}:{line}: UTF-8 text with a NUL byte; remove it or fix that line")
    return text


def read_text_lines(path: Path) -> Iterator[tuple[int, str | None, str | None]]:
    """``(line number, text, None)`` per line, or ``(line number, None, reason)`` for a UTF-8
    line holding an invalid byte (a UTF-16/32 file is decoded whole: an invalid unit refuses it,
    naming the line; a file mostly in another encoding is refused, :func:`check_mostly_utf8`).
    Line endings (``\n``, ``\r\n``, a lone ``\r``) are stripped; a line is never silently
    altered."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise MmcseError(f"{path}: is a folder, expected a text file") from None
    encoding = text_encoding(path, data[:4096])
    if encoding == "utf-8-sig":
        data, encoding = data[len(codecs.BOM_UTF8) :], "utf-8"
    if encoding != "utf-8":
        text = decode_text(path, data).replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, start=1):
            yield number, line, None
        return
    check_mostly_utf8(path, data)
    for number, raw in enumerate(split_lines(data), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, None, f"invalid UTF-8 at byte {exc.start} of the line"
            continue
        problem = nul_problem(raw)
        yield number, None if problem else text, problem
