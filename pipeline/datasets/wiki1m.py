"""SimCSE's Wikipedia corpus (Gao et al. 2021): 10⁶ sentences, one per line -- or any sentence
corpus in a format :mod:`mmcse.corpusfiles` reads (JSON lines, CSV/TSV, Parquet, a ``datasets``
dataset; ``text_field`` picks the column).

``text`` is a local ``wiki1m_for_simcse.txt``; without it the file is fetched from the hub repo
``princeton-nlp/datasets-for-simcse`` (only when online). Sentence ids are the 0-based line (row)
number, zero-padded (``wiki1m-0000000``) so they sort in file order; a blank, undecodable or
over-long line is left out (its number not reused) and reported with its line number, or, with
``bad_lines = "refuse"``, refuses the file -- the read policy training applies too. A UTF-16/32
file with a byte-order mark is decoded as such; without one it is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from mmcse import corpusfiles
from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    RecordError,
    Sentence,
    register_dataset,
)

NAME = "wiki1m"
HUB_REPO = "princeton-nlp/datasets-for-simcse"
HUB_FILE = "wiki1m_for_simcse.txt"


@register_dataset(NAME)
def load_wiki1m(source: DataSource, split: str) -> DatasetRecords:
    path = source.text if source.text is not None else _download()
    if not corpusfiles.exists(path):
        raise FileNotFoundError(f"{NAME}: --text-file {path} does not exist")
    read = corpusfiles.read_sentences(path, source.text_field, source.bad_lines, split)
    sentences = [
        Sentence(f"{NAME}-{row:07d}", text) for row, text in zip(read.rows, read.texts, strict=True)
    ]
    errors = [
        RecordError(f"{NAME}-{row:07d}", str(path), f"{read.records.where(row)}: {reason}")
        for row, reason in read.dropped
    ]
    name = str(path) if corpusfiles.is_hf_name(path) else Path(path).name
    return DatasetRecords(NAME, split, sentences=sentences, errors=errors, source=name)


def _download() -> Path:
    offline_hint = (
        f"{NAME}: no --text-file given and the hub is unreachable; download {HUB_FILE} "
        f"(huggingface.co/datasets/{HUB_REPO}) and pass --text-file PATH"
    )
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise MmcseError(offline_hint)
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(HUB_REPO, HUB_FILE, repo_type="dataset"))
    except Exception as exc:  # any network / auth failure means "use the local route"
        raise MmcseError(f"{offline_hint} ({type(exc).__name__})") from None
