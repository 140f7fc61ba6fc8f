"""A tiny student of every registered architecture (:mod:`mmcse.students`), and the README's
"Students" table the registry renders.

A tiny student is a randomly initialised transformers model of the architecture's own config
(hidden 32, 2 layers) with the kind of tokenizer it ships with, its vocabulary trained offline on
the test's texts, saved like a hub checkpoint so the library loads it as it loads any model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from mmcse.hub import quiet_transformers
from mmcse.students import FLEX, STUDENTS, VARLEN, default_attention
from mmcse.tiny import SIZES, SPECIAL_TOKENS, word_vocab

ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # <mask> last, as XLM-R's vocabulary has it
MPNET_SPECIALS = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]
DEBERTA_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
#: marks the packed attentions a CUDA test proves (``pytest -m cuda``), the others a CPU test
GPU_MARK = "*"


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


def _modernbert_tokenizer(texts: list[str]):
    """A byte-level BPE wrapping each sentence (pair) in ``[CLS] … [SEP]``, as ModernBERT's."""
    import transformers
    from tokenizers import processors

    bpe = _byte_bpe(texts, MODERNBERT_SPECIALS)
    cls, sep = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
    bpe.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )


def tiny_tokenizer(model_type: str, texts: list[str]):
    """The tokenizer class the architecture ships with, its vocabulary trained offline on
    ``texts``: WordPiece (BERT, DistilBERT, ELECTRA, MPNet), byte-level BPE (RoBERTa,
    ModernBERT), Unigram (XLM-R, DeBERTa-v3)."""
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
        return _modernbert_tokenizer(texts)
    raise ValueError(f"no tiny tokenizer for model_type {model_type!r}")


def _architecture_fields(model_type: str, tokenizer) -> dict:
    """The config fields an architecture needs beyond the tiny size and the vocabulary."""
    if model_type in ("roberta", "xlm-roberta", "mpnet"):
        return dict(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if model_type == "deberta-v2":  # DeBERTa-v3's shape: relative attention, no absolute one
        return dict(
            relative_attention=True,
            position_biased_input=False,
            max_relative_positions=-1,
            pos_att_type=["p2c", "c2p"],
            position_buckets=32,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            type_vocab_size=0,
        )
    if model_type == "modernbert":  # a local window narrower than a sentence (packing keeps it)
        return dict(
            local_attention=8,
            global_attn_every_n_layers=2,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
    return {}


def tiny_config(model_type: str, tokenizer, max_position_embeddings: int = 128):
    """A transformers config of ``model_type`` at the ``tiny`` size (hidden 32, 2 layers)."""
    from transformers import CONFIG_MAPPING

    size, positions = SIZES["tiny"], max_position_embeddings
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if model_type == "distilbert":
        return CONFIG_MAPPING[model_type](
            dim=size["hidden_size"],
            n_layers=size["num_hidden_layers"],
            n_heads=size["num_attention_heads"],
            hidden_dim=size["intermediate_size"],
            max_position_embeddings=positions,
            **ids,
        )
    if model_type in ("roberta", "xlm-roberta", "mpnet"):  # positions count after the pad id
        positions += tokenizer.pad_token_id + 1
    extra = _architecture_fields(model_type, tokenizer)
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


def students_table() -> str:
    """The README's "Students" table, one row per registered architecture."""
    rows = [
        "| student (`model_type`) | attention (`auto` first) | `--packing` | pooler default "
        "| `--dropout` sets | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name in STUDENTS.names():
        entry = STUDENTS.get(name)
        attention = [default_attention(entry)]
        attention += [a for a in entry.attention if a not in attention]
        packed = [
            f"{a}{GPU_MARK if a in (FLEX, VARLEN) else ''}"
            for a in entry.packed_attention or entry.attention
        ]
        packing = f"proven: {', '.join(packed)}" if entry.packs else "refused"
        rows.append(
            f"| {entry.name} (`{name}`) | {', '.join(attention)} | {packing} | `{entry.pooler}` "
            f"| {', '.join(f'`{f}`' for f in entry.dropout_fields)} | {entry.notes} |"
        )
    return "\n".join(rows)
