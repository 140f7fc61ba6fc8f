"""Settings dataclasses checked from their annotations and field metadata (one place, no code per field).

Validation is table-driven and happens when a settings dataclass is built (:func:`check_settings`;
``TrainConfig.__post_init__`` calls it, :func:`mmcse.methods.build_method` calls it on method
hyperparameters before the method exists):

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
than the value itself (files exist, the pooler, the model resolves) are the callers'
(:mod:`mmcse.training.preflight` for a training run).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Literal, Union

from mmcse.errors import BadValueError

_NO_VALUE = object()


class SettingError(BadValueError):
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
        _check_number(f.name, value, label)
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


#: setting names whose value has a meaning only above 0 (a temperature divides similarities)
POSITIVE_SUFFIXES = ("temperature",)
#: setting names whose value has a meaning only at 0 or more (0 switches a loss term off)
NON_NEGATIVE_SUFFIXES = ("_weight",)


def _check_number(name: str, value: Any, label: str) -> None:
    """What no float setting may be: NaN or infinite; a temperature ≤ 0; a loss weight < 0."""
    if not isinstance(value, float):
        return
    if not math.isfinite(value):
        raise SettingError(f"{label} must be a finite number, got {value!r}")
    if name.endswith(POSITIVE_SUFFIXES) and value <= 0:
        raise SettingError(f"{label} must be above 0 (it divides the similarities), got {value!r}")
    if name.endswith(NON_NEGATIVE_SUFFIXES) and value < 0:
        raise SettingError(f"{label} must be at least 0 (0 switches the term off), got {value!r}")


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
