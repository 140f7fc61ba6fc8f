"""``mmcse bench all --sections capture``: a method's eager operators, graphs per batch kind,
an update's operators outside a graph. No timing thresholds."""

from __future__ import annotations

import torch

from mmcse.bench import capture as bench_capture
from mmcse.bench import train_step as bench

SEQ_LEN, BATCH = 16, 8


def test_a_methods_eager_operators_and_one_graph_per_batch_kind(tmp_path):
    world = bench.synthetic_world(tmp_path, "tiny", SEQ_LEN, 4 * BATCH, set())
    r = bench_capture.describe_steps(world, ["simcse"], BATCH, SEQ_LEN, "cpu")["simcse"]
    assert set(r) == {"eager_ops", "explain"}  # nothing timed: the train section times
    state = bench.BenchState.of(
        world, "simcse", BATCH, SEQ_LEN, "cpu", "auto", capture="off", dynamic_padding=False
    )
    state.step()
    assert r["eager_ops"] == bench.count_ops(state) > 0  # deterministic
    graphs = {kind: (e["graphs"], e["breaks"]) for kind, e in r["explain"].items()}
    assert graphs == {"caption": (1, 0), "text": (1, 0)}


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
