"""Plain-text overviews for ``mmcse methods`` and ``mmcse cache ls`` (``cache ls`` imports no
torch: the methods, which do, are imported by the method overviews only)."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmcse.cache import list_sets
from mmcse.registry import METHODS


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def method_names() -> list[str]:
    import mmcse.methods  # noqa: F401  (importing registers every method)

    return METHODS.names()


def methods_overview() -> str:
    """``mmcse methods``: every registered method's overview."""
    return "\n".join(method_overview(name) for name in method_names())


def method_overview(name: str) -> str:
    """A method's loss terms, the feature roles it reads and every setting with its default."""
    from mmcse.methods import build_method

    method = build_method(name)
    settings = ", ".join(f"{f.name}={_default(f)!r}" for f in dataclasses.fields(method))
    caption = ", ".join(method.caption_roles) or "-"
    every = ", ".join(method.text_roles) or "-"
    return "\n".join(
        [
            method.describe(),
            f"  feature roles: caption batches: {caption}; every batch: {every}",
            f"  settings (defaults; --method-arg KEY=VALUE): {settings or '-'}",
        ]
    )


CACHE_COLUMNS = (
    "path",
    "kind",
    "data",
    "rows",
    "shape",
    "dtype",
    "backend",
    "size",
    "teacher",
    "weights",
    "caption policy",
    "fingerprint",
)


def cache_row(entry) -> list[str]:
    """One ``cache ls`` row; unfinished sets say so."""
    size = f"{entry.num_bytes / 2**20:.1f} MiB"
    m = entry.manifest
    if m is None:
        problem = entry.problem or "no valid manifest"
        state = "unfinished" if "unfinished write" in problem else "INVALID"
        return [str(entry.path), f"{state} ({problem})", *["-"] * 5, size, *["-"] * 4]
    producer = m.producer or {}
    teacher = producer.get("teacher") or (
        f"loader {producer['loader']}" if "loader" in producer else "-"
    )
    weights = str(producer.get("weights", "-"))
    if producer.get("size") == "tiny":
        weights += " (tiny)"
    return [
        str(entry.path),
        m.kind,
        f"{m.dataset}/{m.split}",
        str(m.num_rows),
        "x".join(map(str, m.shape)) or "-",
        m.dtype,
        m.backend,
        size,
        teacher,
        weights,
        str(m.extra.get("caption_policy", "-")),
        m.fingerprint[:12],
    ]


def format_cache_listing(entries) -> str:
    rows = [list(CACHE_COLUMNS), *(cache_row(e) for e in entries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(CACHE_COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def cache_listing(root: str) -> str:
    """``mmcse cache ls``: the sets and corpora under ``root``, or that there are none."""

    entries = list(list_sets(root))
    return format_cache_listing(entries) if entries else f"no feature sets or corpora under {root}"
