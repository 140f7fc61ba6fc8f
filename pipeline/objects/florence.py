"""Florence-2 phrase grounding (``<CAPTION_TO_PHRASE_GROUNDING>``) with the native transformers port.

MCSEO grounds each caption with Florence-2 and segments the boxes with SAM2, as in
Grounded-SAM-2 (§4.1). The model is loaded with ``Florence2ForConditionalGeneration`` and its
processor, no remote code. Images of a batch are generated together: the prompts are padded and
the attention mask hides the padding; the beam count is configurable (Grounded-SAM-2 uses 3).

Parsing uses the processor's own Florence-2 post-processor, at the instance level
(``processor.post_processor(..., parse_tasks=["phrase_grounding"])``, the parser
``post_process_generation`` wraps): ``post_process_generation`` flattens to one label per box, so
"two dogs" with two boxes could not be told from two separate mentions "a dog" … "a dog". Output a
random or badly trained model produces is garbage text; any text that does not parse yields no
groundings (and is counted), never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mmcse.errors import MmcseError
from mmcse.hub import quiet_transformers

TASK = "<CAPTION_TO_PHRASE_GROUNDING>"
DEFAULT_CHECKPOINT = "florence-community/Florence-2-large"

#: Florence-2-large, written out so the speed benchmark builds it without a download
LARGE_VISION = dict(
    embed_dim=[256, 512, 1024, 2048],
    num_heads=[8, 16, 32, 64],
    num_groups=[8, 16, 32, 64],
    depths=[1, 1, 9, 1],
    window_size=12,
    projection_dim=1024,
    max_position_embeddings=50,
    max_temporal_embeddings=100,
)
LARGE_TEXT = dict(
    vocab_size=51289,
    d_model=1024,
    encoder_layers=12,
    decoder_layers=12,
    encoder_attention_heads=16,
    decoder_attention_heads=16,
    encoder_ffn_dim=4096,
    decoder_ffn_dim=4096,
    max_position_embeddings=1024,
)
LARGE_IMAGE_SIZE = 768
TINY_VISION = dict(
    embed_dim=[8, 16, 24, 32],
    num_heads=[1, 2, 3, 4],
    num_groups=[1, 2, 3, 4],
    depths=[1, 1, 1, 1],
    window_size=2,
    projection_dim=32,
    max_position_embeddings=8,
    max_temporal_embeddings=4,
    drop_path_rate=0.0,
)
TINY_TEXT = dict(
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=512,
)
TINY_IMAGE_SIZE = 64


@dataclass(frozen=True)
class Grounding:
    """One grounded phrase: the phrase as Florence-2 wrote it and its boxes (xyxy, pixels)."""

    phrase: str
    boxes: list[list[float]]
    score: float  # mean log-probability of the generated tokens (the whole caption's answer)


class Florence2Grounder:
    """Batched ``<CAPTION_TO_PHRASE_GROUNDING>`` over PIL images and their captions."""

    def __init__(
        self,
        checkpoint: str | Path = DEFAULT_CHECKPOINT,
        device: str | torch.device = "cpu",
        num_beams: int = 3,
        max_new_tokens: int = 256,
    ) -> None:
        from transformers import AutoProcessor, Florence2ForConditionalGeneration

        quiet_transformers()
        self.checkpoint = str(checkpoint)
        self.device = torch.device(device)
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.num_beams = num_beams
        self.max_new_tokens = max_new_tokens
        try:
            self.processor = AutoProcessor.from_pretrained(self.checkpoint)
            self.model = Florence2ForConditionalGeneration.from_pretrained(
                self.checkpoint, dtype=self.dtype
            )
        except OSError as exc:
            raise MmcseError(f"cannot load Florence-2 from {self.checkpoint!r}: {exc}") from None
        self.model.to(self.device).eval()
        self.parse_failures = 0

    def producer(self) -> dict:
        return {
            "detector": "florence2",
            "checkpoint": self.checkpoint,
            "revision": getattr(self.model.config, "_commit_hash", None) or "local",
            "task": TASK,
            "num_beams": self.num_beams,
            "max_new_tokens": self.max_new_tokens,
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    @torch.inference_mode()
    def ground(
        self, images: list, captions: list[str], image_ids: list[str] | None = None
    ) -> list[list[Grounding]]:
        """Per image, the phrases Florence-2 grounds in its caption (``images``: PIL RGB;
        ``image_ids`` are not needed: Florence-2 looks at the pixels)."""
        inputs = self.processor(
            text=[TASK + caption for caption in captions],
            images=images,
            return_tensors="pt",
            padding=True,
        ).to(self.device)
        inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        out = self.model.generate(
            **inputs,
            max_new_tokens=self.max_new_tokens,
            num_beams=self.num_beams,
            do_sample=False,
            return_dict_in_generate=True,
            output_scores=True,
        )
        scores = self._sequence_scores(out)
        texts = self.processor.batch_decode(out.sequences, skip_special_tokens=False)
        return [
            self.parse(text, image.size, score)
            for text, image, score in zip(texts, images, scores, strict=True)
        ]

    def _sequence_scores(self, out) -> list[float]:
        """Mean log-probability per generated token (pads excluded) of each returned sequence."""
        transition = self.model.compute_transition_scores(
            out.sequences,
            out.scores,
            getattr(out, "beam_indices", None),
            normalize_logits=self.num_beams == 1,  # beam search scores are log-probs already
        )
        generated = out.sequences[:, -transition.shape[1] :]
        real = (generated != self.processor.tokenizer.pad_token_id) & torch.isfinite(transition)
        total = torch.where(real, transition, torch.zeros_like(transition)).sum(-1)
        return (total / real.sum(-1).clamp_min(1)).float().tolist()

    def parse(self, text: str, image_size: tuple[int, int], score: float = 0.0) -> list[Grounding]:
        """Florence-2 output text → groundings (``image_size`` is PIL's ``(width, height)``)."""
        try:
            parsed = self.processor.post_processor(
                text=text, image_size=image_size, parse_tasks=["phrase_grounding"]
            )["phrase_grounding"]
        except (ValueError, IndexError, KeyError, RuntimeError):
            self.parse_failures += 1
            return []
        return [
            Grounding(inst["cat_name"], [list(map(float, b)) for b in inst["bbox"]], score)
            for inst in parsed
            if inst.get("cat_name") and inst.get("bbox")
        ]
