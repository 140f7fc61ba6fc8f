"""Batched sentence encoding for evaluation: many sentences in, one float32 matrix out.

Speed comes from four things that change no number: every sentence is tokenised once, batches
are built from length-sorted sentences (little padding), each batch's sentences are packed end to
end in rows as wide as its longest (:mod:`mmcse.packing`; ``packing=False``: padded), and the
forward runs under ``torch.inference_mode`` (fp32, as the released evaluations;
:func:`mmcse.precision.evaluating_in` selects autocast). Rows come back in the
caller's order. The encoder's train/eval mode is restored afterwards, so the trainer can call
this on its live model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from mmcse.devices import to_device
from mmcse.errors import MmcseError
from mmcse.model import backbone_packs
from mmcse.packing import PackedTokens, pack_tokens, packed_forward
from mmcse.pooling import StModule, needs_hidden_states, pool
from mmcse.precision import autocast_for, evaluation_precision

# tokenizers report "no limit" as a huge sentinel (int(1e30)); anything above this is not a limit
_NO_LIMIT = 1_000_000


def model_max_length(tokenizer, backbone: nn.Module) -> int:
    """The longest input both the tokenizer and the position embeddings accept."""
    limits = [
        getattr(tokenizer, "model_max_length", None),
        getattr(backbone.config, "max_position_embeddings", None),
    ]
    usable = [limit for limit in limits if limit is not None and limit < _NO_LIMIT]
    return min(usable) if usable else 512


def pad_batch(sequences: list[list[int]], pad_id: int, device: torch.device):
    """Right-pad token ids into ``input_ids`` and ``attention_mask`` tensors on ``device``."""
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = 1
    return input_ids.to(device), attention_mask.to(device)


def pack_or_pad(sequences: list[list[int]], pad_id: int, packing: bool):
    """One evaluation batch on the host: packed into rows as wide as its longest sentence
    (a :class:`~mmcse.packing.PackedTokens`), else padded ``(input_ids, attention_mask)``."""
    input_ids, attention_mask = pad_batch(sequences, pad_id, torch.device("cpu"))
    if not packing:
        return input_ids, attention_mask
    return pack_tokens(input_ids, attention_mask, int(input_ids.shape[1]), pad_id)


def forward_pooled(backbone: nn.Module, batch, pooler: str) -> torch.Tensor:
    """Pooled sentences of one evaluation batch: ``(input_ids, attention_mask)`` padded, or a
    :class:`~mmcse.packing.PackedTokens`."""
    hidden = needs_hidden_states(pooler)
    if isinstance(batch, PackedTokens):
        return pool(packed_forward(backbone, batch, pooler, hidden), batch.mask, pooler)
    input_ids, attention_mask = batch
    outputs = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        output_hidden_states=hidden,
        return_dict=True,
    )
    return pool(outputs, attention_mask, pooler)


def token_budget_batches(lengths: Sequence[int], max_tokens: int) -> list[np.ndarray]:
    """Row indices of batches of at most ``max_tokens`` padded tokens (rows × longest row; a
    row longer than the budget is a batch of its own), longest rows first: sorted, so each
    batch pads little, and the first is the widest, so out-of-memory shows up at once."""
    order = np.argsort([-n for n in lengths], kind="stable")
    batches, start = [], 0
    while start < len(order):
        width = max(1, lengths[order[start]])  # the batch's widest row: its padded width
        end = min(len(order), start + max(1, max_tokens // width))
        batches.append(order[start:end])
        start = end
    return batches


def eval_autocast(device: torch.device):
    """The autocast evaluation encodes under: none by default (fp32, as the released
    evaluations), else :func:`~mmcse.precision.evaluating_in`'s precision."""
    return autocast_for(device, evaluation_precision())


def encoder_device(encoder: nn.Module, device: str | torch.device | None) -> torch.device:
    """Where :func:`encode_sentences` runs ``encoder`` for this ``device`` argument."""
    if device is not None:
        return torch.device(device)
    return next(getattr(encoder, "backbone", encoder).parameters()).device


def encode_sentences(
    encoder: nn.Module,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 128,
    max_length: int | None = None,
    device: str | torch.device | None = None,
    pooler: str | None = None,
    progress: bool = False,
    packing: bool = True,
) -> np.ndarray:
    """Embed ``sentences`` into a ``[len(sentences), H]`` float32 array (rows in input order).

    ``encoder`` is a :class:`mmcse.model.SentenceEncoder` (its ``pooler`` is the default) or a
    bare HF ``AutoModel``; ``pooler`` overrides it with any name of :mod:`mmcse.pooling`.
    ``device=None`` uses the device the encoder is on; a given device moves the encoder there.
    Inputs longer than ``max_length`` tokens (default: the encoder's ``max_length``, a
    sentence-transformers model's ``max_seq_length``, else what tokenizer and model allow) are
    truncated. ``packing``: each batch packed end to end (:mod:`mmcse.packing`) where packing
    is proven for the student (:mod:`mmcse.students`), else padded.
    """
    backbone = getattr(encoder, "backbone", encoder)
    packing = packing and backbone_packs(backbone)
    pooler = pooler or getattr(encoder, "pooler", "cls_before_pooler")
    post_pooling = getattr(encoder, "post_pooling", None)  # a model's own Dense/Normalize
    if device is None:
        device = next(backbone.parameters()).device
    device = torch.device(device)
    backbone.to(device)
    if not sentences:
        return np.zeros((0, backbone.config.hidden_size), dtype=np.float32)

    # a sentence-transformers model's own max_seq_length (all-MiniLM-L6-v2: 256), as it encodes
    limit = (
        max_length or getattr(encoder, "max_length", None) or model_max_length(tokenizer, backbone)
    )
    token_ids = tokenizer(list(sentences), truncation=True, max_length=limit)["input_ids"]
    # longest first: the first batch is the largest, so out-of-memory shows up at once
    order = np.argsort([-len(ids) for ids in token_ids], kind="stable")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    chunks = []
    was_training = backbone.training
    backbone.eval()
    try:
        with torch.inference_mode(), eval_autocast(device):
            starts = range(0, len(order), batch_size)
            for start in tqdm(
                starts, desc="encoding", unit="batch", disable=not progress, file=sys.stderr
            ):
                batch = [token_ids[i] for i in order[start : start + batch_size]]
                inputs = to_device(pack_or_pad(batch, pad_id, packing), device)
                pooled = forward_pooled(backbone, inputs, pooler)
                if post_pooling is not None:
                    pooled = post_pooling(pooled)
                chunks.append(pooled.float().cpu().numpy())
    finally:
        backbone.train(was_training)
    vectors = np.empty((len(order), chunks[0].shape[1]), dtype=np.float32)
    vectors[order] = np.concatenate(chunks)
    return vectors


# ---- a sentence-transformers model's own modules after pooling ----------------------------------

#: the weight files of a sentence-transformers Dense folder, in the order they are looked for
DENSE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: Dense settings mmcse applies only at their plain value (a residual or renamed input/output
#: would be another module): anything else is refused
PLAIN_DENSE = {
    "use_residual": False,
    "module_input_name": "sentence_embedding",
    "module_output_name": "sentence_embedding",
}


class Normalize(nn.Module):
    """sentence-transformers' ``Normalize``: unit L2 length per row."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(x, p=2, dim=1)


def post_pooling_modules(modules: Sequence[StModule]) -> nn.Module | None:
    """The modules after pooling (:func:`mmcse.model.resolve_encoding`) as one torch module,
    applied as sentence-transformers applies them; None when there are none."""
    if not modules:
        return None
    return nn.Sequential(
        *(load_dense(m.folder) if m.kind == "Dense" else Normalize() for m in modules)
    ).eval()


def load_dense(folder: Path) -> nn.Sequential:
    """A sentence-transformers ``Dense`` folder: ``activation(linear(x))``."""
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        linear = nn.Linear(
            int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True))
        )
    except FileNotFoundError:
        raise MmcseError(f"{config_path}: missing (a sentence-transformers Dense module)") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise MmcseError(f"{config_path}: not a Dense module config ({exc})") from None
    unsupported = [
        key for key, plain in PLAIN_DENSE.items() if config.get(key, plain) not in (plain, None)
    ]
    if unsupported:
        raise MmcseError(
            f"{config_path}: Dense settings {', '.join(unsupported)} are not supported"
        )
    state = _dense_state(folder)
    try:
        linear.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise MmcseError(f"{folder}: its weights do not fit its config ({first})") from None
    return nn.Sequential(linear, _activation(config.get("activation_function"), config_path))


def _dense_state(folder: Path) -> dict[str, torch.Tensor]:
    found = next((folder / name for name in DENSE_WEIGHTS if (folder / name).is_file()), None)
    if found is None:
        raise MmcseError(f"{folder}: no {' or '.join(DENSE_WEIGHTS)} (the Dense module's weights)")
    if found.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(found))
    else:
        state = torch.load(found, map_location="cpu", weights_only=True)
    return {key.removeprefix("linear."): value for key, value in state.items()}


def _activation(name: object, config_path: Path) -> nn.Module:
    """A torch.nn activation named by its dotted path (``torch.nn.modules.activation.Tanh``);
    only classes of torch.nn are built (no arbitrary import)."""
    if name is None:
        return nn.Tanh()  # sentence-transformers' default
    parts = str(name).split(".")
    found = getattr(nn, parts[-1], None)
    if parts[:2] != ["torch", "nn"] or not (
        isinstance(found, type) and issubclass(found, nn.Module)
    ):
        raise MmcseError(f"{config_path}: activation {name!r} is not a torch.nn module")
    return found()
