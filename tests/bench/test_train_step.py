"""The bench's ``train`` section: every registered method steps on the synthetic cache
(:mod:`mmcse.demo.synthetic`), joined like a real cache."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mmcse.bench import train_step as bench
from mmcse.demo import synthetic
from mmcse.errors import MmcseError
from mmcse.recipes import RECIPES
from mmcse.registry import METHODS

SEQ_LEN, BATCH = 16, 8
#: written out independently of the bench's role kinds: roles whose rows belong to an image
IMAGE_ROLES = {"image", "clip_image"}
#: the widths of the teachers the recipes name, written out by hand: ResNet-50 2048, CLIP ViT-L/14
#: 768 (DALR's released teacher), ViT-B/32 512, BERT-base text teachers 768
TEACHER_WIDTHS = {
    "resnet50": 2048,
    "clip-vit-l14": 768,
    "clip-vit-b32": 512,
    "simcse": 768,
    "diffcse": 768,
}


def expected_dims() -> dict[tuple[str, str], int]:
    """(method, role) → width, for every vector role of every registered method, read from the
    method's first recipe in the catalogue (a new method needs no row here, only a recipe)."""
    first: dict[str, dict] = {}
    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        first.setdefault(recipe.method, recipe.roles)
    return {
        (method, role): TEACHER_WIDTHS[feature.teacher]
        for method in METHODS.names()
        for role, feature in first.get(method, {}).items()
        if feature.kind in ("image", "text")
    }


EXPECTED_DIMS = expected_dims()


def test_every_registered_method_has_a_recipe_the_bench_reads():
    for name in METHODS.names():
        assert synthetic.recipe_roles(name) is not None, name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    names = METHODS.names()
    needs = set().union(*(synthetic.method_needs(n) for n in names))
    world = synthetic.synthetic_world(tmp_path_factory.mktemp("bench"), "tiny", SEQ_LEN, 64, needs)
    return {n: bench.bench_trainer(world, n, BATCH, SEQ_LEN, "cpu", "fp32") for n in names}


@pytest.mark.parametrize("name", METHODS.names())
def test_vector_roles_join_on_image_or_sentence_id(runs, name):
    run, joined = runs[name], set()
    source = run.data.sources["caption"]
    for role, rows in source.feature_rows.items():
        feature_set = run.data.feature_sets[role]
        keys = source.image_ids if role in IMAGE_ROLES else source.ids
        for caption, row in enumerate(rows):
            assert feature_set.ids[row] == keys[caption], (role, caption)
        assert feature_set.dim == EXPECTED_DIMS[name, role]
        joined.add((name, role))
    assert joined == {key for key in EXPECTED_DIMS if key[0] == name}


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
        synthetic.role_kind("depth_map")
    with pytest.raises(MmcseError, match="no recipe"):
        synthetic.recipe_roles("no-such-method")
    assert synthetic.role_kind("text_teacher_simcse") == "text"


def test_teacher_dims_are_the_teacher_table_s():
    """The widths the bench (and any reader of a recipe) takes a teacher to write are the ones
    pipeline.teachers' table states, for every registered teacher."""
    import re

    import pipeline.teachers as teachers

    table = re.findall(r"^``([a-z0-9-]+)``\s+\w+\s+(\d+)\s", teachers.__doc__, re.M)
    assert {name: int(dim) for name, dim in table} == teachers.TEACHER_DIMS
    assert set(teachers.TEACHER_DIMS) == set(teachers.TEACHERS.names())


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
        "from mmcse.demo import synthetic\n"
        "world = synthetic.synthetic_world(Path(sys.argv[1]), 'tiny', 16, 64, "
        "synthetic.method_needs('simcse'))\n"
        "state = bench.BenchState.of(world, 'simcse', 8, 16, 'cpu', 'auto', capture='off')\n"
        "state.step()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("choice", list(bench.CAPTURE_FLAGS))
def test_each_capture_choice_is_the_trainer_s_capture_mode_of_that_name(runs, choice):
    """``--capture forward,whole`` of the bench sets the trainer's own flag (no patching): each
    choice resolves, on any device, to the capture mode it is named after."""
    import dataclasses

    from mmcse.training.fastpath import capture_mode

    cfg = dataclasses.replace(runs["simcse"].cfg, capture=bench.CAPTURE_FLAGS[choice])
    assert capture_mode(cfg, torch.device("cpu"), distributed=False) == choice


def test_the_bench_replays_the_runs_own_batches_whose_packed_budgets_are_fixed(tmp_path):
    """Stepping past the run's last batch starts it again: a further epoch's shuffle could need
    more packed rows than the run's budget (it did on an H200, MCSE packed at batch 128)."""
    world = synthetic.synthetic_world(
        tmp_path, "tiny", SEQ_LEN, 40, synthetic.method_needs("simcse")
    )
    state = bench.BenchState.of(world, "simcse", BATCH, SEQ_LEN, "cpu", "fp32", packing=True)
    total = state.trainer.total
    assert total == 5  # 40 captions, one epoch of batches of 8
    drawn = [next(state.batches)[2].input_ids for _ in range(2 * total + 1)]
    run = [batch.input_ids for _, batch, _ in state.trainer.batches(0, 0)]
    for index, ids in enumerate(drawn):
        torch.testing.assert_close(ids, run[index % total])


def test_the_bench_steps_as_the_training_loop_does(tmp_path):
    """The bench's step is the loop's (``Trainer.train_step``): the run's state moves to the next
    batch of the epoch, and the loss window holds each step's kind and terms."""
    world = synthetic.synthetic_world(
        tmp_path, "tiny", SEQ_LEN, 40, synthetic.method_needs("simcse")
    )
    state = bench.BenchState.of(world, "simcse", BATCH, SEQ_LEN, "cpu", "fp32")
    total = state.trainer.total
    for _ in range(total + 1):  # one past the run's last batch: the replay starts at batch 0
        state.step()
    run = state.trainer.state
    assert (run.step, run.epoch, run.next_index) == (total + 1, 0, 1)
    assert [step for step, _ in state.trainer.window.steps] == list(range(1, total + 2))
    assert "loss" in state.trainer.window.flush()
