"""Whole-update capture (:mod:`mmcse.training.update`), for every registered method, on CPU:

* the captured update equals the eager one — loss of every step, parameters and AdamW's moments
  (the gradients, through ``exp_avg = Σ (1 − β₁) β₁^k g``) after 3 steps, same seed, dropout on;
* a captured step dispatches at most :data:`MAX_OPS_OUTSIDE` operators outside its compiled
  graphs, the loss window included (the deterministic proxy of a GPU step's host work: every
  one is a launch or host work that the GPU waits for when it is short);
* no host read of a device value in a step (``_local_scalar_dense``, ``item``: on CUDA a sync);
* one graph per batch kind (and one for the auxiliary step), no recompile on kinds seen before.

Compiled with ``aot_eager`` (the same graphs and autograd as inductor, without its slow CPU code
generation), which calls the eager kernels in eager's order — dropout's draws included — so the
comparison keeps dropout on. Tolerances: float32, the same kernels, sums reassociated (clipping's
norm over one flat buffer, not per tensor; bias corrections in fp32 on the device, not Python
floats): rtol 1e-5, atol 1e-6 on the loss; atol 1e-6 on parameters; rtol 1e-4, atol 1e-6 on the
moments (gradients of a few hundred terms summed in another order differ by ~1e-6 absolute).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend
from torch.profiler import ProfilerActivity, profile

import mmcse.methods  # noqa: F401  (registers every method)
from mmcse.bench.train_step import BenchState
from mmcse.demo.synthetic import method_needs, synthetic_world
from mmcse.registry import METHODS
from mmcse.training import fastpath

#: the issue's bound on operators a captured step dispatches outside its graphs
MAX_OPS_OUTSIDE = 40
HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")
BATCH, SEQ = 4, 12
#: the auxiliary steps at test size (the papers' 48 examples at 224 px would take minutes)
SMALL_AUX = {
    "visualcse": {"image_batch_size": 4, "image_size": 32},
    "audiocse": {"audio_batch_size": 4, "audio_patch_size": 16},
}
STEPS = 3
#: AdamW's moments hold the gradients, which the two compute in another summation order
MOMENTS = {"rtol": 1e-4, "atol": 1e-6}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    needs = set().union(*(method_needs(n) for n in METHODS.names()))
    return synthetic_world(tmp_path_factory.mktemp("bench-world"), "tiny", SEQ, 48, needs)


def trainer_state(
    world, name: str, capture: str, device: str = "cpu", precision: str = "auto", **settings
) -> BenchState:
    """A bench trainer of ``name`` at test size (a warm-up step, weight decay: every part of
    AdamW's arithmetic is exercised)."""
    args = dict(SMALL_AUX.get(name, {}))
    if name == "visualcse":
        args["vit_init"] = "random"
    torch.manual_seed(0)
    return BenchState.of(
        world, name, BATCH, SEQ, device, precision, capture=capture, dynamic_padding=False,
        method_args=args, warmup_steps=1, weight_decay=0.01, **settings,
    )  # fmt: skip


@pytest.fixture
def aot_eager(monkeypatch):
    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": counter})
    torch._dynamo.reset()
    return counter


def run_steps(state: BenchState, steps: int) -> list[float]:
    """The loss of each step; the random state set before each (the two runs share it)."""
    losses = []
    for index in range(steps):
        torch.manual_seed(100 + index)
        state.step()
        losses.append(state.trainer.window.flush()["loss"])
    return losses


@pytest.mark.parametrize("name", METHODS.names())
def test_captured_update_equals_eager(name, world, aot_eager):
    eager = trainer_state(world, name, "off")
    captured = trainer_state(world, name, "on")
    assert captured.trainer.capture == "whole" and eager.trainer.capture == "off"
    want, got = run_steps(eager, STEPS), run_steps(captured, STEPS)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = dict(captured.trainer.student.named_parameters())
    for key, value in eager.trainer.student.named_parameters():
        torch.testing.assert_close(params[key], value, rtol=0, atol=1e-6, msg=key)
    want_state = eager.trainer.updates.state_dict()["optimizer"]["state"]
    got_state = captured.trainer.updates.state_dict()["optimizer"]["state"]
    assert got_state.keys() == want_state.keys()  # the same parameters stepped
    for index, entry in want_state.items():
        assert float(got_state[index]["step"]) == float(entry["step"])
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got_state[index][moment], entry[moment], **MOMENTS)
    if eager.trainer.aux is not None:  # the auxiliary step: its own AdamW, the same way
        aux_want = eager.trainer.updates.state_dict()["aux"]["optimizer"]["state"]
        aux_got = captured.trainer.updates.state_dict()["aux"]["optimizer"]["state"]
        assert aux_got.keys() == aux_want.keys()
        for index, entry in aux_want.items():
            torch.testing.assert_close(aux_got[index]["exp_avg"], entry["exp_avg"], **MOMENTS)


def step_events(state: BenchState) -> list:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        state.step()
    return list(prof.events())


def outside_graphs(events: list) -> list:
    graphs = [(e.time_range.start, e.time_range.end) for e in events
              if e.name.startswith("Torch-Compiled Region")]  # fmt: skip
    leaf = [e for e in events if e.name.startswith("aten::")
            and not any(c.name.startswith("aten::") for c in e.cpu_children)]  # fmt: skip
    return [e for e in leaf if not any(s <= e.time_range.start <= t for s, t in graphs)]


@pytest.mark.parametrize("name", METHODS.names())
def test_a_captured_step_stays_in_its_graphs_and_never_reads_the_device(name, world, aot_eager):
    state = trainer_state(world, name, "on")
    for _ in range(2):  # compiled (and probed) at the first step
        state.step()
    graphs = aot_eager.frame_count
    events = step_events(state)
    outside = outside_graphs(events)
    assert len(outside) <= MAX_OPS_OUTSIDE, sorted(e.name for e in outside)
    reads = [e.name for e in events if e.name in HOST_READS]
    assert reads == []
    kinds = 2 if state.trainer.aux is not None else 1  # caption batches, + image/audio
    assert graphs == kinds and aot_eager.frame_count == kinds  # no recompile
