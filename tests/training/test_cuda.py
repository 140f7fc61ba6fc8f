"""The captured training step on a CUDA device (marker ``cuda``: skipped without one; CI has none).

What only a GPU shows: the whole update replayed as a CUDA graph equals the eager update
(inductor's ``fallback_random`` makes dropout draw the eager kernels' masks; fp32, so the only
differences are fused kernels' rounding: rtol 1e-4), a step never synchronises the host with the
device (``torch.cuda.set_sync_debug_mode("error")`` turns any sync into an error), a run whose
last batch is partial replays two graphs per kind and finishes, the fp16 image step of
VisualCSE scales its loss with its own GradScaler, and a checkpoint's snapshot is queued into
pinned host buffers without a sync.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from support.runs import tiny_mcse_settings
from training.test_whole_update import run_steps, trainer_state, world  # noqa: F401  (fixture)

from mmcse.training.checkpoint_writer import HostSnapshots
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", ["simcse", "mcse", "dalr"])
def test_the_whole_update_as_a_cuda_graph_equals_eager(name, world):  # noqa: F811
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        eager = trainer_state(world, name, "off", "cuda", "fp32")
        captured = trainer_state(world, name, "on", "cuda", "fp32")
        assert captured.trainer.capture == "whole"
        want, got = run_steps(eager, 3), run_steps(captured, 3)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    params = dict(captured.trainer.student.named_parameters())
    for key, value in eager.trainer.student.named_parameters():
        torch.testing.assert_close(params[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["simcse", "visualcse"])
def test_a_captured_step_never_synchronises(name, world):  # noqa: F811
    torch._dynamo.reset()
    state = trainer_state(world, name, "on", "cuda", "bf16")
    for _ in range(3):  # compiled and recorded
        state.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            state.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_a_run_with_a_last_partial_batch_replays_and_finishes(tiny_model, tiny_world, tmp_path):
    torch._dynamo.reset()
    settings = tiny_mcse_settings(
        tiny_model, tiny_world, tmp_path / "run", batch_size=10, max_seq_length=16,
        device="cuda", capture="on", log_every=1, eval_steps=100,
    )  # fmt: skip
    run = train(TrainConfig(**settings)).output_dir
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 10 + 7 and all(torch.isfinite(torch.tensor(losses)))


def test_the_fp16_image_step_scales_its_loss(world):  # noqa: F811
    torch._dynamo.reset()
    state = trainer_state(world, "visualcse", "on", "cuda", "fp16")
    assert state.trainer.capture == "forward"  # fp16: the update stays eager
    assert state.trainer.updates.auxiliary.scaler.is_enabled()
    losses = run_steps(state, 3)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert state.trainer.updates.auxiliary.scaler.get_scale() > 0


def test_a_checkpoint_snapshot_is_queued_into_pinned_buffers_without_a_sync():
    live = {"weights": torch.randn(1024, 1024, device="cuda"), "step": 3}
    saved = live["weights"].cpu()
    snapshots = HostSnapshots()
    snapshots.copy("last", live)[1]()  # the first save allocates its pinned buffers
    torch.cuda.set_sync_debug_mode("error")
    try:
        snapshot, ready = snapshots.copy("last", live)
        live["weights"].add_(1.0)  # the next step's in-place update: queued after the copy
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ready()  # what the writer thread waits for
    assert snapshot["weights"].is_pinned() and snapshot["step"] == 3
    torch.testing.assert_close(snapshot["weights"], saved, rtol=0, atol=0)


def test_the_prefetch_hands_a_packed_batch_over_on_a_side_stream():
    """The real stream adapter (``CudaStreams``): every tensor of a packed batch reaches the
    device, and the step's stream owns it (the CPU suite runs the rest with stand-ins)."""
    from training.test_prefetch import host_batch

    from mmcse.training.prefetch import prefetched

    cuda = torch.device("cuda")
    ((_, batch, _),) = prefetched(["x"], lambda item: host_batch(), cuda)
    assert {t.device.type for t in batch.tensors()} == {"cuda"}
    torch.testing.assert_close(batch.packed.input_ids.cpu(), host_batch().packed.input_ids)


def test_tf32_is_set_and_unset_on_the_device():
    from mmcse.training.config import TrainConfig
    from mmcse.training.fastpath import set_matmul_precision

    try:
        set_matmul_precision(TrainConfig(tf32=True), torch.device("cuda"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        x = torch.randn(64, 64, device="cuda")
        torch.testing.assert_close(x @ x, (x.double() @ x.double()).float(), rtol=1e-2, atol=1e-1)
    finally:
        set_matmul_precision(TrainConfig(tf32=False), torch.device("cuda"))
    assert not torch.backends.cuda.matmul.allow_tf32


def test_the_cuda_random_state_survives_a_checkpoint():
    from mmcse.training.checkpoint import rng_states, set_rng_states

    saved = rng_states()
    want = torch.rand(3, device="cuda")
    set_rng_states(saved)
    assert torch.equal(torch.rand(3, device="cuda"), want)
