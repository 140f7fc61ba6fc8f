"""AdamW with ``transformers.AdamW``'s ε placement, on top of ``torch.optim.AdamW``.

Every released trainer mmcse reproduces builds ``transformers.AdamW`` (MCSE/KDMCSE/DALR's
``train_mix.py``; the HF Trainer 4.5 behind SimCSE and VisualCSE/AudioCSE, for the text *and*
the image/audio optimizer). It adds ε to √v and folds the bias correction into the step size::

    p ← p − lr·√(1 − β₂ᵗ)/(1 − β₁ᵗ) · m / (√v + ε)

torch's AdamW adds ε to √v̂ = √(v/(1 − β₂ᵗ)) instead, which is the same update with ε replaced by
ε/√(1 − β₂ᵗ) (31.6·ε at t = 1 for β₂ = 0.999, → ε after a few thousand steps). With weight decay
0 (every released run) the two optimizers then agree exactly; with decay they differ in where it
is applied (transformers: after the update, and the released recipes spare biases and LayerNorm
weights), which :mod:`mmcse.training.adamw` reproduces (``weight_decay_style``).
"""

from __future__ import annotations

#: ``adam_eps_style`` values: where AdamW adds ε — ``transformers`` (to √v before the bias
#: correction: transformers.AdamW, which every released trainer here used) or ``torch``
#: (torch.optim.AdamW's own placement)
EPS_STYLES = ("transformers", "torch")
#: ``weight_decay_style`` values: ``transformers`` — decoupled decay *after* the update
#: (transformers.AdamW 4.x ``step``), biases and LayerNorm weights spared (every released
#: trainer's parameter groups) — or ``torch``: torch.optim.AdamW's, every parameter, before it
DECAY_STYLES = ("transformers", "torch")
#: ``zero_grad`` values: what clearing the gradients after a step leaves — ``zeros`` (torch < 2's
#: ``zero_grad()``, which the released trainers ran: a parameter that has had a gradient keeps a
#: zero one, and AdamW, which skips only a missing gradient, steps it on its momentum on every
#: later batch) or ``none`` (set to None: a parameter without a gradient on a batch is skipped)
ZERO_GRADS = ("zeros", "none")
