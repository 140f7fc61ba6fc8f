"""Corpora for tests: one given as arrays, and any corpus read whole into arrays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mmcse.training.corpora import open_corpus


@dataclass
class InMemoryCorpus:
    """A corpus given as arrays (what :class:`mmcse.training.data.Source` reads of a corpus)."""

    ids: np.ndarray
    texts: list[str]
    image_ids: np.ndarray | None = None
    fingerprint: str = ""
    path: Path = Path("<memory>")

    def __len__(self) -> int:
        return len(self.ids)


def read_corpus(
    path: str, text_field: str | None = None, bad_lines: str = "skip"
) -> tuple[np.ndarray, list[str], np.ndarray | None, str]:
    """(ids, texts, image_ids, fingerprint) of a corpus table dir or a sentence file."""
    corpus = open_corpus(path, text_field, bad_lines)
    image_ids = corpus.image_ids
    return np.asarray(corpus.ids, dtype=object), list(corpus.texts), image_ids, corpus.fingerprint
