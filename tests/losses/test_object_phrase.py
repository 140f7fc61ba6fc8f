"""MCSEO's object–phrase loss, token spans from BERT/RoBERTa offsets, and the phrase collate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs
from mmcse.losses.object_phrase import ObjectPhraseInfoNCELoss, mean_over_spans
from mmcse.training.phrases import ObjectPhrase, build_phrase_batch, char_span_to_tokens

CAPTIONS = [
    "A man in a red shirt throws a ball to a dog.",
    "Two women sit on a bench near the lake.",
]


def loop_loss(phrases, objects, mask, temperature):
    """Eq. 7 with explicit loops: per pair, Σ over phrases of −log softmax over the pair's objects."""
    phrases, objects = phrases.detach(), objects.detach()
    total = 0.0
    for b in range(phrases.shape[0]):
        valid = [p for p in range(phrases.shape[1]) if mask[b, p]]
        if len(valid) < 2:
            continue
        for k in valid:
            sims = []
            for j in valid:
                a, o = phrases[b, k], objects[b, j]
                sims.append(float(a @ o) / (float(a.norm()) * float(o.norm())) / temperature)
            top = max(sims)
            log_sum = top + math.log(sum(math.exp(s - top) for s in sims))
            total += log_sum - sims[valid.index(k)]
    return total / phrases.shape[0]


def test_loss_matches_loop_computation():
    torch.manual_seed(0)
    phrases, objects = torch.randn(3, 4, 8), torch.randn(3, 4, 8)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    got = ObjectPhraseInfoNCELoss.compute_loss_from_embeddings(phrases, objects, mask, 0.05)
    assert got.item() == pytest.approx(loop_loss(phrases, objects, mask, 0.05), rel=1e-5)


def test_pairs_with_fewer_than_two_objects_are_skipped_but_keep_the_graph():
    phrases = torch.randn(2, 2, 4, requires_grad=True)
    objects = torch.randn(2, 2, 4)
    mask = torch.tensor([[True, False], [False, False]])
    loss = ObjectPhraseInfoNCELoss.compute_loss_from_embeddings(phrases, objects, mask)
    assert loss.item() == 0.0
    loss.backward()
    assert phrases.grad is not None


def test_mean_over_spans_matches_loop():
    torch.manual_seed(1)
    states = torch.randn(2, 7, 5)
    spans = torch.tensor([[[1, 3], [4, 7]], [[0, 1], [-1, -1]]])
    got = mean_over_spans(states, spans)
    for b in range(2):
        for p in range(2):
            start, end = spans[b, p].tolist()
            expected = states[b, start:end].mean(0) if start >= 0 else torch.zeros(5)
            assert torch.allclose(got[b, p], expected, atol=1e-6)


def test_forward_uses_both_views_and_needs_token_states():
    torch.manual_seed(2)
    loss = ObjectPhraseInfoNCELoss(
        hidden_size=6, feature_dims={"object": 10}, proj_dim=4, views="sum"
    )
    assert loss.needs_token_states
    states = (torch.randn(2, 5, 6), torch.randn(2, 5, 6))
    spans = torch.tensor([[[1, 2], [2, 4]], [[1, 3], [3, 4]]])
    extras = {"phrase_spans": spans, "phrase_mask": torch.ones(2, 2, dtype=torch.bool)}
    objects = torch.randn(2, 2, 10)
    inputs = LossInputs(
        torch.randn(2, 6),
        torch.randn(2, 6),
        features={"object": objects},
        batch_kind="caption",
        token_states=states,
        extras=extras,
    )
    got = loss(inputs)["object_phrase_loss"]
    o = loss.object_head(objects)
    expected = sum(
        loop_loss(loss.phrase_head(mean_over_spans(s, spans)), o, extras["phrase_mask"], 0.05)
        for s in states
    )
    assert got.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="token states"):
        loss(LossInputs(torch.randn(2, 6), torch.randn(2, 6), extras=extras))


# ---- token spans ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    from transformers import AutoTokenizer

    from mmcse.tiny import build_tiny_bert
    from pipeline.objects.florence import byte_level_bpe_tokenizer

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
