"""transformers.AdamW's ε on a plain ``torch.optim.AdamW``: the reference the tests hold mmcse's
updates to (:class:`mmcse.training.adamw.EagerAdamW` counts the steps on the host instead)."""

from __future__ import annotations

import torch

from mmcse.training.adamw import AdamWSettings


def next_step(optimizer: torch.optim.Optimizer, group: dict) -> int:
    """The step ``t`` the group's parameters take next, read from the first parameter with state:
    a group's parameters step together, and one that never receives a gradient keeps no state."""
    state = optimizer.state
    first = next((p for p in group["params"] if "step" in state.get(p, ())), None)
    return 1 if first is None else int(state[first]["step"]) + 1


def set_transformers_eps(optimizer: torch.optim.Optimizer, eps: float) -> None:
    """Set each group's ε so that torch's next AdamW step equals ``transformers.AdamW``'s with
    ``eps``: ε/√(1 − β₂ᵗ), ``t`` the group's next step. Call it before every ``step()``."""
    for group in optimizer.param_groups:
        t = next_step(optimizer, group)
        settings = AdamWSettings(lr=0.0, weight_decay=0.0, eps=eps, betas=group["betas"])
        group["eps"] = settings.eps_at(t)
