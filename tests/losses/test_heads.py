"""Head declarations: widths from the student and the cache, the two kinds, bad declarations."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mmcse.errors import MmcseError
from mmcse.losses.heads import HIDDEN, AlignerHead, Head, MLPHead
from mmcse.methods import build_heads, build_method


def test_widths_come_from_the_student_the_cache_or_a_number():
    assert Head(HIDDEN, "image").widths(16, {"image": 12}) == (16, 12)
    assert Head("clip_text", 256).widths(16, {"clip_text": 768}) == (768, 256)
    mlp = Head(HIDDEN, 8, init="bert").build(16, {})
    assert isinstance(mlp, MLPHead) and (mlp[0].in_features, mlp[0].out_features) == (16, 8)
    assert torch.count_nonzero(mlp[0].bias) == 0  # BERT init: zero bias
    aligner = Head("image", 4, kind="aligner").build(16, {"image": 12})
    assert isinstance(aligner, AlignerHead) and isinstance(aligner[1], nn.BatchNorm1d)
    assert (aligner[0].in_features, aligner[3].out_features) == (12, 4)


def test_a_role_the_run_does_not_load_is_a_clear_error():
    with pytest.raises(
        MmcseError, match=r"role 'image', which this run does not load .* --feature image=DIR"
    ):
        build_heads(build_method("mcse"), 16, {"clip_image": 12})


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"init": "xavier"}, "head init must be one of"),
        ({"kind": "conv"}, "head kind must be one of"),
        ({"kind": "aligner", "init": "bert"}, "default init only"),
    ],
)
def test_bad_declarations_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Head(HIDDEN, 8, **kwargs)
