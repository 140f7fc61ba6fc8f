"""Training configuration: one dataclass, filled from defaults < ``--config`` file < CLI flags.

The resolved config is saved in the run directory, so a run can be repeated from it alone.

Validation is table-driven and happens in one place, when a settings dataclass is built
(:func:`check_settings`; ``TrainConfig.__post_init__`` calls it, :func:`mmcse.methods.build_method`
calls it on method hyperparameters before the method exists):

* the **type** of every field comes from its annotation, so a field added later is checked with
  no extra code: ``int`` refuses ``"64"``, ``1.5`` and ``True``; ``float`` takes ints (stored as
  floats) but refuses strings; ``str``, ``bool``, ``dict[K, V]``, ``list``/``tuple[...]``,
  ``Literal[...]`` and ``X | None`` are understood, anything else is left to its owner;
* the **range** comes from the field's ``metadata``: ``min``/``max`` (inclusive), ``above``/
  ``below`` (exclusive), ``choices`` (a tuple of allowed values), ``pattern`` (a regular
  expression a string must match in full; ``hint`` says it in words) and ``flag`` (the CLI
  spelling, when it is not ``--field-name``), e.g.
  ``eval_steps: int = field(default=125, metadata={"min": 1})``.

Errors are one :class:`SettingError` line (an :class:`~mmcse.errors.MmcseError`, and a
``ValueError``) naming the setting, its flag, the value and what is allowed. Checks that need more
than the value itself (files exist, the pooler, the model resolves) are :mod:`mmcse.training.preflight`'s.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from mmcse.devices import DEVICE_PATTERN, DEVICES
from mmcse.errors import MmcseError

#: ``mcse-train-mix`` = MCSE's released ``train_mix.py`` schedule (see :mod:`mmcse.training.data`)
MIXINGS = ("interleave", "mcse-train-mix", "proportional-random", "caption-only", "text-only")
#: ``auto`` = bf16 autocast on CUDA; ``fp16`` = fp16 autocast + GradScaler on CUDA (the released
#: SimCSE/VisualCSE ``--fp16``); every value trains in plain fp32 on CPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: where AdamW adds ε: ``transformers`` (to √v before bias correction: transformers.AdamW, which
#: every released trainer here used) or ``torch`` (torch.optim.AdamW's own placement)
ADAM_EPS_STYLES = ("transformers", "torch")
#: ``--device`` values torch understands here: auto, cpu, cuda, cuda:N, mps
_NO_VALUE = object()


class SettingError(MmcseError, ValueError):
    """A setting of the wrong type or out of range (a ValueError too, for older callers)."""


# ---- validation ----------------------------------------------------------------------------


def check_settings(cls: type, values: dict[str, Any], where: str = "setting") -> dict[str, Any]:
    """``values`` checked against ``cls``'s field types and metadata; ints for floats converted.

    ``where`` starts each message (e.g. ``"setting"``, ``"method 'dalr' setting"``). Keys that are
    not fields are left to the caller (which knows how to name them).
    """
    hints = typing.get_type_hints(cls)
    checked = dict(values)
    for f in dataclasses.fields(cls):
        if f.name not in values or not f.init:
            continue
        label = _label(f, where)
        value = _check_type(values[f.name], hints.get(f.name, Any), label)
        _check_range(value, f.metadata, label)
        checked[f.name] = value
    return checked


def _label(f: dataclasses.Field, where: str) -> str:
    flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
    return f"{where} {f.name} ({flag})" if where == "setting" else f"{where} {f.name}"


def _describe(value: Any) -> str:
    kind = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}.get(type(value))
    return f"{value!r} ({kind})" if kind else repr(value)


def _check_type(value: Any, hint: Any, label: str) -> Any:
    """``value`` if it fits ``hint`` (an int for a float becomes a float); else MmcseError."""
    result = _fit(value, hint)
    if result is _NO_VALUE:
        raise SettingError(f"{label} must be {_type_name(hint)}, got {_describe(value)}")
    return result


def _fit(value: Any, hint: Any) -> Any:  # noqa: PLR0911 - one return per kind of type
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            fitted = _fit(value, arg)
            if fitted is not _NO_VALUE:
                return fitted
        return _NO_VALUE
    if hint is type(None):
        return value if value is None else _NO_VALUE
    if origin is Literal:
        return value if value in args and not isinstance(value, bool) else _NO_VALUE
    if hint is bool:
        return value if isinstance(value, bool) else _NO_VALUE
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO_VALUE
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok else _NO_VALUE
    if hint is str:
        return value if isinstance(value, str) else _NO_VALUE
    if origin is dict or hint is dict:
        return _fit_dict(value, args)
    if origin in (list, tuple) or hint in (list, tuple):
        return _fit_sequence(value, origin or hint, args)
    return value  # a type this table does not know: its owner checks it


def _fit_dict(value: Any, args: tuple) -> Any:
    if not isinstance(value, dict):
        return _NO_VALUE
    if not args:
        return value
    key_hint, value_hint = args
    out = {}
    for k, v in value.items():
        key, item = _fit(k, key_hint), _fit(v, value_hint)
        if key is _NO_VALUE or item is _NO_VALUE:
            return _NO_VALUE
        out[key] = item
    return out


def _fit_sequence(value: Any, kind: type, args: tuple) -> Any:
    if not isinstance(value, list | tuple):  # JSON gives lists where a tuple is meant
        return _NO_VALUE
    if not args:
        return kind(value)
    if len(args) == 2 and args[1] is Ellipsis or kind is list:
        items = [_fit(v, args[0]) for v in value]
    elif len(args) == len(value):
        items = [_fit(v, a) for v, a in zip(value, args, strict=True)]
    else:
        return _NO_VALUE
    return _NO_VALUE if any(i is _NO_VALUE for i in items) else kind(items)


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is dict or hint is dict:
        if not args:
            return "an object of settings"
        key, value = (_bare(_type_name(a)) for a in args)
        return f"an object with {key} keys and {value} values"
    if origin in (list, tuple) or hint in (list, tuple):
        if args and (origin is list or args[-1] is Ellipsis):
            return f"a list of {_bare(_type_name(args[0]))}s"
        if args:
            kind = "pair" if len(args) == 2 else "list"
            return f"a [{', '.join(_bare(_type_name(a)) for a in args)}] {kind}"
        return "a list"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return names.get(hint, "null" if hint is type(None) else getattr(hint, "__name__", str(hint)))


def _bare(name: str) -> str:
    return name.removeprefix("a ").removeprefix("an ")


def _check_range(value: Any, meta: typing.Mapping[str, Any], label: str) -> None:
    if value is None or not meta:
        return
    bounds = (
        ("min", lambda v, b: v >= b, "at least"),
        ("max", lambda v, b: v <= b, "at most"),
        ("above", lambda v, b: v > b, "above"),
        ("below", lambda v, b: v < b, "below"),
    )
    for key, ok, words in bounds:
        if key in meta and not ok(value, meta[key]):
            raise SettingError(f"{label} must be {words} {meta[key]}, got {value!r}")
    if "choices" in meta and value not in meta["choices"]:
        choices = ", ".join(map(str, meta["choices"]))
        raise SettingError(f"{label} must be one of {choices}, not {value!r}")
    if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
        allowed = meta.get("hint", meta["pattern"])
        raise SettingError(f"{label} must be {allowed}, not {value!r}")


REPORT_TO = ("none", "tensorboard")
#: ``token_cache`` values besides a folder: ``tokens/`` beside each corpus, or no cache
TOKEN_CACHE_AUTO, TOKEN_CACHE_OFF = "auto", "off"
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class TrainConfig:
    """Everything a Stage-2 run needs. Defaults follow SimCSE/MCSE (BERT, Table 3).

    Ranges live in each field's ``metadata`` (see the module docstring); types in annotations.
    """

    model: str = "bert-base-uncased"  # local HF dir or hub id
    method: str = "simcse"
    method_args: dict[str, Any] = field(default_factory=dict, metadata={"flag": "--method-arg"})
    text_corpus: str | None = None  # corpus table dir, or a .txt with one sentence per line
    caption_corpus: str | None = None  # corpus table dir with image_id per caption
    # role -> feature set dir
    features: dict[str, str] = field(default_factory=dict, metadata={"flag": "--feature"})
    # role -> fingerprint
    expect_fingerprints: dict[str, str] = field(
        default_factory=dict, metadata={"flag": "--expect-fingerprint"}
    )
    mixing: str = field(default="interleave", metadata={"choices": MIXINGS})
    output_dir: str = "runs/latest"
    overwrite: bool = False  # replace a non-empty output_dir (else it is refused)
    # per process; under torchrun the global batch is this × world size; 2+ for in-batch negatives
    batch_size: int = field(default=64, metadata={"min": 2})
    learning_rate: float = field(default=3e-5, metadata={"above": 0, "flag": "--lr"})
    weight_decay: float = field(default=0.0, metadata={"min": 0})
    # transformers.AdamW's default, used by MCSE/KDMCSE/DALR (torch: 1e-8)
    adam_eps: float = field(default=1e-6, metadata={"above": 0, "below": 1})
    # ε before bias correction (transformers.AdamW) | "torch"
    adam_eps_style: str = field(default="transformers", metadata={"choices": ADAM_EPS_STYLES})
    epochs: int = field(default=1, metadata={"min": 1})
    # > 0 stops early (and sets the schedule length)
    max_steps: int = field(default=0, metadata={"min": 0})
    max_seq_length: int = field(default=32, metadata={"min": 3})  # [CLS], a token, [SEP]
    # token ids cached once per corpus, tokenizer and max length (mmcse.cache.tokens): "auto" =
    # in tokens/ beside each corpus, "off" = tokenise in memory every run, else a folder
    token_cache: str = field(
        default=TOKEN_CACHE_AUTO, metadata={"pattern": r".*\S.*", "hint": "auto, off or a folder"}
    )
    drop_last: bool = False  # False keeps each corpus's last partial batch (as torch DataLoader)
    warmup_steps: int = field(default=0, metadata={"min": 0})
    grad_clip: float = field(default=1.0, metadata={"min": 0})  # 0 disables clipping
    seed: int = field(default=42, metadata={"min": 0, "max": 2**32 - 1})  # numpy's seed range
    eval_steps: int = field(default=125, metadata={"min": 1})
    eval_data: str | None = None  # SentEval-layout dir; None = ../shared/data/senteval if present
    final_eval: bool = True
    pooler: str = "auto"  # auto: the student's sentence-transformers pooling, else cls_before_pooler
    dropout: float = field(default=0.1, metadata={"min": 0, "below": 1})
    device: str = field(default="auto", metadata={"pattern": DEVICE_PATTERN, "hint": DEVICES})
    precision: str = field(default="auto", metadata={"choices": PRECISIONS})
    # encoder attention: sdpa (fused kernel) | eager (HF's)
    attn_implementation: str = field(default="sdpa", metadata={"choices": ATTN_IMPLEMENTATIONS})
    # torch.compile the encoder (slow first steps)
    compile_encoder: bool = field(default=False, metadata={"flag": "--compile"})
    fused_adamw: bool = True  # AdamW's fused kernel on CUDA (same update; ignored on CPU)
    tf32: bool = False  # TF32 matmuls in fp32 runs on CUDA (faster, ~1e-3 relative error)
    dynamic_padding: bool = True  # pad a batch to its longest sentence, not max_seq_length
    log_every: int = field(default=10, metadata={"min": 1})
    # steps between resumable last/ checkpoints; 0 = every eval_steps
    save_every: int = field(default=0, metadata={"min": 0})
    # "tensorboard" also writes RUN_DIR/tensorboard
    report_to: str = field(default="none", metadata={"choices": REPORT_TO})

    def __post_init__(self) -> None:
        for name, value in check_settings(TrainConfig, self.__dict__).items():
            setattr(self, name, value)
        from mmcse.pooling import check_pooler

        self.pooler = check_pooler(self.pooler, allow_auto=True)  # before any model loads
        unknown_roles = sorted(set(self.expect_fingerprints) - set(self.features))
        if unknown_roles:
            known = ", ".join(sorted(self.features)) or "none (no --feature given)"
            raise SettingError(
                f"--expect-fingerprint names role(s) {', '.join(unknown_roles)} that no --feature "
                f"gives; the run's roles: {known}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML file of TrainConfig fields (a ``[train]`` TOML table is also accepted)."""
    p = Path(path)
    if not p.is_file():
        raise MmcseError(f"config file {p} {'is a folder' if p.is_dir() else 'does not exist'}")
    try:
        text = p.read_text(encoding="utf-8")
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise MmcseError(f"config file {p} is not valid {p.suffix[1:] or 'JSON'}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise MmcseError(f"config file {p} is not UTF-8 text (byte {exc.start})") from None
    data = data.get("train", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise MmcseError(
            f"config file {p} must hold an object of settings "
            f'(e.g. {{"batch_size": 64}}), not {type(data).__name__}'
        )
    return data


def resolve_config(file: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults < config file < overrides (``None`` overrides mean 'not given')."""
    values = read_config_file(file) if file else {}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise MmcseError(f"config file {file}: unknown training setting(s): {', '.join(unknown)}")
    try:  # the file's own values first, so their errors name the file
        check_settings(TrainConfig, values)
    except MmcseError as exc:
        raise MmcseError(f"config file {file}: {exc}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(values) - known)
    if unknown:
        raise MmcseError(f"unknown training setting(s): {', '.join(unknown)}")
    return TrainConfig(**values)


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
