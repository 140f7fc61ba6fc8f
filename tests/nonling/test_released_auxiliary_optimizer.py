"""VisualCSE/AudioCSE's image (audio) optimizer as the released trainer ran it (issue 41), against
that loop written out here — not against mmcse's own code.

``VisualCSE/src/trainers.py`` (yiren-jian/NonLing-CSE; ``AudioCSE`` the same): the image
optimizer is ``transformers.AdamW`` over ``self.model.named_parameters()`` — every parameter of
the model, the text MLP and the image modules included — in two groups (λ =
``image_weight_decay`` but 0 for names containing ``bias``/``LayerNorm.weight``), at
``get_cosine_schedule_with_warmup`` (no warm-up here); each step is ``model.zero_grad()`` (torch
1.10: zeroes every gradient that exists), the image loss's backward, ``clip_grad_norm_`` over
``model.parameters()``, ``image_optimizer.step()``, the schedule, ``model.zero_grad()``; then the
HF Trainer's text step. A parameter the image loss does not reach (the word embeddings, the text
MLP) has a zero gradient once a text step has written one, and transformers.AdamW (which skips
only ``None``) steps it: moments 0, so only the decay moves it.

mmcse's auxiliary update (``image_optimizer_scope="model"`` with ``zero_grad="zeros"``, the
recipes' defaults) must give the same parameters at λ > 0; ``"task"`` (the encoder and the
task's heads) must differ there and agree at λ = 0.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mmcse.nonling.task import IMAGE_KIND, NonLinguisticSettings
from mmcse.training.adamw import AdamWSettings, adamw_groups, decay_exempt
from mmcse.training.update import EagerUpdate, Forward
from mmcse.training.updates import auxiliary_update

TEXT_LR, IMAGE_LR, EPS, MAX_NORM, STEPS = 1e-2, 3e-2, 1e-3, 1.0, 5
BETAS = (0.9, 0.999)


class ToyModel(nn.Module):
    """An encoder with word embeddings only text reaches, a text MLP only text reaches and image
    modules only images reach, named as in the released model."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.ModuleDict(
            {
                "word_embeddings": nn.Linear(3, 4, bias=False),
                "dense": nn.Linear(4, 4),
                "LayerNorm": nn.LayerNorm(4),
            }
        )
        self.mlp = nn.Linear(4, 4)
        self.image = nn.ModuleDict({"patch": nn.Linear(5, 4), "head": nn.Linear(4, 2)})
        self.double()

    def body(self, h: torch.Tensor) -> torch.Tensor:
        return self.encoder["LayerNorm"](self.encoder["dense"](h))

    def text_loss(self, x: torch.Tensor) -> torch.Tensor:
        z = self.mlp(self.body(self.encoder["word_embeddings"](x))).tanh()
        return (z - 0.2).square().mean()

    def image_loss(self, x: torch.Tensor) -> torch.Tensor:
        z = self.image["head"](self.body(self.image["patch"](x)))
        return (z - 1.0).square().mean()


def data():
    gen = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(6, 3, generator=gen, dtype=torch.float64),
            torch.randn(6, 5, generator=gen, dtype=torch.float64),
        )
        for _ in range(STEPS)
    ]


def cosine(step: int) -> float:
    return 0.5 * (1 + math.cos(math.pi * step / STEPS))


def linear(step: int) -> float:
    return (STEPS - step) / STEPS


# ---- the released loop, written out ------------------------------------------------------------


class TransformersAdamW:
    """transformers.AdamW 4.5 per parameter: skips ``grad is None``; ε added to √v before the
    bias correction; decay ``p −= lr·λ·p`` after the update."""

    def __init__(self, named: dict[str, nn.Parameter], decay: float) -> None:
        no_decay = ["bias", "LayerNorm.weight"]
        self.named = named
        self.decay = {n: 0.0 if any(nd in n for nd in no_decay) else decay for n in named}
        self.state: dict[str, dict] = {}

    @torch.no_grad()
    def step(self, lr: float) -> None:
        beta1, beta2 = BETAS
        for name, p in self.named.items():
            if p.grad is None:
                continue
            g = p.grad
            s = self.state.setdefault(
                name, {"step": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)}
            )
            s["step"] += 1
            s["m"] = beta1 * s["m"] + (1 - beta1) * g
            s["v"] = beta2 * s["v"] + (1 - beta2) * g * g
            step_size = lr * math.sqrt(1 - beta2 ** s["step"]) / (1 - beta1 ** s["step"])
            p -= step_size * s["m"] / (s["v"].sqrt() + EPS)
            p -= lr * self.decay[name] * p


def clip(params) -> None:
    grads = [p.grad for p in params if p.grad is not None]
    norm = math.sqrt(sum(float(g.norm()) ** 2 for g in grads))
    if MAX_NORM / (norm + 1e-6) < 1:
        for g in grads:
            g.mul_(MAX_NORM / (norm + 1e-6))


def zero_grad(model: nn.Module) -> None:
    """torch 1.10's ``model.zero_grad()``: every existing gradient zeroed, None kept."""
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()


def run_released(image_decay: float) -> ToyModel:
    model = ToyModel()
    named = dict(model.named_parameters())
    image_optimizer = TransformersAdamW(named, image_decay)
    text_params = {n: p for n, p in named.items() if not n.startswith("image.")}
    text_optimizer = TransformersAdamW(text_params, 0.0)  # the recipes' text λ = 0
    for step, (text, images) in enumerate(data()):
        zero_grad(model)
        model.image_loss(images).backward()
        clip(model.parameters())
        image_optimizer.step(IMAGE_LR * cosine(step))
        zero_grad(model)
        model.text_loss(text).backward()
        clip(model.parameters())
        text_optimizer.step(TEXT_LR * linear(step))
        zero_grad(model)
    return model


# ---- mmcse's updates ---------------------------------------------------------------------------


class ToyTask:
    """What :class:`mmcse.training.updates.AuxiliaryUpdate` reads of a non-linguistic task."""

    captured = False

    def __init__(self, model: ToyModel, image_decay: float, scope: str) -> None:
        self.model, self.encoder, self.heads = model, model.encoder, model.image
        self.settings = NonLinguisticSettings(
            kind=IMAGE_KIND,
            weight=1.0,
            lr=IMAGE_LR,
            batch_size=6,
            weight_decay=image_decay,
            max_grad_norm=MAX_NORM,
            optimizer_scope=scope,
        )
        self.batches = [images for _, images in data()]

    def train(self) -> None:
        self.model.train()

    def inputs(self, index: int) -> tuple:
        return (self.batches[index],)

    def autocast(self):
        return contextlib.nullcontext()

    def viewed(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.model.image_loss(images)}


def run_mmcse(image_decay: float, scope: str) -> ToyModel:
    model = ToyModel()
    task = ToyTask(model, image_decay, scope)
    student = SimpleNamespace(heads=nn.ModuleDict({"mlp": model.mlp}))
    cfg = SimpleNamespace(
        adam_eps=EPS,
        adam_eps_style="transformers",
        zero_grad="zeros",
        weight_decay_style="transformers",
        precision="fp32",
    )
    auxiliary = auxiliary_update(task, cfg, "cpu", total=STEPS, student=student)
    text_settings = AdamWSettings(
        lr=TEXT_LR,
        weight_decay=0.0,
        eps=EPS,
        betas=BETAS,
        max_grad_norm=MAX_NORM,
        zero_grad="zeros",
    )
    loss = lambda x: {"loss": model.text_loss(x)}  # noqa: E731
    forward = Forward(loss, lambda terms: terms["loss"], contextlib.nullcontext)
    text = EagerUpdate(
        adamw_groups([model.encoder, model.mlp]),
        text_settings,
        linear,
        forward,
        exempt=decay_exempt(model),
    )
    for text_batch, _ in data():
        auxiliary.step()
        text.step("text", (text_batch,))
    return model


def differences(got: nn.Module, want: nn.Module) -> list[str]:
    want_params = dict(want.named_parameters())
    return [
        name
        for name, p in got.named_parameters()
        if not torch.allclose(p, want_params[name], rtol=1e-9, atol=1e-12)
    ]


def test_released_scope_equals_the_released_loop_with_image_weight_decay():
    released = run_released(image_decay=0.1)
    assert differences(run_mmcse(0.1, "model"), released) == []
    # the encoder-and-task scope leaves the text MLP undecayed on image steps (and the rest
    # of the model follows it from the next text step on)
    assert "mlp.weight" in differences(run_mmcse(0.1, "task"), released)


@pytest.mark.parametrize("scope", ["model", "task"])
def test_both_scopes_equal_the_released_loop_at_weight_decay_0(scope):
    assert differences(run_mmcse(0.0, scope), run_released(image_decay=0.0)) == []


def test_the_recipes_and_the_methods_default_to_the_released_scope():
    from mmcse.methods.visualcse import AudioCSE, VisualCSE

    assert VisualCSE().nonlinguistic_settings().optimizer_scope == "model"
    assert AudioCSE().nonlinguistic_settings().optimizer_scope == "model"
