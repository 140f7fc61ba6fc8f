"""``mmcse bench train``: every registered method steps on fixtures joined like real caches."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from mmcse.bench import train_step as bench
from mmcse.errors import MmcseError
from mmcse.registry import METHODS

SEQ_LEN, BATCH = 16, 8
#: written out independently of the bench's role kinds: roles whose rows belong to an image
IMAGE_ROLES = {"image", "clip_image"}
#: (method, role) → dim of the teacher of the method's first recipe (written out by hand:
#: ResNet-50 2048, CLIP ViT-L/14 768 (DALR's released teacher), ViT-B/32 512, BERT-base 768)
EXPECTED_DIMS = {
    ("mcse", "image"): 2048,
    ("mcseo", "image"): 2048,
    ("dalr", "image"): 768,
    ("dalr", "text_teacher_simcse"): 768,
    ("dalr", "text_teacher_diffcse"): 768,
    ("dalr-paper", "image"): 512,
    ("dalr-paper", "text_teacher_simcse"): 768,
    ("dalr-paper", "text_teacher_diffcse"): 768,
    ("kdmcse", "clip_image"): 768,
    ("kdmcse", "clip_text"): 768,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    names = METHODS.names()
    needs = set().union(*(bench.method_needs(n) for n in names))
    world = bench.synthetic_world(tmp_path_factory.mktemp("bench"), "tiny", SEQ_LEN, 64, needs)
    return {n: bench.bench_trainer(world, n, BATCH, SEQ_LEN, "cpu", "fp32") for n in names}


def test_vector_roles_join_on_image_or_sentence_id(runs):
    joined = set()
    for name, run in runs.items():
        source = run.data.sources["caption"]
        for role, rows in source.feature_rows.items():
            feature_set = run.data.feature_sets[role]
            keys = source.image_ids if role in IMAGE_ROLES else source.ids
            for caption, row in enumerate(rows):
                assert feature_set.ids[row] == keys[caption], (name, role, caption)
            assert feature_set.dim == EXPECTED_DIMS[name, role]
            joined.add((name, role))
    assert joined == set(EXPECTED_DIMS)


def test_mcseo_caption_batch_pairs_four_phrases_with_2048d_objects(runs):
    run = runs["mcseo"]
    kind, rows = run.data.batch_order(0, BATCH)[0]
    batch = run.data.batch(kind, rows, torch.device("cpu"))
    extras = run.method.batch_inputs(run.data, batch).apply_to(batch)
    assert batch.features["object"].shape == (BATCH, 4, 2048)
    assert extras["phrase_mask"].all()
    words = SEQ_LEN - 2
    for b in range(BATCH):
        for p in range(4):
            token = 1 + p * words // 4  # one word per token, after [CLS]
            assert extras["phrase_spans"][b, p].tolist() == [token, token + 1]


def test_nonlinguistic_examples_have_the_writers_row_shapes(runs):
    assert list(runs["visualcse"].aux.examples.shape) == [3, 256, 256]
    assert list(runs["audiocse"].aux.examples.shape) == [1024, 128]
    assert runs["simcse"].aux is None


def test_unknown_role_is_a_clear_error():
    with pytest.raises(MmcseError, match="depth_map"):
        bench.role_kind("depth_map")
    with pytest.raises(MmcseError, match="no recipe"):
        bench.recipe_roles("no-such-method")
    assert bench.role_kind("text_teacher_simcse") == "text"


def test_teacher_dims_are_the_teacher_table_s():
    """The widths the bench (and any reader of a recipe) takes a teacher to write are the ones
    pipeline.teachers' table states, for every registered teacher."""
    import re

    import pipeline.teachers as teachers

    table = re.findall(r"^``([a-z0-9-]+)``\s+\w+\s+(\d+)\s", teachers.__doc__, re.M)
    assert {name: int(dim) for name, dim in table} == teachers.TEACHER_DIMS
    assert set(teachers.TEACHER_DIMS) == set(teachers.TEACHERS.names())


def test_bench_train_times_every_registered_method():
    result = bench.bench_train(size="tiny", steps=2, rounds=1, batch=BATCH, seq_len=SEQ_LEN)
    assert set(result["ratios"]) == set(METHODS.names())
    for name, ratio in result["ratios"].items():
        assert math.isfinite(ratio) and ratio > 0, name
    assert result["ratios"]["simcse"] == 1.0


def test_profiling_a_step_prints_nothing_of_its_own(capfd):
    """The profiler's C++ side prints ``USDT … profiler_start``/``profiler_stop`` (and, on a
    machine without a GPU, ``gpuGetDeviceCount failed``) straight to the terminal; the bench's
    profiling keeps them off it, while the profiled work may still write."""
    import sys

    import torch

    from mmcse.bench.timing import quiet_profile

    with quiet_profile() as prof:
        torch.ones(3).add_(1)
        print("the work's own line", file=sys.stderr, flush=True)
    err = capfd.readouterr().err
    assert "the work's own line" in err
    assert "profiler_start" not in err and "gpuGetDeviceCount" not in err
    assert any(e.name.startswith("aten::add") for e in prof.events())


def test_a_ratio_carries_the_range_its_rounds_allow():
    simcse = {"step_ms": 10.0, "samples_ms": [9.9, 10.0, 10.1]}
    steady = bench.ratio_with_spread({"step_ms": 10.5, "samples_ms": [10.4, 10.5, 10.6]}, simcse)
    assert steady["ratio_range"][0] <= steady["ratio"] <= steady["ratio_range"][1]
    assert not steady["noisy"]
    noisy = bench.ratio_with_spread({"step_ms": 4.0, "samples_ms": [3.0, 4.0, 9.0]}, simcse)
    assert noisy["noisy"]  # its rounds span 0.30x–0.91x: a 0.4x ratio is no finding


def test_a_bench_state_left_to_interpreter_exit_exits_quietly(tmp_path):
    """Its prefetching generator is never closed; finalised at exit, it must not print an
    ignored exception (it did: cancelling the batch gathered ahead used a torn-down module)."""
    script = (
        "import sys\nfrom pathlib import Path\nfrom mmcse.bench import train_step as bench\n"
        "world = bench.synthetic_world(Path(sys.argv[1]), 'tiny', 16, 64, "
        "bench.method_needs('simcse'))\n"
        "state = bench.BenchState.of(world, 'simcse', 8, 16, 'cpu', 'auto', capture='off')\n"
        "state.step()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
