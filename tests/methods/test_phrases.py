"""MCSEO's phrase collate: token spans from BERT/RoBERTa offsets, padding, truncated pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.phrases import build_phrase_batch

from mmcse.errors import MmcseError
from mmcse.methods.phrases import (
    ObjectPhrase,
    PhraseIndex,
    char_span_to_tokens,
)

CAPTIONS = [
    "A man in a red shirt throws a ball to a dog.",
    "Two women sit on a bench near the lake.",
]


# ---- token spans ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from support.objects import byte_level_bpe_tokenizer
    from transformers import AutoTokenizer

    from mmcse.tiny import build_tiny_bert

    bert_dir = build_tiny_bert(tmp_path_factory.mktemp("bert"), texts=CAPTIONS)
    return {
        "bert": AutoTokenizer.from_pretrained(bert_dir),
        "roberta": byte_level_bpe_tokenizer(CAPTIONS * 3),
    }


@pytest.mark.parametrize("name", ["bert", "roberta"])
@pytest.mark.parametrize("phrase", ["A man", "a red shirt", "a ball", "a dog"])
def test_token_span_covers_exactly_the_phrase(tokenizers, name, phrase):
    tokenizer = tokenizers[name]
    caption = CAPTIONS[0]
    start = caption.find(phrase)
    end = start + len(phrase)
    encoded = tokenizer(caption, return_offsets_mapping=True, return_tensors="pt")
    span = char_span_to_tokens(encoded["offset_mapping"][0], start, end)
    assert span is not None
    pieces = encoded["input_ids"][0, span[0] : span[1]]
    assert tokenizer.decode(pieces).strip().lower() == phrase.lower()


@pytest.mark.parametrize("name", ["bert", "roberta"])
def test_phrases_cut_off_by_max_length_have_no_span(tokenizers, name):
    tokenizer = tokenizers[name]
    caption = CAPTIONS[0]
    encoded = tokenizer(caption, max_length=5, truncation=True, return_offsets_mapping=True)
    offsets = torch.tensor(encoded["offset_mapping"])
    start = caption.find("a dog")
    assert char_span_to_tokens(offsets, start, start + 5) is None
    assert char_span_to_tokens(offsets, 0, 5) is not None  # "A man" is still inside


# ---- collate -------------------------------------------------------------------------------


class FakeTable:
    path = "objects"

    def __init__(self, pairs):
        self.pairs = pairs

    def pairs_for(self, caption_id):
        return self.pairs.get(caption_id, [])


class FakeFeatures:
    dim = 3

    def gather(self, ids):
        return np.array([[float(i.split("/")[1]), len(i), 1.0] for i in ids], dtype=np.float32)


def pair(caption: str, phrase: str, object_id: str) -> ObjectPhrase:
    start = caption.find(phrase)
    return ObjectPhrase(object_id, start, start + len(phrase), phrase)


def test_build_phrase_batch_pads_and_drops_truncated_pairs(tokenizers):
    tokenizer = tokenizers["bert"]
    c0, c1 = CAPTIONS
    table = FakeTable(
        {
            "0#0": [pair(c0, "A man", "0#0/0"), pair(c0, "a dog", "0#0/1")],
            "1#0": [pair(c1, "Two women", "1#0/0"), pair(c1, "a bench", "1#0/1")],
        }
    )
    encoded = tokenizer(
        [c0, c1],
        max_length=8,
        truncation=True,
        padding=True,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    batch = build_phrase_batch(
        ["0#0", "1#0"], [c0, c1], encoded["offset_mapping"], table, FakeFeatures()
    )
    assert batch.spans.shape == (2, 2, 2)
    assert batch.mask.tolist() == [[True, False], [True, True]]  # "a dog" is past 8 tokens
    assert batch.spans[0, 1].tolist() == [-1, -1]
    assert batch.objects[1, 1].tolist() == [1.0, 5.0, 1.0]  # paired with object 1#0/1
    assert batch.objects[0, 1].abs().sum() == 0


class FakeFeatureSet:
    dim = 2

    def take(self, rows):
        return np.stack([[r, -r] for r in rows]).astype(np.float32)


def test_phrase_index_pads_to_the_batch_or_statically_to_the_corpus():
    """Static padding (a captured step: one shape) pads to the corpus's most pairs; the extra
    slots are padding and the rest is the dynamically padded batch."""
    spans = np.array(
        [[[1, 2], [3, 4], [5, 6]], [[1, 3], [-1, -1], [-1, -1]], [[2, 3], [4, 5], [-1, -1]]]
    )
    object_rows = np.array([[0, 1, 2], [3, -1, -1], [4, 5, -1]])
    index = PhraseIndex(spans, object_rows, FakeFeatureSet())
    rows = np.array([1, 2])
    dynamic, static = index.batch(rows), index.batch(rows, static=True)
    assert dynamic.mask.shape == (2, 2) and static.mask.shape == (2, 3)
    assert torch.equal(static.mask[:, :2], dynamic.mask) and not static.mask[:, 2].any()
    assert torch.equal(static.spans[:, :2], dynamic.spans) and (static.spans[:, 2] == -1).all()
    assert torch.equal(static.objects[:, :2], dynamic.objects)
    assert static.objects[0, 0].tolist() == [3.0, -3.0] and static.objects[:, 2].abs().sum() == 0


def test_build_phrase_batch_refuses_a_different_caption(tokenizers):
    tokenizer = tokenizers["bert"]
    table = FakeTable({"0#0": [pair(CAPTIONS[0], "A man", "0#0/0")]})
    other = "The cat sat on the mat."
    encoded = tokenizer([other], return_offsets_mapping=True, return_tensors="pt")
    with pytest.raises(MmcseError, match="different captions"):
        build_phrase_batch(["0#0"], [other], encoded["offset_mapping"], table, FakeFeatures())


def test_mcseo_method_composition():
    from mmcse.methods import build_method

    method = build_method("mcseo")
    weights = {t.name: (t.weight, t.on) for t in method.terms()}
    assert weights == {
        "simcse": (1.0, "all"),
        "image_text": (0.01, "caption"),
        "object_phrase": (0.005, "caption"),
    }
    assert set(method.caption_roles) == {"image", "object"}
