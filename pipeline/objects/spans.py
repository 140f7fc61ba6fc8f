"""Locate grounded phrases in their caption as character spans.

Florence-2 echoes the phrases of the caption it was given, but not byte for byte: its parser drops
every non-ASCII character (``café`` comes back as ``caf``, ``man’s`` as ``mans``), case and
spacing may differ, and a phrase may carry stray punctuation. So matching is done on a normalised
view of the caption (ASCII only, lower case, whitespace collapsed) that keeps, for every
character, its index in the original caption; spans are reported in original characters.

Phrases are matched left to right: each search starts after the previous match, so the second
"a man" in "a man hands a man a cup" gets the second occurrence. A phrase not found after the
cursor may still match an earlier occurrence nobody has taken (Florence-2 does not always keep
caption order). Matches must start and end on word boundaries ("a man" never matches inside
"a mango"). Unmatched phrases are returned with the reason they were dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

_TRIM = " \t\n\r.,;:!?\"'()[]{}"


@dataclass(frozen=True)
class PhraseMatch:
    """One phrase and where it sits in the caption (``start``/``end`` are ``None`` when dropped)."""

    phrase: str
    start: int | None
    end: int | None
    reason: str = ""

    @property
    def matched(self) -> bool:
        return self.start is not None


def _normalise(text: str) -> tuple[str, list[int]]:
    """Lower-cased ASCII text with single spaces, and each kept character's original index."""
    chars: list[str] = []
    index: list[int] = []
    for i, ch in enumerate(text):
        if not ch.isascii():
            continue  # Florence-2's parser strips these; drop them on the caption side too
        if ch.isspace():
            if not chars or chars[-1] == " ":
                continue
            ch = " "
        chars.append(ch.lower())
        index.append(i)
    return "".join(chars), index


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _widen_over_stripped(caption: str, start: int, end: int) -> tuple[int, int]:
    """Grow a span over non-ASCII letters glued to it (``caf`` → ``café``)."""
    while start > 0 and not caption[start - 1].isascii() and _is_word_char(caption[start - 1]):
        start -= 1
    while end < len(caption) and not caption[end].isascii() and _is_word_char(caption[end]):
        end += 1
    return start, end


def _on_word_boundaries(caption: str, start: int, end: int) -> bool:
    before_ok = start == 0 or not (
        _is_word_char(caption[start - 1]) and _is_word_char(caption[start])
    )
    after_ok = end == len(caption) or not (
        _is_word_char(caption[end - 1]) and _is_word_char(caption[end])
    )
    return before_ok and after_ok


def _occurrences(haystack: str, needle: str, start: int) -> list[int]:
    found = []
    at = haystack.find(needle, start)
    while at != -1:
        found.append(at)
        at = haystack.find(needle, at + 1)
    return found


def match_phrases(caption: str, phrases: list[str]) -> list[PhraseMatch]:
    """Character spans of ``phrases`` in ``caption``, in the order given (see module doc)."""
    norm, index = _normalise(caption)
    taken: set[tuple[int, int]] = set()
    cursor = 0
    matches = []
    for phrase in phrases:
        needle, _ = _normalise(phrase.strip(_TRIM))
        needle = needle.strip(_TRIM)
        if not needle:
            matches.append(PhraseMatch(phrase, None, None, "empty phrase"))
            continue
        candidates = _occurrences(norm, needle, cursor) + _occurrences(norm, needle, 0)
        span, blocked = None, False
        for at in candidates:
            start, end = index[at], index[at + len(needle) - 1] + 1
            start, end = _widen_over_stripped(caption, start, end)
            if not _on_word_boundaries(caption, start, end):
                continue
            if (start, end) in taken:
                blocked = True
                continue
            span, cursor = (start, end), at + len(needle)
            break
        if span is None:
            reason = "already matched" if blocked else "not found in caption"
            matches.append(PhraseMatch(phrase, None, None, reason))
            continue
        taken.add(span)
        matches.append(PhraseMatch(phrase, *span))
    return matches
