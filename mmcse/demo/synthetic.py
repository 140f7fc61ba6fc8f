"""The one synthetic cache: a random student and caption corpus with every feature set a method
reads, written through the real Stage-1 writers at the widths the papers' teachers have. The
bench (``mmcse bench all``), the tests and the demo's random feature sets build from here.

* plain vector roles (image, CLIP, text-teacher features): random rows written by the cache
  writer (:func:`write_random_set`), keyed like their kind (:func:`role_kind`, from the
  recipes), so the trainer's id join is exercised; each as wide as its recipe's teacher
  (:func:`role_dim`);
* MCSEO's ``object`` role: a boxes file (~4 phrases per caption) run through
  :func:`pipeline.objects.extract.extract_objects` with a one-block-per-stage ResNet-50-shaped
  random teacher (2048-d like ResNet-50, at 32-px crops so generation stays fast);
* VisualCSE/AudioCSE's examples: ``image_tensor`` / ``audio_fbank`` sets from the
  :mod:`pipeline.nonling_cache` writers (random pixels, noise WAVs).

Caption lengths (``lengths``): ``full`` (every caption ``seq_len - 2`` distinct words: one word
per token, so phrase spans are known), or ``coco`` / ``wiki``: word counts drawn from a normal
with the corpus's mean token count measured on ``../shared/data`` (issue 29: COCO val2017 13.8,
Wiki1M 21.9 tokens at length 32; sd 6), scaled to ``seq_len`` — what dynamic padding and packing
meet on real data. An app module: it imports both stages.
"""

from __future__ import annotations

import dataclasses
import json
import wave
from pathlib import Path

import numpy as np
import torch

from mmcse.cache import write_corpus, write_feature_set
from mmcse.errors import MmcseError
from mmcse.methods import Method, build_method
from mmcse.tiny import SPECIAL_TOKENS, build_tiny_bert

#: mean tokens per sentence at length 32, measured on ../shared/data (issue 29)
MEASURED_MEAN_TOKENS = {"coco": 13.8, "wiki": 21.9}
LENGTHS = ("full", *MEASURED_MEAN_TOKENS)
#: cache kinds whose rows have a fixed shape (their writer's), not a teacher's width
UNPAIRED_KINDS = ("image_tensor", "audio_fbank")
#: settings that only avoid the network (speed does not depend on weights), and DALR's ℓ_CMA
#: image head: the released ℓ_CMA reads the raw image, which must be as wide as the student
#: (ViT-L/14's 768 = BERT-base's); the bench's 512-d image at every student size needs the head
METHOD_ARGS = {"visualcse": {"vit_init": "random"}, "dalr": {"cma_image_head": True}}
CAPTIONS_PER_IMAGE = 4  # several captions per image, so an image-keyed join is not the identity
PHRASES_PER_CAPTION = 4
NONLING_EXAMPLES = 48  # one batch of the papers' 48
NONLING_CLASSES = 8
AUDIO_RATE = 16000


def recipe_roles(method: str) -> dict:
    """``role → Feature(kind, teacher)`` of the method's first recipe in the catalogue: the
    teachers the papers' settings read, so the bench's sets have the widths a real run has (one
    source: :mod:`mmcse.recipes.catalogue`)."""
    from mmcse.recipes import RECIPES

    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        if recipe.method == method:
            return recipe.roles
    raise MmcseError(f"bench: method {method!r} has no recipe; add one to the catalogue")


def role_kind(role: str) -> str:
    """The cache kind of a role's set, as every recipe that reads the role has it: it decides
    the join key (image sets join on the caption's image id, text sets on the sentence id) and
    which writer builds the set."""
    from mmcse.recipes import RECIPES

    kinds = {
        feature.kind
        for name in RECIPES.names()
        for name_role, feature in RECIPES.get(name).roles.items()
        if name_role == role
    }
    if len(kinds) != 1:
        raise MmcseError(f"bench: the recipes give role {role!r} the kinds {sorted(kinds)}")
    return kinds.pop()


def role_dim(method: str, role: str) -> int:
    """The width of the role's set: its recipe teacher's (0 for fixed-shape example sets)."""
    from pipeline.teachers import TEACHER_DIMS

    feature = recipe_roles(method)[role]
    return 0 if feature.kind in UNPAIRED_KINDS else TEACHER_DIMS[feature.teacher]


def roles_of(method: Method) -> set[str]:
    """Every feature role a method instance reads, its auxiliary task's examples included."""
    roles = set(method.caption_roles) | set(method.text_roles)
    nonlinguistic = getattr(method, "nonlinguistic", None)
    return roles | {nonlinguistic} if nonlinguistic else roles


@dataclasses.dataclass
class SyntheticWorld:
    root: Path
    model: Path
    captions: Path
    #: (role, dim) → feature set dir (dim 0 for sets whose shape is fixed by their writer)
    features: dict[tuple[str, int], str]


@dataclasses.dataclass
class Captions:
    ids: list[str]
    texts: list[str]
    image_ids: list[str]
    images: dict[str, Path]  # image id → file (for the object extraction)


def synthetic_vocab() -> list[str]:
    """BERT-base's vocabulary size (30,522: the embedding and its gradient cost the same)."""
    return SPECIAL_TOKENS + [f"w{i}" for i in range(30522 - len(SPECIAL_TOKENS))]


def synthetic_world(
    root: Path, size: str, seq_len: int, rows: int, needs: set, lengths: str = "full"
) -> SyntheticWorld:
    """A student of ``size`` (:data:`mmcse.tiny.SIZES`), a caption corpus of ``rows`` captions
    (``lengths``: one of :data:`LENGTHS`) and the ``(role, dim)`` sets of ``needs``."""
    if lengths not in LENGTHS:
        raise MmcseError(f"lengths must be one of {', '.join(LENGTHS)}, not {lengths!r}")
    vocab = synthetic_vocab()
    model = build_tiny_bert(root / "model", size=size, vocab=vocab, max_position_embeddings=512)
    rng = np.random.default_rng(0)
    num_words = len(vocab) - len(SPECIAL_TOKENS)
    captions = write_captions(root, rng, rows, seq_len, num_words, lengths)
    features = {}
    for role, dim in sorted(needs):
        features[role, dim] = str(write_role(root, role, dim, captions, rng))
    return SyntheticWorld(root, model, root / "captions", features)


def write_captions(
    root: Path, rng, rows: int, seq_len: int, num_words: int, lengths: str = "full"
) -> Captions:
    """Captions of distinct words (so phrases match once; their count by ``lengths``), ids
    sorted as the Stage-1 extraction orders them, one random image file per
    ``CAPTIONS_PER_IMAGE``."""
    from PIL import Image

    from pipeline.datasets.base import caption_id

    (root / "images").mkdir()
    ids, texts, image_ids, images = [], [], [], {}
    for n in range(-(-rows // CAPTIONS_PER_IMAGE)):
        image_id = f"img{n:06d}"
        images[image_id] = root / "images" / f"{image_id}.png"
        pixels = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images[image_id])
        for k in range(CAPTIONS_PER_IMAGE):
            words = rng.choice(num_words, size=word_count(rng, seq_len, lengths), replace=False)
            ids.append(caption_id(image_id, k))
            texts.append(" ".join(f"w{i}" for i in words))
            image_ids.append(image_id)
    write_corpus(root / "captions", ids, texts, image_ids=image_ids, dataset="bench", split="train")
    return Captions(ids, texts, image_ids, images)


def word_count(rng, seq_len: int, lengths: str) -> int:
    """Words of one caption (one token each, plus [CLS] and [SEP])."""
    if lengths == "full":
        return seq_len - 2
    scale = seq_len / 32  # the means were measured at length 32
    tokens = rng.normal(MEASURED_MEAN_TOKENS[lengths] * scale, 6.0 * scale)
    return int(np.clip(round(tokens) - 2, PHRASES_PER_CAPTION, seq_len - 2))


def write_role(root: Path, role: str, dim: int, captions: Captions, rng) -> Path:
    kind = role_kind(role)
    if kind == "object":
        return write_objects(root, captions)
    if kind in UNPAIRED_KINDS:
        return write_nonlinguistic(root, kind, rng)
    ids = sorted(set(captions.image_ids)) if kind == "image" else captions.ids
    values = rng.standard_normal((len(ids), dim), dtype=np.float32)
    return write_random_set(root / f"{role}-{dim}", ids, values, kind, "bench", "float16")


def write_random_set(
    out: Path, ids: list[str], values: np.ndarray, kind: str, dataset: str, dtype: str, **extra
) -> Path:
    """One feature set of (random) ``values`` keyed by ``ids``, through the cache writer."""
    write_feature_set(
        out,
        ids,
        values.astype(dtype),
        kind=kind,
        dim=values.shape[1],
        dtype=dtype,
        dataset=dataset,
        split="train",
        producer={"teacher": "random"},
        **extra,
    )
    return out


def write_objects(root: Path, captions: Captions) -> Path:
    """MCSEO's objects table and 2048-d object features, through the real extraction."""
    from pipeline.datasets.base import DatasetRecords, ImageRecord
    from pipeline.extract import RunOptions
    from pipeline.objects.extract import BoxesFile, ObjectSettings, extract_objects

    boxes = root / "boxes.jsonl"
    with boxes.open("w", encoding="utf-8") as f:
        for text, image_id in zip(captions.texts, captions.image_ids, strict=True):
            words = text.split()
            for p in range(PHRASES_PER_CAPTION):  # spread over the caption, boxes inside 64 px
                phrase = words[p * len(words) // PHRASES_PER_CAPTION]
                box = [4 * p, 4 * p, 32 + 4 * p, 40 + 4 * p]
                row = {"image_id": image_id, "caption": text, "phrase": phrase, "box": box}
                f.write(json.dumps(row) + "\n")
    by_image: dict[str, list[str]] = {}
    for text, image_id in zip(captions.texts, captions.image_ids, strict=True):
        by_image.setdefault(image_id, []).append(text)
    records = DatasetRecords(
        "bench",
        "train",
        [ImageRecord(i, captions.images[i], tuple(t)) for i, t in by_image.items()],
    )
    extract_objects(
        records,
        BoxesFile(boxes),
        None,
        resnet50_shaped_teacher(),
        "resnet50",
        root,  # its captions corpus is checked against the bench's (same ids and texts)
        settings=ObjectSettings(masks="box", caption_policy="all"),
        options=RunOptions(shard_size=4096, batch_size=256, workers=0, progress=False),
    )
    return root / "object-resnet50"


def resnet50_shaped_teacher():
    """Random one-Bottleneck-per-stage ResNet: ResNet-50's 2048-d output at a fraction of the
    cost (the object term's step time depends on the dim, not on the teacher)."""
    from torchvision.models.resnet import Bottleneck, ResNet

    from pipeline.teachers.resnet import TINY_PREPROCESS, ResNetTeacher
    from pipeline.teachers.runtime import WeightsInfo, seeded

    with seeded(0):
        net = ResNet(Bottleneck, [1, 1, 1, 1])
    dim = net.fc.in_features
    net.fc = torch.nn.Identity()
    weights = WeightsInfo("random", "resnet-bottleneck-1111", "random", 0)
    return ResNetTeacher("resnet50", dim, net, weights, size="tiny", preprocess=TINY_PREPROCESS)


def write_nonlinguistic(root: Path, kind: str, rng) -> Path:
    """VisualCSE's uint8 image tensors or AudioCSE's fbanks, at the writers' real row shapes."""
    from pipeline import nonling_cache as nc

    out = root / kind
    if kind == "image_tensor":
        examples = [
            nc.Example(f"c{i % NONLING_CLASSES}/x{i}", rng.integers(0, 256, (64, 64, 3), np.uint8))
            for i in range(NONLING_EXAMPLES)
        ]
        nc.write_image_tensors(examples, out, dataset="bench", workers=0)
        return out
    examples = []
    for i in range(NONLING_EXAMPLES):
        path = root / "wavs" / f"c{i % NONLING_CLASSES}" / f"x{i}.wav"
        write_noise_wav(path, rng)
        examples.append(nc.Example(f"c{i % NONLING_CLASSES}/x{i}", path))
    nc.write_audio_fbanks(examples, out, dataset="bench", workers=0)
    return out


def write_noise_wav(path: Path, rng) -> None:
    """A quarter second of noise: the fbank writer pads every row to its fixed ``[1024, 128]``
    shape."""
    samples = rng.integers(-8000, 8000, size=AUDIO_RATE // 4, dtype=np.int16)
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(AUDIO_RATE)
        f.writeframes(samples.astype("<i2").tobytes())


def method_needs(name: str) -> set[tuple[str, int]]:
    """The ``(role, dim)`` feature sets a method trains on."""
    return {(role, role_dim(name, role)) for role in roles_of(build_method(name, **args_of(name)))}


def args_of(name: str) -> dict:
    return METHOD_ARGS.get(name, {})
