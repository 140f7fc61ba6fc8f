"""The Recipe type: one row of a paper's STS table, runnable off the Stage-1 cache.

A recipe is one row of a paper's table made runnable: the method and its hyperparameters, the
student, the data setting (Wiki1M sentences and/or one caption dataset, how their batches mix,
which caption policy Stage 1 must use), the cached feature set behind each role, the training
settings, and the published numbers it should reproduce (:mod:`mmcse.recipes.published`).

Names are ``method/setting/model[/variant]`` (``mcse/wiki+flickr/bert``,
``mcse/flickr/bert/clip-vit-b32``, ``visualcse/bert``). ``mmcse recipes run NAME`` resolves the
recipe against a cache root by the Stage-1 layout (:mod:`pipeline.extract`)::

    <root>/wiki1m/train/sentences              Wiki1M corpus (extract-text --corpus wiki1m)
    <root>/<dataset>/train[-<policy>]/captions caption corpus; "train" for random-one (MCSE),
                                               "train-all" / "train-longest" otherwise, because
                                               one run directory holds one caption policy
    <root>/<dataset>/train[-<policy>]/{image,text,object}-<teacher>   features of those captions
    <root>/<dataset>/train/{image_tensor,audio_fbank}   unpaired VisualCSE/AudioCSE examples

and, when something is missing, prints the Stage-1 commands that write it.

Batch mixing: MCSE samples mini-batches "in proportion to their data size" (App. A); its
released ``train_mix.py`` (reused by KDMCSE and DALR) does it with two endless, per-pass
re-shuffled loaders: ⌈N_text/B⌉ + ⌈N_caption/B⌉ steps per epoch, a caption batch whenever
``step % ⌊N_text/N_caption⌋ == 0`` (``N`` in batches) — captions are revisited and part of the
text corpus is skipped each epoch. That is the trainer's ``mcse-train-mix``, the default of every
two-corpus recipe. It is *not* equivalent to ``interleave`` (each corpus once per epoch, a caption
batch every ⌊N_text/N_caption⌋ text batches): ``--set mixing=interleave`` runs that instead.

Training loop, optimizer and precision: every recipe records the code it reproduces
(:data:`MCSE_CODE_TRAIN` for MCSE/KDMCSE/DALR/MCSEO, :data:`HF_TRAINER_TRAIN` for VisualCSE and
AudioCSE) and its ``source``; ``mmcse recipes show NAME`` prints all of it, and
``docs/fidelity.md`` tabulates paper vs released code vs mmcse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mmcse.cache import Manifest
from mmcse.cache.layout import MANIFEST_NAME
from mmcse.errors import MmcseError
from mmcse.precision import describe_precision
from mmcse.recipes.published import PUBLISHED, Published
from mmcse.registry import Registry
from mmcse.training.config import GivenSettings, TrainConfig, resolve_config

RECIPES = Registry("recipe")

MODELS = {"bert": "bert-base-uncased", "roberta": "roberta-base"}
#: every paper here: max length 32, STS-B dev every 125 steps, [CLS] before BERT's pooler
COMMON_TRAIN: dict[str, Any] = {
    "max_seq_length": 32,
    "eval_steps": 125,
    "pooler": "cls_before_pooler",
}
#: the released MCSE code (``src/train.py``, ``src/train_mix.py``; KDMCSE's and DALR's
#: ``train_mix.py`` are copies of it): ``Accelerator()`` with no mixed precision under plain
#: ``python`` (fp32; DALR's ``--fp16`` only casts its text teachers' embeddings), ``transformers.
#: AdamW`` at its default ε = 1e-6, weight decay 0, no warm-up, linear decay, clip 1.0,
#: ``DataLoader(shuffle=True)`` keeping each corpus's last partial batch, and STS-B dev at every
#: 125th step and the last (``completed_steps >= max_train_steps``). ``optimizer.zero_grad()``
#: under torch 1.7.1 (accelerate 0.3.0 passes ``set_to_none=None``) zeroes the gradients, so the
#: caption-only heads step on their momentum on text batches; decay groups spare biases and
#: LayerNorm weights, transformers.AdamW decays after the update
MCSE_CODE_TRAIN: dict[str, Any] = {
    "precision": "fp32",
    "adam_eps": 1e-6,
    "adam_eps_style": "transformers",
    "weight_decay": 0.0,
    "weight_decay_style": "transformers",
    "zero_grad": "zeros",
    "warmup_steps": 0,
    "grad_clip": 1.0,
    "drop_last": False,
    "eval_last_step": True,
    "eval_precision": "fp32",  # utils.evaluate: no autocast
    # torch 1.7.1/1.8.1 (MCSE, KDMCSE, DALR's pins) ran fp32 matmuls and cuDNN convolutions in
    # TF32 on Ampere+ by default (their A100/3090 runs): docs/fidelity.md, "TF32"
    "tf32": True,
}
#: SimCSE's HF-Trainer code, which VisualCSE/AudioCSE build on (transformers 4.5): ``--fp16``
#: in their run scripts, ``TrainingArguments`` defaults ε = 1e-8, weight decay 0, no warm-up,
#: linear decay, ``max_grad_norm`` 1.0, ``dataloader_drop_last`` False, and STS-B dev at the
#: multiples of ``--eval_steps 125`` only (``DefaultFlowCallback``: none at the last step);
#: ``model.zero_grad()`` under torch 1.10 zeroes; decay groups as MCSE's
HF_TRAINER_TRAIN: dict[str, Any] = {
    "precision": "fp16",
    "adam_eps": 1e-8,
    "adam_eps_style": "transformers",  # Trainer 4.5 builds transformers.AdamW
    "weight_decay": 0.0,
    "weight_decay_style": "transformers",
    "zero_grad": "zeros",
    "warmup_steps": 0,
    "grad_clip": 1.0,
    "drop_last": False,
    "eval_last_step": False,
    "eval_precision": "fp32",  # the Trainer's SentEval evaluate: no autocast
    "tf32": True,  # torch 1.10's default on Ampere+: fp32 ops outside fp16 autocast in TF32
}
MCSE_SEEDS = (0, 1, 2, 3, 4)  # MCSE's train_mix.py: "We used [0,1,2,3,4] in experiments"
TEXT_CORPUS = "wiki1m"
#: teachers that embed images and captions: one extract-images run writes both feature sets
IMAGE_TEXT_TEACHERS = ("clip-vit-b32", "clip-vit-l14")
CAPTION_KINDS = ("image", "text", "object")
UNPAIRED_KINDS = ("image_tensor", "audio_fbank")
#: unpaired example sets: dataset name → (command, its source placeholder, sampling flags)
UNPAIRED_SOURCES = {
    # VisualCSE §4.1: 60 ImageNet classes × 500 images, the exact files the authors released
    # (VisualCSE/sampled-Imagenet.txt, shipped); --classes 60 --per-class 500 draws new ones
    "imagenet60": ("extract-image-tensors", "IMAGENET_TRAIN_DIR", "--list visualcse"),
    # AudioCSE App. B: LibriSpeech train-clean-100, the 50 speakers with the most utterances
    # (the released prep_librispeech.py + trainers.py:481; --class-pick random draws them)
    "librispeech50": (
        "extract-audio",
        "LIBRISPEECH_SPEAKER_DIRS",
        "--classes 50 --class-pick most",
    ),
}
RAW_CAPTIONS = "--images IMAGES_DIR --captions CAPTIONS"  # placeholders the user fills in


@dataclass(frozen=True)
class RecipeRunSpec:
    """How a recipe is run: the cache it reads, its seeds and how the run departs from it (another
    student, fewer steps, ``--set`` overrides). ``mmcse recipes run`` and ``mmcse ablate`` make
    their flags from these fields (:func:`mmcse.commands.flags.with_flags`); every step of a
    recipe run (:mod:`mmcse.recipes.runs`, :mod:`mmcse.recipes.ablate`) takes it whole."""

    cache_root: str = field(
        default="cache", metadata={"help": "Stage-1 cache root (layout: mmcse.recipes.recipe)"}
    )
    #: a flag's ``"0,1,2"`` becomes the tuple; None: the recipe's own (:meth:`for_recipe`)
    seeds: tuple[int, ...] | None = field(
        default=None,
        metadata={"help": "comma-separated seeds; None: the recipe's (e.g. 0,1,2,3,4)"},
    )
    model: str | None = field(
        default=None, metadata={"help": "student override: local HF dir or hub id"}
    )
    max_steps: int | None = field(
        default=None, metadata={"help": "stop each run after N steps (smoke runs)"}
    )
    overrides: dict[str, Any] = field(
        default_factory=dict,
        metadata={"flag": "--set", "help": "TrainConfig override KEY=VALUE (repeatable)"},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "replace runs already in the seed folders"}
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_root", str(self.cache_root))
        if isinstance(self.seeds, str):
            object.__setattr__(self, "seeds", parse_seed_list(self.seeds))
        elif self.seeds is not None:
            object.__setattr__(self, "seeds", check_unique_seeds(tuple(self.seeds)))
        overrides = dict(self.overrides or {})
        if self.overwrite:
            overrides["overwrite"] = True  # a TrainConfig setting: each seed's run replaces
        object.__setattr__(self, "overrides", overrides)

    def for_recipe(self, recipe: Recipe) -> RecipeRunSpec:
        """This spec with the recipe's own seeds where none were given."""
        return self if self.seeds is not None else replace(self, seeds=tuple(recipe.seeds))

    def with_overrides(self, overrides: dict[str, Any]) -> RecipeRunSpec:
        return replace(self, overrides=overrides)


def parse_seed_list(text: str) -> tuple[int, ...]:
    """``--seeds "0,1,2"``."""
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise MmcseError(f"--seeds expects comma-separated integers, got {text!r}") from None
    return check_unique_seeds(seeds)


def check_unique_seeds(seeds: tuple[int, ...]) -> tuple[int, ...]:
    """Each seed trains once, into its own ``seed<k>/``: a seed given twice is refused."""
    twice = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if twice:
        raise MmcseError(
            f"--seeds {','.join(map(str, seeds))}: seed {', '.join(map(str, twice))} given more "
            "than once (each seed trains once, into its own folder); give distinct seeds"
        )
    return seeds


@dataclass(frozen=True)
class Feature:
    """The cached set behind one role: ``kind`` and the Stage-1 ``teacher`` that wrote it.

    Caption kinds (image, text, object) live beside the recipe's caption corpus as
    ``<kind>-<teacher>``; for unpaired kinds ``teacher`` names the example dataset.
    ``every_corpus`` (text teachers): the role also reads the teacher's set of the recipe's text
    corpus, ``<text corpus>/train/text-<teacher>`` — distillation on every batch, as DALR's
    eq. 14 prints it; the run gets both sets for the role (``--feature ROLE=CAPTIONS,TEXT``).
    """

    kind: str
    teacher: str
    every_corpus: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (*CAPTION_KINDS, *UNPAIRED_KINDS):
            raise ValueError(f"unknown feature kind {self.kind!r}")


@dataclass(frozen=True)
class Need:
    """One cache set a recipe reads: the config key it fills, where it is, what writes it."""

    key: str  # "text_corpus", "caption_corpus" or "features.<role>"
    what: str
    path: Path
    command: str
    corpus: str | None = None  # a feature set's: the corpus whose ids it holds ("text"/"caption")


@dataclass(frozen=True)
class Recipe:
    name: str
    method: str
    model: str
    text_corpus: str | None  # "wiki1m" or None
    caption_dataset: str | None  # "flickr30k", "coco" or None
    caption_policy: str | None  # what Stage 1 must use for the caption corpus
    mixing: str
    roles: dict[str, Feature] = field(default_factory=dict)
    method_args: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)  # TrainConfig overrides
    seeds: tuple[int, ...] = MCSE_SEEDS
    notes: tuple[str, ...] = ()  # where the settings come from
    source: str = ""  # the one source the recipe follows (paper table or released script)
    variant: str = ""  # which reading of the method it runs (paper as printed / released code)
    published_as: str | None = None  # another reading of the method: that recipe's numbers

    @property
    def published(self) -> tuple[Published, ...]:
        return PUBLISHED.get(self.published_as or self.name, ())

    # -- the cache ------------------------------------------------------------------------
    def caption_dir(self, root: str | Path) -> Path:
        split = "train" if self.caption_policy == "random-one" else f"train-{self.caption_policy}"
        return Path(root) / str(self.caption_dataset) / split

    def needs(self, root: str | Path) -> list[Need]:
        """Every corpus and feature set the recipe reads under ``root``, with its command."""
        root = Path(root)
        out = []
        if self.text_corpus:
            path = root / self.text_corpus / "train" / "sentences"
            command = (
                f"mmcse extract-text --corpus {self.text_corpus} --text-file WIKI1M_TXT "
                f"--teacher none --out {path.parent}"  # the table only: no method reads its features
            )
            out.append(Need("text_corpus", f"{self.text_corpus} sentences", path, command))
        if self.caption_dataset:
            what = f"{self.caption_dataset} captions ({self.caption_policy})"
            path = self.caption_dir(root) / "captions"
            out.append(Need("caption_corpus", what, path, self._images_command(root)))
        for role, feature in self.roles.items():
            path = self.feature_path(feature, root)
            what = f"{feature.kind} features of {feature.teacher} (role {role})"
            command = self._command(feature, path, root)
            corpus = None if feature.kind in UNPAIRED_KINDS else "caption"
            out.append(Need(f"features.{role}", what, path, command, corpus=corpus))
            if feature.every_corpus and self.text_corpus:
                corpus = root / self.text_corpus / "train" / "sentences"
                path = corpus.parent / f"{feature.kind}-{feature.teacher}"
                command = f"mmcse extract-text --corpus {corpus} --teacher {feature.teacher}"
                what = f"{what}, {self.text_corpus} sentences"
                out.append(Need(f"features.{role}", what, path, command, corpus="text"))
        return out

    def feature_path(self, feature: Feature, root: str | Path) -> Path:
        if feature.kind in UNPAIRED_KINDS:
            return Path(root) / feature.teacher / "train" / feature.kind
        return self.caption_dir(root) / f"{feature.kind}-{feature.teacher}"

    def _images_command(self, root: Path, teacher: str | None = None) -> str:
        # the caption corpus comes with the first image teacher's run (resnet50 when the
        # recipe reads no image features, so SimCSE baselines train on MCSE's exact captions)
        if teacher is None:
            images = [f.teacher for f in self.roles.values() if f.kind == "image"]
            teacher = images[0] if images else "resnet50"
        return (
            f"mmcse extract-images --dataset {self.caption_dataset} --split train {RAW_CAPTIONS} "
            f"--teacher {teacher} --caption-policy {self.caption_policy} "
            f"--out {self.caption_dir(root)}"
        )

    def _command(self, feature: Feature, path: Path, root: Path) -> str:
        if feature.kind in UNPAIRED_KINDS:
            command, source, flags = UNPAIRED_SOURCES[feature.teacher]
            return f"mmcse {command} {source} {path} {flags} --dataset {feature.teacher}"
        if feature.kind == "image" or feature.teacher in IMAGE_TEXT_TEACHERS:
            return self._images_command(root, feature.teacher)
        if feature.kind == "text":
            return f"mmcse extract-text --corpus {self.caption_dir(root) / 'captions'} --teacher {feature.teacher}"
        return (
            f"mmcse extract-objects --dataset {self.caption_dataset} --split train {RAW_CAPTIONS} "
            f"--teacher {feature.teacher} --caption-policy {self.caption_policy} "
            f"--out {self.caption_dir(root)}"
        )

    def check_cache(self, root: str | Path, overridden: set[str] = frozenset()) -> None:
        """Refuse to start when a set is missing (listing the commands) or has the wrong policy.

        Needs whose config key is in ``overridden`` (``--set text_corpus=...``) are not checked.
        """
        needs = [n for n in self.needs(root) if not _is_overridden(n.key, overridden)]
        missing = [n for n in needs if not (n.path / MANIFEST_NAME).is_file()]
        if missing:
            commands = "\n".join(f"  {c}" for c in dict.fromkeys(n.command for n in missing))
            raise MmcseError(
                f"recipe {self.name} needs {len(missing)} cache set(s) missing under {root}: "
                f"{', '.join(str(n.path) for n in missing)}; run first (UPPERCASE = your paths):\n"
                f"{commands}"
            )
        for need in needs:
            if need.key == "caption_corpus":
                self._check_policy(need.path)

    def _check_policy(self, path: Path) -> None:

        policy = Manifest.read(path).extra.get("caption_policy")
        if policy != self.caption_policy:
            raise MmcseError(
                f"{path} holds captions of policy {policy!r}; recipe {self.name} needs "
                f"{self.caption_policy!r} (re-extract with --caption-policy {self.caption_policy})"
            )

    # -- training -------------------------------------------------------------------------
    def config(
        self, spec: RecipeRunSpec | str | Path, *, seed: int, output_dir: str | Path
    ) -> TrainConfig:
        """The TrainConfig of one seed: recipe < ``spec.model``/``spec.max_steps`` <
        ``spec.overrides`` (a cache root alone: the recipe's own setting).

        A ``method_args`` override is merged into the recipe's (so ``--set
        method_args={"image_text_weight": 0.05}`` changes one hyperparameter).
        """
        spec = spec if isinstance(spec, RecipeRunSpec) else RecipeRunSpec(str(spec))
        cache_root, model = spec.cache_root, spec.model
        max_steps, overrides = spec.max_steps, spec.overrides
        paths: dict[str, str] = {}
        for need in self.needs(cache_root):  # a role reading two corpora's sets: DIR1,DIR2
            paths[need.key] = ",".join(filter(None, (paths.get(need.key), str(need.path))))
        values: dict[str, Any] = {
            **COMMON_TRAIN,
            **self.train,
            "model": model or self.model,
            "method": self.method,
            "method_args": dict(self.method_args),
            "text_corpus": paths.get("text_corpus"),
            "caption_corpus": paths.get("caption_corpus"),
            "features": {role: paths[f"features.{role}"] for role in self.roles},
            "mixing": self.mixing,
            "seed": seed,
            "output_dir": str(output_dir),
            "max_steps": max_steps,
        }
        extra = dict(overrides or {})
        values["method_args"].update(extra.pop("method_args", None) or {})
        return resolve_config(None, GivenSettings({**values, **extra}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "method": self.method,
            "method_args": self.method_args,
            "model": self.model,
            "text_corpus": self.text_corpus,
            "caption_dataset": self.caption_dataset,
            "caption_policy": self.caption_policy,
            "mixing": self.mixing,
            "roles": {r: {"kind": f.kind, "teacher": f.teacher} for r, f in self.roles.items()},
            "train": {**COMMON_TRAIN, **self.train},
            "seeds": list(self.seeds),
            "source": self.source,
            "variant": self.variant,
            "published_as": self.published_as,
            "notes": list(self.notes),
            "published": [p.to_dict() for p in self.published],
        }

    def describe(self, cache_root: str | Path = "cache") -> str:
        data = " + ".join(
            filter(None, [self.text_corpus, self.caption_dataset and f"{self.caption_dataset}"])
        )
        cfg = self.config(cache_root, seed=self.seeds[0], output_dir="-")
        lines = [
            f"{self.name}",
            f"  source      {self.source or '-'}",
            f"  method      {self.method} {json.dumps(self.method_args)}",
            f"  variant     {self.variant or '-'}",
            f"  model       {self.model}",
            f"  data        {data} (caption policy {self.caption_policy})",
            f"  mixing      {cfg.mixing}",
            f"  precision   {describe_precision(cfg.precision, cfg.tf32)}",
            f"  optimizer   AdamW lr {cfg.learning_rate:g}, eps {cfg.adam_eps:g} (placed as "
            f"{cfg.adam_eps_style}), weight decay {cfg.weight_decay:g} "
            f"({cfg.weight_decay_style}), grad clip {cfg.grad_clip:g}, gradients after a step: "
            f"{cfg.zero_grad}",
            f"  schedule    linear, warm-up {cfg.warmup_steps} steps, decay to 0 "
            "(HF get_linear_schedule_with_warmup)",
            f"  batches     {cfg.batch_size} per step, {cfg.epochs} epoch(s), max length "
            f"{cfg.max_seq_length}, last partial batch "
            f"{'dropped' if cfg.drop_last else 'kept (as torch DataLoader)'}",
            f"  evaluation  STS-B dev every {cfg.eval_steps} steps "
            f"{'and at the last step' if cfg.eval_last_step else '(not at the last step)'}, "
            f"pooler {cfg.pooler}, in {cfg.eval_precision}",
            f"  seeds       {','.join(map(str, self.seeds))}",
            *(
                f"  examples    {n.command}"
                for n in self.needs(cache_root)
                if n.corpus is None and n.key.startswith("features.")
            ),
            "  cache:",
            *(f"    {n.key:<24} {n.path}" for n in self.needs(cache_root)),
            *(f"  note: {note}" for note in self.notes),
        ]
        return "\n".join(lines)


def _is_overridden(key: str, overridden: set[str]) -> bool:
    return key in overridden or (key.startswith("features.") and "features" in overridden)


def get_recipe(name: str) -> Recipe:
    return RECIPES.get(name)


def register(recipe: Recipe) -> Recipe:
    RECIPES.register(recipe.name)(recipe)
    return recipe
