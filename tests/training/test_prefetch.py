"""The prefetch's copy to a CUDA device, every line but the device calls run on the CPU.

The side-stream copy pins a host batch, copies it on its own stream and hands it over to the
step's stream, which must then own *every* tensor of the batch (the allocator would otherwise
reuse a packed batch's memory while the step still reads it). Here the CUDA calls are stand-ins
(``meta`` tensors for the device copy), so the hand-over of a packed batch, which only CUDA used
to reach, runs in the CPU suite; ``tests/training/test_cuda.py`` runs the real adapter.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
import torch
from torch import Tensor

from mmcse.packing import pack_tokens
from mmcse.training.data import Batch
from mmcse.training.prefetch import SideStreamCopy, prefetched

META = torch.device("meta")


def host_batch(packed: bool = True, kind: str = "text") -> Batch:
    lengths = torch.tensor([5, 3, 7, 2])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).long()
    ids = torch.arange(1, 29).view(4, 7) * mask
    batch = Batch(
        kind,
        np.arange(4),
        ids,
        mask,
        features={"image": torch.randn(4, 6)},
        extras={"spans": torch.zeros(4, 2, dtype=torch.long)},
    )
    if packed:
        batch.packed = pack_tokens(ids, mask, width=8, pad_id=0, copies=2)
    return batch


def test_a_batch_walks_every_tensor_it_holds():
    """``tensors``/``map`` cover each tensor field (a field added later without them fails)."""
    batch = host_batch()
    walked = {id(t) for t in batch.tensors()}
    held = [batch.input_ids, batch.attention_mask]
    held += [*batch.features.values(), *batch.extras.values(), *batch.packed.tensors()]
    assert walked == {id(t) for t in held}
    assert len(batch.packed.tensors()) == sum(
        isinstance(getattr(batch.packed, f.name), Tensor) for f in dataclasses.fields(batch.packed)
    )
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, Tensor):
            assert id(value) in walked, f.name
    doubled = batch.map(lambda t: t * 2)
    assert all(
        torch.equal(a * 2, b) for a, b in zip(batch.tensors(), doubled.tensors(), strict=True)
    )
    assert doubled.kind == batch.kind and doubled.rows is batch.rows


class FakeCudaStreams:
    """A stand-in of :class:`mmcse.training.prefetch.CudaStreams` that records what it was asked."""

    def __init__(self):
        self.pinned: list[Tensor] = []
        self.kept: list[tuple[Tensor, str]] = []
        self.waited: list[str] = []

    def copying(self):
        return contextlib.nullcontext()

    def copied(self):
        return "copy-event"

    def wait(self, done):
        self.waited.append(done)
        return "current-stream"

    def pin(self, tensor):
        self.pinned.append(tensor)
        return tensor

    def keep(self, tensor, stream):
        self.kept.append((tensor, stream))


@pytest.mark.parametrize("packed", [True, False])
def test_the_step_stream_owns_every_tensor_of_a_copied_batch(packed):
    streams = FakeCudaStreams()
    copy = SideStreamCopy(META, streams)
    batch = host_batch(packed)
    moved, done = copy(batch)
    assert len(streams.pinned) == len(batch.tensors())  # every host tensor pinned
    assert all(t.device == META for t in moved.tensors())
    handed = copy.hand_over(moved, done)
    assert streams.waited == ["copy-event"]
    assert [id(t) for t, _ in streams.kept] == [id(t) for t in handed.tensors()]
    assert {stream for _, stream in streams.kept} == {"current-stream"}
    assert (handed.packed is not None) == packed


def test_prefetched_hands_over_each_batch_in_order():
    streams = FakeCudaStreams()
    items = ["a", "b", "c"]
    seen = []
    for item, batch, waited in prefetched(
        items, lambda item: host_batch(kind=item), META, SideStreamCopy(META, streams)
    ):
        seen.append((item, batch.kind))
        assert batch.packed.input_ids.device == META and waited >= 0
    assert seen == [(i, i) for i in items]
    assert streams.waited == ["copy-event"] * 3
    assert len(streams.kept) == 3 * len(host_batch().tensors())


def test_prefetched_copies_to_a_device_without_streams():
    """A device with no side stream (MPS; ``meta`` here) still gets its batches on it."""
    ((_, batch, _),) = prefetched(["x"], lambda item: host_batch(), META)
    assert {t.device for t in batch.tensors()} == {META}


def test_the_packed_hand_over_runs_through_torch_cuda(monkeypatch):
    """The default adapter with torch's CUDA calls stood in for: the hand-over of a packed
    batch (which called a method ``PackedTokens`` does not have) keeps each tensor alive."""
    kept = []

    class Stream:
        def wait_event(self, event):
            self.waited = event

    class Event:
        def record(self, stream):
            self.stream = stream

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", lambda: Event())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: kept.append(self))
    copy = SideStreamCopy(META)
    moved = copy.hand_over(*copy(host_batch()))
    assert len(kept) == len(host_batch().tensors()) and kept[-1].device == META
    assert moved.packed.cu_seqlens.device == META
