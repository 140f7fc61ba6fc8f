"""The settings of a tiny MCSE run on the ``tiny_model`` / ``tiny_world`` fixtures (CPU)."""

from __future__ import annotations

from typing import Any


def tiny_mcse_settings(tiny_model, tiny_world, out, **overrides: Any) -> dict[str, Any]:
    """TrainConfig keyword arguments: MCSE, batch 8, no SentEval, on CPU; ``overrides`` win."""
    return {
        "model": str(tiny_model),
        "method": "mcse",
        "text_corpus": tiny_world["text"],
        "caption_corpus": tiny_world["captions"],
        "features": {"image": tiny_world["image"]},
        "batch_size": 8,
        "eval_data": "",
        "final_eval": False,
        "device": "cpu",
        "output_dir": str(out),
        **overrides,
    }
