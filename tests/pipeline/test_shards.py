"""Stage 1's resumable shard loop alone (pipeline.shards), with a real feature-set writer."""

from __future__ import annotations

import numpy as np
import pytest

from mmcse.cache import FeatureSet, FeatureSetWriter
from mmcse.errors import CacheError
from pipeline.shards import ShardPlan, run_shards

ITEMS = [f"id-{i:02d}" for i in range(10)]  # 4 shards of 3 (the last holds 1), batches of 2
PLAN = ShardPlan(len(ITEMS), 3)


def _writer(path, teacher="a"):
    return FeatureSetWriter(
        path, kind="text", dim=2, dtype="float32", dataset="toy", split="train",
        producer={"teacher": teacher},
    )  # fmt: skip


def _run(writer, calls, written, fail_at=None):
    """One run: batch rows computed into ``calls``, shards written into ``written``."""

    def batches(pending):
        for shard in pending:
            for rows in PLAN.batches(shard, 2):
                if shard == fail_at:
                    raise KeyboardInterrupt  # killed part-way through this shard
                calls.append(list(rows))
                yield shard, rows, np.array([[float(i), -float(i)] for i in rows])

    def write(shard, parts):
        written.append(shard)
        writer.write_shard(shard, [ITEMS[i] for i in PLAN.rows(shard)], np.concatenate(parts))

    return run_shards(
        PLAN, range(PLAN.num_shards), batch_size=2, done=writer.has_shard, batches=batches,
        write=write, desc="toy", unit="sent", progress=False,
    )  # fmt: skip


def test_a_run_killed_mid_shard_resumes_writing_each_shard_once_in_order(tmp_path):
    calls, written = [], []
    with pytest.raises(KeyboardInterrupt):
        _run(_writer(tmp_path / "set"), calls, written, fail_at=2)
    assert written == [0, 1]
    assert calls == [[0, 1], [2], [3, 4], [5]]

    again = _run(_writer(tmp_path / "set"), calls, written)
    assert again == [2, 3]  # the shards this run computed
    assert written == [0, 1, 2, 3]  # each shard once, in order
    assert calls[4:] == [[6, 7], [8], [9]]  # rows of written shards were not computed again
    assert _run(_writer(tmp_path / "set"), calls, written) == []  # nothing left to do
    _writer(tmp_path / "set").finalize(num_shards=PLAN.num_shards)
    stored = FeatureSet.open(tmp_path / "set")
    assert stored.ids.tolist() == ITEMS
    assert stored.take(np.arange(10))[:, 0].tolist() == [float(i) for i in range(10)]


def test_a_rerun_with_changed_settings_is_refused_before_any_shard(tmp_path):
    calls, written = [], []
    with pytest.raises(KeyboardInterrupt):
        _run(_writer(tmp_path / "set"), calls, written, fail_at=1)
    with pytest.raises(CacheError, match="other settings .*producer"):
        _run(_writer(tmp_path / "set", teacher="b"), calls, written)
    assert written == [0]


def test_only_this_ranks_shards_run_and_a_stream_out_of_step_is_a_bug(tmp_path):
    written = []

    def batches(pending):
        assert pending == [1, 3]
        for shard in pending:
            for rows in PLAN.batches(shard, 2):
                yield shard, rows, None

    ran = run_shards(
        PLAN, PLAN.shards_for_rank(1, 2), batch_size=2, done=lambda k: False, batches=batches,
        write=lambda k, parts: written.append((k, len(parts))), desc="toy", unit="sent",
        progress=False,
    )  # fmt: skip
    assert ran == [1, 3] and written == [(1, 2), (3, 1)]

    with pytest.raises(RuntimeError, match="arrived where shard 0"):
        run_shards(
            PLAN, [0], batch_size=2, done=lambda k: False,
            batches=lambda pending: iter([(0, range(0, 1), None)]), write=lambda k, p: None,
            desc="toy", unit="sent", progress=False,
        )  # fmt: skip
