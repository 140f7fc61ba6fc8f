"""Randomly initialised Florence-2 and SAM2 checkpoints (and the byte-level BPE tokenizer the
Florence-2 one needs), written like hub checkpoints so MCSEO's object extraction runs offline."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.objects.florence import (
    LARGE_IMAGE_SIZE,
    LARGE_TEXT,
    LARGE_VISION,
    TINY_IMAGE_SIZE,
    TINY_TEXT,
    TINY_VISION,
)
from pipeline.objects.sam2 import sam2_config

#: the checkpoints' post-processor settings (``processor_config.json`` of the native ports)
POST_PROCESSOR_CONFIG = {
    "phrase_grounding": {"banned_grounding_tokens": ["the image"]},
    "pure_text": {},
}
#: special tokens of Florence-2's tokenizer beyond BART's
LOCATION_TOKENS = [f"<loc_{i}>" for i in range(1000)]
GROUNDING_TOKENS = ["<od>", "</od>", "<ground>", "</ground>", "<obj>", "</obj>"]


def build_florence2(
    out_dir: str | Path, size: str = "tiny", texts: list[str] | None = None, seed: int = 0
) -> Path:
    """Write a randomly initialised Florence-2 (``tiny`` or ``large`` shapes) with a processor
    to ``out_dir``: tests load it like a hub checkpoint.

    The tokenizer is a byte-level BPE (BART's kind) trained on ``texts`` plus Florence-2's
    location and grounding tokens; ``large`` keeps the real vocabulary size.
    """
    from transformers import (
        CLIPImageProcessor,
        Florence2Config,
        Florence2ForConditionalGeneration,
        Florence2Processor,
    )

    if size not in ("tiny", "large"):
        raise ValueError(f"size must be 'tiny' or 'large', not {size!r}")
    tokenizer = byte_level_bpe_tokenizer(
        texts or ["Locate the phrases in the caption: a man and a dog on the grass."],
        image_token="<image>",
    )
    tokenizer.add_tokens(LOCATION_TOKENS + GROUNDING_TOKENS)
    image_size = TINY_IMAGE_SIZE if size == "tiny" else LARGE_IMAGE_SIZE
    image_processor = CLIPImageProcessor(
        size={"height": image_size, "width": image_size},
        do_center_crop=False,
        crop_size={"height": image_size, "width": image_size},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    image_processor.image_seq_length = (image_size // 32) ** 2 + 1  # DaViT /32 grid + 1 pooled
    processor = Florence2Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        post_processor_config=POST_PROCESSOR_CONFIG,
    )
    vision, text = (TINY_VISION, TINY_TEXT) if size == "tiny" else (LARGE_VISION, LARGE_TEXT)
    text = {"vocab_size": len(tokenizer), **text}
    special = dict(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
    )
    config = Florence2Config(
        vision_config=vision,
        text_config={**text, **special},
        image_token_id=tokenizer.image_token_id,
    )
    torch.manual_seed(seed)
    out = Path(out_dir)
    Florence2ForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return out


def byte_level_bpe_tokenizer(texts: list[str], vocab_size: int = 400, **special_tokens: str):
    """A RoBERTa/BART-style byte-level BPE tokenizer trained on ``texts`` (offline, seconds).

    ``special_tokens`` name extra special tokens (e.g. ``image_token="<image>"``).
    """
    import json
    import tempfile

    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        bpe.save_model(tmp)
        vocab = json.loads((Path(tmp) / "vocab.json").read_text(encoding="utf-8"))
        merges_lines = (Path(tmp) / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split(" ")) for line in merges_lines if line and not line.startswith("#")]
    extra = {"extra_special_tokens": special_tokens} if special_tokens else {}
    return RobertaTokenizer(vocab=vocab, merges=merges, **extra)


def build_sam2(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a randomly initialised SAM2 (:func:`sam2_config` shapes) with its processor to
    ``out_dir``, loadable like a hub checkpoint."""
    from transformers import Sam2ImageProcessor, Sam2Model, Sam2Processor

    config = sam2_config(size)
    image_size = config.prompt_encoder_config.image_size
    torch.manual_seed(seed)
    out = Path(out_dir)
    Sam2Model(config).save_pretrained(out)
    image_processor = Sam2ImageProcessor(
        size={"height": image_size, "width": image_size},
        mask_size={"height": image_size // 4, "width": image_size // 4},
    )
    Sam2Processor(image_processor=image_processor).save_pretrained(out)
    return out
