"""Stage-1 jobs, one dataclass per ``mmcse`` extract command: its settings are the command's
flags (made from each field's ``metadata``: ``help``, ``flag``, ``argument``, as for
:class:`mmcse.training.config.TrainConfig`) and :meth:`run` does the work.

>>> ImagesJob(dataset="flickr30k", images="data/flickr30k-images", teacher="clip-vit-b32").run()

Runs return :class:`Written`, the manifests by part, whose text is the command's summary. This
module is imported to build the command line, so the heavy imports are in the ``run`` methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.devices import default_device_name
from mmcse.errors import MmcseError
from pipeline.workers import decode_workers

#: the registered teachers (:mod:`pipeline.teachers`, its table) each extract command takes,
#: named in its --help (importing the registry would load torch for --help)
IMAGE_TEACHERS = "resnet50, resnet50-v2, clip-vit-b32, clip-vit-l14 (CLIP: captions too)"
TEXT_TEACHERS = (
    "simcse, diffcse, rankcse, simcse-roberta, diffcse-roberta, clip-text, clip-vit-b32, "
    "clip-vit-l14"
)


def setting(default: Any = None, help: str = "", **meta: Any) -> Any:
    """A job field: its default and its flag's help (``meta``: ``flag``, ``argument``)."""
    return field(default=default, metadata={"help": help, **meta})


def required(help: str, **meta: Any) -> Any:
    return field(metadata={"help": help, **meta})


class Written(dict):
    """``{part: Manifest | None}``; None where another rank's job finalizes the set. Printed
    with where each set is, and which were already complete before (``before``): a re-run
    that recomputed nothing says so."""

    def __init__(self, parts: dict, out: Path | None = None, before: frozenset = frozenset()):
        super().__init__(parts)
        self.out, self.before = out, before

    def __str__(self) -> str:
        from pipeline.errors_log import summarize_errors

        lines = [f"{self._where(part)}: {self._state(part, m)}" for part, m in self.items()]
        if self and set(self) <= self.before:
            lines.insert(0, f"nothing to do: every set in {self.out} was already complete")
        left_out = summarize_errors(self.out) if self.out is not None else None
        if left_out:
            lines.append(left_out)
        objects = self.get("objects")  # extract-objects' table: how many pairs it found
        if objects is not None and "pairs_per_caption" in objects.extra:
            lines.append(f"object–phrase pairs per caption: {objects.extra['pairs_per_caption']}")
        return "\n".join(lines)

    def _where(self, part: str) -> str:
        return str(self.out / part) if self.out is not None else part

    def _state(self, part: str, m) -> str:
        done = "already complete, nothing recomputed: " if part in self.before else ""
        return done + _state(m)


def written(target: Path, extraction: Callable[[], dict]) -> Written:
    """Run ``extraction`` (writing into ``target``); what it wrote, and what was there before."""
    before = frozenset(p.parent.name for p in target.glob("*/manifest.json"))
    return Written(extraction(), target, before)


def _state(m) -> str:
    """A set's rows and what it left out: a feature set its inputs that failed, a caption corpus
    the captions dropped with their images (the run's every left-out input, loader rows
    included, is the summary's last line, counted from errors.jsonl)."""
    if m is None:
        return "this rank's shards done; the last rank finalizes"
    if m.kind == "corpus":
        dropped = m.extra.get("num_dropped_captions", 0)
        left = f", {dropped} captions dropped with their images" if dropped else ""
        return f"{m.num_rows} rows{left}, fingerprint {m.fingerprint[:12]}"
    errors = m.extra.get("num_errors", 0)
    return f"{m.num_rows} rows, {errors} errors, fingerprint {m.fingerprint[:12]}"


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


@dataclass(kw_only=True)
class RunFlags:
    """How a job runs (:class:`pipeline.extract.RunOptions`), not what it computes."""

    shard_size: int = setting(4096, "Items per shard (fixed boundaries; resume unit).")
    batch_size: int = setting(256, "Items per teacher call (never crosses a shard).")
    dtype: str = setting("float32", "Storage dtype of the features: float32 or float16.")
    strict: bool = setting(False, "Stop at the first bad input (exit 2).")
    rank: int | None = setting(None, "This job's rank (unset: $RANK or 0).")
    world_size: int | None = setting(None, "Number of jobs (unset: $WORLD_SIZE or 1).")
    backend: str = setting("arrow", "Shard format: arrow or hdf5.")

    def run_options(self, **more: Any):
        from pipeline.extract import RunOptions, resolve_rank

        rank, world_size = resolve_rank(self.rank, self.world_size)
        return RunOptions(
            shard_size=self.shard_size,
            batch_size=self.batch_size,
            dtype=self.dtype,
            strict=self.strict,
            rank=rank,
            world_size=world_size,
            backend=self.backend,
            **{"workers": 0, **more},  # decode workers: image jobs only
        )


@dataclass(kw_only=True)
class TeacherFlags:
    """Which frozen teacher encodes, with which weights, where, in which precision."""

    weights: str = setting("default", "default | random | PATH to local weights.")
    teacher_size: str = setting("real", "real | tiny (random small model for tests).")
    device: str = setting("auto", "auto | cpu | cuda | cuda:N.")
    compute_dtype: str | None = setting(None, "bfloat16 | float16 | float32.")

    def build_teacher(self, name: str):
        from pipeline import teachers

        device = default_device_name() if self.device == "auto" else self.device
        return teachers.build_teacher(
            name,
            weights=self.weights,
            device=device,
            dtype=self.compute_dtype,
            size=self.teacher_size,
        )


@dataclass(kw_only=True)
class DataFlags:
    """Where a registered dataset's files are (see its loader)."""

    split: str = setting("train", "Split to extract.")
    images: str | None = setting(None, "Image root folder.")
    captions: str | None = setting(None, "Caption file or folder (see the dataset loader).")
    split_file: str | None = setting(None, "List of image files/ids in the split.")
    caption_policy: str = setting("random-one", "random-one (MCSE) | all (KDMCSE, DALR) | longest.")
    seed: int = setting(0, "Seed of the random-one caption draw.")
    text_field: str | None = setting(
        None, "Column/field holding the text (sentences; local captions: unset = caption)."
    )
    bad_lines: str = setting(
        "skip", "Undecodable, blank or over-long line: skip (logged) or refuse the file."
    )

    def records(self, dataset: str, text_file: str | None = None):
        from pipeline.datasets import DataSource, load_dataset

        paths = (self.images, self.captions, self.split_file)
        text = text_file if text_file and text_file.startswith("hf:") else _path(text_file)
        source = DataSource(*map(_path, paths), text, self.text_field, self.bad_lines)
        return load_dataset(dataset, source, self.split)


@dataclass(kw_only=True)
class ImagesJob(RunFlags, TeacherFlags, DataFlags):
    """Image features (+ caption features for CLIP teachers) and the caption corpus table."""

    dataset: str = required("Registered dataset (flickr30k, coco, flickr8k, local).")
    teacher: str = setting("resnet50", f"Image teacher: {IMAGE_TEACHERS}.")
    out: str | None = setting(None, "Output folder (unset: cache/<dataset>/<split>).")
    workers: int | None = setting(None, "DataLoader decode workers (unset: min(8, CPUs)).")
    decode: str = setting("cpu", "Only cpu (Pillow, in the decode workers); gpu was removed.")
    max_pixels: int = setting(89_478_485, "Refuse images decoding larger than this many pixels.")

    def run(self) -> Written:
        from pipeline.extract import extract_images

        workers = decode_workers(self.workers)
        options = self.run_options(workers=workers, decode=self.decode, max_pixels=self.max_pixels)
        records, model = self.records(self.dataset), self.build_teacher(self.teacher)
        target = _path(self.out) or Path("cache") / self.dataset / self.split
        return written(
            target,
            lambda: extract_images(
                records,
                model,
                self.teacher,
                target,
                options=options,
                caption_policy=self.caption_policy,
                seed=self.seed,
            ),
        )


@dataclass(kw_only=True)
class TextJob(RunFlags, TeacherFlags, DataFlags):
    """Text features of a corpus (one row per sentence id) and, if needed, its corpus table."""

    corpus: str = required("wiki1m, a caption dataset name, or a corpus table dir.")
    text_file: str | None = setting(
        None,
        "Sentence corpus (wiki1m's, or yours): .txt, .jsonl, .csv, .tsv, .parquet, a "
        "datasets folder or hf:NAME[:CONFIG[:SPLIT]].",
    )
    teacher: str = setting(
        "simcse",
        f"Text teacher: {TEXT_TEACHERS}; or none: the corpus table "
        "only, no teacher pass (all SimCSE/MCSE/KDMCSE read of a text corpus).",
    )
    out: str | None = setting(None, "Output folder (unset: cache/<corpus>/<split>).")

    def run(self) -> Written:
        from pipeline.extract import extract_corpus_texts, extract_texts

        no_teacher, table = self.teacher == "none", Path(self.corpus).is_dir()
        if no_teacher and table:
            raise MmcseError(
                f"{self.corpus} is already a corpus table; --teacher none has nothing to add"
            )
        model = None if no_teacher else self.build_teacher(self.teacher)
        options = self.run_options()
        if table:
            target = _path(self.out) or Path(self.corpus).parent
            return written(
                target,
                lambda: extract_corpus_texts(
                    Path(self.corpus), model, self.teacher, target, options
                ),
            )
        records = self.records(self.corpus, self.text_file)
        target = _path(self.out) or Path("cache") / self.corpus / self.split
        return written(
            target,
            lambda: extract_texts(
                records,
                model,
                None if no_teacher else self.teacher,
                target,
                caption_policy=self.caption_policy,
                seed=self.seed,
                options=options,
            ),
        )


@dataclass(kw_only=True)
class Hdf5Job:
    """Turn MCSE's released HDF5 features + captions into a feature set and a corpus table."""

    features: str = required("MCSE's HDF5 file (a [N, dim] features dataset).")
    captions: str = required("Row-aligned captions, one per line.")
    dataset: str = required("Dataset name recorded in the manifests and ids.")
    split: str = setting("train", "Split recorded in the manifests.")
    out: str = required("Output folder (captions/ + image-<teacher>/).")
    key: str = setting("features", "HDF5 dataset holding the features.")
    teacher_name: str = setting("mcse-resnet50", "Name for the image feature set.")
    dtype: str | None = setting(None, "Storage dtype (unset: the file's).")

    def run(self) -> Written:
        from pipeline.hdf5_import import import_hdf5_features

        for path in (self.features, self.captions):
            if not Path(path).is_file():
                raise MmcseError(f"{path} does not exist")
        return written(
            Path(self.out),
            lambda: import_hdf5_features(
                Path(self.features),
                Path(self.captions),
                dataset=self.dataset,
                split=self.split,
                out=Path(self.out),
                key=self.key,
                teacher_name=self.teacher_name,
                dtype=self.dtype,
            ),
        )


@dataclass(kw_only=True)
class ObjectsJob(RunFlags, TeacherFlags, DataFlags):
    """MCSEO object–phrase pairs: objects table + object features (ids = object ids)."""

    dataset: str | None = setting(None, "Registered dataset (flickr30k, coco, local).")
    detector: str = setting("florence2-sam2", "florence2-sam2 | boxes-file PATH (JSONL).")
    boxes_file: str | None = setting(None, "JSONL of image_id, caption, phrase, box.")
    masks: str = setting("sam2", "sam2 | box (with --detector boxes-file).")
    florence: str = setting("florence-community/Florence-2-large", "Florence-2 id or dir.")
    sam2: str = setting("facebook/sam2.1-hiera-large", "SAM2 id or dir (smaller: -base-plus, …).")
    num_beams: int = setting(3, "Florence-2 beams (Grounded-SAM-2 uses 3).")
    max_new_tokens: int = setting(256, "Florence-2 generation budget.")
    from_objects: str | None = setting(None, "Re-encode an objects table dir (no detection).")
    teacher: str = setting("resnet50", f"Image teacher of the objects: {IMAGE_TEACHERS}.")
    background: str = setting("mean", "Fill of the cut-out's transparent area: mean|black|white.")
    out: str | None = setting(None, "Output folder (unset: cache/<dataset>/<split>).")
    caption_policy: str = setting("longest", "longest (MCSEO) | all | random-one.")
    shard_size: int = setting(1024, "Items per shard (fixed boundaries; resume unit).")
    batch_size: int = setting(8, "Items per teacher call (never crosses a shard).")

    def run(self) -> Written:
        from pipeline.objects.extract import ObjectSettings, extract_objects, reencode_objects

        if self.from_objects:
            model = self.build_teacher(self.teacher)
            target = _path(self.out) or Path(self.from_objects).parent
            return written(
                target,
                lambda: reencode_objects(
                    Path(self.from_objects),
                    model,
                    self.teacher,
                    target,
                    background=self.background,
                    options=self.run_options(),
                ),
            )
        if self.dataset is None:
            raise MmcseError("give --dataset (or --from-objects DIR to re-encode existing objects)")
        records, model = self.records(self.dataset), self.build_teacher(self.teacher)
        found, segmenter = self.detector_and_segmenter(model.device)
        target = _path(self.out) or Path("cache") / self.dataset / self.split
        settings = ObjectSettings(self.background, self.masks, self.caption_policy, self.seed)
        return written(
            target,
            lambda: extract_objects(
                records,
                found,
                segmenter,
                model,
                self.teacher,
                target,
                settings=settings,
                options=self.run_options(),
            ),
        )

    def detector_and_segmenter(self, device):
        """The grounder (Florence-2, or a boxes file) and the segmenter (SAM2; None: box masks)."""
        from pipeline.objects.extract import BoxesFile
        from pipeline.objects.florence import Florence2Grounder
        from pipeline.objects.sam2 import Sam2Segmenter

        if self.detector == "boxes-file":
            if not self.boxes_file:
                raise MmcseError("--detector boxes-file needs --boxes-file PATH")
            found = BoxesFile(self.boxes_file)
        elif self.detector == "florence2-sam2":
            if self.masks != "sam2":
                raise MmcseError("--masks box only goes with --detector boxes-file")
            found = Florence2Grounder(self.florence, device, self.num_beams, self.max_new_tokens)
        else:
            raise MmcseError(
                f"--detector must be florence2-sam2 or boxes-file, not {self.detector!r}"
            )
        return found, Sam2Segmenter(self.sam2, device) if self.masks == "sam2" else None


@dataclass(kw_only=True)
class LabelledFlags:
    """A class-per-folder tree (``CLASS/NAME`` ids) and the random subset of it to cache."""

    dataset: str | None = setting(None, "dataset name for the manifest (unset: the folder's)")
    split: str = setting("train", "split recorded in the manifest")
    classes: int | None = setting(None, "random subset of this many classes")
    per_class: int | None = setting(None, "random subset of files per class")
    seed: int = setting(0, "seed of the random class/file subset")
    workers: int = setting(4, "decoding processes (more than the CPUs: lowered to them)")

    def name(self, source: str) -> str:
        return self.dataset or Path(source).resolve().name


@dataclass(kw_only=True)
class ImageTensorsJob(LabelledFlags):
    """Cache unpaired labelled images as uint8 tensors for VisualCSE (ids: CLASS/NAME)."""

    source: str = required("class-per-folder image tree, or a CIFAR python dir", argument=True)
    out: str = required("feature set directory to write (kind image_tensor)", argument=True)
    source_format: str = setting("folder", "folder|cifar (CIFAR: --split)", flag="--format")
    size: int = setting(256, "cached side length; training crops views from it")
    classes: int | None = setting(None, "random subset of this many classes (paper: 60)")
    per_class: int | None = setting(None, "random subset of files per class (paper: 500)")
    file_list: str | None = setting(
        None,
        "exact files: a list (CLASS/FILE per line) or 'visualcse', the authors' released "
        "60 x 500 list (shipped)",
        flag="--list",
    )
    shard_rows: int = setting(1024, "rows per shard")

    def run(self) -> str:
        from pipeline import nonling_cache as nc

        workers = decode_workers(self.workers)  # before any file is read
        if self.source_format == "cifar":
            examples = nc.cifar_batches(self.source, self.split)
        elif self.source_format != "folder":
            raise MmcseError(f"--format must be folder or cifar, not {self.source_format!r}")
        elif self.file_list:
            examples = nc.listed_files(self.source, self.file_list)
        else:
            examples = nc.class_folder(
                self.source, nc.IMAGE_SUFFIXES, self.classes, self.per_class, self.seed
            )
        m = nc.write_image_tensors(
            examples,
            self.out,
            dataset=self.name(self.source),
            split=self.split,
            size=self.size,
            shard_rows=self.shard_rows,
            workers=workers,
        )
        return f"{self.out}: {m.num_rows} images, {len(m.extra['classes'])} classes"


@dataclass(kw_only=True)
class AudioJob(LabelledFlags):
    """Cache SSAST-style Kaldi log-mel filterbanks of unpaired labelled audio for AudioCSE."""

    source: str = required("class-per-folder tree of WAV files (class=speaker)", argument=True)
    out: str = required("feature set directory to write (kind audio_fbank)", argument=True)
    classes: int | None = setting(None, "subset of this many classes (paper: 50 speakers)")
    class_pick: str = setting(
        "most", "which --classes: most (the most files: AudioCSE's released top speakers)|random"
    )
    class_numbering: str = setting(
        "walk",
        "labels: walk (speakers in the order os.walk first meets them: AudioCSE's released "
        "prep_librispeech.py)|sorted (by name)",
    )
    mel_bins: int = setting(128, "mel filterbank bins")
    frames: int = setting(1024, "frames per clip (zero-padded or cut)")
    window: str = setting("hanning", "hanning (SSAST)|povey (Kaldi default)|hamming")
    dtype: str = setting("float16", "float16|float32")
    shard_rows: int = setting(256, "rows per shard")

    def run(self) -> str:
        from pipeline import nonling_cache as nc
        from pipeline.fbank import FbankConfig

        workers = decode_workers(self.workers)  # before any file is read
        examples = nc.class_folder(
            self.source,
            nc.AUDIO_SUFFIXES,
            self.classes,
            self.per_class,
            self.seed,
            by=self.class_pick,
        )
        cfg = FbankConfig(num_mel_bins=self.mel_bins, target_frames=self.frames, window=self.window)
        classes = nc.numbered_classes(
            self.source, nc.AUDIO_SUFFIXES, examples, self.class_numbering
        )
        m = nc.write_audio_fbanks(
            examples,
            self.out,
            dataset=self.name(self.source),
            split=self.split,
            cfg=cfg,
            dtype=self.dtype,
            shard_rows=self.shard_rows,
            workers=workers,
            classes=classes,
        )
        return f"{self.out}: {m.num_rows} clips, {len(m.extra['classes'])} classes"
