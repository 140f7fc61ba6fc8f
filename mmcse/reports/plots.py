"""PNG figures of runs: training curves, the alignment–uniformity plane, ablation bars.

``mmcse plot RUN...`` (or :func:`write_run_plots`) writes

* ``<run>/training_curves.png`` for every run: each ``*_loss`` term and the weighted total
  (``loss``), the learning rate, and STS-B dev, against the step, read from ``metrics.jsonl``
  (any key ending in ``_loss`` is a term; records missing a key are skipped for that curve);
* ``curves-<metric>.png`` (in ``out_dir``) when several runs are given: one figure per metric
  (STS-B dev, the total loss, each loss term) with every run on it, to compare them;
* ``align_uniform.png`` (in ``out_dir``): one point per run in the ``(L_uniform, L_align)``
  plane, as SimCSE's Fig. 2 / MCSE's analysis (lower-left is better); the values come from the
  run's ``results.json`` (``mmcse eval --align-uniform``) or ``align_uniform.json``, or are
  computed on STS-B when asked (:mod:`mmcse.evaluation.align_uniform`);
* ``<dir>/ablation.png`` for an ``mmcse ablate`` output folder (``ablation.json``): STS avg ±
  std per row, the published avg ± std beside it where the paper printed the same ablation.

Axes are honest: tick labels carry the values themselves (no ``+8.673e1`` offset), and a
curve that barely moves is not stretched over the whole height -- the y range spans at least
:data:`MIN_DEV_SPAN` Spearman points for STS-B dev and :data:`MIN_REL_SPAN` of the values'
magnitude for a loss, so noise looks like noise. Series of few points (a single one included)
are drawn with markers. ``--align-uniform`` logs each run it computes and shows an encoding bar.

matplotlib is an optional dependency (``pip install 'mmcse[plot]'``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.evaluation.align_uniform import align_uniform
from mmcse.evaluation.encode import encode_sentences
from mmcse.evaluation.sts import (
    STSB_FILES,
    embed_unique,
    load_encoder,
    load_stsbenchmark,
    resolve_downstream,
)
from mmcse.files import read_json, write_json
from mmcse.recipes.layout import ABLATION_RECORD, AblationDir
from mmcse.recipes.published import PUBLISHED_ABLATIONS
from mmcse.reports.runs import Run, find_group
from mmcse.rundir import ALIGN_UNIFORM_PLOT, METRICS_FILE, OVERLAY_PLOT

logger = logging.getLogger(__name__)

#: the least y range of an STS-B dev axis, in Spearman x 100 points
MIN_DEV_SPAN = 5.0
#: the least y range of any other axis, as a share of the largest |value| drawn
MIN_REL_SPAN = 0.1
#: a series with at most this many points is drawn with markers
MARKERS_UP_TO = 30
DEV_KEY = "stsb_dev"
#: the least range of each align–uniform axis (SimCSE's Fig. 2 spans about 2.5 x 0.5)
MIN_AU_SPAN = {"uniformity": 1.0, "alignment": 0.2}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MmcseError("plots need matplotlib: pip install 'mmcse[plot]'") from None
    return plt


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    return [p[0] for p in points], [p[1] for p in points]


def loss_series(records: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """``{"loss": ..., "<term>_loss": ...}`` → (steps, values), for every key any record has."""
    terms = sorted({k for r in records for k in r if k.endswith("_loss")})
    series = {key: _series(records, key) for key in ("loss", *terms)}
    return {key: value for key, value in series.items() if value[0]}


def honest_axis(ax, values: Sequence[float], min_span: float | None = None) -> None:
    """Plain tick labels (the values written out, no offset) and a y range of at least
    ``min_span`` (default :data:`MIN_REL_SPAN` of the largest magnitude) around ``values``."""
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    if not values:
        return
    low, high = min(values), max(values)
    if max(abs(low), abs(high)) < 1e-3:  # a learning rate: 2e-05, not 0.0000200
        from matplotlib.ticker import FormatStrFormatter

        ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    if min_span is None:
        min_span = MIN_REL_SPAN * max(abs(low), abs(high)) or 1.0
    if high - low < min_span:
        middle = (low + high) / 2
        ax.set_ylim(middle - min_span / 2, middle + min_span / 2)


def draw(ax, steps: Sequence[float], values: Sequence[float], **style) -> None:
    """One series; markers when it has few points, so a single point is visible."""
    if len(steps) <= MARKERS_UP_TO:
        style = {"marker": "o", "markersize": 4, **style}
    ax.plot(steps, values, **style)


def _span(key: str) -> float | None:
    return MIN_DEV_SPAN if key == DEV_KEY else None


def plot_training_curves(run: Run, path: str | Path) -> Path | None:
    """Loss terms, lr and STS-B dev of one run; ``None`` when it logged nothing yet."""
    fig = training_figure(run)
    return None if fig is None else _save(fig, path)


def training_figure(run: Run):
    """The figure of :func:`plot_training_curves`: a panel per loss term on its own scale (an
    unweighted term ten times the size of another would flatten it on a shared axis), the
    weighted total, the learning rate and STS-B dev; None without records."""
    records = run.metrics()
    if not records:
        return None
    plt = _pyplot()
    losses = loss_series(records) or {"loss": ([], [])}
    count = len(losses) + 2
    columns = min(count, 4)
    rows = -(-count // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.6 * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[count:]:
        ax.set_visible(False)
    for ax, (key, (steps, values)) in zip(axes, losses.items(), strict=False):
        total = key == "loss"
        draw(ax, steps, values, **({"color": "black", "linewidth": 2} if total else {}))
        honest_axis(ax, values)
        ax.set(title="loss (weighted total)" if total else key, xlabel="step", ylabel="loss")
    lr_ax, dev_ax = axes[len(losses)], axes[len(losses) + 1]
    for ax, key, title in ((lr_ax, "lr", "learning rate"), (dev_ax, DEV_KEY, "STS-B dev")):
        steps, values = _series(records, key)
        if steps:
            draw(ax, steps, values)
            honest_axis(ax, values, _span(key))
        else:
            ax.text(
                0.5, 0.5, f"no '{key}' records", ha="center", va="center", transform=ax.transAxes
            )
        ax.set(title=title, xlabel="step")
    dev_ax.set_ylabel("Spearman x 100")
    fig.suptitle(str(run.path))
    fig.tight_layout()
    return fig


def overlay_metrics(runs: Sequence[tuple[str, Run]]) -> dict[str, dict[str, tuple]]:
    """``{metric: {run label: (steps, values)}}`` for STS-B dev, the total loss and every loss
    term any of the runs logged."""
    out: dict[str, dict[str, tuple]] = {}
    for label, run in runs:
        records = run.metrics()
        series = {DEV_KEY: _series(records, DEV_KEY), **loss_series(records)}
        for key, (steps, values) in series.items():
            if steps:
                out.setdefault(key, {})[label] = (steps, values)
    return out


def overlay_figure(metric: str, series: dict[str, tuple]):
    """One metric, every run on the same axes (the figure, for :func:`_save`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (steps, values) in series.items():
        draw(ax, steps, values, label=label)
    honest_axis(ax, [v for _, values in series.values() for v in values], _span(metric))
    title = "STS-B dev" if metric == DEV_KEY else metric
    ax.set(
        title=f"{title}: {len(series)} runs",
        xlabel="step",
        ylabel="Spearman x 100" if metric == DEV_KEY else "loss",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_overlays(runs: Sequence[tuple[str, Run]], out_dir: Path) -> list[Path]:
    """``curves-<metric>.png`` per metric, every run overlaid."""
    return [
        _save(overlay_figure(metric, series), out_dir / OVERLAY_PLOT.format(metric=metric))
        for metric, series in overlay_metrics(runs).items()
    ]


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def plot_align_uniform(
    points: dict[str, tuple[float, float]],
    path: str | Path,
    base: tuple[str, tuple[float, float]] | None = None,
) -> Path:
    """``{label: (uniformity, alignment)}`` as a labelled scatter (:func:`align_uniform_figure`)."""
    return _save(align_uniform_figure(points, base), path)


def label_offsets(points: dict[str, tuple[float, float]]) -> list[tuple[int, int]]:
    """Each point's label offset (points): the usual up-right, moved a line further down for
    every earlier point within :data:`MIN_AU_SPAN`/10 of it, so close runs' labels do not print
    over each other."""
    near_u, near_a = MIN_AU_SPAN["uniformity"] / 10, MIN_AU_SPAN["alignment"] / 10
    offsets: list[tuple[int, int]] = []
    placed: list[tuple[float, float]] = []
    for uniform, align in points.values():
        crowd = sum(abs(uniform - u) < near_u and abs(align - a) < near_a for u, a in placed)
        offsets.append((5, 5 - 11 * crowd))
        placed.append((uniform, align))
    return offsets


def align_uniform_figure(
    points: dict[str, tuple[float, float]], base: tuple[str, tuple[float, float]] | None = None
):
    """The runs' points, and ``base`` (label, point: the student before fine-tuning) as a grey
    cross for context. Each axis spans at least :data:`MIN_AU_SPAN` around what it shows, so
    runs 0.015 apart read as close, and carries at most 6 ticks of 2 decimals."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 5))
    shown = list(points.values())
    if base is not None:  # under the runs: a run at the base model's point stays visible
        label, (uniform, align) = base
        ax.scatter(uniform, align, s=70, marker="X", color="grey", label=label, zorder=1)
        ax.legend(fontsize=8, loc="best")
        shown.append((uniform, align))
    for (label, (uniform, align)), offset in zip(
        points.items(), label_offsets(points), strict=True
    ):
        ax.scatter(uniform, align, s=40, zorder=3)
        ax.annotate(label, (uniform, align), textcoords="offset points", xytext=offset, fontsize=8)
    for values, span, set_lim in (
        ([u for u, _ in shown], MIN_AU_SPAN["uniformity"], ax.set_xlim),
        ([a for _, a in shown], MIN_AU_SPAN["alignment"], ax.set_ylim),
    ):
        low, high = min(values), max(values)
        pad = max(span - (high - low), 0.0) / 2 + 0.1 * (high - low)
        set_lim(low - pad, high + pad)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(6))
        axis.set_major_formatter(FormatStrFormatter("%.2f"))
    ax.set(
        xlabel=r"$\ell_{uniform}$",
        ylabel=r"$\ell_{align}$",
        title="alignment vs uniformity on STS-B (lower is better)",
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _published_avg(recipe: str, drop: list[str]) -> tuple[float, float | None] | None:

    for spec, rows in PUBLISHED_ABLATIONS.get(recipe, {}).items():
        if set(filter(None, spec.split("+"))) == set(drop) and rows and "avg" in rows[0].mean:
            return rows[0].mean["avg"], rows[0].std.get("avg")
    return None


def plot_ablation(ablation_json: str | Path, path: str | Path) -> Path:
    """Bars of each ablation row's STS avg ± std (ours) and the published one beside it."""
    data = read_json(ablation_json) or {}
    labels, ours, ours_err, paper, paper_err = [], [], [], [], []
    for row in data.get("rows", []):
        table = row.get("table", {})
        labels.append(table.get("label") or ("w/o " + " & ".join(row.get("drop", [])) or "full"))
        ours.append(table.get("mean", {}).get("avg", float("nan")))
        ours_err.append(table.get("std", {}).get("avg", 0.0))
        published = _published_avg(data.get("recipe", ""), row.get("drop", []))
        paper.append(published[0] if published else float("nan"))
        paper_err.append((published[1] or 0.0) if published else 0.0)
    if not labels:
        raise MmcseError(f"{ablation_json} has no rows")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 4.5))
    x = range(len(labels))
    has_paper = any(p == p for p in paper)  # not all NaN
    width = 0.4 if has_paper else 0.6
    offset = width / 2 if has_paper else 0.0
    ax.bar([i - offset for i in x], ours, width, yerr=ours_err, capsize=3, label="this run")
    if has_paper:
        ax.bar(
            [i + offset for i in x],
            paper,
            width,
            yerr=paper_err,
            capsize=3,
            label="published",
            alpha=0.7,
        )
    finite = [v for v in ours + paper if v == v]
    if finite:
        ax.set_ylim(min(finite) - 2, max(finite) + 2)
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.set(
        ylabel="STS avg (Spearman x 100)",
        title=f"ablation of {data.get('recipe', '?')} (mean ± std over seeds)",
    )
    ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def compute_align_uniform(run: Run, data_dir=None, model: str | None = None) -> dict:
    """Alignment/uniformity of the run's best checkpoint (or of ``model``, encoded its own way)
    on the full STS-B; saved in the run's folder."""

    downstream = resolve_downstream(data_dir)
    subsets = [load_stsbenchmark(downstream, split) for split in STSB_FILES]
    logger.info(f"{model or run.path}: loading {'the model' if model else 'the best checkpoint'}")
    encoder, tokenizer, pooler, _ = load_encoder(model or run.path, None, None)
    pairs = [pair for subset in subsets for pair in subset.pairs]
    gold = [g for subset in subsets for g in subset.gold]
    logger.info(f"{run.path}: encoding the {len(pairs)} STS-B pairs")
    vectors, row = embed_unique(
        (s for pair in pairs for s in pair),
        lambda sentences: encode_sentences(
            encoder, tokenizer, sentences, pooler=pooler, progress=True
        ),
    )
    import numpy as np

    result = align_uniform(pairs, np.asarray(gold), vectors, row)
    write_json(run.files.align_uniform, result)
    return result


def base_point(runs: Sequence[Run], data_dir=None) -> tuple[str, tuple[float, float]] | None:
    """The align–uniform point of the student the runs started from (when they share one):
    computed once and cached with the base model's scores (:mod:`mmcse.reports.base_model`);
    None, with a warning, when it cannot be had."""
    from mmcse.hub import resolve_model_source
    from mmcse.reports.base_model import results_dir

    students = {(run.config() or {}).get("model") for run in runs}
    if len(students) != 1 or None in students:
        return None
    student = str(next(iter(students)))
    try:
        source = resolve_model_source(student, flag="--model")
        base = Run(results_dir(source, str(data_dir) if data_dir else None))
        au = read_json(base.files.align_uniform)
        if au is None:
            logger.info(f"alignment/uniformity of the base model: {student}")
            base.path.mkdir(parents=True, exist_ok=True)
            au = compute_align_uniform(base, data_dir, model=source)
    except MmcseError as exc:
        logger.warning(f"no base-model point on the align–uniform plot: {exc}")
        return None
    return f"{Path(student).name} (before fine-tuning)", (au["uniformity"], au["alignment"])


def _default_out_dir(arguments: Sequence[Path]) -> Path:
    if len(arguments) == 1:
        return arguments[0]
    return Path(os.path.commonpath([str(a.resolve()) for a in arguments]))


def write_run_plots(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    with_align_uniform: bool = False,
    data_dir=None,
) -> list[Path]:
    """Every figure for ``run_dirs`` (runs, seed folders, ablation folders); the paths written."""
    if not run_dirs:
        raise MmcseError("give at least one run directory")
    arguments = [Path(p) for p in run_dirs]
    written, points, plotted = [], {}, []
    for argument in arguments:
        if not argument.is_dir():
            raise MmcseError(f"{argument} is not a directory")
        runs = []
        ablation = AblationDir(argument)
        if ablation.is_ablation():
            written.append(plot_ablation(ablation.record, ablation.plot))
            for row_dir in sorted(p for p in argument.iterdir() if p.is_dir()):
                try:
                    runs += [(f"{row_dir.name}/{r.label}", r) for r in find_group(row_dir).runs]
                except MmcseError:
                    continue  # not a row folder
        else:
            group = find_group(argument)
            runs = [
                (group.label if len(group.runs) == 1 else f"{group.label}/{r.label}", r)
                for r in group.runs
            ]
        plotted += runs
    missing = [r for _, r in plotted if r.align_uniform() is None] if with_align_uniform else []
    for label, run in plotted:
        curves = plot_training_curves(run, run.files.training_curves)
        if curves:
            written.append(curves)
        au = run.align_uniform()
        if au is None and with_align_uniform:
            index = missing.index(run) + 1
            logger.info(f"alignment/uniformity [{index}/{len(missing)}]: {label}")
            au = compute_align_uniform(run, data_dir)
        if au is not None:
            points[label] = (au["uniformity"], au["alignment"])
    target = Path(out_dir) if out_dir else _default_out_dir(arguments)
    if len(plotted) > 1:
        written += plot_overlays(plotted, target)
    if points:
        base = base_point([r for _, r in plotted], data_dir) if with_align_uniform else None
        written.append(plot_align_uniform(points, target / ALIGN_UNIFORM_PLOT, base))
    if not written:
        raise MmcseError(
            f"nothing to plot: no {METRICS_FILE} records, no alignment/uniformity "
            f"(use --align-uniform), no {ABLATION_RECORD}"
        )
    return written
