"""Sentence-encoder text teachers (BERT-base): SimCSE, DiffCSE, RankCSE.

DALR (He et al., 2025, §3.3 and App. E.2) distils ranking information from frozen unsupervised
sentence encoders, as RankCSE does: SimCSE + DiffCSE by default, RankCSE or CLIP's text tower as
alternatives (``clip-text``, in :mod:`pipeline.teachers.clip`). Each teacher embeds a sentence
with its own evaluation pooling — ``cls_before_pooler`` (last-layer [CLS], no MLP) for all three,
as their released evaluation commands use — truncated at ``max_length=32`` tokens like the
students (configurable).

Checkpoints: ``princeton-nlp/unsup-simcse-bert-base-uncased`` (the SimCSE authors),
``voidism/diffcse-bert-base-uncased-sts`` (the DiffCSE authors' STS-selected model) and
``perceptiveshawty/rankcse-listmle-bert-base-uncased`` — RankCSE's authors released no
checkpoint; this is the public community reproduction (ListMLE, BERT-base, trained with the
DiffCSE + SimCSE teachers), so DALR's "SimCSE+RankCSE" row may not be reproduced exactly.

Random init (``weights="random"``) builds BERT-base from its config in code. Without
``tokenizer=DIR`` it uses a whole-word WordPiece tokenizer over a tiny vocabulary (most words
become one [UNK] token, about as many tokens as real WordPiece produces): for speed only.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from torch import Tensor

from mmcse.errors import MmcseError
from mmcse.hub import quiet_transformers
from mmcse.pooling import POOLERS, needs_hidden_states, pool
from mmcse.tiny import word_vocab
from pipeline.teachers.runtime import TextEncoding, WeightsInfo, seeded
from pipeline.teachers.weights import hf_snapshot, hf_weight_files, weights_kind, weights_sha256

BERT_BASE = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
)
BERT_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
SPEED_TOKENIZER = "wordpiece-speed-only"


def load_tokenizer(source: str | Path):
    from transformers import AutoTokenizer

    quiet_transformers()
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as exc:
        raise MmcseError(f"{source}: no usable tokenizer there ({type(exc).__name__})") from exc


def speed_tokenizer():
    """A whole-word BERT tokenizer over a handful of words (random-init teachers only)."""
    from transformers import BertTokenizer

    vocab = word_vocab(["a the of and in on with is are man woman dog people , ."])
    return BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)


def random_init_tokenizer(tokenizer: str | None):
    """``(tokenizer, source)`` for a random-init teacher: ``tokenizer`` DIR, else speed-only."""
    if tokenizer:
        return load_tokenizer(tokenizer), str(tokenizer)
    return speed_tokenizer(), SPEED_TOKENIZER


class HFTextTeacher(TextEncoding):
    backend = "transformers"

    def __init__(
        self, *args, tokenizer, tokenizer_source: str, pooling: str, max_length: int, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer = tokenizer
        self.tokenizer_source = tokenizer_source
        self.pooling = pooling
        self.max_length = max_length

    def _embed_tokens(self, batch: dict[str, Tensor]) -> Tensor:
        out = self.modules(
            **batch, output_hidden_states=needs_hidden_states(self.pooling), return_dict=True
        )
        return pool(out, batch["attention_mask"], self.pooling)


def build_bert_teacher(
    name: str,
    hub_id: str,
    default_pooling: str,
    weights: str = "default",
    *,
    size: str = "real",
    seed: int = 0,
    dtype=None,
    max_length: int = 32,
    batch_size: int = 128,
    tokenizer: str | None = None,
    pooling: str | None = None,
) -> HFTextTeacher:
    from transformers import AutoModel, BertConfig, BertModel

    quiet_transformers()
    pooling = pooling or default_pooling
    if pooling not in POOLERS:
        raise MmcseError(f"{name}: unknown pooling {pooling!r}; choose one of {POOLERS}")
    kind = weights_kind(weights)
    if size == "tiny" and kind == "default":
        raise MmcseError(f"{name}: size='tiny' has no published weights; use weights='random'")
    if kind == "random":
        tok, tok_source = random_init_tokenizer(tokenizer)
        arch = dict(BERT_BASE) if size == "real" else {**BERT_TINY, "max_position_embeddings": 128}
        arch["vocab_size"] = max(arch.get("vocab_size", 0), len(tok))
        with seeded(seed):
            model = BertModel(BertConfig(**arch))
        info = WeightsInfo("random", f"bert-{size}", "random", seed)
    else:
        model_dir = hf_snapshot(hub_id) if kind == "default" else Path(weights)
        if not (model_dir / "config.json").is_file():
            raise MmcseError(
                f"{weights}: a text teacher takes an HF model directory (config.json, weights, "
                f"tokenizer)"
            )
        model = AutoModel.from_pretrained(str(model_dir))
        tok_source = str(tokenizer or (hub_id if kind == "default" else model_dir))
        tok = load_tokenizer(tokenizer or model_dir)
        source = hub_id if kind == "default" else str(weights)
        info = WeightsInfo(kind, source, weights_sha256(hf_weight_files(model_dir)))
    max_length = min(max_length, model.config.max_position_embeddings)
    return HFTextTeacher(
        name,
        model.config.hidden_size,
        model,
        info,
        size=size,
        dtype=dtype,
        tokenizer=tok,
        tokenizer_source=tok_source,
        pooling=pooling,
        max_length=max_length,
        batch_size=batch_size,
    )


#: registry name → (hub id, the authors' evaluation pooling). The ``-roberta`` pair share
#: RoBERTa's tokenizer: DALR's released code feeds the student's token ids to its teachers
#: (``model_modified.py:670–683``), so its RoBERTa rows needed RoBERTa teachers; these are the
#: SimCSE and DiffCSE authors' published RoBERTa-base checkpoints (docs/fidelity.md, DALR)
BERT_TEACHERS = {
    "simcse": ("princeton-nlp/unsup-simcse-bert-base-uncased", "cls_before_pooler"),
    "diffcse": ("voidism/diffcse-bert-base-uncased-sts", "cls_before_pooler"),
    "simcse-roberta": ("princeton-nlp/unsup-simcse-roberta-base", "cls_before_pooler"),
    "diffcse-roberta": ("voidism/diffcse-roberta-base-sts", "cls_before_pooler"),
    "rankcse": ("perceptiveshawty/rankcse-listmle-bert-base-uncased", "cls_before_pooler"),
}


def bert_factories() -> dict:
    return {
        name: partial(build_bert_teacher, name, hub_id, pooling)
        for name, (hub_id, pooling) in BERT_TEACHERS.items()
    }
