"""SAM2 masks from boxes, with the native ``Sam2Model`` + ``Sam2Processor``.

The processor only batches images that have the same number of boxes, so the image encoder (the
expensive part) runs once per batch of images and the prompt encoder and mask decoder then run
per image on that image's embeddings with all of its boxes at once. One mask per box
(``multimask_output=False``, as Grounded-SAM-2 does for box prompts); its predicted IoU is kept
as the mask score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmcse.errors import MmcseError
from mmcse.hub import quiet_transformers

DEFAULT_CHECKPOINT = "facebook/sam2.1-hiera-large"
#: smaller checkpoints of the same family, selectable with ``--sam2``
CHECKPOINTS = (
    "facebook/sam2.1-hiera-large",
    "facebook/sam2.1-hiera-base-plus",
    "facebook/sam2.1-hiera-small",
    "facebook/sam2.1-hiera-tiny",
)

#: SAM2.1 Hiera-L image encoder, written out so the speed benchmark needs no download
LARGE_BACKBONE = dict(
    hidden_size=144,
    num_attention_heads=2,
    blocks_per_stage=[2, 6, 36, 4],
    embed_dim_per_stage=[144, 288, 576, 1152],
    num_attention_heads_per_stage=[2, 4, 8, 16],
    window_size_per_stage=[8, 4, 16, 8],
    global_attention_blocks=[23, 33, 43],
    window_positional_embedding_background_size=[7, 7],
)
LARGE_CHANNELS = [1152, 576, 288, 144]
TINY_SIZE = 64
TINY_BACKBONE = dict(
    hidden_size=8,
    num_attention_heads=1,
    image_size=[TINY_SIZE, TINY_SIZE],
    blocks_per_stage=[1, 1, 2, 1],
    embed_dim_per_stage=[8, 16, 32, 64],
    num_attention_heads_per_stage=[1, 1, 1, 1],
    window_size_per_stage=[2, 2, 2, 2],
    global_attention_blocks=[3],
    window_positional_embedding_background_size=[2, 2],
)
TINY_CHANNELS = [64, 32, 16, 8]


@dataclass(frozen=True)
class Segmentation:
    masks: np.ndarray  # [K, H, W] bool, at the original image size
    scores: np.ndarray  # [K] predicted IoU


class Sam2Segmenter:
    """Box-prompted SAM2 over batches of ``[H, W, 3]`` uint8 images."""

    def __init__(self, checkpoint: str | Path = DEFAULT_CHECKPOINT, device="cpu") -> None:
        from transformers import Sam2Model, Sam2Processor

        quiet_transformers()
        self.checkpoint = str(checkpoint)
        self.device = torch.device(device)
        try:
            self.processor = Sam2Processor.from_pretrained(self.checkpoint)
            self.model = Sam2Model.from_pretrained(self.checkpoint)
        except OSError as exc:
            raise MmcseError(f"cannot load SAM2 from {self.checkpoint!r}: {exc}") from None
        self.model.to(self.device).eval()

    def producer(self) -> dict:
        return {
            "segmenter": "sam2",
            "checkpoint": self.checkpoint,
            "revision": getattr(self.model.config, "_commit_hash", None) or "local",
            "multimask_output": False,
        }

    @torch.inference_mode()
    def segment(
        self, images: list[np.ndarray], boxes: list[list[list[float]]]
    ) -> list[Segmentation]:
        """One mask per box of each image (``boxes[i]``: xyxy pixels; may be empty)."""
        results: list[Segmentation | None] = [None] * len(images)
        todo = [i for i, b in enumerate(boxes) if b]
        for i in set(range(len(images))) - set(todo):
            h, w = images[i].shape[:2]
            results[i] = Segmentation(np.zeros((0, h, w), dtype=bool), np.zeros(0, np.float32))
        if todo:
            inputs = self.processor(images=[images[i] for i in todo], return_tensors="pt")
            embeddings = self.model.get_image_embeddings(inputs["pixel_values"].to(self.device))
            for n, i in enumerate(todo):
                size = inputs["original_sizes"][n].tolist()
                prompt = self.processor(
                    original_sizes=[size], input_boxes=[boxes[i]], return_tensors="pt"
                )
                out = self.model(
                    image_embeddings=[e[n : n + 1] for e in embeddings],
                    input_boxes=prompt["input_boxes"].to(self.device),
                    multimask_output=False,
                )
                masks = self.processor.post_process_masks(out.pred_masks.cpu(), [size])[0]
                results[i] = Segmentation(
                    masks[:, 0].numpy().astype(bool), out.iou_scores[0, :, 0].float().cpu().numpy()
                )
        return results  # type: ignore[return-value]


def sam2_config(size: str = "tiny"):
    """A ``Sam2Config`` of ``tiny`` (tests) or ``large`` (SAM2.1 Hiera-L) shapes."""
    from transformers import Sam2Config

    if size not in ("tiny", "large"):
        raise ValueError(f"size must be 'tiny' or 'large', not {size!r}")
    image_size = TINY_SIZE if size == "tiny" else 1024
    backbone, channels = (
        (TINY_BACKBONE, TINY_CHANNELS) if size == "tiny" else (LARGE_BACKBONE, LARGE_CHANNELS)
    )
    hidden = 32 if size == "tiny" else 256
    tiny_decoder = dict(
        mlp_dim=64, num_hidden_layers=1, num_attention_heads=2, iou_head_hidden_dim=16
    )
    return Sam2Config(
        vision_config=dict(
            backbone_config=dict(model_type="sam2_hiera_det_model", **backbone),
            backbone_channel_list=channels,
            backbone_feature_sizes=[[image_size // s] * 2 for s in (4, 8, 16)],
            fpn_hidden_size=hidden,
        ),
        prompt_encoder_config=dict(hidden_size=hidden, image_size=image_size, patch_size=16),
        mask_decoder_config=dict(hidden_size=hidden, **(tiny_decoder if size == "tiny" else {})),
    )
