"""mmcse plot: training curves from old and new metrics.jsonl, the align–uniform scatter,
ablation bars; clear errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from support.cli import run_main_output

import cli
import mmcse.recipes.ablate as ablate_mod
import mmcse.recipes.runs as recipes_mod
from mmcse.errors import MmcseError
from mmcse.recipes import Recipe, get_recipe
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.reports.plots import (
    MIN_AU_SPAN,
    MIN_DEV_SPAN,
    align_uniform_figure,
    loss_series,
    overlay_figure,
    overlay_metrics,
    training_figure,
    write_run_plots,
)
from mmcse.reports.recipes import write_ablation
from mmcse.reports.runs import Run
from mmcse.rundir import RunDir

pytest.importorskip("matplotlib")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SENTEVAL_MINI = Path(__file__).resolve().parents[1] / "fixtures" / "senteval_mini"


def old_format_records() -> list[dict]:
    """Today's trainer: one record per logged step, eval merged into the step's record."""
    out = []
    for step in range(1, 41):
        record = {"step": step, "epoch": 0, "kind": "text" if step % 4 else "caption",
                  "lr": 3e-5 * (1 - step / 40), "loss": 2.0 / step, "simcse_loss": 1.5 / step}  # fmt: skip
        if step % 4 == 0:
            record["image_text_loss"] = 3.0 / step  # only on caption batches
        if step % 10 == 0:
            record["stsb_dev"] = 60 + step / 2
        out.append(record)
    return out


def new_format_records() -> list[dict]:
    """The ``loop`` format: window averages with time/batch counts; eval records apart."""
    out = [{"plan": {"total_steps": 30}}]  # no step: not a curve point
    for step in range(5, 31, 5):
        out.append({"step": step, "epoch": 0, "time": 1.7e9 + step, "lr": 2e-5, "loss": 1 / step,
                    "simcse_loss": 0.8 / step, "cross_modal_loss": 0.3 / step,
                    "text_batches": 4, "caption_batches": 1, "steps_per_s": 3.0})  # fmt: skip
        if step % 10 == 0:
            out.append({"step": step, "time": 1.7e9 + step, "stsb_dev": 70 + step / 10})
    return out


def make_run(path: Path, records: list[dict], au: tuple[float, float] | None = None) -> Path:
    path.mkdir(parents=True)
    lines = [json.dumps(r) for r in records]
    (path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 99, "lo')  # torn last line
    if au is not None:
        results = {"avg": 70.0, "align_uniform": {"alignment": au[1], "uniformity": au[0]}}
        (path / "results.json").write_text(json.dumps(results))
    return path


def test_loss_series_takes_every_loss_term_of_both_formats(tmp_path):
    old = loss_series(Run(make_run(tmp_path / "old", old_format_records())).metrics())
    assert set(old) == {"loss", "simcse_loss", "image_text_loss"}
    assert old["image_text_loss"][0] == list(range(4, 41, 4))  # missing keys are skipped
    new_records = Run(make_run(tmp_path / "new", new_format_records())).metrics()
    assert set(loss_series(new_records)) == {"loss", "simcse_loss", "cross_modal_loss"}
    assert [r["stsb_dev"] for r in new_records if "stsb_dev" in r] == [71.0, 72.0, 73.0]


def test_write_run_plots_writes_pngs_next_to_the_runs(tmp_path):
    simcse = make_run(tmp_path / "runs" / "simcse", old_format_records(), au=(-2.2, 0.21))
    group = tmp_path / "runs" / "mcse"
    make_run(group / "seed0", new_format_records(), au=(-2.5, 0.25))
    make_run(group / "seed1", new_format_records(), au=(-2.6, 0.24))
    written = write_run_plots([simcse, group])
    overlays = ("stsb_dev", "loss", "simcse_loss", "image_text_loss", "cross_modal_loss")
    expected = {
        simcse / "training_curves.png",
        group / "seed0" / "training_curves.png",
        group / "seed1" / "training_curves.png",
        tmp_path / "runs" / "align_uniform.png",
        *(tmp_path / "runs" / f"curves-{metric}.png" for metric in overlays),
    }
    assert set(written) == expected
    for path in expected:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_plot_align_uniform_computes_what_a_run_lacks(tmp_path, tiny_model, monkeypatch, capsys):
    """`mmcse plot RUN --align-uniform`: a run with a checkpoint but no alignment/uniformity
    gets both computed on STS-B, saved in the run, and plotted."""
    run = make_run(tmp_path / "runs" / "tiny", new_format_records())
    shutil.copytree(tiny_model, RunDir(run).best.path)
    assert Run(run).align_uniform() is None
    args = ["plot", str(run), "--align-uniform", "--data", str(SENTEVAL_MINI)]
    code, out, err = run_main_output(args, monkeypatch, capsys)
    assert code == 0, err
    au = json.loads(RunDir(run).align_uniform.read_text())
    assert au["alignment"] >= 0 and -4.1 < au["uniformity"] <= 0  # t=2: uniformity >= -2t
    scatter = run / "align_uniform.png"
    assert f"wrote {scatter}" in out and scatter.read_bytes()[:8] == PNG_MAGIC
    # its work shows: which run, what it does, an encoding bar
    assert "alignment/uniformity [1/1]: tiny" in err and "encoding the" in err
    assert "encoding: 100%" in err


def fake_train(cfg):
    dropped = sum(v == 0 for k, v in cfg.method_args.items() if k.endswith("_weight"))
    base = 79.0 - 1.2 * dropped + 0.3 * cfg.seed
    return {"STS12": base, "avg": base}


def test_ablation_bar_chart(monkeypatch, tmp_path):
    monkeypatch.setattr(recipes_mod, "train_one", fake_train)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)
    result = ablate_mod.ablate(
        get_recipe("dalr/wiki+flickr/bert"),
        ablate_mod.parse_drops("image_text,cross_modal,rank"),
        RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1, 2)),
        output_dir=tmp_path / "abl",
    )
    write_ablation(result, tmp_path / "abl" / "ablation.md")
    written = write_run_plots([tmp_path / "abl"])
    assert written == [tmp_path / "abl" / "ablation.png"]  # fake runs logged no metrics
    assert written[0].read_bytes()[:8] == PNG_MAGIC


def test_errors_are_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()
    monkeypatch.setattr(sys, "argv", ["mmcse", "plot", str(tmp_path / "empty")])
    with pytest.raises(SystemExit) as info:
        cli.main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("error:") and err.count("\n") == 1

    run = make_run(tmp_path / "r", old_format_records())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    with pytest.raises(MmcseError, match=r"pip install 'mmcse\[plot\]'"):
        write_run_plots([run])


def test_runs_are_overlaid_per_metric_on_honest_axes_with_visible_single_points(tmp_path):
    """A 0.005-point wobble of STS-B dev is drawn on a range of at least 5 points with its
    values written out (no offset), and a run with one dev point shows a marker."""
    steady = [{"step": s, "loss": 1.0 / s, "stsb_dev": 86.73 + 0.005 * (s % 2)} for s in
              range(1, 41)]  # fmt: skip
    once = [{"step": 5, "loss": 0.9}, {"step": 10, "loss": 0.8, "stsb_dev": 86.731}]
    runs = [("steady", Run(make_run(tmp_path / "steady", steady))),
            ("once", Run(make_run(tmp_path / "once", once)))]  # fmt: skip
    metrics = overlay_metrics(runs)
    assert set(metrics) == {"stsb_dev", "loss"} and set(metrics["stsb_dev"]) == {"steady", "once"}
    fig = overlay_figure("stsb_dev", metrics["stsb_dev"])
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_ylim()
    assert high - low >= MIN_DEV_SPAN and low < 86.73 < high
    assert ax.yaxis.get_major_formatter().get_offset() == ""  # no '+8.673e1'
    assert all(float(t.get_text().replace("−", "-")) > 80 for t in ax.get_yticklabels())
    steady_line, once_line = ax.get_lines()
    assert once_line.get_marker() == "o" and len(once_line.get_xdata()) == 1
    assert steady_line.get_marker() == "None"  # 40 points: a line says enough
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["steady", "once"]
    written = write_run_plots([tmp_path / "steady", tmp_path / "once"], tmp_path / "figs")
    assert tmp_path / "figs" / "curves-stsb_dev.png" in written


def test_each_loss_term_has_its_own_scale(tmp_path):
    """A term 20 times smaller than another is not flattened under it: a panel per term (and
    the total), each spanning its own values, then lr and STS-B dev."""
    records = [{"step": s, "loss": 20.0 / s, "simcse_loss": 0.5 + 0.2 / s,
                "image_text_loss": 10.0 + 10.0 / s, "lr": 1e-5} for s in range(1, 21)]  # fmt: skip
    fig = training_figure(Run(make_run(tmp_path / "run", records)))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in shown]
    assert titles == ["loss (weighted total)", "image_text_loss", "simcse_loss",
                      "learning rate", "STS-B dev"]  # fmt: skip
    simcse = shown[titles.index("simcse_loss")]
    low, high = simcse.get_ylim()
    values = [r["simcse_loss"] for r in records]
    assert low <= min(values) and max(values) <= high and high - low < 1.0  # not 0..20


def test_align_uniform_labels_of_close_runs_do_not_overlap_and_the_base_hides_no_run():
    """Two runs 0.015 apart printed their labels over each other; a run at the base model's
    point sat under its grey cross."""
    points = {"simcse-s0": (-2.300, 0.250), "mcse-s0": (-2.315, 0.260), "far": (-1.5, 0.4)}
    fig = align_uniform_figure(points, ("bert (before fine-tuning)", (-2.300, 0.250)))
    ax = fig.axes[0]
    offsets = {t.get_text(): t.xyann for t in ax.texts}
    assert offsets["simcse-s0"] != offsets["mcse-s0"] and offsets["far"] == offsets["simcse-s0"]
    base, *runs = ax.collections  # the cross is drawn first, under every run
    assert all(run.get_zorder() > base.get_zorder() for run in runs) and len(runs) == 3


def test_align_uniform_plot_has_the_base_model_honest_ranges_and_readable_ticks():
    """Two runs 0.015 apart do not fill the plot; the base model's point is there, labelled;
    ticks are few and short."""
    points = {"simcse-s0": (-2.300, 0.250), "mcse-s0": (-2.315, 0.260)}
    fig = align_uniform_figure(points, ("bert (before fine-tuning)", (-1.2, 0.05)))
    ax = fig.axes[0]
    fig.canvas.draw()
    (x_low, x_high), (y_low, y_high) = ax.get_xlim(), ax.get_ylim()
    assert (
        x_high - x_low >= MIN_AU_SPAN["uniformity"] and y_high - y_low >= MIN_AU_SPAN["alignment"]
    )
    assert x_low < -2.315 and x_high > -1.2 and y_low < 0.05 and y_high > 0.26
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["bert (before fine-tuning)"]
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        texts = [t.get_text() for t in labels if t.get_text()]
        assert 2 <= len(texts) <= 7 and all(len(t) <= 5 for t in texts), texts
    only_runs = align_uniform_figure(points).axes[0]
    low, high = only_runs.get_xlim()
    assert high - low >= MIN_AU_SPAN["uniformity"]  # 0.015 apart: not a trend
