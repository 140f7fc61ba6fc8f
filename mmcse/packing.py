"""Packed batches: a batch's sentences laid end to end in rows, with no padding between them.

A padded batch computes ``sentences × longest`` tokens (BERT uncased, length ≤ 32, batches of
128 on ``../shared/data``: 32 % padding on Wiki1M, 50-65 % on captions); every GEMM, LayerNorm,
GELU and dropout runs on the padding too. Packed, the sentences of a batch (each dropout view
included) are laid into ``rows`` rows of ``width`` tokens (:func:`packed_row_width`: a multiple
of the run's ``max_seq_length``, so no sentence ever straddles two rows), best fit, longest first; the unused
tail of a row is *fill* (the pad token). Any HF encoder runs it through its own extension points,
no fork of model code:

* ``position_ids`` restart at every sentence (RoBERTa-style embeddings, which count from
  ``padding_idx + 1``, keep that offset: :func:`position_offset`);
* attention stays inside each sentence: a ready 4D mask passes through transformers'
  ``create_bidirectional_mask`` unchanged, built for the encoder's ``attn_implementation``
  (:func:`attention_arguments`): ``sdpa`` a block-diagonal boolean mask over each row,
  ``eager`` (HF's plain matmul–softmax) the same as an additive mask, ``flex_attention`` a
  document ``BlockMask``, ``varlen`` (:mod:`torch.nn.attention.varlen`, CUDA, registered
  in transformers' ``AttentionInterface`` here) cumulative sentence starts over the flattened
  rows. Fill tokens attend among themselves (their own segment), so no query row is fully
  masked;
* the last-layer (and, for ``avg_first_last``/``avg_top2``, the needed hidden) states are
  gathered back into the padded ``[sentences, width, H]`` layout (:meth:`PackedTokens.unpack`),
  so every pooler and MCSEO's phrase spans read each sentence exactly as in a padded batch.

With dropout off a packed forward equals the padded one to fp32 rounding (``tests/test_packing.py``,
``tests/training/test_packed_training.py``); with dropout on, the masks are drawn over other
shapes (the same distribution, other draws).

A batch kind's row count is either each batch's own (eager: the fewest rows best fit needs) or
a fixed budget for static shapes (capture): the most rows any batch of the run's schedule needs
(:func:`rows_needed`), so no batch overflows and each step sees exactly its padded run's
sentences.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mmcse.errors import MmcseError

#: the attention implementations a packed forward builds its mask for (``attn_implementation``)
PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "varlen")
VARLEN = "varlen"
#: why varlen refuses fp32, in the step and the STS evaluation alike (it failed so on an H200)
VARLEN_DTYPES = (
    "varlen attention runs FlashAttention, bf16/fp16 only: use --precision bf16 and "
    "--eval-precision bf16, or sdpa/flex_attention"
)


# ---- where each sentence goes ---------------------------------------------------------------

#: the fewest tokens a packed training row holds: rows of ``max_seq_length`` (32) leave a COCO
#: caption of 17 tokens alone with one of at most 15 (real ÷ computed 0.87 on COCO, 0.78 on
#: Flickr30k at batch 64); rows of 64 hold 0.92-0.97 of real tokens on Wiki, COCO and Flickr30k
#: (``docs/benchmarks/packing_budget.py``, BENCHMARKS.md). Attention stays inside each sentence,
#: so a wider row only widens the masked attention (64 / (6 · hidden) of a layer's FLOPs)
PACKED_ROW_TOKENS = 64


def packed_row_width(max_length: int) -> int:
    """The width of a training run's packed rows: the least multiple of ``max_length`` (so a
    sentence never straddles two rows) that holds :data:`PACKED_ROW_TOKENS`."""
    return max_length * max(1, -(-PACKED_ROW_TOKENS // max_length))


def pack_rows(lengths: Sequence[int] | np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row, start)`` of each sentence: best fit decreasing into rows of ``width`` tokens.

    Longest first, each sentence goes to a row with the least room left that still holds it
    (a new row when none does). Deterministic. Rows are found by their room left (at most
    ``width`` lists), so a run's whole schedule is packed in seconds (:func:`rows_needed`)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.max()) > width:
        raise ValueError(f"a sentence of {int(lengths.max())} tokens exceeds the row ({width})")
    rows = np.zeros(len(lengths), dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    by_room: list[list[int]] = [[] for _ in range(width)]  # room left → rows with that room
    count = 0
    for i in np.argsort(-lengths, kind="stable").tolist():
        n = int(lengths[i])
        room = next((r for r in range(max(n, 1), width) if by_room[r]), width)
        if room == width:
            row, count = count, count + 1
        else:
            row = by_room[room].pop()
        rows[i], starts[i] = row, width - room
        if room - n > 0:
            by_room[room - n].append(row)
    return rows, starts


def rows_needed(lengths: Sequence[int] | np.ndarray, width: int) -> int:
    """How many rows :func:`pack_rows` fills with these sentences."""
    rows, _ = pack_rows(lengths, width)
    return int(rows.max()) + 1 if len(rows) else 0


def position_offset(backbone: torch.nn.Module) -> int:
    """The first position id of a sentence: ``padding_idx + 1`` for RoBERTa-style embeddings
    (RoBERTa, XLM-R, MPNet: positions counted from after the pad id, their embeddings keep
    ``padding_idx``), else 0."""
    embeddings = getattr(backbone, "embeddings", None)
    if embeddings is not None and getattr(embeddings, "padding_idx", None) is not None:
        return int(embeddings.padding_idx) + 1
    return 0


# ---- the packed tensors ---------------------------------------------------------------------


@dataclass
class PackedTokens:
    """One packed batch: ``copies`` copies of its sentences (SimCSE's two dropout views) in
    ``[rows, width]`` tensors, and where each sentence's tokens are."""

    input_ids: Tensor  # [R, W] token ids, fill = pad id
    position_ids: Tensor  # [R, W] restarting per sentence (+ the model's offset)
    segments: Tensor  # [R, W] sentence number; fill of row r: sentences + r
    index: Tensor  # [copies·N, L] flat token index of each sentence's tokens (clamped past its end)
    mask: Tensor  # [copies·N, L] the padded attention mask of the sentences
    #: [copies·(N + rows) + 1] int32 starts of every segment over the flattened rows (varlen),
    #: a fixed length (repeated totals at the end: empty segments) so a budget's shapes are static
    cu_seqlens: Tensor

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def width(self) -> int:
        return int(self.input_ids.shape[1])

    def tensors(self) -> list[Tensor]:
        """Every tensor of the batch (what a copy to a device must keep alive)."""
        return [getattr(self, name) for name in self._tensor_fields()]

    def map(self, fn: Callable[[Tensor], Tensor]) -> PackedTokens:
        """The same batch with ``fn`` applied to every tensor (a copy to a device, pinning)."""
        return dataclasses.replace(
            self, **{name: fn(getattr(self, name)) for name in self._tensor_fields()}
        )

    def _tensor_fields(self) -> list[str]:
        return [
            f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), Tensor)
        ]

    def unpack(self, states: Tensor) -> Tensor:
        """``[R, W, H]`` packed states → ``[copies·N, L, H]`` per sentence, padded layout (the
        positions past a sentence's end hold its first token: masked out like padding)."""
        flat = states.reshape(-1, states.shape[-1])
        return flat[self.index.reshape(-1)].view(*self.index.shape, states.shape[-1])


def pack_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    width: int,
    pad_id: int,
    rows: int | None = None,
    copies: int = 1,
) -> PackedTokens:
    """Pack a right-padded batch (``input_ids``/``attention_mask`` ``[N, L]``, on the host).

    ``rows``: a fixed row count for static shapes (per copy; None: the fewest best fit needs),
    which must hold the batch; ``copies``: the sentences packed this many times over (the
    copies' rows follow each other). Positions count from 0 here; the forward adds the
    encoder's :func:`position_offset`."""
    ids = input_ids.cpu().numpy()
    lengths = attention_mask.sum(1).cpu().numpy().astype(np.int64)
    n, padded_width = ids.shape
    row_of, start_of = pack_rows(lengths, width)
    needed = int(row_of.max()) + 1 if n else 0
    rows = needed if rows is None else rows
    if needed > rows:  # the run's budget is the most any batch of its schedule needs
        raise MmcseError(f"a batch needs {needed} packed rows, more than its budget of {rows}")
    total = rows * copies
    packed = np.full((total, width), pad_id, dtype=np.int64)
    positions = np.zeros((total, width), dtype=np.int64)
    segments = (np.arange(total)[:, None] + copies * n).repeat(width, 1)
    index = np.zeros((copies * n, padded_width), dtype=np.int64)
    column = np.arange(padded_width)
    for copy in range(copies):
        for i in range(n):
            r, s, k = copy * rows + int(row_of[i]), int(start_of[i]), int(lengths[i])
            packed[r, s : s + k] = ids[i, :k]
            positions[r, s : s + k] = np.arange(k)
            segments[r, s : s + k] = copy * n + i
            index[copy * n + i] = r * width + s + np.where(column < k, column, 0)
    mask = attention_mask.cpu().repeat(copies, 1)
    return PackedTokens(
        torch.from_numpy(packed),
        torch.from_numpy(positions),
        torch.from_numpy(segments),
        torch.from_numpy(index),
        mask,
        torch.from_numpy(_segment_starts(segments, copies * (n + rows) + 1)),
    )


def _segment_starts(segments: np.ndarray, size: int) -> np.ndarray:
    """Cumulative starts of every run of one segment over the flattened rows, ``size`` long."""
    flat = segments.reshape(-1)
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    cu = np.full(size, flat.size, dtype=np.int32)
    cu[0] = 0
    cu[1 : len(change) + 1] = change
    return cu


# ---- attention inside each sentence ---------------------------------------------------------


def attention_arguments(
    packed: PackedTokens, implementation: str, dtype: torch.dtype, window: int | None = None
) -> dict:
    """The keyword arguments of a packed backbone call that keep attention inside each sentence,
    for the encoder's ``attn_implementation``. ``window``: a local-attention half-window
    (ModernBERT's ``sliding_window``): its sliding layers get a mask that also keeps each query
    within ``window`` tokens, as transformers' padded mask does (sdpa and eager only)."""
    if implementation == VARLEN:
        register_varlen()
        return {"cu_seqlens": packed.cu_seqlens, "max_seqlen": packed.width}
    if implementation == "flex_attention":
        return {"attention_mask": document_block_mask(packed.segments)}
    same = packed.segments[:, None, :, None] == packed.segments[:, None, None, :]  # [R,1,W,W]
    if implementation in ("sdpa", "eager"):
        if window is None:
            return {"attention_mask": _attention_mask(same, implementation, dtype)}
        column = torch.arange(packed.width, device=same.device)
        near = (column[:, None] - column[None, :]).abs() <= window  # within a sentence: as padded
        masks = {"full_attention": same, "sliding_attention": same & near}
        return {
            "attention_mask": {
                k: _attention_mask(m, implementation, dtype) for k, m in masks.items()
            }
        }
    raise MmcseError(
        f"attention {implementation!r} cannot run packed; use one of {', '.join(PACKED_ATTENTION)}"
    )


def _attention_mask(same: Tensor, implementation: str, dtype: torch.dtype) -> Tensor:
    """sdpa's boolean mask, or eager's additive one (HF's reference attention adds its mask)."""
    if implementation == "sdpa":
        return same
    additive = torch.zeros(same.shape, dtype=dtype, device=same.device)
    return additive.masked_fill(~same, torch.finfo(dtype).min)


def local_window(config) -> int | None:
    """A config's local-attention half-window when some of its layers attend locally
    (ModernBERT: ``layer_types`` with ``sliding_attention``), else None."""
    if "sliding_attention" not in (getattr(config, "layer_types", None) or ()):
        return None
    return getattr(config, "sliding_window", None)


def document_block_mask(segments: Tensor):
    """FlexAttention's ``BlockMask``: each token attends to the tokens of its own segment."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_segment(b, h, q, kv):
        return segments[b, q] == segments[b, kv]

    rows, width = segments.shape
    return create_block_mask(
        same_segment, rows, None, width, width, device=segments.device, BLOCK_SIZE=width
    )


def varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling=None,
    dropout=0.0,
    cu_seqlens=None,
    max_seqlen=None,
    **kwargs,
):
    """Transformers attention function over the flattened rows, one sequence per segment
    (``torch.nn.attention.varlen``, CUDA). It has no attention-probability dropout: with
    dropout on in training it refuses rather than silently train another model."""
    from torch.nn.attention.varlen import varlen_attn

    if cu_seqlens is None:
        raise MmcseError("varlen attention runs packed batches only (--packing)")
    if dropout:
        raise MmcseError(
            "varlen attention has no attention dropout: use --dropout 0, or sdpa/flex_attention"
        )
    if query.dtype not in (torch.bfloat16, torch.float16):  # its FlashAttention kernel's dtypes
        raise MmcseError(VARLEN_DTYPES)
    rows, heads, width, dim = query.shape  # [R, heads, W, D] → [R·W, heads, D]
    q, k, v = (t.transpose(1, 2).reshape(rows * width, heads, dim) for t in (query, key, value))
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scaling)
    return out.view(rows, width, heads, dim), None


_REGISTERED: set[str] = set()


def register_varlen() -> None:
    """Register :func:`varlen_attention` as ``attn_implementation="varlen"`` (once)."""
    if VARLEN in _REGISTERED:
        return
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention)
    AttentionMaskInterface.register(VARLEN, lambda *args, **kwargs: None)  # segments say it
    _REGISTERED.add(VARLEN)


# ---- a packed forward of an HF backbone ------------------------------------------------------


class PackedOutputs:
    """A packed backbone output in the padded layout :func:`mmcse.pooling.pool` reads: the
    last-layer states unpacked, the hidden states a pooler needs unpacked (the others None), the
    ``cls`` pooler's output recomputed from each sentence's first token."""

    def __init__(self, out, packed: PackedTokens, backbone, hidden_needed: Sequence[int] = ()):
        self.last_hidden_state = packed.unpack(out.last_hidden_state)
        self.hidden_states = None
        if out.hidden_states is not None:
            count = len(out.hidden_states)
            wanted = {i % count for i in hidden_needed}
            self.hidden_states = tuple(
                packed.unpack(h) if i in wanted else None for i, h in enumerate(out.hidden_states)
            )
        pooler = getattr(backbone, "pooler", None)
        self.pooler_output = pooler(self.last_hidden_state) if pooler is not None else None


def hidden_layers(pooler: str) -> tuple[int, ...]:
    """The hidden-state indices a pooler reads (:func:`mmcse.pooling.pool`)."""
    return {"avg_first_last": (1, -1), "avg_top2": (-2, -1)}.get(pooler, ())


def packed_forward(backbone, packed: PackedTokens, pooler: str, output_hidden_states: bool):
    """Run ``backbone`` on a packed batch; :class:`PackedOutputs` in the padded layout."""
    implementation = backbone.config._attn_implementation
    dtype = backbone.get_input_embeddings().weight.dtype
    offset = position_offset(backbone)
    out = backbone(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids + offset if offset else packed.position_ids,
        output_hidden_states=output_hidden_states,
        return_dict=True,
        **attention_arguments(packed, implementation, dtype, local_window(backbone.config)),
    )
    return PackedOutputs(out, packed, backbone, hidden_layers(pooler))
