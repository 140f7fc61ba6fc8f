"""The ``objects`` section of ``mmcse bench all``: images/s of the three stages of object
extraction.

Models are built from configs with random weights (``real`` = Florence-2-large, SAM2.1 Hiera-L
and the real-size image teacher; ``tiny`` = the test models), so no download is needed; speed
does not depend on the weights. Florence-2 generates a fixed number of new tokens (EOS is never
allowed to stop it early), so every run does the same work. Each stage runs once to warm up, then
is timed over ``images`` images (:func:`mmcse.bench.timing.repeat`) in batches of ``batch_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmcse.bench.timing import repeat

PROMPT_TOKENS = 24  # "Locate the phrases in the caption: " + a typical Flickr30k caption
BOXES_PER_IMAGE = 4  # MCSEO reports 4.2 object–phrase pairs per image


@dataclass(frozen=True)
class BenchResult:
    stage: str
    images_per_s: float
    detail: str


def _batches(images: int, batch_size: int) -> list[int]:
    return [min(batch_size, images - s) for s in range(0, images, batch_size)]


def bench_florence(size: str, device, images: int, batch_size: int, new_tokens: int):
    from transformers import Florence2Config, Florence2ForConditionalGeneration

    from pipeline.objects import florence

    vision = florence.LARGE_VISION if size == "real" else florence.TINY_VISION
    text = florence.LARGE_TEXT if size == "real" else {"vocab_size": 1400, **florence.TINY_TEXT}
    side = florence.LARGE_IMAGE_SIZE if size == "real" else florence.TINY_IMAGE_SIZE
    ids = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    image_token = text["vocab_size"] - 1
    config = Florence2Config(
        vision_config=vision, text_config={**text, **ids}, image_token_id=image_token
    )
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    model = Florence2ForConditionalGeneration(config).to(device, dtype).eval()
    image_tokens = (side // 32) ** 2 + 1

    def run() -> None:
        for n in _batches(images, batch_size):
            prompt = torch.randint(3, 1000, (n, PROMPT_TOKENS), device=device)
            input_ids = torch.cat(
                [torch.full((n, image_tokens), image_token, device=device), prompt], dim=1
            )
            with torch.inference_mode():
                model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    pixel_values=torch.randn(n, 3, side, side, device=device, dtype=dtype),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    num_beams=3,
                    do_sample=False,
                )

    seconds = repeat(run, device, warmup=1, repeats=1).seconds
    return BenchResult("florence2 grounding", images / seconds, f"{new_tokens} tokens, 3 beams")


def bench_sam2(size: str, device, images: int, batch_size: int):
    from transformers import Sam2Model

    from pipeline.objects.sam2 import sam2_config

    model = Sam2Model(sam2_config("large" if size == "real" else "tiny")).to(device).eval()
    side = model.config.prompt_encoder_config.image_size
    boxes = torch.tensor([[[10.0, 10.0, side / 2, side / 2]] * BOXES_PER_IMAGE], device=device)

    def run() -> None:
        for n in _batches(images, batch_size):
            with torch.inference_mode():
                embeddings = model.get_image_embeddings(
                    torch.randn(n, 3, side, side, device=device)
                )
                for i in range(n):  # prompts run per image (box counts differ between images)
                    model(
                        image_embeddings=[e[i : i + 1] for e in embeddings],
                        input_boxes=boxes,
                        multimask_output=False,
                    )

    seconds = repeat(run, device, warmup=1, repeats=1).seconds
    return BenchResult("sam2 masks", images / seconds, f"{BOXES_PER_IMAGE} boxes per image")


def bench_encoding(size: str, device, images: int, batch_size: int, teacher_name: str):
    import numpy as np

    from pipeline.objects.cutout import cut_out
    from pipeline.teachers import build_teacher

    teacher = build_teacher(teacher_name, weights="random", device=device, size=size)
    crop = teacher.preprocess.crop
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)
    mask = np.zeros((480, 640), dtype=bool)
    mask[100:300, 150:450] = True

    def run() -> None:
        for n in _batches(images, batch_size):
            crops = [
                cut_out(image, mask, crop, (124, 116, 104)) for _ in range(n * BOXES_PER_IMAGE)
            ]
            teacher.encode_images(torch.stack(crops).to(device))

    seconds = repeat(run, device, warmup=1, repeats=1).seconds
    return BenchResult(
        f"object cut-out + {teacher_name}",
        images / seconds,
        f"{BOXES_PER_IMAGE} objects per image",
    )


def bench_objects(
    size: str = "tiny",
    device: str = "cpu",
    images: int = 4,
    batch_size: int = 4,
    new_tokens: int = 64,
    teacher: str = "resnet50",
) -> list[BenchResult]:
    """Images/s of grounding, segmentation and object encoding, each timed on its own."""
    torch.manual_seed(0)
    dev = torch.device(device)
    return [
        bench_florence(size, dev, images, batch_size, new_tokens),
        bench_sam2(size, dev, images, batch_size),
        bench_encoding(size, dev, images, batch_size, teacher),
    ]
