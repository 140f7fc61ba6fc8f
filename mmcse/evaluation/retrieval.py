"""Cross-modal retrieval in a trained run's grounded space (the analyses of MCSE §5 / DALR).

A grounding method (MCSE, DALR, ...) trains two heads next to the student, in a loss term's
``student`` slot (``H -> d``, on the sentence embedding) and ``image`` slot (``D -> d``, on the
cached image feature), both Linear + Tanh, compared by cosine. After training they are saved in
``mmcse_heads.safetensors`` (the run info's ``term_heads`` says which term used which); here captions of a held-out image–caption set are embedded by the
student, both sides go through the heads, and every caption is ranked against every image:

* text→image: for each caption, the rank of *its* image among all images;
* image→text: for each image, the best rank of *any* of its captions among all captions (an
  image with 5 captions is a hit at k when one of them is in the top k — the usual COCO/Flickr
  protocol).

Recall@k (%, k = 1, 5, 10) is the share of queries whose rank is < k (ranks start at 0); the
median rank is reported 1-based (``floor(median(rank)) + 1``, as VSE++/SentEval's COCO task).
A rank counts the candidates with a strictly higher cosine (ties resolved in the query's
favour). The zero-shot baseline compares the raw sentence embedding with the raw image feature,
only when their dimensions match; otherwise it is reported as not applicable.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mmcse.cache import Corpus, FeatureSet
from mmcse.cache.manifest import Manifest
from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation.encode import encode_sentences, encoder_device
from mmcse.evaluation.report import _render
from mmcse.evaluation.sts import load_encoder
from mmcse.hub import local_or_hub_id
from mmcse.precision import precision_name
from mmcse.rundir import HEADS_FILE, Checkpoint

KS = (1, 5, 10)
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroundingHeads:
    """The text and image heads of one loss term of a run (Linear + Tanh each)."""

    term: str
    text_weight: torch.Tensor  # [d, H]
    text_bias: torch.Tensor
    image_weight: torch.Tensor  # [d, D]
    image_bias: torch.Tensor

    def text(self, x: np.ndarray) -> np.ndarray:
        return _head(x, self.text_weight, self.text_bias)

    def image(self, x: np.ndarray) -> np.ndarray:
        return _head(x, self.image_weight, self.image_bias)


def _head(x: np.ndarray, weight: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        out = torch.tanh(torch.as_tensor(x, dtype=torch.float32) @ weight.float().T + bias.float())
    return out.numpy()


def load_heads(model_dir: str | Path, term: str | None = None) -> GroundingHeads:
    """The grounding heads of one loss term of a checkpoint: the head in the term's ``student``
    slot (on the sentence embedding) and the one in its ``image`` slot (on the cached image
    feature). The run info records which saved head each term used; ``term=None`` takes the
    first term (by name) that has both."""
    from safetensors.torch import load_file

    path = Checkpoint(model_dir).heads
    if not path.is_file():
        raise MmcseError(
            f"{model_dir} has no {HEADS_FILE}: retrieval needs a run trained with a grounding "
            "method (mcse, dalr, ...), not a plain HF model"
        )
    state = load_file(str(path))
    pairs = {
        name: (f"heads.{slots['student']}.0.", f"heads.{slots['image']}.0.")
        for name, slots in _term_heads(Path(model_dir)).items()
        if {"student", "image"} <= slots.keys()
    }
    terms = sorted(t for t, keys in pairs.items() if all(k + "weight" in state for k in keys))
    if not terms:
        raise MmcseError(
            f"{path} holds no student + image head pair: the run's method has no image "
            "grounding term, so there is no shared text–image space to retrieve in"
        )
    chosen = term or terms[0]
    if chosen not in terms:
        raise MmcseError(f"no grounding heads for a term {chosen!r} in {path}; it has {terms}")
    text, image = pairs[chosen]
    return GroundingHeads(
        chosen,
        state[text + "weight"],
        state[text + "bias"],
        state[image + "weight"],
        state[image + "bias"],
    )


def _term_heads(model_dir: Path) -> dict[str, dict[str, str]]:
    """term → slot → saved head name, from the checkpoint's run info."""
    checkpoint = Checkpoint(model_dir)
    wiring = (checkpoint.read_info() or {}).get("term_heads")
    if not isinstance(wiring, dict):
        raise MmcseError(
            f"{checkpoint.run_info} does not record which heads each loss term used (term_heads); retrieval "
            "needs a checkpoint written by `mmcse train`"
        )
    return wiring


def load_pairs(images_features: str | Path, captions: str | Path):
    """Caption texts, each caption's image index, the image ids and their features."""

    for path, what in ((captions, "--captions"), (images_features, "--images-features")):
        if not Path(path).is_dir():
            raise MmcseError(f"{what} {path} is not a directory")
    corpus = Corpus.open(captions)
    image_of = corpus.image_ids
    if any(i is None for i in image_of):
        raise MmcseError(f"{captions}: captions without an image id cannot be scored")
    image_ids = list(dict.fromkeys(image_of))
    features = FeatureSet.open(images_features).gather(image_ids).astype(np.float32)
    index = {image: row for row, image in enumerate(image_ids)}
    return corpus.texts, np.array([index[i] for i in image_of]), image_ids, features


def check_held_out(model_dir: str | Path, captions: str | Path, image_ids: list[str]) -> None:
    """Refuse retrieval on the images the run trained on, and warn when only some of them are.

    The run info records the fingerprint (and path) of every corpus it trained on: ``captions``
    with one of those fingerprints is refused; otherwise its images are compared with those of
    the recorded caption corpora that are still where the run read them, unchanged."""

    recorded = (Checkpoint(model_dir).read_info() or {}).get("fingerprints") or {}
    trained = {
        key: entry
        for key, entry in recorded.items()
        if str(key).startswith("corpus:") and isinstance(entry, dict)
    }
    fingerprint = Manifest.read(captions).fingerprint
    for key, entry in trained.items():
        if entry.get("fingerprint") == fingerprint:
            raise MmcseError(
                f"--captions {captions} is the corpus the run trained on ({key}, fingerprint "
                f"{fingerprint[:16]}…): retrieval must be scored on held-out images (extract "
                "another split, e.g. mmcse extract-images --split test)"
            )
    wanted = set(image_ids)
    for key, entry in trained.items():
        path = entry.get("path")
        if not path or not Path(path).is_dir():
            logger.warning(
                f"{path or 'its path'} ({key}, which the run trained on) is gone: "
                "cannot tell whether the retrieval images are held out"
            )
            continue
        corpus = Corpus.open(path)
        if corpus.fingerprint != entry.get("fingerprint"):
            logger.warning(
                f"{path} changed since the run trained on it ({key}): cannot tell "
                "whether the retrieval images are held out"
            )
            continue
        seen = wanted & {i for i in corpus.image_ids if i is not None}
        if len(seen) == len(wanted):
            raise MmcseError(
                f"--captions {captions}: all {len(wanted)} of its images are in {path}, which "
                f"the run trained on ({key}); retrieval must be scored on held-out images"
            )
        if seen:
            logger.warning(
                f"{len(seen)} of the {len(wanted)} retrieval images of {captions} are in {path}, "
                f"which the run trained on ({key}): their scores are inflated; score held-out "
                "images only"
            )


def ranks(similarity: np.ndarray, caption_image: np.ndarray) -> dict[str, np.ndarray]:
    """0-based ranks: ``t2i`` per caption (``similarity`` is ``[images, captions]``), ``i2t``
    per image (best of its captions)."""
    correct = similarity[caption_image, np.arange(similarity.shape[1])]  # [captions]
    t2i = (similarity > correct[None, :]).sum(axis=0)
    i2t = np.empty(similarity.shape[0], dtype=np.int64)
    for image in range(similarity.shape[0]):
        own = similarity[image, caption_image == image]
        if own.size == 0:
            raise MmcseError(f"image row {image} has no caption")
        i2t[image] = int((similarity[image] > own.max()).sum())
    return {"t2i": t2i, "i2t": i2t}


def recall_table(rank: np.ndarray) -> dict[str, float]:
    out = {f"R@{k}": float(100.0 * np.mean(rank < k)) for k in KS}
    out["medr"] = float(np.floor(np.median(rank)) + 1)
    return out


def cosine(images: np.ndarray, texts: np.ndarray) -> np.ndarray:
    a = images / np.linalg.norm(images, axis=1, keepdims=True).clip(min=1e-12)
    b = texts / np.linalg.norm(texts, axis=1, keepdims=True).clip(min=1e-12)
    return a @ b.T


def score_space(images: np.ndarray, texts: np.ndarray, caption_image: np.ndarray) -> dict:
    r = ranks(cosine(images, texts), caption_image)
    return {"t2i": recall_table(r["t2i"]), "i2t": recall_table(r["i2t"])}


def evaluate_retrieval(
    model: str | Path,
    images_features: str | Path,
    captions: str | Path,
    pooler: str | None = None,
    batch_size: int = 128,
    device: str | None = None,
    head: str | None = None,
    progress: bool = False,
) -> dict:
    """Recall@1/5/10 and median rank both ways, grounded space and raw zero-shot baseline;
    ``details`` has the ``protocol`` (pooler, head, the two folders) and the ``environment``."""

    started = time.perf_counter()
    model_dir = local_or_hub_id(model)
    heads = load_heads(model_dir, head)  # fail before encoding anything
    texts, caption_image, image_ids, features = load_pairs(images_features, captions)
    if heads.image_weight.shape[1] != features.shape[1]:
        raise MmcseError(
            f"the run's image head takes {heads.image_weight.shape[1]}-d features but "
            f"{images_features} holds {features.shape[1]}-d ones: use the teacher it trained on"
        )
    check_held_out(model_dir, captions, image_ids)  # before encoding
    encoder, tokenizer, pooler, model_dir = load_encoder(model, pooler, device)
    # the heads read the pooled output training fed them, not its student's Normalize after it
    encoder.post_pooling = None
    sentences = encode_sentences(
        encoder,
        tokenizer,
        texts,
        batch_size=batch_size,
        device=device,
        pooler=pooler,
        progress=progress,
    )
    used = encoder_device(encoder, device)
    grounded = score_space(heads.image(features), heads.text(sentences), caption_image)
    if sentences.shape[1] == features.shape[1]:
        raw = score_space(features, sentences, caption_image)
    else:
        raw = f"n/a: sentence dim {sentences.shape[1]} != image feature dim {features.shape[1]}"
    return {
        "grounded": grounded,
        "raw": raw,
        "details": {
            "model": str(model_dir),
            "pooler": pooler,
            "head": heads.term,
            "images": len(image_ids),
            "captions": len(texts),
            "captions_per_image": round(len(texts) / len(image_ids), 2),
            "images_features": str(images_features),
            "captions_dir": str(captions),
            "seconds": round(time.perf_counter() - started, 2),
            "protocol": {
                "pooler": pooler,
                "head": heads.term,
                "images_features": str(Path(images_features).resolve()),
                "captions_dir": str(Path(captions).resolve()),
            },
            "environment": environment(used, precision_name(used)),
        },
    }


def format_retrieval_table(results: dict) -> str:

    header = ["space", "t2i R@1", "R@5", "R@10", "medr", "i2t R@1", "R@5", "R@10", "medr"]
    rows = []
    for space in ("grounded", "raw"):
        r = results[space]
        if isinstance(r, str):
            rows.append([space, *(["–"] * 8)])
            continue
        cells = [space]
        for direction in ("t2i", "i2t"):
            d = r[direction]
            cells += [f"{d['R@1']:.2f}", f"{d['R@5']:.2f}", f"{d['R@10']:.2f}", f"{d['medr']:.0f}"]
        rows.append(cells)
    lines = _render(header, rows)
    d = results["details"]
    if isinstance(results["raw"], str):
        lines.append(f"raw baseline {results['raw']}")
    lines.append(
        f"retrieval | heads {d['head']} | {d['images']} images, {d['captions']} captions | "
        f"model {d['model']} | {d['seconds']:.1f} s"
    )
    return "\n".join(lines)
