"""The optimizer step as the released runs took it (issue 31), against the released loop written
out here — not against mmcse's own code:

* ``zero_grad``: torch 1.7.1's ``Optimizer.zero_grad()`` (MCSE/KDMCSE/DALR's ``train_mix.py``
  through accelerate 0.3.0, which passes ``set_to_none=None``) *zeroes* every gradient that
  exists; a parameter whose gradient was never written keeps ``None``;
* ``transformers.AdamW`` (4.2.1 = 4.5.0 = 4.8.2 in ``step``): skips only ``grad is None``; per
  parameter ``step += 1``, ``m = β₁m + (1 − β₁)g``, ``v = β₂v + (1 − β₂)g²``, ``p −= lr·√(1 −
  β₂ᵗ)/(1 − β₁ᵗ)·m/(√v + ε)``, then the decay ``p −= lr·λ·p`` after the update, λ per group (the
  released groups: 0 for names containing ``bias``/``LayerNorm.weight``);
* ``clip_grad_norm_`` (torch 1.7.1): the 2-norm of the per-tensor norms of the gradients that
  exist, scaled by ``max/(norm + 1e-6)`` when that is below 1;
* ``GradScaler`` (torch 1.7.1/1.10, the HF-Trainer runs' ``--fp16``): the loss times the scale;
  ``unscale_`` divides and flags a non-finite gradient; ``step`` skips ``optimizer.step()`` when
  flagged; ``update`` halves the scale then (and doubles it after ``growth_interval`` clean
  steps); the released loops step the lr schedule either way.

Over text and caption batches of a toy student whose head only caption batches reach (MCSE's
grounding head, KDMCSE's and DALR's caption-only heads), in float64, for the eager update and the
captured update's arithmetic (its function run uncompiled, and compiled with ``aot_eager``),
parameters *and* AdamW's moments and step counts are compared.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn

from mmcse.training.adamw import AdamWSettings, FlatParameters, adamw_groups, decay_exempt
from mmcse.training.lr import linear_factor, linear_factor_tensor
from mmcse.training.update import CapturedUpdate, EagerUpdate, Forward, WholeUpdateSettings

LR, EPS, WD, MAX_NORM = 1e-2, 1e-3, 0.1, 1.0
BETAS = (0.9, 0.999)
#: text (t) and caption (c) batches: the head is first reached at the second step
KINDS = "tcttct"


class ToyEncoder(nn.Module):
    """A dense layer and a LayerNorm, named as in HF's BERT (the released groups match names)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.LayerNorm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x))


class ToyStudent(nn.Module):
    """An encoder every batch reaches and a head only caption batches reach."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = ToyEncoder()
        self.head = nn.Linear(4, 3)
        self.double()

    def forward(self, x: torch.Tensor, caption: bool) -> dict[str, torch.Tensor]:
        z = self.encoder(x)
        terms = {"text": (z.tanh() - 0.3).square().mean()}
        if caption:
            terms["caption"] = (self.head(z) - 1.0).square().mean()
        terms["loss"] = sum(terms.values())
        return terms


def batches(kinds: str = KINDS, overflow_at: int | None = None):
    gen = torch.Generator().manual_seed(1)
    out = []
    for index, kind in enumerate(kinds):
        x = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        if index == overflow_at:
            x[0, 0] = math.inf  # an fp16-style overflow: the scaled gradient is not finite
        out.append((x, kind == "c"))
    return out


# ---- the released loop, written out ------------------------------------------------------------


def released_decay_groups(model: nn.Module) -> dict[str, float]:
    """MCSE's ``train_mix.py`` groups: λ = 0 where the name contains a ``no_decay`` entry."""
    no_decay = ["bias", "LayerNorm.bias", "LayerNorm.weight"]
    return {n: 0.0 if any(nd in n for nd in no_decay) else WD for n, _ in model.named_parameters()}


class ReleasedLoop:
    """torch 1.7.1 zero_grad/clip/GradScaler + transformers.AdamW 4.8.2, per parameter."""

    def __init__(self, model: nn.Module, total: int, scale: float | None = None) -> None:
        self.model, self.total, self.scale = model, total, scale
        self.decay = released_decay_groups(model)
        self.state: dict[str, dict] = {}
        self.steps_done = 0  # the scheduler's count (stepped after skipped steps too)

    def step(self, x: torch.Tensor, caption: bool) -> None:
        model = self.model
        loss = model(x, caption)["loss"]
        # backward accumulates into the (zeroed) gradients that exist
        (loss * (self.scale or 1.0)).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        found_inf = False
        if self.scale is not None:  # scaler.unscale_
            for g in grads.values():
                g.mul_(1.0 / self.scale)
                found_inf |= not bool(torch.isfinite(g).all())
        norm = math.sqrt(sum(float(g.norm()) ** 2 for g in grads.values()))
        coef = MAX_NORM / (norm + 1e-6)
        if coef < 1:
            for g in grads.values():
                g.mul_(coef)
        lr = LR * (self.total - self.steps_done) / self.total  # linear, no warm-up
        if not found_inf:
            self._adamw(grads, lr)
        if self.scale is not None and found_inf:  # scaler.update: back off
            self.scale *= 0.5
        self.steps_done += 1  # lr_scheduler.step()
        for g in grads.values():  # optimizer.zero_grad(): zeroed, not None
            g.zero_()

    @torch.no_grad()
    def _adamw(self, grads: dict[str, torch.Tensor], lr: float) -> None:
        params = dict(self.model.named_parameters())
        beta1, beta2 = BETAS
        for name, g in grads.items():
            p = params[name]
            s = self.state.setdefault(
                name, {"step": 0, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            )
            s["step"] += 1
            s["exp_avg"] = beta1 * s["exp_avg"] + (1 - beta1) * g
            s["exp_avg_sq"] = beta2 * s["exp_avg_sq"] + (1 - beta2) * g * g
            step_size = lr * math.sqrt(1 - beta2 ** s["step"]) / (1 - beta1 ** s["step"])
            p -= step_size * s["exp_avg"] / (s["exp_avg_sq"].sqrt() + EPS)
            p -= lr * self.decay[name] * p  # "Add weight decay at the end"


def run_released(kinds: str = KINDS, overflow_at: int | None = None, scale=None) -> ReleasedLoop:
    loop = ReleasedLoop(ToyStudent(), len(kinds), scale)
    for x, caption in batches(kinds, overflow_at):
        loop.step(x, caption)
    return loop


# ---- mmcse's updates ------------------------------------------------------------------------


def settings(**kw) -> AdamWSettings:
    values = dict(lr=LR, weight_decay=WD, eps=EPS, betas=BETAS, max_grad_norm=MAX_NORM)
    values.update(kw)
    return AdamWSettings(**values)


def run_eager(kinds: str = KINDS, overflow_at=None, scaler=None, fused=None, **kw):
    model = ToyStudent()
    groups = adamw_groups([model.encoder, model.head])
    schedule = lambda step: linear_factor(step, 0, len(kinds))  # noqa: E731
    forward = Forward(model, lambda terms: terms["loss"], contextlib.nullcontext)
    update = EagerUpdate(
        groups,
        settings(**kw),
        schedule,
        forward,
        fused=fused,
        scaler=scaler,
        exempt=decay_exempt(model),
    )
    for x, caption in batches(kinds, overflow_at):  # the one interface, as the trainer calls it
        update.step("caption" if caption else "text", (x, caption))
    return model, update


def run_captured(kinds: str = KINDS, compile_fn=lambda f: f, **kw):
    model = ToyStudent()
    groups = adamw_groups([model.encoder, model.head])
    flat = FlatParameters(groups)
    total = len(kinds)
    update = CapturedUpdate(
        WholeUpdateSettings(flat, compile_fn),
        Forward(model, lambda terms: terms["loss"], contextlib.nullcontext),
        groups,
        settings(**kw),
        lr_factor=lambda step: linear_factor_tensor(step, 0, total),
        host_factor=lambda step: linear_factor(step, 0, total),
    )
    for x, caption in batches(kinds):
        update.step("caption" if caption else "text", (x, caption))
    return model, update


def assert_equals_released(
    model: nn.Module, update, released: ReleasedLoop, rtol: float, atol: float = 1e-12,
    moment_rtol: float | None = None,
):  # fmt: skip
    """Parameters, moments and step counts of mmcse's update against the written-out loop."""
    names = [n for n, _ in model.named_parameters()]
    want_params = dict(released.model.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, want_params[name], rtol=rtol, atol=atol, msg=name)
    state = update.state_dict()["optimizer"]["state"]
    order = [n for group in adamw_groups([model.encoder, model.head]) for n in group]
    index_of = {id(p): i for i, p in enumerate(order)}
    by_name = {n: state.get(index_of[id(p)]) for n, p in model.named_parameters()}
    assert {n for n in names if by_name[n] is not None} == set(released.state)
    for name, want in released.state.items():
        got = by_name[name]
        assert int(got["step"]) == want["step"], name
        for moment in ("exp_avg", "exp_avg_sq"):
            tol = moment_rtol or rtol  # relative to the moment's largest entry
            torch.testing.assert_close(
                got[moment].to(want[moment]),
                want[moment],
                rtol=tol,
                atol=tol * float(want[moment].abs().max()),
                msg=name,
            )


# ---- point 1: heads used only on caption batches ---------------------------------------------


def test_eager_zeros_steps_caption_only_heads_as_the_released_loop():
    released = run_released()
    model, update = run_eager(zero_grad="zeros")
    assert_equals_released(model, update, released, rtol=1e-10)
    # the head first stepped at the caption batch (step 2), then on every batch: 5 steps
    assert released.state["head.weight"]["step"] == len(KINDS) - 1


def test_eager_none_leaves_the_head_alone_on_text_batches():
    """The other reading (torch ≥ 2's default): the head steps on caption batches only, so it
    ends elsewhere than the released loop's."""
    released = run_released()
    model, update = run_eager(zero_grad="none")
    head_steps = [int(s["step"]) for i, s in update.state_dict()["optimizer"]["state"].items()
                  if i >= 4]  # fmt: skip
    assert head_steps == [KINDS.count("c")] * 2
    assert (model.head.weight - released.model.head.weight).abs().max() > 1e-4


@pytest.mark.parametrize("compiled", [False, True], ids=["function", "aot_eager"])
def test_captured_zeros_steps_caption_only_heads_as_the_released_loop(compiled):
    compile_fn = (lambda f: torch.compile(f, backend="aot_eager")) if compiled else (lambda f: f)
    if compiled:
        torch._dynamo.reset()
    released = run_released()
    model, update = run_captured(zero_grad="zeros", compile_fn=compile_fn)
    # the captured update's step counts and bias corrections are fp32 device tensors: √(1 − β₂ᵗ)
    # is off by ~3e-5 relative at t = 1, so each update (~lr = 1e-2) by ~3e-7
    # (and the gradients that follow from those parameters, hence the moments, by ~1e-5)
    assert_equals_released(model, update, released, rtol=1e-6, atol=2e-6, moment_rtol=1e-4)


def test_captured_none_skips_the_head_on_text_batches():
    model, update = run_captured(zero_grad="none")
    eager_model, _ = run_eager(zero_grad="none")
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=2e-6, msg=name)


def test_zero_grad_zeros_survives_a_resume():
    """A resumed run keeps stepping the head on text batches (it had a gradient before)."""
    model, update = run_eager("tc", zero_grad="zeros")
    state = update.state_dict()
    resumed_model = ToyStudent()
    resumed_model.load_state_dict(model.state_dict())
    groups = adamw_groups([resumed_model.encoder, resumed_model.head])
    forward = Forward(resumed_model, lambda terms: terms["loss"], contextlib.nullcontext)
    resumed = EagerUpdate(groups, settings(zero_grad="zeros"), lambda s: 1.0, forward)
    resumed.load_state_dict(state)
    x, _ = batches("t")[0]
    resumed.step("text", (x, False))
    head_state = resumed.optimizer.state[resumed_model.head.weight]
    assert int(head_state["step"]) == 2  # the caption step, then this text step


# ---- point 2: transformers' ε counts the steps AdamW took, not those the scaler skipped -----

SCALE = 256.0


# fused: GradScaler calls a fused AdamW's step even on an overflow, telling it by ``found_inf``
@pytest.mark.parametrize("fused", [None, True], ids=["foreach", "fused"])
def test_a_step_the_scaler_skips_is_not_counted_in_eps(fused):
    """fp16 (the VisualCSE/AudioCSE recipes): the second batch overflows; the scaler skips that
    step (no AdamW step: transformers.AdamW's per-parameter count stays), backs the scale off,
    and the lr schedule moves on, as the released HF-Trainer loop. ε's scaling must then use
    t = 1, 2, 3 for the three steps taken."""
    kinds, overflow_at = "tttt", 1
    released = run_released(kinds, overflow_at, scale=SCALE)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1000)
    model, update = run_eager(kinds, overflow_at, scaler=scaler, fused=fused, zero_grad="zeros")
    assert released.scale == SCALE / 2 and scaler.get_scale() == SCALE / 2
    assert update.optimizer.group_steps == [
        3,
        0,
    ]  # the encoder's 3 steps; the head never had a gradient
    assert_equals_released(model, update, released, rtol=1e-10)


def test_hooks_on_the_eager_optimizer_run_once_a_step():
    """EagerAdamW's work runs in its own step hooks, not in an override of ``step()``: an
    override calling torch's would run torch's hook wrapper twice (every hook twice) once any
    plain AdamW exists in the process."""
    torch.optim.AdamW([nn.Parameter(torch.zeros(1))])  # torch wraps AdamW.step for its hooks
    model = ToyStudent()
    forward = Forward(model, lambda terms: terms["loss"], contextlib.nullcontext)
    groups = adamw_groups([model.encoder, model.head])
    update = EagerUpdate(groups, settings(), lambda step: 1.0, forward)
    calls = []
    update.optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    update.optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    for x, caption in batches("tc"):
        update.step("caption" if caption else "text", (x, caption))
    assert calls == ["pre", "post"] * 2


# ---- under DDP (gloo, 2 ranks): the zeroed gradients of idle heads survive the all-reduce -----


def head_steps(run_dir) -> dict[int, int]:
    """Step counts per optimizer index in ``last/`` (the heads are the groups after the
    encoder's)."""
    from mmcse.training.checkpoint import load_trainer_state

    state = load_trainer_state(run_dir)["optimizer"]["state"]
    return {int(i): int(entry["step"]) for i, entry in state.items()}


@pytest.mark.slow  # two spawned ranks: ~90 s on 2 busy cores
def test_zero_grad_zeros_under_ddp_steps_the_grounding_head_on_text_batches(
    tiny_model, tiny_world, tmp_path
):
    from training.test_loop import _ddp_worker, _free_port, config

    from mmcse.training.loop import train

    kw = dict(method="mcse", dropout=0.0, max_steps=4, mixing="interleave", zero_grad="zeros")
    ddp = config(tiny_model, tiny_world, tmp_path / "ddp", batch_size=8, **kw)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), ddp), nprocs=2, join=True)
    single = train(config(tiny_model, tiny_world, tmp_path / "one", batch_size=16, **kw))
    none = train(
        config(
            tiny_model, tiny_world, tmp_path / "none", batch_size=16, **{**kw, "zero_grad": "none"}
        )
    )
    got, want = head_steps(tmp_path / "ddp" / "run"), head_steps(single.output_dir)
    assert got == want
    # the first batch is a caption batch: under zeros every parameter steps at all 4 steps;
    # under none the grounding head steps on caption batches only
    assert set(got.values()) == {4}
    assert min(head_steps(none.output_dir).values()) < 4


# ---- point 4: weight decay as transformers.AdamW, biases and LayerNorm weights spared --------


def test_torch_decay_style_is_the_other_reading():
    """``weight_decay_style=torch``: every parameter, before the update — not the release's."""
    released = run_released()
    model, _ = run_eager(zero_grad="zeros", decay_style="torch")
    norms = model.encoder.LayerNorm.weight
    assert (norms - released.model.encoder.LayerNorm.weight).abs().max() > 1e-5
    # with λ = 0 the two styles are one update
    a, _ = run_eager(zero_grad="zeros", decay_style="torch", weight_decay=0.0)
    b, _ = run_eager(zero_grad="zeros", weight_decay=0.0)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_decay_exemptions_are_the_released_groups_on_bert(tiny_model):
    """On a BERT student with mmcse's heads: the spared set equals MCSE's ``train_mix.py`` rule
    (``bias``/``LayerNorm.bias``/``LayerNorm.weight`` in the name) and the HF Trainer 4.5 rule
    (every LayerNorm parameter, every name with ``bias``)."""
    from transformers import AutoModel

    student = nn.Module()
    student.encoder = AutoModel.from_pretrained(tiny_model)
    student.head = nn.Sequential(nn.Linear(32, 8), nn.Tanh())
    named = dict(student.named_parameters())
    released = {n for n in named if released_decay_groups(student)[n] == 0.0}
    layer_norms = {
        f"{m}.{n}" for m, mod in student.named_modules() if isinstance(mod, nn.LayerNorm)
        for n, _ in mod.named_parameters(recurse=False)
    }  # fmt: skip
    trainer_45 = layer_norms | {n for n in named if "bias" in n}
    exempt = {n for n, p in named.items() if id(p) in decay_exempt(student)}
    assert exempt == released == trainer_45
    assert any("LayerNorm.weight" in n for n in exempt) and "head.0.weight" not in exempt


# ---- the recipes follow the releases; mmcse train keeps its own defaults ----------------------


def test_every_recipe_steps_and_evaluates_as_its_release():
    from mmcse.recipes import RECIPES, get_recipe
    from mmcse.training.config import TrainConfig

    for name in RECIPES.names():
        recipe = get_recipe(name)
        cfg = recipe.config("cache", seed=recipe.seeds[0], output_dir="o")
        assert cfg.zero_grad == "zeros", name
        assert cfg.weight_decay_style == "transformers", name
        assert cfg.eval_precision == "fp32", name
    default = TrainConfig()
    assert (default.zero_grad, default.weight_decay_style, default.eval_precision) == (
        "none",
        "transformers",
        "fp32",
    )
