"""transformers-style ε on torch's AdamW (AdamWSettings.eps_at) against transformers.AdamW written out."""

from __future__ import annotations

import math

import torch
from support.optim import set_transformers_eps


class TransformersAdamW:
    """transformers.AdamW's update (correct_bias=True, weight decay 0), written out in float64:
    m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², p ← p − lr·√(1−β₂ᵗ)/(1−β₁ᵗ) · m/(√v + ε)."""

    def __init__(self, lr: float, eps: float, betas=(0.9, 0.999)):
        self.lr, self.eps, (self.b1, self.b2) = lr, eps, betas
        self.m: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.t: dict[int, int] = {}

    def update(self, key: int, param: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor:
        p = param.detach().double()
        if grad is None:  # no gradient: transformers.AdamW skips the parameter
            return p
        g = grad.detach().double()
        m = self.b1 * self.m.get(key, torch.zeros_like(g)) + (1 - self.b1) * g
        v = self.b2 * self.v.get(key, torch.zeros_like(g)) + (1 - self.b2) * g * g
        t = self.t[key] = self.t.get(key, 0) + 1
        self.m[key], self.v[key] = m, v
        size = self.lr * math.sqrt(1 - self.b2**t) / (1 - self.b1**t)
        return p - size * m / (v.sqrt() + self.eps)


def test_set_transformers_eps_gives_transformers_adamw_updates():
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    unused = torch.nn.Parameter(torch.randn(2, dtype=torch.float64))  # first, never stepped
    optimizer = torch.optim.AdamW([unused, param], lr=0.1, eps=1e-3, weight_decay=0.0)
    reference = TransformersAdamW(lr=0.1, eps=1e-3)
    for _ in range(3):
        param.grad = 1e-3 * torch.randn(5, dtype=torch.float64)  # ε matters at this scale
        expected = reference.update(0, param, param.grad)
        set_transformers_eps(optimizer, 1e-3)
        optimizer.step()
        torch.testing.assert_close(param.detach(), expected, rtol=1e-12, atol=1e-15)
