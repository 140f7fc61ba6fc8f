"""Command-line flags made from a settings dataclass (TrainConfig, a Stage-1 job): one source.

A field's annotation gives its flag's type, its ``metadata`` the rest: ``help``, ``flag`` (when not
``--field-name``), ``aliases``, ``negative`` (a boolean's off switch, else ``--no-...``),
``choices``, ``argument`` (positional), ``panel`` (its group in ``--help``). A field without a
default is a required flag; the others default to None, "not given" (a config file or the
field's default fills them), and ``--help`` shows the field's default. ``dict`` fields take repeated ``KEY=VALUE`` (JSON values but strings)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import typer

from mmcse.training.config import parse_pairs, parse_value


def flag_parameters(cls: type) -> list[inspect.Parameter]:
    """A keyword parameter per init field of ``cls`` (its own fields first), typer's default."""
    hints, own = typing.get_type_hints(cls), list(cls.__dict__.get("__annotations__", {}))
    fields = [f for f in dataclasses.fields(cls) if f.init]
    params = []
    for f in sorted(fields, key=lambda f: own.index(f.name) if f.name in own else len(own)):
        meta, kind = f.metadata, _flag_type(hints[f.name])
        decls = [meta.get("flag", "--" + f.name.replace("_", "-")), *meta.get("aliases", ())]
        if kind is bool:
            decls[0] += "/" + meta.get("negative", "--no-" + decls[0][2:])
        choices = ": " + " | ".join(meta["choices"]) if "choices" in meta else ""  # wraps
        text = meta.get("help", "") + choices
        shown = {"metavar": _metavar(kind), "rich_help_panel": meta.get("panel")}
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            option = (
                typer.Argument(..., help=plain(text))
                if meta.get("argument")
                else typer.Option(..., *decls, help=plain(text), **shown)
            )
        else:
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            text = f"{text} (default: {default!r})".strip()
            option = typer.Option(None, *decls, help=plain(text), **shown)
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind
            )
        )
    return params


def plain(text: str) -> str:
    """Help as written: typer reads it as rich markup, where ``[train]`` is a style tag."""
    from rich.markup import escape

    return escape(text)


def _metavar(kind: type) -> str | None:
    """A short value name (typer's ``<list[str]>`` widens the flag column)."""
    return {int: "INT", float: "FLOAT", str: "TEXT", list[str]: "KEY=VALUE"}.get(kind)


def _flag_type(hint: typing.Any) -> type:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None: X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is dict or hint is dict:
        return list[str]
    return hint if hint in (bool, int, float, str) else str


def with_flags(
    cls: type, into: str, build: bool = False, given: Callable[[dict], Any] | None = None
):
    """Give a command a flag per field of ``cls``; it receives them as ``into``: a dict (field ->
    value, None where not given; ``KEY=VALUE`` lists as dicts), or, ``build``, a ``cls``, or what
    ``given`` makes of that dict (:class:`~mmcse.training.config.GivenSettings` for TrainConfig:
    the flags given, checked once, here)."""
    added, hints = flag_parameters(cls), typing.get_type_hints(cls)
    flags_of = {
        f.name: f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        for f in dataclasses.fields(cls)
    }

    def value(name: str, given):
        if given is None or typing.get_origin(hints[name]) is not dict:
            return given
        pairs = parse_pairs(given, flags_of[name])
        text = typing.get_args(hints[name])[1] is str
        return (pairs if text else {k: parse_value(v) for k, v in pairs.items()}) or None

    def decorate(command):
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.name != into]

        @functools.wraps(command)
        def run(**kwargs):
            flags = {p.name: value(p.name, kwargs.pop(p.name)) for p in added}
            if build:
                made = cls(**{k: v for k, v in flags.items() if v is not None})
            else:
                made = given(flags) if given else flags
            return command(**kwargs, **{into: made})

        run.__signature__ = signature.replace(parameters=kept + added)
        run.__annotations__ = {k: v for k, v in command.__annotations__.items() if k != into}
        return run

    return decorate
