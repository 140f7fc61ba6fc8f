"""Small generated worlds: a word list, random sentences, SentEval transfer tasks, image folders,
WAV files, recipe caches."""

from __future__ import annotations

import random
import wave
from pathlib import Path

import numpy as np

SR = 16000  # sample rate of the generated WAV files

WORDS = [
    "a",
    "the",
    "man",
    "woman",
    "dog",
    "cat",
    "red",
    "blue",
    "small",
    "big",
    "runs",
    "sits",
    "on",
    "in",
    "park",
    "street",
    "with",
    "ball",
    "car",
]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]


def _sentence(rng: random.Random, marker: str) -> str:
    return " ".join([marker, *(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))])


def write_downstream(root: Path, n: int = 30) -> Path:
    """Tiny copies of the 7 tasks in SentEval's layout; the class is readable from one word."""
    rng = random.Random(0)
    down = root / "downstream"
    files = {
        "MR": ("rt-polarity.pos", "rt-polarity.neg"),
        "CR": ("custrev.pos", "custrev.neg"),
        "SUBJ": ("subj.objective", "subj.subjective"),
        "MPQA": ("mpqa.pos", "mpqa.neg"),
    }
    for folder, (pos, neg) in files.items():
        (down / folder).mkdir(parents=True)
        (down / folder / pos).write_text("\n".join(_sentence(rng, "dog") for _ in range(n)) + "\n")
        (down / folder / neg).write_text("\n".join(_sentence(rng, "cat") for _ in range(n)) + "\n")
    sst = down / "SST" / "binary"
    sst.mkdir(parents=True)
    for split, size in (("train", 3 * n), ("dev", n), ("test", n)):
        lines = [f"{_sentence(rng, 'dog' if i % 2 else 'cat')}\t{i % 2}" for i in range(size)]
        (sst / f"sentiment-{split}").write_text("\n".join(lines) + "\n")
    (down / "TREC").mkdir()
    coarse = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    marker = ["a", "the", "man", "woman", "car", "ball"]
    for file, size in (("train_5500.label", 6 * n), ("TREC_10.label", 60)):
        lines = [f"{coarse[i % 6]}:fine {_sentence(rng, marker[i % 6])}" for i in range(size)]
        (down / "TREC" / file).write_text("\n".join(lines) + "\n")
    (down / "MRPC").mkdir()
    for file, size in (("msr_paraphrase_train.txt", 3 * n), ("msr_paraphrase_test.txt", n)):
        lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(size):
            first = _sentence(rng, "dog")
            second = first if i % 2 else _sentence(rng, "cat")
            lines.append(f"{i % 2}\t{i}\t{i + 1}\t{first}\t{second}")
        (down / "MRPC" / file).write_text("\n".join(lines) + "\n")
    return root


def write_sine_wav(path: Path, freq: float, seconds: float = 0.5, amplitude: float = 0.5) -> None:
    t = np.arange(int(seconds * SR)) / SR
    samples = (amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SR)
        f.writeframes(samples.tobytes())


def make_image_folder(root: Path, per_class: int = 4) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog", "owl"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            size = (40 + 8 * i, 36 + 4 * c)
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"img{i}.png")
    return root


def write_tiny_cache(recipe, root: Path) -> None:
    """Random features for every set the recipe reads, at the paths the convention gives."""
    from mmcse.cache import write_corpus
    from mmcse.demo.synthetic import write_random_set

    rng = np.random.default_rng(0)
    captions = sentences(48, seed=2)
    image_ids = [f"img{i // 2}" for i in range(len(captions))]
    caption_ids = [f"{im}#{i % 2}" for i, im in enumerate(image_ids)]
    wiki_ids = [f"wiki1m-{i:07d}" for i in range(64)]
    for need in recipe.needs(root):
        if need.key == "text_corpus":
            write_corpus(
                need.path, wiki_ids, sentences(64, seed=1), dataset="wiki1m", split="train"
            )
        elif need.key == "caption_corpus":
            extra = {"caption_policy": recipe.caption_policy}
            write_corpus(need.path, caption_ids, captions, image_ids=image_ids,
                         dataset=recipe.caption_dataset, split="train", extra=extra)  # fmt: skip
        else:
            feature = recipe.roles[need.key.removeprefix("features.")]
            if feature.kind == "image":
                ids = sorted(set(image_ids))
            elif feature.kind == "text":
                ids = wiki_ids if need.corpus == "text" else caption_ids
            elif feature.kind == "object":  # MCSEO's set; unread while its weight is 0
                ids = [f"{c}/0" for c in caption_ids]
            else:
                write_unpaired(feature.kind, need.path)
                continue
            values = rng.standard_normal((len(ids), feature_width(feature))).astype(np.float32)
            write_random_set(need.path, ids, values, feature.kind, str(recipe.caption_dataset),
                             "float32")  # fmt: skip


def feature_width(feature) -> int:
    """16, except CLIP ViT-L/14 images: as wide as the tiny student, as the real ones are as wide
    as BERT-base (768) — DALR's released ℓ_CMA compares them raw with the student's pooler."""
    from mmcse.tiny import SIZES

    if feature.kind == "image" and feature.teacher == "clip-vit-l14":
        return SIZES["tiny"]["hidden_size"]
    return 16


def write_unpaired(kind: str, path: Path) -> None:
    from pipeline import nonling_cache as nc
    from pipeline.fbank import FbankConfig

    scratch = path.parent / "raw"
    if kind == "image_tensor":
        folder = make_image_folder(scratch)
        examples = nc.class_folder(folder, nc.IMAGE_SUFFIXES)
        nc.write_image_tensors(examples, path, dataset="toy", size=40, workers=0)
        return
    for speaker, freq in (("s1", 220.0), ("s2", 880.0)):
        for i in range(3):
            write_sine_wav(scratch / speaker / f"u{i}.wav", freq * (1 + 0.1 * i))
    cfg = FbankConfig(num_mel_bins=32, target_frames=48)
    examples = nc.class_folder(scratch, nc.AUDIO_SUFFIXES)
    nc.write_audio_fbanks(examples, path, dataset="sines", cfg=cfg, workers=0)


#: tiny settings for the non-linguistic task (what the 224-px / 1024-frame defaults become)
TINY_METHOD_ARGS = {
    "visualcse": {"image_batch_size": 4, "image_size": 32},
    "audiocse": {"audio_batch_size": 4, "audio_patch_size": 16},
    # object-phrase pairs need an objects table from a detector run (tested with the loss)
    "mcseo": {"object_phrase_weight": 0.0},
}
