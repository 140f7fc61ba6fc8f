"""Tiny models built from configs: tests, the offline demo and speed benchmarks (no weights).

Nothing here is a special code path: a tiny model is saved as an ordinary HF model directory and
then loaded exactly like a hub checkpoint or a local fine-tuned model.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from mmcse.hub import quiet_transformers

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

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


def word_vocab(texts: Iterable[str], max_size: int = 30000, min_count: int = 1) -> list[str]:
    """Whole-word vocabulary (lower-cased, punctuation split like BERT's basic tokenizer)."""
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    words = [w for w, c in counts.most_common(max_size) if c >= min_count]
    return SPECIAL_TOKENS + sorted(set(words) - set(SPECIAL_TOKENS))


def build_tiny_bert(
    out_dir: str | Path,
    texts: Iterable[str] | None = None,
    size: str = "tiny",
    vocab: list[str] | None = None,
    max_position_embeddings: int = 128,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised BERT of ``size`` plus a WordPiece tokenizer to ``out_dir``.

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
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# ---- a tiny student of every registered architecture (mmcse.students) ------------------------

ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # <mask> last, as XLM-R's vocabulary has it
MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
DEBERTA_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def _trained(model, pre_tokenizer, trainer, texts: list[str]):
    """A ``tokenizers`` model trained on ``texts`` (milliseconds at this size)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def _byte_bpe(texts: list[str], specials: list[str], vocab_size: int = 400):
    """A byte-level BPE (RoBERTa's and ModernBERT's kind) trained on ``texts``."""
    from tokenizers import models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet
    )
    return _trained(models.BPE(), pre_tokenizers.ByteLevel(add_prefix_space=False), trainer, texts)


def _unigram_pieces(texts: list[str], specials: list[str], unk: str) -> list[tuple[str, float]]:
    """A SentencePiece-style Unigram vocabulary (XLM-R's and DeBERTa-v3's kind): (piece, score)."""
    from tokenizers import models, pre_tokenizers, trainers

    alphabet = len(set("".join(texts)))  # Unigram keeps every character: room for them all
    trainer = trainers.UnigramTrainer(
        vocab_size=len(specials) + alphabet + 200, special_tokens=specials, unk_token=unk
    )
    trained = _trained(models.Unigram(), pre_tokenizers.Metaspace(), trainer, texts)
    return [tuple(piece) for piece in json.loads(trained.to_str())["model"]["vocab"]]


def tiny_tokenizer(model_type: str, texts: list[str]):
    """``(tokenizer, special ids)``: the tokenizer class the architecture ships with, its
    vocabulary trained offline on ``texts``: WordPiece (BERT, DistilBERT, ELECTRA, MPNet),
    byte-level BPE (RoBERTa, ModernBERT), Unigram (XLM-R, DeBERTa-v3)."""
    import transformers

    if model_type in ("bert", "distilbert", "electra"):
        name = {"bert": "Bert", "distilbert": "DistilBert", "electra": "Electra"}[model_type]
        vocab = {w: i for i, w in enumerate(word_vocab(texts))}
        return getattr(transformers, f"{name}Tokenizer")(vocab=vocab, do_lower_case=True)
    if model_type == "mpnet":
        words = [w for w in word_vocab(texts) if w not in SPECIAL_TOKENS]
        vocab = {w: i for i, w in enumerate(MPNET_SPECIALS + words)}
        return transformers.MPNetTokenizer(vocab=vocab, do_lower_case=True)
    if model_type == "roberta":
        trained = json.loads(_byte_bpe(texts, [*ROBERTA_SPECIALS, "<mask>"]).to_str())["model"]
        merges = [
            tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]
        ]
        return transformers.RobertaTokenizer(vocab=trained["vocab"], merges=merges)
    if model_type == "xlm-roberta":
        pieces = _unigram_pieces(texts, ROBERTA_SPECIALS, "<unk>")
        return transformers.XLMRobertaTokenizer(vocab=[*pieces, ("<mask>", 0.0)])
    if model_type == "deberta-v2":
        pieces = _unigram_pieces(texts, DEBERTA_SPECIALS, "[UNK]")
        return transformers.DebertaV2Tokenizer(vocab=[*pieces, ("[MASK]", 0.0)])
    if model_type == "modernbert":
        from tokenizers import processors

        bpe = _byte_bpe(texts, MODERNBERT_SPECIALS)
        cls, sep = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
        bpe.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )  # fmt: skip
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            pad_token="[PAD]", mask_token="[MASK]",
        )  # fmt: skip
    raise ValueError(f"no tiny tokenizer for model_type {model_type!r}")


def tiny_config(model_type: str, tokenizer, max_position_embeddings: int = 128):
    """A transformers config of ``model_type`` at the ``tiny`` size (hidden 32, 2 layers)."""
    from transformers import CONFIG_MAPPING

    size, positions = SIZES["tiny"], max_position_embeddings
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if model_type == "distilbert":
        return CONFIG_MAPPING[model_type](
            dim=size["hidden_size"], n_layers=size["num_hidden_layers"],
            n_heads=size["num_attention_heads"], hidden_dim=size["intermediate_size"],
            max_position_embeddings=positions, **ids,
        )  # fmt: skip
    extra: dict = {}
    if model_type in ("roberta", "xlm-roberta", "mpnet"):  # positions count after the pad id
        positions += tokenizer.pad_token_id + 1
        extra = dict(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if model_type == "deberta-v2":  # DeBERTa-v3's shape: relative attention, no absolute one
        extra = dict(relative_attention=True, position_biased_input=False, max_relative_positions=-1,
                     pos_att_type=["p2c", "c2p"], position_buckets=32, norm_rel_ebd="layer_norm",
                     share_att_key=True, type_vocab_size=0)  # fmt: skip
    if model_type == "modernbert":  # a local window narrower than a sentence (packing keeps it)
        extra = dict(local_attention=8, global_attn_every_n_layers=2,
                     cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                     bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)  # fmt: skip
    return CONFIG_MAPPING[model_type](max_position_embeddings=positions, **size, **ids, **extra)


def build_tiny_student(
    model_type: str,
    out_dir: str | Path,
    texts: Iterable[str] | None = None,
    max_position_embeddings: int = 128,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised tiny ``model_type`` (hidden 32, 2 layers) plus the kind of
    tokenizer it ships with, trained on ``texts``, to ``out_dir``; returns ``out_dir``."""
    import torch
    from transformers import AutoModel

    quiet_transformers()
    texts = list(texts or ["a the of and , ."])
    tokenizer = tiny_tokenizer(model_type, texts)
    tokenizer.model_max_length = max_position_embeddings
    config = tiny_config(model_type, tokenizer, max_position_embeddings)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    AutoModel.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
