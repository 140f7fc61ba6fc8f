"""Tiny models built from configs: tests, the offline demo and speed benchmarks (no weights).

Nothing here is a special code path: a tiny model is saved as an ordinary HF model directory and
then loaded exactly like a hub checkpoint or a local fine-tuned model.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from mmcse.hub import quiet_transformers

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
#: the most words a built vocabulary keeps (about BERT-base's 30,522 entries)
MAX_WORDS = 30000

#: BERT-shaped configs by size name; ``base`` is BERT-base (random init: speed needs no weights)
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "small": dict(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
    ),
    "base": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
}


def word_vocab(texts: Iterable[str]) -> list[str]:
    """Whole-word vocabulary (lower-cased, punctuation split like BERT's basic tokenizer): the
    :data:`MAX_WORDS` most frequent words."""
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    words = [w for w, _ in counts.most_common(MAX_WORDS)]
    return SPECIAL_TOKENS + sorted(set(words) - set(SPECIAL_TOKENS))


def build_tiny_bert(
    out_dir: str | Path,
    texts: Iterable[str] | None = None,
    size: str = "tiny",
    vocab: list[str] | None = None,
    max_position_embeddings: int = 128,
) -> Path:
    """Write a randomly initialised (seed 0) BERT of ``size`` plus a WordPiece tokenizer to
    ``out_dir``.

    The vocabulary is ``vocab`` if given, else every word of ``texts`` (so no word is [UNK]), else
    a small fixed one. Returns ``out_dir``.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    quiet_transformers()
    if vocab is None:
        vocab = word_vocab(texts or ["a the of and , ."])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    tokenizer.model_max_length = max_position_embeddings
    config = BertConfig(
        vocab_size=len(vocab), max_position_embeddings=max_position_embeddings, **SIZES[size]
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
