"""What a packed batch computes: its real tokens against the tokens its rows hold."""

from __future__ import annotations

from mmcse.packing import PackedTokens


def token_counts(packed: PackedTokens) -> tuple[int, int]:
    """``(real tokens, computed tokens)`` of a packed batch."""
    return int(packed.mask.sum()), packed.rows * packed.width
