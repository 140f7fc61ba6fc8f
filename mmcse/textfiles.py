"""Text files read strictly, the same way by both stages (dataset loaders, training corpora).

UTF-8 with or without a byte-order mark, or UTF-16/32 with a BOM. A byte that is not valid in
the file's encoding is reported with its line number and never replaced by U+FFFD. A file
without a BOM that looks like UTF-16/32 (NUL bytes in a quarter of its first bytes, or NULs and
no valid UTF-8) is refused with a hint to convert it; a UTF-8 file with a stray NUL byte is UTF-8
with one bad line, named as such (a line reader skips it like an undecodable line).
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
    naming the line). Line endings are stripped; a line is never silently altered."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise MmcseError(f"{path}: is a folder, expected a text file") from None
    encoding = text_encoding(path, data[:4096])
    if encoding == "utf-8-sig":
        data, encoding = data[len(codecs.BOM_UTF8) :], "utf-8"
    if encoding != "utf-8":
        lines = decode_text(path, data).split("\n")
        if lines[-1] == "":
            lines.pop()
        for number, line in enumerate(lines, start=1):
            yield number, line.rstrip("\r"), None
        return
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, None, f"invalid UTF-8 at byte {exc.start} of the line"
            continue
        problem = nul_problem(raw)
        yield number, None if problem else text, problem
