"""``mmcse bench all --sections capture``: eager vs captured step, ops, graphs per batch kind.

The captured runs compile with ``aot_eager`` here (inductor's CPU code generation takes minutes;
the figures' structure is what is tested). No timing thresholds.
"""

from __future__ import annotations

import torch

from mmcse.bench import capture as bench_capture
from mmcse.bench import train_step as bench
from mmcse.training import fastpath

SEQ_LEN, BATCH = 16, 8


def test_every_figure_of_a_method_and_one_graph_per_batch_kind(tmp_path, monkeypatch):
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": "aot_eager"})
    world = bench.synthetic_world(tmp_path, "tiny", SEQ_LEN, 4 * BATCH, set())
    r = bench_capture.bench_capture(world, ["simcse"], BATCH, SEQ_LEN, "cpu", 2, 1, 1)["simcse"]
    assert r["eager_ms"] > 0 and r["captured_ms"] > 0 and r["compile_s"] > 0
    assert r["speedup"] == r["eager_ms"] / r["captured_ms"]
    assert r["eager_ops"] > 0 and 0 < r["captured_ops_in_graphs"] < r["captured_ops"]
    graphs = {kind: (e["graphs"], e["breaks"]) for kind, e in r["explain"].items()}
    assert graphs == {"caption": (1, 0), "text": (1, 0)}
    eager = bench_capture.bench_capture(world, ["simcse"], BATCH, SEQ_LEN, "cpu", 1, 0, 1, False)
    assert "captured_ms" not in eager["simcse"] and eager["simcse"]["eager_ops"] > 0
    untimed = bench_capture.describe_steps(world, ["simcse"], BATCH, SEQ_LEN, "cpu")["simcse"]
    assert set(untimed) == {"eager_ops", "explain"}  # the suite's: the train section times
    assert untimed["eager_ops"] == eager["simcse"]["eager_ops"]


def test_explain_names_the_break_of_a_step_that_has_one():
    def step(x):
        y = x.sin()
        if y.sum() > 0:  # data-dependent branching: a break
            return y.cos()
        return y

    explained = bench_capture.explain(step, torch.ones(3))
    assert explained["graphs"] == 2 and explained["breaks"] == 1
    assert len(explained["reasons"]) == 1 and explained["reasons"][0]


def test_update_ops_count_fewer_calls_for_multi_tensor_and_fused_updates():
    counts = bench_capture.update_ops(
        torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(6)))
    )
    assert counts["parameters"] == 12
    assert counts["clip_foreach"] < counts["clip_per_parameter"]
    assert counts["adamw_fused"] < counts["adamw_foreach"] < counts["adamw_per_parameter"]
