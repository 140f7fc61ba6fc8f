"""The Stage-1 engine: run a frozen teacher over images or sentences into sharded feature sets.

Layout of one run under ``out`` (default ``cache/<dataset>/<split>/``)::

    captions/ or sentences/   corpus table (id, text, image_id, source)
    image-<teacher>/          image features, ids = image ids
    text-<teacher>/           text features, ids = caption / sentence ids
    errors.jsonl              every input left out (stage, id, path, reason)
    .errors/                  per-shard error sidecars (merged into errors.jsonl at finalize)

Determinism and resume. The work list is sorted by id and cut into fixed ``shard_size`` shards;
batches never cross a shard and always start at the shard's first item, so a shard's rows do not
depend on which shards ran before it. Finished shards (:meth:`FeatureSetWriter.has_shard`) are
skipped on rerun, so a run killed at any moment and rerun ends byte-identical to an uninterrupted
one. The inputs' id hash, shard size and batch size are part of the set's settings: a rerun with
different inputs or sharding is refused instead of mixing shards, and a finished set is reused only
when the command would write exactly it again (same teacher, weights, dtype, …; otherwise an
error says to remove it or choose another ``--out``). Temp files of killed runs are deleted at
the start of the next one.

Scale-out. Rank ``r`` of ``W`` (``--rank/--world-size`` or torchrun's ``RANK``/``WORLD_SIZE``)
takes shards ``k`` with ``k % W == r`` — no padding, no duplicates. Whichever rank finds every
shard present when it is done finalizes (writes the manifest); rerunning the command with all
shards present does the same.

Bad inputs (undecodable images, unreadable caption rows, paths outside the image root, rows whose
features are NaN/Inf) are logged and left out; the count is in ``extra.num_errors`` of the
manifest. With ``strict`` the first one stops the run; when every input is left out, nothing is
written and the run fails. The caption corpus is written after the image set is complete and
holds only the captions of images that got features (the others are logged as
``captions-dropped``), so the corpus and the features of one run always join; with several ranks
the rank that completes the image set writes the corpus and the caption features.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmcse.cache import Corpus, FeatureSet, FeatureSetWriter, Manifest, write_corpus
from mmcse.cache.layout import MANIFEST_NAME, os_errors, sha256_ids
from mmcse.cache.writer import remove_finished_leftovers, settings_mismatch
from mmcse.distributed import env_int
from mmcse.errors import CacheError, MmcseError
from pipeline.datasets.base import (
    DatasetRecords,
    RecordError,
    caption_id,
    select_captions,
)
from pipeline.errors_log import (
    LOADER_PART,
    error_counts,
    merge_errors,
    read_parts,
    read_sidecar,
    remove_stale_temp_files_under,
    sidecar_path,
    write_sidecar,
)
from pipeline.images import CPU_DECODER, DEFAULT_MAX_PIXELS, DecodeDataset, collate_decoded
from pipeline.shards import ShardPlan, run_shards
from pipeline.workers import decode_workers

logger = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 4096
DEFAULT_BATCH_SIZE = 256
CAPTIONS_DIR = "captions"
SENTENCES_DIR = "sentences"
#: errors.jsonl stage of captions dropped because their image was left out
DROPPED_CAPTIONS_PART = "captions-dropped"


@dataclass(frozen=True)
class RunOptions:
    """How to run (not what to compute): sharding, batching, devices, failure policy."""

    shard_size: int = DEFAULT_SHARD_SIZE
    batch_size: int = DEFAULT_BATCH_SIZE
    workers: int = field(default_factory=lambda: decode_workers(None))
    dtype: str = "float32"  # storage dtype of the features
    strict: bool = False
    rank: int = 0
    world_size: int = 1
    decode: str = "cpu"  # the one decoder: Pillow in the workers ("gpu" was removed)
    max_pixels: int = DEFAULT_MAX_PIXELS
    backend: str = "arrow"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.shard_size < 1 or self.batch_size < 1:
            raise MmcseError("--shard-size and --batch-size must be positive")
        if self.workers < 0:  # checked here, before the teacher loads and .pending.json exists
            raise MmcseError(
                f"--workers {self.workers}: give 0 (decode in this process) or more processes"
            )
        if not 0 <= self.rank < self.world_size:
            raise MmcseError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.decode != "cpu":
            raise MmcseError(
                f"--decode {self.decode} is not available: images are decoded by Pillow on the "
                "CPU workers only, the decoder whose truncation checks and pixels the tests pin "
                "(the nvJPEG route, removed, used torchvision.io's deprecated decoding and was "
                "never measured to pay); drop --decode"
            )


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit flags win; otherwise torchrun's ``RANK``/``WORLD_SIZE``; otherwise ``(0, 1)``.
    A malformed value is one error naming the flag or variable and its value."""
    rank_name = "--rank" if rank is not None else "RANK"
    world_name = "--world-size" if world_size is not None else "WORLD_SIZE"
    if world_size is None:
        world_size = env_int("WORLD_SIZE", 1, minimum=1)
    elif world_size < 1:
        raise MmcseError(f"--world-size must be at least 1, got {world_size}")
    if rank is None:
        rank = env_int("RANK", 0)
    elif rank < 0:
        raise MmcseError(f"--rank must be at least 0, got {rank}")
    if rank >= world_size:
        raise MmcseError(
            f"{rank_name}={rank} is not below {world_name}={world_size} "
            f"(ranks run from 0 to {world_size - 1})"
        )
    return rank, world_size


@dataclass
class FeatureJob:
    """One feature set to produce: sorted unique ids, their inputs, the writer settings."""

    part: str  # directory name under ``out``
    ids: list[str]
    inputs: list[Any]  # image paths or sentences, aligned with ids
    settings: dict[str, Any]  # FeatureSetWriter keywords except path/backend


@dataclass
class BatchResult:
    """What one batch adds to its shard: the kept ids, their features, the inputs left out."""

    ids: list[str]
    features: torch.Tensor
    errors: list[RecordError]


def strict_failure(error: RecordError) -> MmcseError:
    return MmcseError(
        f"{error.path}: {error.reason} (id {error.id}); --strict stops at the first bad input "
        "(drop --strict to skip and log bad inputs in errors.jsonl)"
    )


# ---- images ----------------------------------------------------------------------------------


def extract_images(
    records: DatasetRecords,
    teacher: Any,
    teacher_name: str,
    out: Path,
    *,
    caption_policy: str,
    seed: int,
    options: RunOptions,
) -> dict[str, Manifest | None]:
    """Corpus of captions + image features (+ caption features for CLIP-style teachers).

    Returns the manifest of every set this call finished (``None`` for a set other ranks still
    have to complete).
    """
    out = Path(out)
    start_run(out)
    image_list = sorted(records.images, key=lambda r: r.image_id)
    _refuse_duplicate_ids([r.image_id for r in image_list], "image")
    log_loader_errors(out, records.errors, options)
    corpus_extra = {"caption_policy": caption_policy, **_seed_extra(caption_policy, seed)}
    image_job = FeatureJob(
        part=f"image-{teacher_name}",
        ids=[r.image_id for r in image_list],
        inputs=[str(r.path) for r in image_list],
        settings=_settings(records, teacher, "image", options, decode=CPU_DECODER),
    )
    results: dict[str, Manifest | None] = {
        image_job.part: run_job(out, image_job, teacher, options)
    }
    if results[image_job.part] is None:
        return results  # the rank that completes the image set writes the captions
    # Captions of images left out are dropped too, so the corpus and the features cover the
    # same images and the output trains as is.
    kept = set(FeatureSet.open(out / image_job.part).ids.tolist())
    corpus = _caption_rows([r for r in image_list if r.image_id in kept], caption_policy, seed)
    dropped = log_dropped_captions(
        out, [r for r in image_list if r.image_id not in kept], caption_policy, seed
    )
    results[CAPTIONS_DIR] = ensure_corpus(
        out / CAPTIONS_DIR,
        *corpus,
        records=records,
        extra={**corpus_extra, "num_dropped_captions": dropped},
    )
    if hasattr(teacher, "encode_texts"):
        text_job = _text_job(records, teacher, teacher_name, corpus[0], corpus[1], options)
        text_job.settings["extra"].update(corpus_extra)
        # every shard here: other ranks stopped at the image set
        whole = replace(options, rank=0, world_size=1)
        results[text_job.part] = run_job(out, text_job, teacher, whole)
    return results


def log_dropped_captions(out: Path, images: list, policy: str, seed: int) -> int:
    """One errors.jsonl row per caption dropped because its image was left out; their count."""
    dropped = [
        RecordError(caption_id(r.image_id, k), str(r.path), "image left out (see its own row)")
        for r in images
        for k, _ in select_captions(r, policy, seed)
    ]
    write_sidecar(sidecar_path(out, DROPPED_CAPTIONS_PART), dropped)
    merge_errors(out)
    return len(dropped)


def start_run(out: Path) -> None:
    """Create ``out`` (an OS error names it) and delete temp files of killed runs."""
    with os_errors(out, "create the output folder"):
        out.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files_under(out)


def _caption_rows(images, policy: str, seed: int) -> tuple[list, list, list]:
    rows = [
        (caption_id(r.image_id, k), text, r.image_id)
        for r in images
        for k, text in select_captions(r, policy, seed)
    ]
    rows.sort()
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _seed_extra(policy: str, seed: int) -> dict:
    return {"caption_seed": seed} if policy == "random-one" else {}


# ---- texts -----------------------------------------------------------------------------------


def extract_texts(
    records: DatasetRecords,
    teacher: Any,
    teacher_name: str,
    out: Path,
    *,
    caption_policy: str,
    seed: int,
    options: RunOptions,
) -> dict[str, Manifest | None]:
    """A corpus table (sentences, or captions under ``caption_policy``) + its text features.

    ``teacher=None`` writes the corpus table alone (no teacher pass).
    """
    out = Path(out)
    start_run(out)
    log_loader_errors(out, records.errors, options, SENTENCES_DIR if records.sentences else None)
    if records.sentences:
        part, extra = SENTENCES_DIR, {}
        sentences = sorted(records.sentences, key=lambda s: s.id)
        ids, texts, image_ids = [s.id for s in sentences], [s.text for s in sentences], None
    else:
        part, extra = (
            CAPTIONS_DIR,
            {"caption_policy": caption_policy, **_seed_extra(caption_policy, seed)},
        )
        images = sorted(records.images, key=lambda r: r.image_id)
        ids, texts, image_ids = _caption_rows(images, caption_policy, seed)
    results: dict[str, Manifest | None] = {}
    if options.rank == 0:
        results[part] = ensure_corpus(
            out / part, ids, texts, image_ids, records=records, extra=extra
        )
    if teacher is None:  # --teacher none: the corpus table only (SimCSE/MCSE read no features)
        merge_errors(out)  # the loader's rows left out still go to errors.jsonl
        return results
    job = _text_job(records, teacher, teacher_name, ids, texts, options)
    job.settings["extra"].update(extra)
    results[job.part] = run_job(out, job, teacher, options)
    return results


def extract_corpus_texts(
    corpus_path: Path, teacher: Any, teacher_name: str, out: Path, options: RunOptions
) -> dict[str, Manifest | None]:
    """Text features for an existing corpus table (e.g. the captions ``extract-images`` wrote)."""
    start_run(Path(out))
    corpus = Corpus.open(corpus_path)
    ids = [str(i) for i in corpus.ids]
    order = sorted(range(len(ids)), key=ids.__getitem__)
    records = DatasetRecords(corpus.manifest.dataset, corpus.manifest.split)
    texts = corpus.texts
    job = _text_job(
        records, teacher, teacher_name, [ids[i] for i in order], [texts[i] for i in order], options
    )
    job.settings["extra"]["corpus_fingerprint"] = corpus.fingerprint
    return {job.part: run_job(Path(out), job, teacher, options)}


def _text_job(records, teacher, teacher_name, ids, texts, options) -> FeatureJob:
    _refuse_duplicate_ids(ids, "sentence")
    return FeatureJob(
        part=f"text-{teacher_name}",
        ids=list(ids),
        inputs=list(texts),
        settings=_settings(records, teacher, "text", options),
    )


def text_batches(
    job: FeatureJob, plan: ShardPlan, shards: Sequence[int], teacher: Any, options: RunOptions
) -> Iterator[tuple[int, list[int], torch.Tensor, list[RecordError]]]:
    """``(shard, rows, features, bad)`` per batch; sentences never fail (loaders drop blanks)."""
    for shard in shards:
        for rows in plan.batches(shard, options.batch_size):
            yield shard, list(rows), teacher.encode_texts([job.inputs[i] for i in rows]), {}


def image_batches(
    job: FeatureJob, plan: ShardPlan, shards: Sequence[int], teacher: Any, options: RunOptions
) -> Iterator[tuple[int, list[int], torch.Tensor, dict[int, RecordError]]]:
    """``(shard, rows, features, bad)`` per batch: workers decode to uint8, the teacher's device
    normalises and encodes. Batches are fixed slices of one shard (see the module docstring)."""
    device = torch.device(getattr(teacher, "device", "cpu"))
    dataset = DecodeDataset(job.inputs, teacher.preprocess, options.max_pixels)
    batch_rows = [list(rows) for k in shards for rows in plan.batches(k, options.batch_size)]
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batch_rows,
        num_workers=options.workers,
        collate_fn=collate_decoded,
        pin_memory=device.type == "cuda",
    )
    for rows, pixels, reasons in loader:
        bad = {r: RecordError(job.ids[r], job.inputs[r], reason) for r, reason in reasons.items()}
        if len(pixels):
            features = teacher.encode_images(pixels.to(device, non_blocking=True))
        else:
            features = torch.empty(0, job.settings["dim"])
        yield rows[0] // plan.shard_size, rows, features, bad


# ---- one feature set, shard by shard -----------------------------------------------------------------


def run_job(out: Path, job: FeatureJob, teacher: Any, options: RunOptions) -> Manifest | None:
    """Compute this rank's missing shards of ``job``; finalize if every shard is then present."""
    path = out / job.part
    settings = {
        **job.settings,
        "extra": {**job.settings["extra"], "inputs_sha256": sha256_ids(job.ids)},
    }
    if (path / MANIFEST_NAME).exists():  # finished by an earlier run or another rank
        manifest = reuse_finished(path, settings, options)
        merge_errors(out)  # a run killed right after the manifest had not merged them yet
        return manifest
    writer = FeatureSetWriter(path, backend=options.backend, **settings)
    plan = ShardPlan(len(job.ids), options.shard_size)
    stream = image_batches if job.settings["kind"] == "image" else text_batches

    def batches(pending: list[int]) -> Iterator[tuple[int, list[int], BatchResult]]:
        for shard, rows, features, bad in stream(job, plan, pending, teacher, options):
            yield shard, rows, _checked(job, rows, features, bad, options)

    def write(shard: int, results: list[BatchResult]) -> None:
        write_sidecar(sidecar_path(out, job.part, shard), [e for r in results for e in r.errors])
        features = _concat([r.features for r in results], job.settings["dim"])
        writer.write_shard(shard, [i for r in results for i in r.ids], features)

    run_shards(
        plan,
        plan.shards_for_rank(options.rank, options.world_size),
        batch_size=options.batch_size,
        done=writer.has_shard,
        batches=batches,
        write=write,
        desc=job.part,
        unit="img" if job.settings["kind"] == "image" else "sent",
        progress=options.progress,
    )
    if all(writer.has_shard(k) for k in range(plan.num_shards)):
        return finalize_job(out, job.part, writer, plan.num_shards)
    return None


def reuse_finished(path: Path, settings: dict[str, Any], options: RunOptions) -> Manifest:
    """The manifest of the finished set at ``path`` if this command would write the same set;
    a :class:`CacheError` saying what differs otherwise (never a silent reuse). Writer state a
    run killed right after the manifest left behind (``.pending.json``) is removed."""
    remove_finished_leftovers(path)
    manifest = FeatureSet.open(path).manifest
    differences = settings_mismatch(manifest, **{"backend": options.backend, **settings})
    if differences:
        shown = "; ".join(differences[:3]) + (" …" if len(differences) > 3 else "")
        raise CacheError(
            f"{path} already holds a set made with other settings ({shown}); remove it with "
            f"`mmcse cache rm {path}` to recompute it, or pass another --out"
        )
    return manifest


def _checked(job: FeatureJob, rows, features: torch.Tensor, bad: dict, options) -> BatchResult:
    """One batch's kept ids and features and its errors (non-finite rows included); with
    ``strict`` its first error stops the run."""
    features, bad = _drop_nonfinite(job, rows, features.detach().float().cpu(), bad)
    if bad and options.strict:
        raise strict_failure(next(iter(bad.values())))
    return BatchResult([job.ids[i] for i in rows if i not in bad], features, list(bad.values()))


def _drop_nonfinite(job: FeatureJob, rows, features: torch.Tensor, bad: dict):
    """Rows whose features are NaN/Inf in the storage dtype (overflow included) become errors."""
    good_rows = [i for i in rows if i not in bad]
    if not len(features):
        return features, bad
    with np.errstate(over="ignore", invalid="ignore"):
        stored = features.reshape(len(features), -1).numpy().astype(job.settings["dtype"])
    finite = np.isfinite(stored).all(axis=1)
    if finite.all():
        return features, bad
    kind = job.settings["kind"]
    reason = f"non-finite features: NaN or Inf from the teacher or overflow in {stored.dtype}"
    bad = dict(bad)
    for row, ok in zip(good_rows, finite, strict=True):
        if not ok:
            path = job.inputs[row] if kind == "image" else ""
            bad[row] = RecordError(job.ids[row], path, reason)
    return features[torch.from_numpy(finite)], bad


def _concat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    parts = [p for p in parts if len(p)]
    return torch.cat(parts) if parts else torch.empty(0, dim)


def finalize_job(out: Path, part: str, writer: FeatureSetWriter, num_shards: int) -> Manifest:
    """Write the manifest (with error counts from every shard's sidecar) and ``errors.jsonl``."""
    errors = read_parts(out, part, num_shards)
    if not any(writer.shard_num_rows(k) for k in range(num_shards)):
        log = merge_errors(out)
        reasons = ", ".join(
            f"{n} {why}" for why, n in error_counts(errors)["errors_by_reason"].items()
        )
        raise MmcseError(
            f"{out / part}: every input was left out ({reasons or 'no inputs'}); no set written. "
            f"Check the input paths (e.g. --images); each input's reason is in {log}"
        )
    manifest = writer.finalize(extra=error_counts(errors), num_shards=num_shards)
    merge_errors(out)
    return manifest


def _settings(records, teacher, kind: str, options: RunOptions, **extra) -> dict[str, Any]:
    return {
        "kind": kind,
        "dim": int(teacher.dim),
        "dtype": options.dtype,
        "dataset": records.dataset,
        "split": records.split,
        "producer": teacher.producer(),
        "normalized": bool(getattr(teacher, "normalized", False)),
        "extra": {
            "source": records.source,
            "shard_size": options.shard_size,
            "batch_size": options.batch_size,
            **extra,
        },
    }


# ---- corpus and loader errors ----------------------------------------------------------------


def ensure_corpus(
    path: Path,
    ids: list[str],
    texts: list[str],
    image_ids: list[str] | None,
    *,
    records: DatasetRecords,
    extra: dict,
) -> Manifest:
    """Write the corpus table, or check that the one already there holds the same rows."""
    sources = [records.dataset] * len(ids)
    if (path / MANIFEST_NAME).exists():
        existing = Corpus.open(path)
        if [str(i) for i in existing.ids] != ids or existing.texts != texts:
            raise CacheError(
                f"{path} holds a different corpus (other caption policy, seed or inputs?); "
                "remove it or choose another --out"
            )
        return existing.manifest
    return write_corpus(
        path,
        ids,
        texts,
        image_ids,
        sources,
        dataset=records.dataset,
        split=records.split,
        producer={"loader": records.dataset, "source": records.source},
        extra=extra,
    )


def log_loader_errors(
    out: Path, errors: list[RecordError], options: RunOptions, part: str | None = None
) -> None:
    """Rows the loader could not read: fatal with ``strict``, else logged once (by rank 0), as
    stage ``part`` of errors.jsonl (default: captions; a sentence corpus's: sentences)."""
    if errors and options.strict:
        raise strict_failure(errors[0])
    if options.rank == 0:
        path = sidecar_path(out, part or LOADER_PART)
        if read_sidecar(path) != sorted(errors, key=lambda e: (e.id, e.path, e.reason)):
            write_sidecar(path, errors)


def _refuse_duplicate_ids(ids: list[str], what: str) -> None:
    unique, counts = np.unique(np.asarray(ids, dtype=str), return_counts=True)
    if len(unique) != len(ids):
        raise MmcseError(f"duplicate {what} ids in the dataset: {list(unique[counts > 1][:5])}")
