"""CLIP teachers: projected image embeddings, and caption embeddings from the same model.

* ``clip-vit-b32`` — ``openai/clip-vit-base-patch32``, 512-d (DALR's image teacher).
* ``clip-vit-l14`` — ``openai/clip-vit-large-patch14``, 768-d (KDMCSE's teacher).
* ``clip-text`` — the ViT-B/32 model's text tower only (DALR App. E.2's "CLIP" text teacher).

An image embedding is the vision tower's pooled [CLS] state through ``visual_projection``; a
text embedding is the text tower's end-of-text state through ``text_projection`` (pooling
``eos_projected``), truncated at CLIP's 77-token context. Both are *not* L2-normalised (the
manifest says ``normalized=False``; losses normalise). Preprocessing is CLIP's own: resize the
short side to 224 bicubic, centre crop 224, CLIP mean/std.

Backends: ``transformers`` (default; ``CLIPModel``, one load for both towers — the
``*WithProjection`` classes read ``projection_dim`` from the sub-configs, which not every saved
config carries) or ``open_clip`` (``backend="open_clip"``: OpenAI's weights need QuickGELU, so
the model names are ``ViT-B-32-quickgelu`` / ``ViT-L-14-quickgelu`` with ``pretrained="openai"``;
its BPE tokenizer ships with the package, so even random init tokenizes for real).

``weights``: ``"default"`` (hub), ``"random"`` (configs embedded below, no network), an HF model
directory, or one state-dict file (``.safetensors``/``.pth``) of this backend's model — with a
file, captions need ``tokenizer=DIR`` (transformers backend).
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.hub import quiet_transformers
from mmcse.tiny import SIZES as TINY_SIZES
from pipeline.teachers.base import CLIP_MEAN, CLIP_STD, ImagePreprocess
from pipeline.teachers.runtime import ImageEncoding, TextEncoding, WeightsInfo, seeded
from pipeline.teachers.text import load_tokenizer, random_init_tokenizer
from pipeline.teachers.weights import (
    hf_snapshot,
    hf_weight_files,
    load_state_dict,
    load_strict,
    weight_files,
    weights_kind,
    weights_sha256,
)

CONTEXT_LENGTH = 77
HUB_IDS = {"b32": "openai/clip-vit-base-patch32", "l14": "openai/clip-vit-large-patch14"}
OPEN_CLIP_NAMES = {"b32": "ViT-B-32-quickgelu", "l14": "ViT-L-14-quickgelu"}
OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
PREPROCESS = ImagePreprocess(
    resize=224, crop=224, mean=CLIP_MEAN, std=CLIP_STD, interpolation="bicubic"
)
TINY_PREPROCESS = ImagePreprocess(
    resize=32, crop=32, mean=CLIP_MEAN, std=CLIP_STD, interpolation="bicubic"
)

#: (text tower, vision tower, projection dim) — the published configs' values
ARCHITECTURES = {
    "b32": (
        dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8),
        dict(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            patch_size=32,
            image_size=224,
        ),
        512,
    ),
    "l14": (
        dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
        dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=24,
            num_attention_heads=16,
            patch_size=14,
            image_size=224,
        ),
        768,
    ),
    "tiny": (
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            patch_size=8,
            image_size=32,
        ),
        # as wide as mmcse.tiny's student, as L/14's 768 is BERT-base's width: DALR's released
        # raw-feature ℓ_CMA compares the two, so a tiny DALR world needs them equal
        TINY_SIZES["tiny"]["hidden_size"],
    ),
}


def hf_clip_config(arch: str):
    from transformers import CLIPConfig

    text, vision, projection = ARCHITECTURES[arch]
    common = dict(projection_dim=projection, hidden_act="quick_gelu")
    text = {**text, **common, "vocab_size": 49408, "max_position_embeddings": CONTEXT_LENGTH}
    return CLIPConfig(
        text_config=text, vision_config={**vision, **common}, projection_dim=projection
    )


def open_clip_tiny():
    from open_clip.model import CLIP

    text, vision, projection = ARCHITECTURES["tiny"]
    return CLIP(
        embed_dim=projection,
        vision_cfg=dict(
            layers=vision["num_hidden_layers"],
            width=vision["hidden_size"],
            head_width=vision["hidden_size"] // vision["num_attention_heads"],
            mlp_ratio=2.0,
            patch_size=vision["patch_size"],
            image_size=vision["image_size"],
        ),
        text_cfg=dict(
            context_length=CONTEXT_LENGTH,
            vocab_size=49408,
            width=text["hidden_size"],
            heads=text["num_attention_heads"],
            layers=text["num_hidden_layers"],
            mlp_ratio=2.0,
        ),
        quick_gelu=True,
    )


class HFCLIPTowers(nn.Module):
    """The parts of a transformers ``CLIPModel`` a teacher uses (``vision=False``: text only)."""

    def __init__(self, model, vision: bool = True) -> None:
        super().__init__()
        self.text_model, self.text_projection = model.text_model, model.text_projection
        if vision:
            self.vision_model = model.vision_model
            self.visual_projection = model.visual_projection

    def embed_images(self, pixels: Tensor) -> Tensor:
        return self.visual_projection(self.vision_model(pixel_values=pixels).pooler_output)

    def embed_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        return self.text_projection(self.text_model(**batch).pooler_output)


class OpenCLIPTowers(nn.Module):
    def __init__(self, model, vision: bool = True) -> None:
        super().__init__()
        if not vision:
            model.visual = None  # frees the image tower; encode_text never touches it
        self.model = model

    def embed_images(self, pixels: Tensor) -> Tensor:
        return self.model.encode_image(pixels)

    def embed_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        return self.model.encode_text(batch["input_ids"])


class CLIPTextTeacher(TextEncoding):
    pooling = "eos_projected"

    def __init__(self, *args, backend: str, tokenizer, tokenizer_source, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.backend = backend
        self.tokenizer = tokenizer
        self.tokenizer_source = tokenizer_source
        self.max_length = CONTEXT_LENGTH

    def _tokenize(self, texts: list[str]) -> dict[str, Tensor]:
        if self.tokenizer is None:
            raise MmcseError(
                f"{self.name}: weights from a single file carry no tokenizer; pass tokenizer=DIR "
                f"(an HF CLIP directory) to embed captions"
            )
        if self.backend == "open_clip":  # always pads to the 77-token context
            return {"input_ids": self.tokenizer(texts)}
        return super()._tokenize(texts)

    def _embed_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        return self.modules.embed_tokens(batch)


class CLIPTeacher(ImageEncoding, CLIPTextTeacher):
    """Images and captions (both ``ImageTeacher`` and ``TextTeacher``)."""

    image_pooling = "cls_projected"

    def _embed_images(self, pixels: Tensor) -> Tensor:
        return self.modules.embed_images(pixels)


def load_hf_clip(arch: str, weights: str, kind: str, seed: int, tokenizer: str | None):
    """``(CLIPModel, WeightsInfo, tokenizer, tokenizer source)`` for the transformers backend."""
    from transformers import CLIPModel

    quiet_transformers()
    if kind == "random":
        with seeded(seed):
            model = CLIPModel(hf_clip_config(arch))
        tok, tok_source = random_init_tokenizer(tokenizer)
        return model, WeightsInfo("random", f"clip-{arch}", "random", seed), tok, tok_source
    path = hf_snapshot(HUB_IDS[arch]) if kind == "default" else Path(weights)
    source = HUB_IDS[arch] if kind == "default" else str(weights)
    if path.is_dir():
        model = CLIPModel.from_pretrained(str(path))
        files, tok_source = hf_weight_files(path), str(tokenizer or source)
        tok = load_tokenizer(tokenizer or path)
    else:
        model, files = CLIPModel(hf_clip_config(arch)), [path]
        load_strict(model, load_state_dict(path), path)
        tok_source = str(tokenizer) if tokenizer else None
        tok = load_tokenizer(tokenizer) if tokenizer else None
    return model, WeightsInfo(kind, source, weights_sha256(files)), tok, tok_source


def load_open_clip(arch: str, weights: str, kind: str, seed: int):
    """``(open_clip CLIP, WeightsInfo, tokenizer, tokenizer source)``."""
    import open_clip
    from open_clip.factory import load_checkpoint

    name = OPEN_CLIP_NAMES.get(arch, OPEN_CLIP_NAMES["b32"])
    if kind == "default":  # open_clip's own download retries for a minute when offline
        hub_id = open_clip.get_pretrained_cfg(name, "openai")["hf_hub"].strip("/")
        snapshot = hf_snapshot(hub_id, OPEN_CLIP_WEIGHTS)
        files = [next(f for p in OPEN_CLIP_WEIGHTS for f in sorted(snapshot.glob(p)))]
        source = f"{hub_id} (open_clip {name} 'openai')"
    elif kind == "path":
        files, source = weight_files(weights), str(weights)
    with seeded(seed):
        model = open_clip_tiny() if arch == "tiny" else open_clip.create_model(name)
    if kind == "random":
        info = WeightsInfo("random", f"open_clip:{arch}", "random", seed)
    else:
        try:
            load_checkpoint(model, str(files[0]))
        except RuntimeError as exc:
            raise MmcseError(f"{files[0]}: weights do not fit open_clip {name}") from exc
        info = WeightsInfo(kind, source, weights_sha256(files))
    return model, info, open_clip.get_tokenizer(name), f"open_clip:{name}"


def build_clip(
    name: str,
    arch: str,
    weights: str = "default",
    *,
    text_only: bool = False,
    size: str = "real",
    backend: str = "transformers",
    seed: int = 0,
    dtype=None,
    batch_size: int = 128,
    tokenizer: str | None = None,
) -> CLIPTextTeacher:
    kind = weights_kind(weights)
    if size == "tiny":
        if kind == "default":
            raise MmcseError(f"{name}: size='tiny' has no published weights; use weights='random'")
        arch = "tiny"
    if backend == "transformers":
        model, info, tok, tok_source = load_hf_clip(arch, weights, kind, seed, tokenizer)
        towers = HFCLIPTowers(model, vision=not text_only)
        dim = model.config.projection_dim
    elif backend == "open_clip":
        model, info, tok, tok_source = load_open_clip(arch, weights, kind, seed)
        towers = OpenCLIPTowers(model, vision=not text_only)
        dim = model.text_projection.shape[1]
    else:
        raise MmcseError(f"{name}: unknown backend {backend!r}; choose transformers or open_clip")
    common = dict(size=size, dtype=dtype, batch_size=batch_size, backend=backend)
    common.update(tokenizer=tok, tokenizer_source=tok_source)
    if text_only:
        return CLIPTextTeacher(name, dim, towers, info, **common)
    preprocess = TINY_PREPROCESS if size == "tiny" else PREPROCESS
    return CLIPTeacher(name, dim, towers, info, preprocess=preprocess, **common)
