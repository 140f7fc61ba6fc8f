"""Packed batches (mmcse/packing.py): where sentences go, and a packed forward equal to the padded
one for every pooler, tiny BERT and tiny RoBERTa, each attention a CPU runs packed.

Tolerance: dropout off, fp32; a sentence's embedding and token states agree to 1e-5 absolute
(measured: 0 for the token states and the token poolers, ~5e-8 for ``cls``, whose pooler MLP
runs on another batch shape). Attention over a padded row masks its padding keys; packed, it
masks the other sentences' keys: either way they get exactly zero weight.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.packing import token_counts
from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

from mmcse.errors import MmcseError
from mmcse.model import SentenceEncoder
from mmcse.packing import (
    attention_arguments,
    pack_rows,
    pack_tokens,
    position_offset,
    rows_needed,
)
from mmcse.pooling import POOLERS

TOLERANCE = 1e-5
FAMILIES = {"bert": (BertModel, BertConfig, 0), "roberta": (RobertaModel, RobertaConfig, 1)}


def tiny_backbone(family: str, attention: str = "sdpa", hidden: int = 32):
    model_class, config_class, pad = FAMILIES[family]
    config = config_class(
        vocab_size=100, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, pad_token_id=pad,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_class._from_config(config, attn_implementation=attention).eval()


def padded_batch(lengths: list[int], pad: int, width: int | None = None, seed: int = 0):
    width = width or max(lengths)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (len(lengths), width), generator=generator)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask + pad * (1 - mask), mask


def test_best_fit_puts_every_sentence_in_one_row_without_overlap():
    lengths = np.array([5, 12, 3, 9, 16, 7, 1, 16, 15])
    rows, starts = pack_rows(lengths, 16)
    assert rows.max() + 1 == rows_needed(lengths, 16) == 6  # the least possible: ⌈84/16⌉
    for r in range(rows.max() + 1):
        spans = sorted(
            (s, s + n) for s, n, row in zip(starts, lengths, rows, strict=True) if row == r
        )
        assert spans[0][0] == 0 and spans[-1][1] <= 16
        assert all(
            a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)
        )  # end to end, no gap
    with pytest.raises(ValueError, match="exceeds the row"):
        pack_rows([17], 16)


def test_packed_tensors_restart_positions_and_count_real_tokens():
    ids, mask = padded_batch([3, 2, 4], pad=1)
    packed = pack_tokens(ids, mask, width=4, pad_id=1, copies=2)
    assert packed.rows == 6  # 3 rows per copy: 4 | 3 | 2 (best fit), twice
    assert token_counts(packed) == (18, 24)
    first = packed.index[0]  # the 3-token sentence: its tokens, then its first token again
    flat_ids = packed.input_ids.reshape(-1)
    assert flat_ids[first[:3]].tolist() == ids[0, :3].tolist()
    assert packed.position_ids.reshape(-1)[first[:3]].tolist() == [0, 1, 2]
    copy_two = packed.index[3]
    assert flat_ids[copy_two[:3]].tolist() == ids[0, :3].tolist() and copy_two[0] >= 12
    # segments: per copy 3 sentences + fill in 2 rows (the 4-token row is full), then repeats
    assert packed.cu_seqlens.tolist() == [0, 4, 7, 8, 10, 12, 16, 19, 20, 22, 24, 24, 24]


def test_a_fixed_budget_holds_the_batch_or_refuses():
    ids, mask = padded_batch([3, 2, 4], pad=0)
    assert pack_tokens(ids, mask, width=4, pad_id=0, rows=5).rows == 5  # fill rows added
    with pytest.raises(MmcseError, match="needs 3 packed rows, more than its budget of 2"):
        pack_tokens(ids, mask, width=4, pad_id=0, rows=2)


def test_position_offset_is_robertas_padding_idx_plus_one():
    assert position_offset(tiny_backbone("bert")) == 0
    assert position_offset(tiny_backbone("roberta")) == 2


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("pooler", POOLERS)
def test_packed_forward_equals_padded(family, pooler, attention):
    backbone = tiny_backbone(family, attention)
    pad = FAMILIES[family][2]
    lengths = [5, 12, 3, 9, 16, 7, 1]
    ids, mask = padded_batch(lengths, pad, width=20)  # static width: padding past the longest
    encoder = SentenceEncoder(backbone, pooler)
    packed = pack_tokens(ids, mask, 16, pad, copies=2)
    assert packed.rows < len(lengths) * 2  # the point: fewer rows than sentences
    with torch.no_grad():
        padded = encoder(input_ids=ids, attention_mask=mask)
        out = encoder(packed=packed)
    n = len(lengths)
    for view in (slice(0, n), slice(n, 2 * n)):
        torch.testing.assert_close(out.sentence[view], padded.sentence, atol=TOLERANCE, rtol=0)
        real = mask[..., None].bool()
        torch.testing.assert_close(
            out.token_states[view] * real, padded.token_states * real, atol=TOLERANCE, rtol=0
        )


def test_packed_sentences_do_not_see_each_other():
    """Changing one sentence changes no other sentence packed in its row."""
    backbone = tiny_backbone("bert")
    ids, mask = padded_batch([6, 5, 4], pad=0)
    encoder = SentenceEncoder(backbone, "avg")
    packed = pack_tokens(ids, mask, 16, 0)
    assert packed.rows == 1
    changed = ids.clone()
    changed[0, 1:6] = 7
    with torch.no_grad():
        before = encoder(packed=packed).sentence
        after = encoder(packed=pack_tokens(changed, mask, 16, 0)).sentence
    assert not torch.allclose(before[0], after[0])
    torch.testing.assert_close(before[1:], after[1:], atol=TOLERANCE, rtol=0)


def test_an_unknown_attention_cannot_run_packed():
    backbone = tiny_backbone("bert")
    backbone.config._attn_implementation = "paged|sdpa"
    ids, mask = padded_batch([3, 2], pad=0)
    with pytest.raises(MmcseError, match="cannot run packed"):
        SentenceEncoder(backbone, "avg")(packed=pack_tokens(ids, mask, 4, 0))


@pytest.mark.cuda
@pytest.mark.parametrize("attention", ["flex_attention", "varlen"])
def test_packed_forward_equals_padded_on_cuda(attention):
    """FlexAttention (no backward on CPU) and varlen (CUDA only) against padded SDPA; varlen is
    FlashAttention, bf16/fp16 only, so both run under bf16 autocast (bf16's tolerance) there."""
    from mmcse.packing import register_varlen

    register_varlen()
    reference = tiny_backbone("bert").cuda()
    backbone = tiny_backbone("bert", attention).cuda()
    ids, mask = padded_batch([5, 12, 3, 9, 16, 7, 1], 0)
    packed = pack_tokens(ids, mask, 16, 0, copies=2).map(lambda t: t.cuda())
    bf16 = attention == "varlen"
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        padded = SentenceEncoder(reference, "avg")(input_ids=ids.cuda(), attention_mask=mask.cuda())
        out = SentenceEncoder(backbone, "avg")(packed=packed)
    atol = 2e-2 if bf16 else 1e-4
    torch.testing.assert_close(out.sentence[:7].float(), padded.sentence.float(), atol=atol, rtol=0)


# ---- varlen and flex on the CPU: the kernel stood in for, the rest run ---------------------------


def reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=None):
    """``torch.nn.attention.varlen.varlen_attn`` written out: attention within each
    ``[cu[i], cu[i+1])`` segment of the flattened tokens (empty segments at the end)."""
    out = torch.zeros_like(q)
    for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        if end > start:
            seg = [t[start:end].transpose(0, 1) for t in (q, k, v)]  # [heads, n, D]
            out[start:end] = F.scaled_dot_product_attention(*seg, scale=scale).transpose(0, 1)
    return out


def packed_example():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [4, 0, 0, 0]])
    return pack_tokens(ids, (ids > 0).long(), width=4, pad_id=0, copies=2)


def test_varlen_attention_over_the_flattened_rows_equals_masked_sdpa(monkeypatch):
    import torch.nn.attention.varlen as varlen

    from mmcse.packing import varlen_attention

    monkeypatch.setattr(varlen, "varlen_attn", reference_varlen_attn)
    packed = packed_example()
    rows, width, heads, dim = packed.rows, packed.width, 2, 8
    q, k, v = (torch.randn(rows, heads, width, dim, generator=torch.Generator().manual_seed(i))
               .bfloat16() for i in range(3))  # fmt: skip
    args = attention_arguments(packed, "varlen", torch.bfloat16)
    out, weights = varlen_attention(None, q, k, v, None, scaling=0.5, **args)
    same = attention_arguments(packed, "sdpa", torch.bfloat16)["attention_mask"]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=same, scale=0.5).transpose(1, 2)
    assert weights is None and out.shape == (rows, width, heads, dim)
    torch.testing.assert_close(out, want)


def test_varlen_attention_refuses_dropout_unpacked_batches_and_fp32():
    from mmcse.packing import varlen_attention

    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(MmcseError, match="packed batches only"):
        varlen_attention(None, q, q, q, None)
    with pytest.raises(MmcseError, match="no attention dropout"):
        varlen_attention(None, q, q, q, None, dropout=0.1, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(
        MmcseError, match="bf16/fp16 only"
    ):  # FlashAttention: fp32 failed on an H200
        varlen_attention(None, q, q, q, None, cu_seqlens=torch.tensor([0, 4]))


def test_the_flex_block_mask_keeps_attention_inside_each_segment():
    from mmcse.packing import document_block_mask

    packed = packed_example()
    mask = document_block_mask(packed.segments)
    rows, width = packed.segments.shape
    b, q, kv = torch.meshgrid(torch.arange(rows), torch.arange(width), torch.arange(width),
                              indexing="ij")  # fmt: skip
    allowed = mask.mask_mod(b, torch.zeros_like(b), q, kv)
    same = attention_arguments(packed, "sdpa", torch.float32)["attention_mask"][:, 0]
    assert torch.equal(allowed, same)
