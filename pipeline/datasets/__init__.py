"""Dataset loaders (registry ``DATASETS``): local files → image records and/or sentences."""

from pipeline.datasets import coco, flickr8k, flickr30k, local, wiki1m  # noqa: F401  (register)
from pipeline.datasets.base import (
    CAPTION_POLICIES,
    DATASETS,
    DatasetRecords,
    DataSource,
    ImageRecord,
    RecordError,
    Sentence,
    caption_id,
    load_dataset,
    select_captions,
)

__all__ = [
    "CAPTION_POLICIES",
    "DATASETS",
    "DataSource",
    "DatasetRecords",
    "ImageRecord",
    "RecordError",
    "Sentence",
    "caption_id",
    "load_dataset",
    "select_captions",
]
