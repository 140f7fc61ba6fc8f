"""Import MCSE's released image features: an HDF5 ``features`` array + a row-aligned captions file.

MCSE (Zhang et al. 2022) ships e.g. ``flickr_resnet.hdf5`` (``features``: ``[N, 2048]`` ResNet-50
pool features) with ``flickr_random_captions.txt`` (line ``i`` = the caption drawn for image ``i``).
The files carry no ids, so ids are derived from the row index: image id ``<dataset>-<row>``
(zero-padded so ids sort in row order), caption id ``<image id>#0``. Both a corpus table
(``captions/``) and an image feature set (``image-<teacher>/``) are written, so Stage 2 joins them
by id like any extracted pair. A row-count mismatch is refused: row alignment is the only link.
"""

from __future__ import annotations

from pathlib import Path

from mmcse.cache import FeatureSetWriter, Manifest, write_corpus
from mmcse.errors import MmcseError
from mmcse.files import sha256_file
from pipeline.datasets.base import caption_id, read_text
from pipeline.extract import CAPTIONS_DIR

DEFAULT_TEACHER = "mcse-resnet50"


def import_hdf5_features(
    features: Path,
    captions: Path,
    *,
    dataset: str,
    split: str,
    out: Path,
    key: str = "features",
    teacher_name: str = DEFAULT_TEACHER,
    dtype: str | None = None,
    shard_size: int = 100_000,
) -> dict[str, Manifest]:
    """Write ``out/captions`` and ``out/image-<teacher_name>`` from MCSE's release files."""
    import h5py

    texts = read_text(captions).splitlines()  # strict: row-aligned, nothing may be skipped
    with h5py.File(features, "r") as h5:
        if key not in h5:
            raise MmcseError(f"{features}: no dataset {key!r} (has: {', '.join(h5.keys())})")
        array = h5[key]
        if array.ndim != 2:
            raise MmcseError(f"{features}:{key} has shape {array.shape}; expected [N, dim]")
        if not texts:
            raise MmcseError(f"{captions} is empty")
        if array.shape[0] != len(texts):
            raise MmcseError(
                f"{features}:{key} has {array.shape[0]} rows but {captions} has {len(texts)} "
                "lines; the files must be row-aligned"
            )
        image_ids = row_ids(dataset, len(texts))
        corpus = write_corpus(
            out / CAPTIONS_DIR,
            [caption_id(i, 0) for i in image_ids],
            [t.strip() for t in texts],
            image_ids,
            [dataset] * len(texts),
            dataset=dataset,
            split=split,
            producer={"loader": "import-hdf5", "source_sha256": sha256_file(captions)},
            extra={"caption_policy": "as-released", "source": captions.name},
        )
        writer = FeatureSetWriter(
            out / f"image-{teacher_name}",
            kind="image",
            dim=int(array.shape[1]),
            dtype=dtype or array.dtype.name,
            dataset=dataset,
            split=split,
            producer={"teacher": teacher_name, "weights_sha256": sha256_file(features)},
            extra={"source": f"{features.name}:{key}", "imported": True},
        )
        starts = range(0, len(texts), shard_size)
        for index, start in enumerate(starts):
            stop = min(start + shard_size, len(texts))
            writer.write_shard(index, image_ids[start:stop], array[start:stop])
        image_set = writer.finalize(num_shards=len(starts))
    return {CAPTIONS_DIR: corpus, f"image-{teacher_name}": image_set}


def row_ids(dataset: str, n: int) -> list[str]:
    width = max(6, len(str(n - 1)))
    return [f"{dataset}-{i:0{width}d}" for i in range(n)]
