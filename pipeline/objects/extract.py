"""``mmcse extract-objects``: image–caption pairs → object–phrase pairs → object features.

Per caption (the longest one per image by default, as MCSEO does): a detector grounds the
caption's phrases in the image (Florence-2, or boxes imported from a JSONL file), each phrase is
located in the caption (:mod:`pipeline.objects.spans`), its boxes are segmented (SAM2, or the box
itself), the object is cut out on a filled background (:mod:`pipeline.objects.cutout`) and the
image teacher encodes it. Layout under ``out``::

    captions/            corpus table of the selected captions (shared with extract-images)
    objects/             objects table (kind 'objects'; see mmcse.methods.phrases)
    object-<teacher>/    object features (kind 'object', ids = object ids)
    errors.jsonl         images that could not be read

Object ids are ``f"{caption_id}/{k}"``. A phrase Florence-2 grounds with several boxes ("two
dogs") becomes *one* object whose mask is the union of the boxes' masks: the paper's pairs are
one-to-one (§3.3), and two objects sharing one phrase would be each other's false negatives in
eq. 7. Boxes, masks and spans are in the original image's pixels and the caption's characters.

Sharding, resume, rank splitting and progress are :mod:`pipeline.shards`'s, bad-input handling
that of :mod:`pipeline.extract` (same :class:`~pipeline.extract.RunOptions`): the work list is the sorted
caption ids cut into fixed shards; a shard counts as done when both sets hold it.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import torch
from pyarrow import ipc

from mmcse.cache import FeatureSetWriter, Manifest
from mmcse.cache.kinds import OBJECT_KIND, OBJECT_ROW, OBJECT_TEXT_COLUMNS, OBJECTS_KIND
from mmcse.cache.layout import (
    MANIFEST_NAME,
    publish,
    sha256_ids,
)
from mmcse.cache.objects import ObjectsColumns
from mmcse.errors import MmcseError
from mmcse.files import sha256_file, temp_path
from pipeline.datasets.base import (
    DatasetRecords,
    RecordError,
    caption_id,
    read_text,
    select_captions,
)
from pipeline.errors_log import error_counts, merge_errors, read_parts, sidecar_path, write_sidecar
from pipeline.extract import (
    CAPTIONS_DIR,
    RunOptions,
    ensure_corpus,
    log_loader_errors,
    reuse_finished,
    strict_failure,
)
from pipeline.images import BadImageError, open_rgb
from pipeline.objects.cutout import box_mask, cut_out, decode_rle, encode_rle, fill_colour
from pipeline.objects.florence import Grounding
from pipeline.objects.spans import match_phrases
from pipeline.shards import ShardPlan, run_shards

OBJECTS_DIR = "objects"
STATS_DIR = ".objects-stats"
MASK_SOURCES = ("sam2", "box")
#: decode at full resolution: boxes and masks are stored in the original image's pixels
FULL_RESOLUTION = 1 << 30


class Detector(Protocol):
    def ground(
        self, images: list, captions: list[str], image_ids: list[str]
    ) -> list[list[Grounding]]: ...

    def producer(self) -> dict: ...


@dataclass(frozen=True)
class ObjectSettings:
    """What is computed (recorded in the manifests)."""

    background: str = "mean"
    masks: str = "sam2"
    caption_policy: str = "longest"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.masks not in MASK_SOURCES:
            raise MmcseError(
                f"--masks must be one of {', '.join(MASK_SOURCES)}, not {self.masks!r}"
            )
        fill_colour(self.background, (0.0, 0.0, 0.0))  # validates the name


@dataclass(frozen=True)
class WorkItem:
    caption_id: str
    caption: str
    image_id: str
    path: str


@dataclass
class ShardOutput:
    """One batch's or shard's rows of both sets, plus what it left out and its counts."""

    table_ids: list[str]
    numeric: list[list[float]]
    text: dict[str, list[str]]
    features: list[torch.Tensor]
    errors: list[RecordError]
    stats: Counter

    @classmethod
    def empty(cls) -> ShardOutput:
        return cls([], [], {}, [], [], Counter())

    @classmethod
    def joined(cls, outputs: list[ShardOutput]) -> ShardOutput:
        """One shard's output from its batches' outputs, in batch order."""
        whole = cls.empty()
        for part in outputs:
            whole.table_ids += part.table_ids
            whole.numeric += part.numeric
            for name, values in part.text.items():
                whole.text.setdefault(name, []).extend(values)
            whole.features += part.features
            whole.errors += part.errors
            whole.stats.update(part.stats)
        return whole


class BoxesFile:
    """Precomputed phrase–box pairs (``--detector boxes-file``): JSONL rows with ``image_id``,
    ``caption``, ``phrase`` and ``box`` (xyxy pixels of the original image). A phrase with
    several rows gets all their boxes (one object, like a multi-box Florence-2 phrase)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise MmcseError(f"boxes file {self.path} does not exist")
        self._pairs: dict[tuple[str, str], dict[str, list[list[float]]]] = {}
        lines = read_text(self.path).splitlines()
        for line_no, line in enumerate(lines, start=1):
            if line.strip():
                image_id, caption, phrase, box = self._parse(line, line_no)
                phrases = self._pairs.setdefault((image_id, caption), {})
                phrases.setdefault(phrase, []).append(box)

    def _parse(self, line: str, line_no: int) -> tuple[str, str, str, list[float]]:
        try:
            row = json.loads(line)
            box = [float(v) for v in row["box"]]
            if len(box) != 4 or not all(map(math.isfinite, box)):
                raise ValueError("box must be 4 finite numbers x0, y0, x1, y1")
            return str(row["image_id"]), str(row["caption"]).strip(), str(row["phrase"]), box
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise MmcseError(
                f"{self.path}:{line_no}: expected a JSON object with image_id, caption, phrase "
                f"and box [x0, y0, x1, y1] ({exc})"
            ) from None

    def ground(self, images: list, captions: list[str], image_ids: list[str]) -> list[list]:
        return [
            [
                Grounding(phrase, boxes, float("nan"))
                for phrase, boxes in self._pairs.get((i, c.strip()), {}).items()
            ]
            for i, c in zip(image_ids, captions, strict=True)
        ]

    def producer(self) -> dict:

        return {"detector": "boxes-file", "file": self.path.name, "sha256": sha256_file(self.path)}


class ObjectsTableWriter(FeatureSetWriter):
    """A :class:`FeatureSetWriter` whose shards also carry the objects table's text columns."""

    def __init__(self, path: Path, **settings: Any) -> None:
        super().__init__(path, kind=OBJECTS_KIND, dim=len(OBJECT_ROW), dtype="float32", **settings)

    def write_table_shard(
        self, index: int, ids: list[str], numeric: list[list[float]], text: dict[str, list[str]]
    ) -> Path:
        rows = np.asarray(numeric, dtype=np.float32).reshape(len(ids), len(OBJECT_ROW))
        values = pa.array(rows.reshape(-1))
        columns = {
            "id": pa.array(ids, pa.string()),
            "features": pa.FixedSizeListArray.from_arrays(values, len(OBJECT_ROW)),
            **{name: pa.array(text.get(name, []), pa.string()) for name in OBJECT_TEXT_COLUMNS},
        }
        final = self.shard_path(index)
        temp = temp_path(final)
        try:
            table = pa.table(columns)
            with pa.OSFile(str(temp), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            publish(temp, final)
        finally:
            temp.unlink(missing_ok=True)
        return final


# ---- detection → objects ---------------------------------------------------------------------


def work_items(records: DatasetRecords, policy: str, seed: int) -> list[WorkItem]:
    items = [
        WorkItem(caption_id(r.image_id, k), text, r.image_id, str(r.path))
        for r in records.images
        for k, text in select_captions(r, policy, seed)
    ]
    return sorted(items, key=lambda item: item.caption_id)


def extract_objects(
    records: DatasetRecords,
    detector: Detector,
    segmenter: Any | None,
    teacher: Any,
    teacher_name: str,
    out: Path,
    *,
    settings: ObjectSettings,
    options: RunOptions,
) -> dict[str, Manifest | None]:
    """Ground, segment, cut out and encode every selected caption's objects (module doc)."""
    out = Path(out)
    items = work_items(records, settings.caption_policy, settings.seed)
    if not items:
        raise MmcseError(f"{records.dataset}: no captions to ground")
    log_loader_errors(out, records.errors, options)
    corpus_extra = {"caption_policy": settings.caption_policy}
    if settings.caption_policy == "random-one":
        corpus_extra["caption_seed"] = settings.seed
    results: dict[str, Manifest | None] = {}
    if options.rank == 0:
        results[CAPTIONS_DIR] = ensure_corpus(
            out / CAPTIONS_DIR,
            [i.caption_id for i in items],
            [i.caption for i in items],
            [i.image_id for i in items],
            records=records,
            extra=corpus_extra,
        )
    detection = {
        **detector.producer(),
        "masks": settings.masks,
        **({"segmenter": segmenter.producer()} if segmenter is not None else {}),
    }
    common = dict(dataset=records.dataset, split=records.split, backend=options.backend)
    run_extra = {
        "inputs_sha256": sha256_ids(i.caption_id for i in items),
        "shard_size": options.shard_size,
        "batch_size": options.batch_size,
        **corpus_extra,
    }
    producer = {"teacher": detection.get("detector", "?"), **detection}
    table_settings = dict(kind=OBJECTS_KIND, dim=len(OBJECT_ROW), dtype="float32", **common)
    if (out / OBJECTS_DIR / MANIFEST_NAME).exists():  # detection done: encode its objects
        reuse_finished(
            out / OBJECTS_DIR, {**table_settings, "producer": producer, "extra": run_extra}, options
        )
        encoded = reencode_objects(
            out / OBJECTS_DIR,
            teacher,
            teacher_name,
            out,
            background=settings.background,
            options=options,
        )
        return {**results, OBJECTS_DIR: Manifest.read(out / OBJECTS_DIR), **encoded}
    table = ObjectsTableWriter(out / OBJECTS_DIR, producer=producer, extra=run_extra, **common)
    features = _feature_writer(out, teacher, teacher_name, settings, common, run_extra, options)
    fill = fill_colour(settings.background, teacher.preprocess.mean)

    def compute(batch: list[WorkItem], output: ShardOutput) -> None:
        _objects_of_batch(batch, detector, segmenter, teacher, fill, settings.masks, output)

    plan = ShardPlan(len(items), options.shard_size)
    _run_shards(out, plan, items, table, features, compute, options, "captions", teacher.dim)
    if all(table.has_shard(k) and features.has_shard(k) for k in range(plan.num_shards)):
        results.update(_finalize(out, plan.num_shards, len(items), table, features, teacher_name))
    return results


def _objects_of_batch(
    batch: list[WorkItem],
    detector: Detector,
    segmenter: Any | None,
    teacher: Any,
    fill: tuple[int, int, int],
    masks_from: str,
    output: ShardOutput,
) -> None:
    decoded = _decode(batch, output)
    if not decoded:
        return
    good = [item for item, _ in decoded]
    images = [image for _, image in decoded]
    failures = getattr(detector, "parse_failures", 0)
    groundings = detector.ground(images, [i.caption for i in good], [i.image_id for i in good])
    output.stats["unparsable detector outputs"] += getattr(detector, "parse_failures", 0) - failures
    arrays = [np.array(image) for image in images]
    per_image_pairs = []
    for item, found in zip(good, groundings, strict=True):
        matches = match_phrases(item.caption, [g.phrase for g in found])
        output.stats["phrases_grounded"] += len(found)
        output.stats.update(f"dropped: {m.reason}" for m in matches if not m.matched)
        per_image_pairs.append([(m, g) for m, g in zip(matches, found, strict=True) if m.matched])
    boxes = [[box for _, g in pairs for box in g.boxes] for pairs in per_image_pairs]
    masks = _masks(arrays, boxes, segmenter, masks_from)
    pixels = []
    for item, array, pairs, (box_masks, box_scores) in zip(
        good, arrays, per_image_pairs, masks, strict=True
    ):
        at, k = 0, 0
        for match, grounding in pairs:
            n = len(grounding.boxes)
            mask = box_masks[at : at + n].any(axis=0)
            score = float(np.mean(box_scores[at : at + n]))
            at += n
            cutout = cut_out(array, mask, teacher.preprocess.crop, fill)
            if cutout is None:
                output.stats["dropped: empty mask"] += 1
                continue
            pixels.append(cutout)
            _add_row(output, item, k, match, grounding, mask, score)
            k += 1
    if pixels:
        device = torch.device(getattr(teacher, "device", "cpu"))
        output.features.append(teacher.encode_images(torch.stack(pixels).to(device)).float().cpu())


def _decode(batch: list[WorkItem], output: ShardOutput) -> list[tuple[WorkItem, Any]]:
    decoded = []
    for item in batch:
        try:
            decoded.append((item, open_rgb(item.path, FULL_RESOLUTION)))
        except BadImageError as exc:
            output.errors.append(RecordError(item.image_id, item.path, exc.reason))
    output.stats["captions"] += len(decoded)
    return decoded


def _masks(arrays, boxes, segmenter, masks_from: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per image, ``([K, H, W] bool, [K] score)`` for its flattened boxes."""
    if masks_from == "sam2":
        return [(s.masks, s.scores) for s in segmenter.segment(arrays, boxes)]
    return [
        (
            np.stack([box_mask(a.shape[0], a.shape[1], b) for b in bs])
            if bs
            else np.zeros((0, *a.shape[:2]), dtype=bool),
            np.ones(len(bs), dtype=np.float32),
        )
        for a, bs in zip(arrays, boxes, strict=True)
    ]


def _add_row(output, item: WorkItem, k: int, match, grounding: Grounding, mask, score) -> None:
    boxes = np.asarray(grounding.boxes, dtype=np.float64)
    union = [boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max()]
    output.table_ids.append(f"{item.caption_id}/{k}")
    output.numeric.append([match.start, match.end, *union, grounding.score, score])
    columns = {
        "image_id": item.image_id,
        "image_path": item.path,
        "caption_id": item.caption_id,
        "phrase": grounding.phrase,
        "span_text": item.caption[match.start : match.end],
        "mask_rle": json.dumps(encode_rle(mask), separators=(",", ":")),
    }
    for name, value in columns.items():
        output.text.setdefault(name, []).append(value)
    output.stats["objects"] += 1


# ---- re-encoding (--from-objects) ------------------------------------------------------------


def reencode_objects(
    objects_dir: Path,
    teacher: Any,
    teacher_name: str,
    out: Path,
    *,
    background: str,
    options: RunOptions,
) -> dict[str, Manifest | None]:
    """Object features of another teacher for an existing objects table (no detection)."""
    table = ObjectsColumns.open(objects_dir)
    manifest = table.manifest
    order = np.argsort(table.columns["id"].astype(str), kind="stable")
    settings = ObjectSettings(background=background)
    common = dict(dataset=manifest.dataset, split=manifest.split, backend=options.backend)
    run_extra = {
        "inputs_sha256": sha256_ids(table.columns["id"].astype(str)),
        "shard_size": options.shard_size,
        "batch_size": options.batch_size,
    }
    out = Path(out)
    part = f"object-{teacher_name}"
    if (out / part / MANIFEST_NAME).exists():  # same teacher settings; extra may differ by route
        wanted = _feature_settings(teacher, settings, common, {}, options)
        return {part: reuse_finished(out / part, wanted, options)}
    features = _feature_writer(out, teacher, teacher_name, settings, common, run_extra, options)
    fill = fill_colour(background, teacher.preprocess.mean)

    def compute(rows: list[int], output: ShardOutput) -> None:
        _reencode_batch(table, rows, teacher, fill, output)

    plan = ShardPlan(len(order), options.shard_size)
    work = [int(r) for r in order]
    _run_shards(out, plan, work, None, features, compute, options, "objects", teacher.dim)
    if not all(features.has_shard(k) for k in range(plan.num_shards)):
        return {f"object-{teacher_name}": None}
    errors = read_parts(out, f"object-{teacher_name}", plan.num_shards)
    done = features.finalize(
        extra={**error_counts(errors), **_table_link(out / f"object-{teacher_name}", objects_dir)},
        num_shards=plan.num_shards,
        allow_empty=len(table) == 0,
    )
    merge_errors(out)
    return {f"object-{teacher_name}": done}


def _reencode_batch(table: ObjectsColumns, rows: list[int], teacher, fill, output) -> None:
    pixels, images = [], {}
    for row in rows:
        path = str(table.columns["image_path"][row])
        object_id = str(table.columns["id"][row])
        try:
            image = images.get(path)
            if image is None:
                image = images[path] = np.array(open_rgb(path, FULL_RESOLUTION))
        except BadImageError as exc:
            output.errors.append(RecordError(object_id, path, exc.reason))
            continue
        cutout = cut_out(image, decode_rle(table.mask(row)), teacher.preprocess.crop, fill)
        if cutout is None:
            output.errors.append(RecordError(object_id, path, "empty mask"))
            continue
        pixels.append(cutout)
        output.table_ids.append(object_id)
    if pixels:
        device = torch.device(getattr(teacher, "device", "cpu"))
        output.features.append(teacher.encode_images(torch.stack(pixels).to(device)).float().cpu())


# ---- shards, writers, finalize ---------------------------------------------------------------


def _run_shards(
    out: Path,
    plan: ShardPlan,
    work: list,
    table: ObjectsTableWriter | None,
    features: FeatureSetWriter,
    compute: Callable[[list, ShardOutput], None],
    options: RunOptions,
    unit: str,
    dim: int,
) -> None:
    """This rank's unfinished shards, batch by batch; features are written before the table,
    so a shard whose table part exists is complete."""

    def done(k: int) -> bool:
        return features.has_shard(k) and (table is None or table.has_shard(k))

    def batches(pending: list[int]) -> Iterator[tuple[int, range, ShardOutput]]:
        for k in pending:
            for rows in plan.batches(k, options.batch_size):
                output = ShardOutput.empty()
                compute([work[r] for r in rows], output)
                if output.errors and options.strict:
                    raise strict_failure(output.errors[0])
                yield k, rows, output

    def write(k: int, outputs: list[ShardOutput]) -> None:
        output = ShardOutput.joined(outputs)
        write_sidecar(sidecar_path(out, part, k), output.errors)
        _write_stats(out, k, output.stats)
        stacked = torch.cat(output.features) if output.features else torch.empty(0, dim)
        features.write_shard(k, output.table_ids, stacked)
        if table is not None:
            table.write_table_shard(k, output.table_ids, output.numeric, output.text)

    part = features.path.name if table is None else OBJECTS_DIR
    run_shards(
        plan,
        plan.shards_for_rank(options.rank, options.world_size),
        batch_size=options.batch_size,
        done=done,
        batches=batches,
        write=write,
        desc=part,
        unit=unit,
        progress=options.progress,
    )


def _write_stats(out: Path, shard: int, stats: Counter) -> None:
    path = out / STATS_DIR / f"shard-{shard:05d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(stats.items()))), encoding="utf-8")


def _read_stats(out: Path, num_shards: int) -> Counter:
    total: Counter = Counter()
    for k in range(num_shards):
        path = out / STATS_DIR / f"shard-{k:05d}.json"
        if path.exists():
            total.update(json.loads(path.read_text(encoding="utf-8")))
    return total


def _feature_writer(
    out, teacher, teacher_name, settings: ObjectSettings, common, run_extra, options
) -> FeatureSetWriter:
    path = out / f"object-{teacher_name}"
    return FeatureSetWriter(
        path, **_feature_settings(teacher, settings, common, run_extra, options)
    )


def _feature_settings(teacher, settings: ObjectSettings, common, run_extra, options) -> dict:
    fill = fill_colour(settings.background, teacher.preprocess.mean)
    producer = {
        **teacher.producer(),
        "cutout": {"background": settings.background, "fill_rgb": list(fill), "fit": "pad-square"},
    }
    return dict(
        kind=OBJECT_KIND,
        dim=int(teacher.dim),
        dtype=options.dtype,
        producer=producer,
        normalized=bool(getattr(teacher, "normalized", False)),
        extra=run_extra,
        **common,
    )


def _finalize(out, num_shards, num_captions, table, features, teacher_name) -> dict:
    errors = read_parts(out, OBJECTS_DIR, num_shards)
    stats = _read_stats(out, num_shards)
    # no object detected at all is a result (reported in counts), not a failed run
    table_manifest = table.finalize(
        extra={**error_counts(errors), **_summary(stats, num_captions)},
        num_shards=num_shards,
        allow_empty=True,
    )
    feature_manifest = features.finalize(
        extra=_table_link(features.path, out / OBJECTS_DIR), num_shards=num_shards, allow_empty=True
    )
    merge_errors(out)
    return {OBJECTS_DIR: table_manifest, f"object-{teacher_name}": feature_manifest}


def _summary(stats: Counter, num_captions: int) -> dict:
    captions = stats.get("captions", 0)
    return {
        "num_captions": num_captions,
        "captions_decoded": captions,
        "pairs_per_caption": round(stats.get("objects", 0) / captions, 3) if captions else 0.0,
        "counts": dict(sorted(stats.items())),
    }


def _table_link(feature_path: Path, objects_dir: Path) -> dict:
    """``extra`` keys naming the objects table (relative, so the cache folder can move)."""
    relative = os.path.relpath(Path(objects_dir).resolve(), Path(feature_path).resolve())
    return {
        "objects_table": relative,
        "objects_fingerprint": Manifest.read(objects_dir).fingerprint,
    }
