"""Frozen teachers for Stage 1, by name.

=================  =====  ====  ==============================================  ===============
name               kind   dim   default weights                                 pooling
=================  =====  ====  ==============================================  ===============
``resnet50``       image  2048  torchvision ``IMAGENET1K_V1`` (MCSE)            global avg pool
``resnet50-v2``    image  2048  torchvision ``IMAGENET1K_V2``                   global avg pool
``clip-vit-b32``   both   512   ``openai/clip-vit-base-patch32`` (DALR)         projected
``clip-vit-l14``   both   768   ``openai/clip-vit-large-patch14`` (KDMCSE)      projected
``clip-text``      text   512   ``openai/clip-vit-base-patch32``, text tower    eos_projected
``simcse``         text   768   ``princeton-nlp/unsup-simcse-bert-base-uncased``  cls_before_pooler
``diffcse``        text   768   ``voidism/diffcse-bert-base-uncased-sts``       cls_before_pooler
``rankcse``        text   768   ``perceptiveshawty/rankcse-listmle-bert-...``   cls_before_pooler
``simcse-roberta``  text  768   ``princeton-nlp/unsup-simcse-roberta-base``     cls_before_pooler
``diffcse-roberta``  text 768   ``voidism/diffcse-roberta-base-sts``            cls_before_pooler
=================  =====  ====  ==============================================  ===============

"both": the teacher is an ``ImageTeacher`` and a ``TextTeacher`` (CLIP embeds captions too).
``build_teacher(name, weights="default"|"random"|PATH, device=..., dtype=..., **kw)``; keyword
options: ``size="real"|"tiny"`` (tiny: random small models for tests/demo), ``seed`` (random
init), ``backend="open_clip"`` (CLIP), ``max_length``/``batch_size``/``tokenizer``/``pooling``
(text). See :mod:`pipeline.teachers.weights` for how weights resolve offline.
"""

from __future__ import annotations

import inspect
from functools import partial

import torch

from mmcse.errors import MmcseError
from mmcse.registry import Registry
from pipeline.teachers.base import ImagePreprocess, ImageTeacher, TextTeacher
from pipeline.teachers.clip import build_clip
from pipeline.teachers.resnet import build_resnet
from pipeline.teachers.runtime import SIZES
from pipeline.teachers.text import bert_factories

__all__ = [
    "TEACHERS",
    "TEACHER_DIMS",
    "ImagePreprocess",
    "ImageTeacher",
    "TextTeacher",
    "build_teacher",
]

TEACHERS = Registry("teacher")

#: the width of each teacher's features (the table above; held to it by a test), known without
#: building the teacher: what a cache set of that teacher holds
TEACHER_DIMS = {
    "resnet50": 2048,
    "resnet50-v2": 2048,
    "clip-vit-b32": 512,
    "clip-vit-l14": 768,
    "clip-text": 512,
    "simcse": 768,
    "diffcse": 768,
    "rankcse": 768,
    "simcse-roberta": 768,
    "diffcse-roberta": 768,
}

_FACTORIES = {
    "resnet50": partial(build_resnet, "resnet50", "IMAGENET1K_V1"),
    "resnet50-v2": partial(build_resnet, "resnet50-v2", "IMAGENET1K_V2"),
    "clip-vit-b32": partial(build_clip, "clip-vit-b32", "b32"),
    "clip-vit-l14": partial(build_clip, "clip-vit-l14", "l14"),
    "clip-text": partial(build_clip, "clip-text", "b32", text_only=True),
    **bert_factories(),
}
for _name, _factory in _FACTORIES.items():
    TEACHERS.register(_name)(_factory)


def build_teacher(
    name: str,
    weights: str = "default",
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
    **kwargs,
):
    """A frozen teacher on ``device``, in eval mode, ready for ``encode_images``/``encode_texts``.

    ``dtype``: compute precision (autocast); ``None`` → bf16 on CUDA (fp16 without bf16),
    float32 on CPU.
    """
    size = kwargs.get("size", "real")
    if size not in SIZES:
        raise MmcseError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MmcseError("device 'cuda' requested but CUDA is not available here; use --device cpu")
    factory = TEACHERS.get(name)
    try:
        inspect.signature(factory).bind(weights, dtype=dtype, **kwargs)
    except TypeError as exc:
        raise MmcseError(f"teacher {name!r}: {exc}") from None
    return factory(weights, dtype=dtype, **kwargs).to(device)
