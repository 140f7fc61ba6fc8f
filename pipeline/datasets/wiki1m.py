"""SimCSE's Wikipedia corpus (Gao et al. 2021): 10⁶ sentences, one per line.

``text`` is a local ``wiki1m_for_simcse.txt``; without it the file is fetched from the hub repo
``princeton-nlp/datasets-for-simcse`` (only when online). Sentence ids are the 0-based line number,
zero-padded (``wiki1m-0000000``) so they sort in file order; blank lines and lines that are not
valid UTF-8 are skipped (their numbers are not reused) and reported with their line number. A
UTF-16/32 file with a byte-order mark is decoded as such; without one it is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    RecordError,
    Sentence,
    read_text_lines,
    register_dataset,
)

NAME = "wiki1m"
HUB_REPO = "princeton-nlp/datasets-for-simcse"
HUB_FILE = "wiki1m_for_simcse.txt"


@register_dataset(NAME)
def load_wiki1m(source: DataSource, split: str) -> DatasetRecords:
    path = source.text if source.text is not None else _download()
    if not path.exists():
        raise FileNotFoundError(f"{NAME}: --text-file {path} does not exist")
    sentences, errors = [], []
    for line_no, line, problem in read_text_lines(path):
        sentence_id = f"{NAME}-{line_no - 1:07d}"
        text = (line or "").strip()
        if problem or not text:
            reason = f"line {line_no}: {problem}" if problem else "blank line"
            errors.append(RecordError(sentence_id, str(path), reason))
        else:
            sentences.append(Sentence(sentence_id, text))
    return DatasetRecords(NAME, split, sentences=sentences, errors=errors, source=path.name)


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
