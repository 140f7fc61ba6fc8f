"""Training configuration: one dataclass, filled from defaults < ``--config`` file < CLI flags.

The resolved config is saved in the run directory, so a run can be repeated from it alone.

Every field is checked from its annotation and ``metadata`` when the config is built
(:func:`mmcse.settings.check_settings`, which says what the metadata keys mean: ``min``/``max``,
``above``/``below``, ``choices``, ``pattern``/``hint``, ``flag``). The **command line** comes from
the same metadata: ``help``, ``flag``, ``aliases`` and ``negative`` (a boolean's off switch) are
what :mod:`mmcse.commands.flags` makes ``mmcse train``'s flags from, so a field added here is a
flag with no CLI change. Checks that need more than the value itself (files exist, the pooler,
the model resolves) are :mod:`mmcse.training.preflight`'s.

Every field also declares its ``scope`` (:data:`SCOPES`): whether another value is another run,
is resolved at setup, tells seeds apart, or only changes how a session of the run is carried out.
What a resume may change (:data:`RESUMABLE_CHANGES`), what the seeds of one setting differ in
(:data:`PER_RUN_SETTINGS`: compare's groups, a recipe's departures) and what a saved run matches
(:func:`same_setting`) are derived from it here, without torch, so no list is kept by hand.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mmcse.corpusfiles import BAD_LINES
from mmcse.devices import DEVICE_PATTERN, DEVICES
from mmcse.errors import MmcseError
from mmcse.optim import DECAY_STYLES, EPS_STYLES, ZERO_GRADS
from mmcse.pooling import check_pooler
from mmcse.precision import PRECISIONS
from mmcse.rundir import METRICS_FILE
from mmcse.settings import SettingError, check_settings

#: ``mcse-train-mix`` = MCSE's released ``train_mix.py`` schedule (see :mod:`mmcse.training.data`)
MIXINGS = ("interleave", "mcse-train-mix", "proportional-random", "caption-only", "text-only")
ADAM_EPS_STYLES = EPS_STYLES  # where AdamW adds ε (mmcse.optim)


REPORT_TO = ("none", "tensorboard")
#: whole-step capture (:mod:`mmcse.training.fastpath`): ``auto`` = on CUDA, off on CPU
CAPTURES = ("auto", "on", "off", "forward")
#: ``token_cache`` values besides a folder: the default place (:func:`mmcse.cache.tokens.entry_path`), or no cache
TOKEN_CACHE_AUTO, TOKEN_CACHE_OFF = "auto", "off"
#: ``--set packing=WORD``: auto (decided per device at set-up), on, off
PACKING_WORDS = {"auto": None, "on": True, "off": False}
#: encoder attention (:mod:`mmcse.packing`): ``flex_attention`` and ``varlen`` need a GPU for
#: training (FlexAttention has no backward on CPU; varlen is CUDA-only and packed-only)
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention", "varlen")


#: the ``mmcse train --help`` panel of each setting (field metadata ``panel``)
PANEL_MODEL = "Model and method"
PANEL_DATA = "Data"
PANEL_OPTIMISATION = "Optimisation"
PANEL_EVALUATION = "Evaluation and checkpoints"
PANEL_SPEED = "Speed and precision"
PANEL_OUTPUT = "Output and logging"

#: each setting's scope (field metadata ``scope``, one per field): which runs it tells apart.
#: ``run``: what a run trains and measures; another value is another run (a resume refuses it,
#: compare splits seeds by it, a recipe run that changes it is not the published setting).
SCOPE_RUN = "run"
#: ``setup``: as ``run``, but setup resolves the default (``auto``) and ``config.json`` holds what
#: it became (:mod:`mmcse.training.resolved`), so a planned default matches any saved value
SCOPE_SETUP = "setup"
#: ``seed``: tells the seeds of one run apart (compare groups them, a recipe run sets it per
#: seed); fixed for a run: a resume may not change it, a seed folder holds its own seed's run
SCOPE_SEED = "seed"
#: ``session``: how one session of a run is carried out, not what it trains: where it is written,
#: on which device, how it is watched, what it keeps, where its evaluation data lies. A resume
#: may change it, seeds of one run may differ in it, and it departs from no recipe
SCOPE_SESSION = "session"
SCOPES = (SCOPE_RUN, SCOPE_SETUP, SCOPE_SEED, SCOPE_SESSION)


@dataclass
class TrainConfig:
    """Everything a Stage-2 run needs. Defaults follow SimCSE/MCSE (BERT, Table 3).

    Types live in the annotations; ranges and the command line in each field's ``metadata`` (see
    the module docstring): ``help``, ``flag``, ``aliases`` and, for a boolean, ``negative`` (its
    off switch; default ``--no-<flag>``) make ``mmcse train``'s flags, so a field added here is a
    flag with no CLI change. ``scope`` (one of :data:`SCOPES`, required) says which runs it tells
    apart.
    """

    model: str = field(
        default="bert-base-uncased",
        metadata={
            "panel": PANEL_MODEL,
            "scope": SCOPE_RUN,
            "help": "student: local HF dir or hub id",
        },
    )
    method: str = field(
        default="simcse",
        metadata={
            "panel": PANEL_MODEL,
            "scope": SCOPE_RUN,
            "help": "registered method (mmcse methods lists them)",
        },
    )
    method_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "panel": PANEL_MODEL,
            "scope": SCOPE_RUN,
            "flag": "--method-arg",
            "help": "method hyperparameter KEY=VALUE (JSON value)",
        },
    )
    text_corpus: str | None = field(
        default=None,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "help": "text corpus: corpus table dir, .txt (a sentence a line), .jsonl, .csv, "
            ".tsv, .parquet, a datasets folder or hf:NAME[:CONFIG[:SPLIT]]",
        },
    )
    text_field: str | None = field(
        default=None,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "help": "the column/field of --text-corpus holding the text (unset: the one obvious "
            "candidate)",
        },
    )
    bad_lines: str = field(
        default="skip",
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "choices": BAD_LINES,
            "help": "an undecodable, blank or over-long line: skip (and report) or refuse the file",
        },
    )
    caption_corpus: str | None = field(
        default=None,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "help": "caption corpus table dir (from extract-images)",
        },
    )
    features: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "flag": "--feature",
            "help": "cached features ROLE=DIR",
        },
    )
    expect_fingerprints: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "flag": "--expect-fingerprint",
            "help": "refuse a --feature set unless ROLE=SHA",
        },
    )
    mixing: str = field(
        default="interleave",
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "choices": MIXINGS,
            "help": "how text and caption batches take turns",
        },
    )
    output_dir: str = field(
        default="runs/latest",
        metadata={"panel": PANEL_OUTPUT, "scope": SCOPE_SESSION, "help": "run directory"},
    )
    overwrite: bool = field(
        default=False,
        metadata={
            "panel": PANEL_OUTPUT,
            "scope": SCOPE_SESSION,
            "help": "replace the run in a non-empty --output-dir",
        },
    )
    batch_size: int = field(
        default=64,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 2,
            "help": "per process (x world size under torchrun); 2+: negatives",
        },
    )
    learning_rate: float = field(
        default=3e-5,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "above": 0,
            "flag": "--lr",
            "aliases": ("--learning-rate",),
            "help": "peak LR",
        },
    )
    weight_decay: float = field(
        default=0.0,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 0,
            "help": "AdamW weight decay",
        },
    )
    weight_decay_style: str = field(
        default="transformers",
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "choices": DECAY_STYLES,
            "help": "decay after the update, biases and LayerNorm spared (transformers.AdamW), "
            "or torch's: every parameter, before it",
        },
    )
    zero_grad: str = field(
        default="none",
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "choices": ZERO_GRADS,
            "help": "gradients after a step: none (a parameter without one is skipped) or zeros "
            "(torch<2: a head that had one keeps stepping on its momentum)",
        },
    )
    adam_eps: float = field(
        default=1e-6,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "above": 0,
            "below": 1,
            "help": "AdamW epsilon (transformers.AdamW's, used by MCSE/KDMCSE/DALR; torch: 1e-8)",
        },
    )
    adam_eps_style: str = field(
        default="transformers",
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "choices": ADAM_EPS_STYLES,
            "help": "AdamW epsilon before bias correction, or torch's placement",
        },
    )
    epochs: int = field(
        default=1,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 1,
            "help": "passes over the data",
        },
    )
    max_steps: int = field(
        default=0,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 0,
            "help": "> 0 stops early (and sets the schedule length)",
        },
    )
    max_seq_length: int = field(
        default=32,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "min": 3,
            "help": "tokens per sentence ([CLS], a token, [SEP])",
        },
    )
    token_cache: str = field(
        default=TOKEN_CACHE_AUTO,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "pattern": r".*\S.*",
            "hint": "auto, off or a folder",
            "help": "corpus token ids cached once (mmcse.cache.tokens): auto = tokens/ beside "
            "a corpus table, cache/tokens/ for other corpora; off = tokenise in memory every "
            "run; else a folder",
        },
    )
    drop_last: bool = field(
        default=False,
        metadata={
            "panel": PANEL_DATA,
            "scope": SCOPE_RUN,
            "negative": "--keep-last",
            "help": "drop each corpus's last partial batch",
        },
    )
    warmup_steps: int = field(
        default=0,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 0,
            "help": "linear LR warmup steps",
        },
    )
    grad_clip: float = field(
        default=1.0,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_RUN,
            "min": 0,
            "help": "max gradient norm (0 disables clipping)",
        },
    )
    seed: int = field(  # numpy's seed range
        default=42,
        metadata={
            "panel": PANEL_OPTIMISATION,
            "scope": SCOPE_SEED,
            "min": 0,
            "max": 2**32 - 1,
            "help": "seeds data order and dropout",
        },
    )
    eval_steps: int = field(
        default=125,
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_RUN,
            "min": 1,
            "help": "steps between STS-B dev evaluations",
        },
    )
    eval_last_step: bool = field(
        default=True,
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_RUN,
            "help": "also score dev at the last step (MCSE's train_mix.py; the HF Trainer of "
            "SimCSE/VisualCSE/AudioCSE: multiples of --eval-steps only)",
        },
    )
    eval_data: str | None = field(
        default=None,
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_SESSION,
            "help": "SentEval-layout dir ('' disables evaluation; unset: ../shared/data)",
        },
    )
    eval_precision: str = field(
        default="fp32",
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_RUN,
            "choices": PRECISIONS,
            "help": "STS-B dev and test scoring: fp32 (the released evaluations) or autocast "
            "on CUDA (auto/bf16: bf16)",
        },
    )
    final_eval: bool = field(
        default=True,
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_SESSION,
            "help": "score best/ on the 7 STS test sets at the end",
        },
    )
    pooler: str = field(
        default="auto",
        metadata={
            "panel": PANEL_MODEL,
            "scope": SCOPE_SETUP,
            "help": "auto (the student's own sentence-transformers pooling, else "
            "cls_before_pooler) | cls | cls_before_pooler | avg (= mean) | max | "
            "avg_first_last | avg_top2",
        },
    )
    dropout: float = field(
        default=0.1,
        metadata={
            "panel": PANEL_MODEL,
            "scope": SCOPE_RUN,
            "min": 0,
            "below": 1,
            "help": "encoder dropout (the views' noise), set on the student's own dropout "
            "fields (README: Students)",
        },
    )
    device: str = field(
        default="auto",
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_SESSION,
            "pattern": DEVICE_PATTERN,
            "hint": DEVICES,
            "help": DEVICES,
        },
    )
    precision: str = field(
        default="auto",
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_RUN,
            "choices": PRECISIONS,
            "help": "autocast (auto: bf16 where the GPU has it; CPU: fp32)",
        },
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_SETUP,
            "choices": ("auto", *ATTN_IMPLEMENTATIONS),
            "help": "encoder attention (auto: sdpa where the student has it, else eager; "
            "eager: HF's)",
        },
    )
    compile_encoder: bool = field(
        default=False,
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_RUN,
            "flag": "--compile",
            "help": "torch.compile the encoder (slow first steps)",
        },
    )
    capture: str = field(
        default="auto",
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_RUN,
            "choices": CAPTURES,
            "help": "compile the whole step (encoder, every loss term, backward) into one graph, "
            "replayed as CUDA graphs on CUDA; pads batches to --max-seq-length; auto: on CUDA; "
            "forward: the forward/backward only, the update eager (what DDP and fp16 runs get)",
        },
    )
    fused_adamw: bool = field(
        default=True,
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_RUN,
            "help": "AdamW's fused kernel on CUDA (same update; not on CPU)",
        },
    )
    tf32: bool = field(
        default=False,
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_RUN,
            "help": "TF32 matmuls in fp32 runs on CUDA (~1e-3 rel. error)",
        },
    )
    dynamic_padding: bool = field(
        default=True,
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_SETUP,
            "help": "pad a batch to its longest sentence, not max_seq_length",
        },
    )
    #: None = auto: decided per device by mmcse.training.resolved.resolve_packing (on for CPU
    #: and CUDA, measured faster on both; off elsewhere: BENCHMARKS.md)
    packing: bool | None = field(
        default=None,
        metadata={
            "panel": PANEL_SPEED,
            "scope": SCOPE_SETUP,
            "help": "pack each batch's sentences end to end in rows of 64 tokens "
            "(no padding computed; the same numbers with dropout off); not given (auto, "
            "--set packing=auto): on for CPU and CUDA, off elsewhere (BENCHMARKS.md)",
        },
    )
    log_every: int = field(
        default=10,
        metadata={
            "panel": PANEL_OUTPUT,
            "scope": SCOPE_SESSION,
            "min": 1,
            "help": f"steps per {METRICS_FILE} record (terms averaged)",
        },
    )
    save_every: int = field(
        default=0,
        metadata={
            "panel": PANEL_EVALUATION,
            "scope": SCOPE_SESSION,
            "min": 0,
            "help": "steps between resumable last/ saves (0: --eval-steps)",
        },
    )
    keep_last_checkpoint: bool = field(
        default=True,
        metadata={
            "panel": PANEL_OUTPUT,
            "scope": SCOPE_SESSION,
            "flag": "--keep-last-dir",
            "negative": "--drop-last-dir",
            "help": "keep the resumable last/ once the run finishes (--drop-last-dir removes "
            "it: best/ stays, and the run still reads as finished)",
        },
    )
    report_to: str = field(
        default="none",
        metadata={
            "panel": PANEL_OUTPUT,
            "scope": SCOPE_SESSION,
            "choices": REPORT_TO,
            "help": "tensorboard also writes RUN_DIR/tensorboard",
        },
    )

    def __post_init__(self) -> None:
        # --set packing=auto|on|off (a config file alike): the tri-state in words
        if isinstance(self.packing, str) and self.packing in PACKING_WORDS:
            self.packing = PACKING_WORDS[self.packing]
        for name, value in check_settings(TrainConfig, self.__dict__).items():
            setattr(self, name, value)

        self.pooler = check_pooler(self.pooler, allow_auto=True)  # before any model loads
        if self.attn_implementation == "varlen" and self.packing is False:
            raise SettingError(
                "--attn-implementation varlen runs packed batches only: add --packing"
            )
        unknown_roles = sorted(set(self.expect_fingerprints) - set(self.features))
        if unknown_roles:
            known = ", ".join(sorted(self.features)) or "none (no --feature given)"
            raise SettingError(
                f"--expect-fingerprint names role(s) {', '.join(unknown_roles)} that no --feature "
                f"gives; the run's roles: {known}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the training settings' names: TrainConfig's fields
TRAIN_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def packing_required(cfg: TrainConfig) -> bool:
    """Whether the run packs on any device: ``--packing`` given, or varlen attention (it runs
    packed batches only); the student check refuses such a run for a student that cannot pack."""
    return cfg.packing is True or (cfg.packing is None and cfg.attn_implementation == "varlen")


def settings_of_scope(*scopes: str) -> tuple[str, ...]:
    """The names of the settings whose ``scope`` is one of ``scopes``, in field order (a field
    that declares none is in none: tests/training/test_setting_scopes.py asks it to)."""
    unknown = set(scopes) - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown setting scope(s) {sorted(unknown)}; known: {SCOPES}")
    return tuple(name for name, f in _FIELDS.items() if f.metadata.get("scope") in scopes)


#: settings a resumed run may change; any other difference from the run's config is refused
RESUMABLE_CHANGES = settings_of_scope(SCOPE_SESSION)
#: settings the runs of one setting differ in by design (seeds, and how each was carried out):
#: compare groups such runs as seeds, and none of them departs from a recipe
PER_RUN_SETTINGS = settings_of_scope(SCOPE_SEED, SCOPE_SESSION)


def same_setting(name: str, saved: Any, planned: Any) -> bool:
    """A saved run's value of setting ``name`` is the ``planned`` one: equal, or ``planned`` is
    the default of a setting setup resolves (:data:`SCOPE_SETUP`), which ``saved`` holds resolved."""
    if saved == planned:
        return True
    f = _FIELDS.get(name)
    return f is not None and f.metadata.get("scope") == SCOPE_SETUP and planned == f.default


#: the config file formats read, by suffix
CONFIG_FORMATS = {".json": "JSON", ".toml": "TOML"}
#: the one table a config file may put its settings in (else they are at the top level)
TRAIN_TABLE = "train"
_TOML_WHERE = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """TrainConfig fields from a JSON (``.json``) or TOML (``.toml``) file: at the top level, or
    all in one ``[train]`` table (``{"train": {...}}`` in JSON) with nothing beside it.

    Refused, one line naming the file: another suffix, a syntax error (``FILE:LINE:COL``), a key
    outside ``[train]`` when the file has one, and any key that is not a training setting.
    """
    p = Path(path)
    if not p.is_file():
        raise MmcseError(f"config file {p} {'is a folder' if p.is_dir() else 'does not exist'}")
    kind = CONFIG_FORMATS.get(p.suffix.lower())
    if kind is None:
        raise MmcseError(
            f"config file {p}: {p.suffix or 'a name without a suffix'} is not a format mmcse reads;"
            " give a JSON (.json) or TOML (.toml) file of training settings"
        )
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except json.JSONDecodeError as exc:
        raise MmcseError(f"{p}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except tomllib.TOMLDecodeError as exc:
        where = _TOML_WHERE.search(str(exc))
        place = f"{p}:{where[1]}:{where[2]}" if where else f"config file {p}"
        raise MmcseError(f"{place}: not valid TOML: {_TOML_WHERE.sub('', str(exc))}") from None
    except UnicodeDecodeError as exc:
        raise MmcseError(f"config file {p} is not UTF-8 text (byte {exc.start})") from None
    where = ""
    if isinstance(data, dict) and TRAIN_TABLE in data:
        beside = sorted(k for k in data if k != TRAIN_TABLE)
        if beside:
            raise MmcseError(
                f"config file {p}: {', '.join(beside)} outside [{TRAIN_TABLE}]: the file has a "
                f"[{TRAIN_TABLE}] table, so every setting goes in it (or drop the "
                f"[{TRAIN_TABLE}] header and keep every setting at the top level)"
            )
        data, where = data[TRAIN_TABLE], f" in [{TRAIN_TABLE}]"
    if not isinstance(data, dict):
        raise MmcseError(
            f"config file {p} must hold an object of settings "
            f'(e.g. {{"batch_size": 64}}), not {type(data).__name__}'
        )
    unknown = sorted(set(data) - TRAIN_FIELDS)
    if unknown:
        tables = [k for k in unknown if isinstance(data[k], dict)]
        hint = f" ({', '.join(tables)}: only [{TRAIN_TABLE}] is read)" if tables else ""
        raise MmcseError(
            f"config file {p}: unknown training setting(s){where}: {', '.join(unknown)}{hint}"
        )
    return data


@dataclass(frozen=True)
class GivenSettings:
    """The training settings a user gave (flags, ``--set``, a recipe's own): a field name of
    :class:`TrainConfig` -> its value, checked once when built. ``None`` means "not given" and is
    dropped; an unknown name or a wrong value is refused there, one line, and values are converted
    as :func:`~mmcse.settings.check_settings` does. :meth:`over` lays them over a config's other
    values (defaults < a file < these)."""

    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = {k: v for k, v in self.values.items() if v is not None}
        unknown = sorted(set(given) - TRAIN_FIELDS)
        if unknown:
            raise MmcseError(f"unknown training setting(s): {', '.join(unknown)}")
        object.__setattr__(self, "values", MappingProxyType(check_settings(TrainConfig, given)))

    def over(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base``'s values (a file's, a saved run's) with these given ones in their place."""
        return {**base, **self.values}


def resolve_config(
    file: str | Path | None = None, given: GivenSettings | None = None
) -> TrainConfig:
    """Defaults < config file < ``given`` (the settings a user gave, already checked)."""
    values = read_config_file(file) if file else {}  # unknown keys refused there
    try:  # the file's own values first, so their errors name the file
        check_settings(TrainConfig, values)
    except MmcseError as exc:
        raise MmcseError(f"config file {file}: {exc}") from None
    return TrainConfig(**(given or GivenSettings()).over(values))


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}`` with a clear error for malformed items."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MmcseError(f"{what} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_value(text: str) -> Any:
    """Method hyperparameters from the CLI: JSON literals when they parse, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
