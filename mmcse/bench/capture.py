"""``mmcse bench all --sections capture``: every method's training steps as Dynamo sees them.

Whole-update capture (:mod:`mmcse.training.fastpath`) needs each batch kind's step to be one
graph with no break. Per method this reports, from the real trainer on the bench's caption
batches (every term active; :mod:`mmcse.bench.train_step`), with nothing timed or compiled:

* ``eager_ops``: what one eager step dispatches outside the optimizer, counted by the profiler
  (leaf ATen operators; :func:`~mmcse.bench.train_step.count_ops`; deterministic, so it compares
  on any machine): the host work a launch-bound eager step pays per step;
* ``graphs`` / ``breaks``: ``torch._dynamo.explain`` of the student's step per batch kind (text,
  caption) and, for VisualCSE/AudioCSE, of the auxiliary image/audio step;

and, once, the operator calls of an update left outside a graph (:func:`update_ops`). The
``train`` section times every method eager and captured, with its compile seconds, operators
outside the graphs and host reads (:func:`mmcse.bench.train_step.bench_methods`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch._dynamo

from mmcse.bench.timing import quiet_profile
from mmcse.bench.train_step import (
    BenchState,
    BenchWorld,
    count_ops,
)


def explain(fn, *args) -> dict:
    """``torch._dynamo.explain`` of ``fn(*args)``: graphs, breaks and the first line of each
    break's reason."""
    torch._dynamo.reset()
    result = torch._dynamo.explain(fn)(*args)
    reasons = [str(b.reason).strip().splitlines()[0] for b in result.break_reasons]
    return {"graphs": result.graph_count, "breaks": result.graph_break_count, "reasons": reasons}


def explain_steps(run) -> dict[str, dict]:
    """:func:`explain` of the student's step on a caption and a text batch (the same rows,
    text roles only), and of the auxiliary step if the method has one."""
    kind, rows = run.data.batch_order(0, run.run_plan.global_batch)[0]
    run.student.train()
    out = {}
    for as_kind in ("caption", "text"):
        batch = run.data.batch(kind, rows, run.device)
        if as_kind == "text":
            text_roles = set(run.data.roles_for("text"))
            features = {r: v for r, v in batch.features.items() if r in text_roles}
            batch = dataclasses.replace(batch, kind="text", features=features)
        out[as_kind] = explain(
            run.student, batch, run.method.batch_inputs(run.data, batch).apply_to(batch)
        )
    if run.aux is not None:
        views, labels = run.aux.batch(0)
        run.aux.step_forward.train()
        out[run.aux.settings.modality] = explain(run.aux.step_forward, views, labels)
    return out


def describe_steps(
    world: BenchWorld, names: list[str], batch: int, seq_len: int, device: str
) -> dict[str, dict]:
    """Per method, nothing timed or compiled: its eager step's operators (after a first step,
    so AdamW's state exists) and the graphs/breaks of its steps."""
    reports = {}
    for name in names:
        torch._dynamo.reset()
        state = BenchState.of(
            world, name, batch, seq_len, device, "auto", capture="off", dynamic_padding=False
        )
        state.step()
        reports[name] = {"eager_ops": count_ops(state), "explain": explain_steps(state.trainer)}
    torch._dynamo.reset()
    return reports


def is_outermost_aten(event) -> bool:
    parent = event.cpu_parent
    return event.name.startswith("aten::") and (
        parent is None or not parent.name.startswith("aten::")
    )


def update_ops(module: torch.nn.Module) -> dict[str, int]:
    """Operator calls of the update that stays outside the captured graph, over ``module``'s
    parameters: gradient clipping and AdamW, per parameter (CPU's default) and multi-tensor
    (``foreach``, CUDA's default), and AdamW's ``fused`` kernel (the trainer's on CUDA).

    Counted are the outermost ``aten::`` calls (what the host dispatches): on a CPU a
    multi-tensor op then runs per tensor inside that call, which is not what it does on a GPU,
    so the leaf count would say nothing about CUDA here."""
    from torch.profiler import ProfilerActivity

    params = [torch.nn.Parameter(p.detach().clone()) for p in module.parameters()]
    for p in params:
        p.grad = torch.ones_like(p)

    def ops(work) -> int:
        with quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
            work()
        return sum(1 for e in prof.events() if is_outermost_aten(e))

    clip = torch.nn.utils.clip_grad_norm_
    counts = {
        "parameters": len(params),
        "clip_per_parameter": ops(lambda: clip(params, 1.0, foreach=False)),
        "clip_foreach": ops(lambda: clip(params, 1.0, foreach=True)),
    }
    for name, kwargs in (("per_parameter", {"foreach": False}), ("foreach", {"foreach": True}),
                         ("fused", {"fused": True})):  # fmt: skip
        optimizer = torch.optim.AdamW(params, lr=1e-5, **kwargs)
        optimizer.step()  # the state exists from the second step on
        counts[f"adamw_{name}"] = ops(optimizer.step)
    return counts
