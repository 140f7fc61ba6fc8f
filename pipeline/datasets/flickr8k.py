"""Flickr8k (Hodosh et al. 2013): 8,092 images × 5 captions.

Needs ``images`` and ``captions`` = ``Flickr8k.token.txt``; the split comes from ``split_file`` or,
when omitted, from ``Flickr_8k.{train,dev,test}Images.txt`` beside the token file (``val`` reads
``dev``).
"""

from __future__ import annotations

from mmcse.errors import MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    DataSource,
    SplitInfo,
    parse_token_file,
    read_name_list,
    records_from_split,
    register_dataset,
    require_path,
)

NAME = "flickr8k"
SPLIT_FILES = {"train": "trainImages", "val": "devImages", "dev": "devImages", "test": "testImages"}


@register_dataset(NAME)
def load_flickr8k(source: DataSource, split: str) -> DatasetRecords:
    images = require_path(source.images, "--images (the Flicker8k_Dataset folder)", NAME)
    token_file = require_path(source.captions, "--captions (Flickr8k.token.txt)", NAME)
    split_file = source.split_file
    if split_file is None:
        if split not in SPLIT_FILES:
            raise MmcseError(f"{NAME}: splits are train, val, test; got {split!r}")
        split_file = token_file.parent / f"Flickr_8k.{SPLIT_FILES[split]}.txt"
    split_file = require_path(split_file, "split list", NAME)
    captions, file_names, errors = parse_token_file(token_file)
    records, missing = records_from_split(
        read_name_list(split_file), captions, file_names, images, split_file
    )
    return DatasetRecords(
        NAME,
        split,
        records,
        errors=errors + missing,
        source=token_file.name,
        split_info=SplitInfo(listed_by=split_file),
    )
