"""Whole-step capture (:mod:`mmcse.training.fastpath`): every registered method's step is one graph
per batch kind, computes the eager step's loss and gradients, and recompiles a bounded number of
times over an epoch.

These tests compile with the ``aot_eager`` backend: what they check is the capture — Dynamo's
single graph, AOTAutograd's joint forward/backward — not inductor's code generation, which is the
same for every graph and takes minutes on a CPU. With ``aot_eager`` the captured step calls the
same ATen kernels in the same order as eager, dropout's draws included, so the comparison with
eager keeps dropout on.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch._dynamo
from support.runs import tiny_mcse_settings
from support.worlds import write_unpaired
from torch._dynamo.testing import CompileCounterWithBackend

import mmcse.methods  # noqa: F401  (registers every method)
from mmcse.methods import Method, build_method
from mmcse.model import SentenceEncoder
from mmcse.registry import METHODS
from mmcse.rundir import PLAN_FILE
from mmcse.training import fastpath
from mmcse.training.config import TrainConfig
from mmcse.training.data import Batch
from mmcse.training.loop import train
from mmcse.training.student import Student
from mmcse.training.update import CapturedUpdate
from mmcse.training.updates import auxiliary_update

B, L, P = 6, 12, 3
KINDS = ("text", "caption")
#: float32 tolerance of captured against eager: the same kernels, sums possibly reassociated
RTOL, ATOL = 1e-5, 1e-6


def step_inputs(method: Method, kind: str, vocab: int, dim: int) -> tuple[Batch, dict]:
    """A batch of ``kind`` padded to ``L`` with the features (``dim`` wide) and extras ``method``
    reads."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    ids = torch.randint(5, vocab, (B, L), generator=g) * mask
    roles = set(method.text_roles) | (set(method.caption_roles) if kind == "caption" else set())
    features = {
        role: torch.randn(B, P, dim, generator=g) if role == "object" else torch.randn(B, dim)
        for role in sorted(roles)
    }
    extras = {}
    if "object" in roles:  # MCSEO: phrase spans, one caption with a single pair (skipped)
        spans = torch.tensor([[1, 2], [2, 4], [-1, -1]]).repeat(B, 1, 1)
        spans[1, 1] = -1
        extras = {"phrase_spans": spans, "phrase_mask": spans[..., 0] >= 0}
    return Batch(kind, np.arange(B), ids, mask, features), extras


def build_student(name: str, model_dir) -> tuple[Student, Method]:
    method = build_method(name)
    roles = set(method.text_roles) | set(method.caption_roles)
    torch.manual_seed(0)  # the heads' init
    encoder = SentenceEncoder.from_pretrained(str(model_dir), dropout=0.1)
    # features as wide as the student: DALR's released ℓ_CMA compares the raw feature with [CLS]
    dim = encoder.backbone.config.hidden_size
    return Student(encoder, method, {role: dim for role in roles}).train(), method


def shape_of(student: Student) -> tuple[int, int]:
    """(vocabulary size, feature width) of the batches ``student`` reads."""
    config = student.encoder.backbone.config
    return config.vocab_size, config.hidden_size


def run_step(student: Student, batch: Batch, extras: dict) -> tuple[dict, dict]:
    student.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the dropout masks' draws
    terms = student(batch, extras)
    terms["loss"].backward()
    grads = {k: p.grad for k, p in student.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, grads


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_step_is_one_graph_per_batch_kind_with_the_eager_gradients(name, tiny_model):
    """One graph per batch kind, counted as ``torch._dynamo.explain`` counts them (graphs handed
    to the backend); ``fullgraph=True`` turns any graph break into an error that names it."""
    eager, method = build_student(name, tiny_model)
    captured, _ = build_student(name, tiny_model)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    captured.compile(backend=counter, dynamic=False, fullgraph=True)
    for graphs, kind in enumerate(KINDS, start=1):
        batch, extras = step_inputs(method, kind, *shape_of(eager))
        want_terms, want_grads = run_step(eager, batch, extras)
        got_terms, got_grads = run_step(captured, batch, extras)
        assert counter.frame_count == graphs, kind
        assert got_terms.keys() == want_terms.keys()
        for key in want_terms:
            torch.testing.assert_close(got_terms[key], want_terms[key], rtol=RTOL, atol=ATOL)
        assert got_grads.keys() == want_grads.keys()
        for key in want_grads:
            torch.testing.assert_close(got_grads[key], want_grads[key], rtol=RTOL, atol=ATOL)
        buffers = dict(captured.named_buffers())  # e.g. DALR's aligners' BatchNorm statistics
        for key, want in eager.named_buffers():
            torch.testing.assert_close(buffers[key], want, rtol=RTOL, atol=ATOL)
    run_step(captured, *step_inputs(method, "text", *shape_of(eager)))
    assert counter.frame_count == len(KINDS)  # a kind seen before: no recompile


def test_mcseo_step_explains_as_one_graph_per_batch_kind(tiny_model):
    """The object–phrase pairing was the one step with breaks (a branch on ``use.any()``,
    boolean indexing): ``torch._dynamo.explain`` itself finds none now."""
    student, method = build_student("mcseo", tiny_model)
    for kind in KINDS:
        batch, extras = step_inputs(method, kind, *shape_of(student))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(student)(batch, extras)
        reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), (kind, reasons)


# ---- the auxiliary VisualCSE/AudioCSE step ---------------------------------------------------

AUXILIARY = {"visualcse": ("image_tensor", {"image_batch_size": 4, "image_size": 32}),
             "audiocse": ("audio_fbank", {"audio_batch_size": 4, "audio_patch_size": 16})}  # fmt: skip


def auxiliary_cfg(name: str, examples) -> SimpleNamespace:
    kind, _ = AUXILIARY[name]
    return SimpleNamespace(
        features={kind: str(examples)}, seed=3, precision="auto", adam_eps=1e-8,
        adam_eps_style="transformers", weight_decay_style="transformers", zero_grad="none",
    )  # fmt: skip


def auxiliary_task(name: str, model_dir, examples):
    method = build_method(name, **AUXILIARY[name][1])
    encoder = SentenceEncoder.from_pretrained(str(model_dir))
    torch.manual_seed(0)  # the task's heads
    return method.auxiliary_task(encoder, auxiliary_cfg(name, examples), "cpu")


def auxiliary_forward(task) -> tuple[dict, dict]:
    views, labels = task.batch(0)
    task.step_forward.train()  # as the update sets it
    torch.manual_seed(1)
    terms = task.step_forward(views, labels)
    sum(terms.values()).backward()
    grads = {k: p.grad for k, p in task.step_forward.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in terms.items()}, grads


@pytest.mark.parametrize("name", sorted(AUXILIARY))
def test_auxiliary_step_is_one_graph_with_the_eager_gradients(name, tiny_model, tmp_path):
    """The image (audio) step's forward — patch embedding, the encoder's layers, head, SupCon —
    is captured too; the view augmentation before it stays eager."""
    examples = tmp_path / "examples"
    write_unpaired(AUXILIARY[name][0], examples)
    eager, captured = (auxiliary_task(name, tiny_model, examples) for _ in range(2))
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    captured.capture(lambda module: module.compile(backend=counter, dynamic=False, fullgraph=True))
    (want_terms, want_grads), (got_terms, got_grads) = map(auxiliary_forward, (eager, captured))
    assert got_terms.keys() == want_terms.keys() and got_grads.keys() == want_grads.keys()
    for key in want_terms:
        torch.testing.assert_close(got_terms[key], want_terms[key], rtol=RTOL, atol=ATOL)
    for key in want_grads:
        torch.testing.assert_close(got_grads[key], want_grads[key], rtol=RTOL, atol=ATOL)
    update = auxiliary_update(captured, auxiliary_cfg(name, examples), "cpu")  # forward compiled
    parts = [update.step()[0] for _ in range(3)]  # 12 examples, batch 4: a new epoch's order
    assert all(torch.isfinite(values).all() for _, values in parts)
    assert counter.frame_count == 1
    assert not update.scaler.is_enabled()  # fp32 on a CPU: a scaler that passes through
    # what `mmcse bench` reports: explain finds no break (torch.unique once made three)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(eager.step_forward)(*eager.batch(0))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


# ---- the training loop -----------------------------------------------------------------------


def losses_of(run_dir) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def train_eager_and(capture: str, tiny_model, tiny_world, tmp_path, monkeypatch, **settings):
    """Train the tiny MCSE run eagerly and with ``capture``, compiling with a counting
    ``aot_eager`` backend: (the counter, {capture: run dir})."""
    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setitem(fastpath.CAPTURE_COMPILE, "cpu", {"backend": counter})
    torch._dynamo.reset()
    runs = {}
    for each in ("off", capture):
        config = tiny_mcse_settings(
            tiny_model, tiny_world, tmp_path / each, batch_size=10, max_seq_length=16,
            capture=each, dynamic_padding=False, eval_steps=100, log_every=1, **settings,
        )  # fmt: skip
        runs[each] = train(TrainConfig(**config)).output_dir
    return counter, runs


def test_two_epochs_compile_one_graph_per_batch_kind_and_size_and_train_as_eager(
    tiny_model, tiny_world, tmp_path, monkeypatch
):
    """Text 96 = 9 × 10 + 6 sentences, captions 64 = 6 × 10 + 4: each kind has full batches and
    a last partial one, so two epochs compile four graphs, and no more. Dropout is on; with
    ``aot_eager`` the captured run draws the eager run's masks, so its losses are eager's."""
    counter, runs = train_eager_and("on", tiny_model, tiny_world, tmp_path, monkeypatch, epochs=2)
    assert counter.frame_count == 4
    eager, captured = losses_of(runs["off"]), losses_of(runs["on"])
    assert len(captured) == 2 * (10 + 7)
    np.testing.assert_allclose(captured, eager, rtol=1e-5)
    plan = json.loads((runs["on"] / PLAN_FILE).read_text())
    assert plan["capture"].startswith("on: the whole update (forward, backward, clipping")
    assert json.loads((runs["off"] / PLAN_FILE).read_text())["capture"].startswith("off")


def test_forward_capture_compiles_the_student_and_trains_as_eager(
    tiny_model, tiny_world, tmp_path, monkeypatch
):
    """``--capture forward`` (what DDP and fp16 runs get): the student's forward/backward is
    compiled in place and the update stays eager; with ``aot_eager`` the losses are eager's."""
    counter, runs = train_eager_and(
        "forward", tiny_model, tiny_world, tmp_path, monkeypatch, max_steps=4
    )
    assert counter.frame_count >= 1  # the student's call went through the compiler
    np.testing.assert_allclose(losses_of(runs["forward"]), losses_of(runs["off"]), rtol=1e-5)
    plan = json.loads((runs["forward"] / PLAN_FILE).read_text())
    assert plan["capture"].startswith("on: forward and backward, the update eager as one")


def test_capture_pads_batches_to_max_length_and_auto_stays_eager_on_cpu(tiny_model, tiny_world):
    from mmcse.training.loop import Trainer

    settings = tiny_mcse_settings(tiny_model, tiny_world, "unused", max_seq_length=16)
    assert not fastpath.capture_enabled(TrainConfig(**settings), torch.device("cpu"))
    assert fastpath.capture_enabled(TrainConfig(**settings), torch.device("cuda"))
    assert not fastpath.capture_enabled(
        TrainConfig(**settings, capture="off"), torch.device("cuda")
    )
    run = Trainer(TrainConfig(**settings, capture="on")).setup()
    assert run.capture == "whole" and not run.cfg.dynamic_padding  # recorded so in config.json
    assert isinstance(run.updates.text, CapturedUpdate)
    assert run.data.batch("text", np.arange(4), torch.device("cpu")).input_ids.shape == (4, 16)
    assert Trainer(TrainConfig(**settings)).setup().capture == "off"


def test_the_run_config_is_resolved_once_before_anything_is_built(tiny_model, tiny_world):
    """Pooler, attention, packing, capture, padding and precision are decided by one function, from the config,
    the method and the device: the trainer, its record and the bench read what it returns."""
    from mmcse.methods import build_method
    from mmcse.training.resolved import resolve_run_config

    settings = tiny_mcse_settings(tiny_model, tiny_world, "unused", max_seq_length=16)
    cfg = TrainConfig(**{**settings, "pooler": "auto", "dynamic_padding": True})
    cpu, mcse = torch.device("cpu"), build_method("mcse")
    captured, resolved = resolve_run_config(
        dataclasses.replace(cfg, capture="on"), mcse, cpu, False
    )
    assert resolved.capture == "whole" and not captured.dynamic_padding  # one shape per kind
    assert captured.pooler != "auto" and resolved.pooler_source and resolved.precision == "fp32"
    eager, resolved = resolve_run_config(cfg, mcse, cpu, False)  # capture auto: eager on CPU
    assert resolved.capture == "off" and eager.dynamic_padding
    # nothing else changed but what setup resolves from the student and the device
    resolved_too = {"attn_implementation": "sdpa", "packing": True}  # BERT on a CPU
    assert eager == dataclasses.replace(cfg, pooler=captured.pooler, **resolved_too)
    _, under_ddp = resolve_run_config(dataclasses.replace(cfg, capture="on"), mcse, cpu, True)
    assert under_ddp.capture == "forward"
