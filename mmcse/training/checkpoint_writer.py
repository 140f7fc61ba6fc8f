"""How best/ and last/ are written, and what they take on disk.

A save is a snapshot taken by the training thread (host copies of the weights, the heads and,
for last/, the trainer state: :class:`HostSnapshots`) and a write on one background thread
(:class:`BackgroundWriter`) into a temp folder beside the checkpoint, renamed into place
(:func:`mmcse.files.atomic_dir`): never half a save. :class:`CheckpointWriter` is the two
together, as :class:`~mmcse.training.record.RunRecord` uses them. What last/ holds and how a
resume checks it is :mod:`mmcse.training.checkpoint`'s.

The disk estimates (:func:`checkpoint_sizes`) count what the writer writes: the weights and
heads as saved, AdamW's two fp32 moments per trained parameter (last/ only), the tokenizer files.
The run's plan shows them (:func:`trained_sizes`); the recipes estimate a run's before its
student loads (:func:`checkpoint_estimate`).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten_with_path, tree_unflatten

from mmcse.files import atomic_dir
from mmcse.rundir import Checkpoint
from mmcse.training import checkpoint as ckpt

if TYPE_CHECKING:
    from mmcse.model import SentenceEncoder
    from mmcse.training.student import Student

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Checkpoint writes on one background thread, in order: the training thread only
    snapshots (copies into host buffers, :class:`HostSnapshots`); the writing (hundreds of MB,
    seconds at BERT-base, where a captured step takes milliseconds) overlaps the steps that
    follow. At most :data:`MAX_PENDING` writes wait (an evaluation step saves best/ and last/:
    both go at once); a further write waits for the oldest, a new snapshot of a checkpoint for
    that checkpoint's last write (:meth:`wait_for`: its buffers are reused). A write's error
    (a full disk) is raised in the training thread at the next save or at the end of the run
    (:meth:`close`). A run killed outright (SIGKILL) loses the write in flight, never the
    checkpoint before it (each is written beside and renamed into place), so it resumes from
    that one; a stop signal waits for the writes."""

    MAX_PENDING = 2

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmcse-checkpoint")
        self.pending: collections.deque[tuple[str, Future]] = collections.deque()

    def submit(self, name: str, write: Callable[[], None]) -> None:
        """Queue ``write`` (of the checkpoint ``name``) after the writes before it."""
        while len(self.pending) >= self.MAX_PENDING:
            self.pending.popleft()[1].result()
        self.pending.append((name, self.pool.submit(write)))

    def wait_for(self, name: str) -> None:
        """Until the last write of checkpoint ``name`` (and every write before it) is on disk:
        its snapshot's buffers are free again (:class:`HostSnapshots`)."""
        while any(pending == name for pending, _ in self.pending):
            self.pending.popleft()[1].result()

    def wait(self) -> None:
        """Until every write is on disk; the first failed one's error raised here."""
        while self.pending:
            self.pending.popleft()[1].result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown(wait=True)


class HostSnapshots:
    """Snapshots of a checkpoint's tensors in host buffers kept for that checkpoint's next save.

    Allocating a snapshot anew each save costs the training thread the allocation and its page
    faults (BERT-base: best/ 0.44 GB, last/ with AdamW's moments 1.3 GB); from a GPU into
    ordinary memory, the copy also waits for the queued steps and runs at pageable speed. Here
    each tensor, found by its place in the nested state (its pytree path), is copied into the
    buffer the last save of the same ``name`` used (a new one where its shape or dtype changed);
    from CUDA the buffers are pinned and the copies queued (``non_blocking``) on the current
    stream, so they follow the step that saved and the next step's in-place updates follow
    them; the returned ``ready`` waits for them (the writer thread calls it, never the training
    thread). The caller must not snapshot ``name`` again while a write of the last snapshot
    of ``name`` may still read it (:meth:`BackgroundWriter.wait_for`)."""

    def __init__(self) -> None:
        self.buffers: dict[str, dict[tuple, torch.Tensor]] = {}

    def copy(self, name: str, value: Any) -> tuple[Any, Callable[[], None]]:
        """(the snapshot of ``value``, a function that returns once its copies are done)."""
        leaves, spec = tree_flatten_with_path(value)
        kept, used = self.buffers.get(name, {}), {}
        for path, leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                used[path] = self._filled(kept.get(path), leaf.detach())
        self.buffers[name] = used  # the buffer of a tensor no longer in the state is dropped
        snapshot = tree_unflatten([used.get(path, leaf) for path, leaf in leaves], spec)
        if not any(isinstance(leaf, torch.Tensor) and leaf.is_cuda for _, leaf in leaves):
            return snapshot, lambda: None
        copied = torch.cuda.Event()  # pragma: cuda
        copied.record()  # pragma: cuda
        return snapshot, copied.synchronize  # pragma: cuda

    @staticmethod
    def _filled(buffer: torch.Tensor | None, source: torch.Tensor) -> torch.Tensor:
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)
        return buffer.copy_(source, non_blocking=source.is_cuda)


class CheckpointWriter:
    """Saves a student's checkpoints: snapshotted now (:class:`HostSnapshots`), written in the
    background (:class:`BackgroundWriter`) beside the checkpoint and renamed into place. A
    checkpoint with a trainer state (last/) gets it and its integrity record
    (:func:`mmcse.training.checkpoint.write_integrity`, written last: it records every file)."""

    def __init__(self, encoder: SentenceEncoder, tokenizer: Any) -> None:
        self.encoder, self.tokenizer = encoder, tokenizer
        self.background = BackgroundWriter()
        self.snapshots = HostSnapshots()

    def save(
        self, checkpoint: Checkpoint, info: dict, heads: dict, trainer_state: dict | None = None
    ) -> None:
        """Snapshot the weights, ``heads`` (their state dict) and ``trainer_state`` as they are
        now, so the steps that follow change nothing in them, and queue their write with the run
        info ``info`` (whose ``step``, ``config`` and ``fingerprints`` the integrity record
        takes)."""
        name = checkpoint.path.name
        self.background.wait_for(name)  # the buffers of its last snapshot are reused
        live = {
            "weights": self.encoder.backbone.state_dict(),
            "heads": heads,
            "state": trainer_state,
        }
        snapshot, ready = self.snapshots.copy(name, live)
        self.background.submit(name, lambda: self._write(checkpoint, info, snapshot, ready))

    def _write(self, checkpoint: Checkpoint, info: dict, snapshot: dict, ready) -> None:
        ready()
        with atomic_dir(checkpoint.path) as tmp:
            self.encoder.save_checkpoint(
                tmp, self.tokenizer, snapshot["heads"], info, weights=snapshot["weights"]
            )
            if snapshot["state"] is not None:
                ckpt.save_trainer_state(tmp, snapshot["state"])
                ckpt.write_integrity(
                    tmp,
                    step=info["step"],
                    settings=info["config"],
                    fingerprints=info["fingerprints"],
                )

    def wait(self) -> None:
        """Until every queued checkpoint is on disk (a failed write's error raised here)."""
        self.background.wait()

    def close(self) -> None:
        """Every write on disk, the writer's thread ended."""
        self.background.close()

    @contextlib.contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """However the block fails (a stop signal, an error), the write in flight is on disk
        before the error goes on; a clean end leaves the waiting to :meth:`close`, which raises
        a failed write's error."""
        try:
            yield
        except BaseException:
            try:
                self.close()
            except Exception as exc:  # the block's own error is the one to report
                logger.error("writing a checkpoint failed too: %s", exc)
            raise


# ---- disk: what each checkpoint will take ------------------------------------------------------

#: AdamW keeps two fp32 moments per trained parameter (``exp_avg``, ``exp_avg_sq``), which
#: ``last/``'s trainer state holds beside the weights; ``best/`` holds the weights only
OPTIMIZER_BYTES_PER_PARAMETER = 2 * 4
#: what a checkpoint writes besides tensors and tokenizer: model config, run info, integrity
#: record (a few KB); last/'s trainer state adds the RNG states and bookkeeping (tens of KB)
CHECKPOINT_OVERHEAD = 8 * 1024
TRAINER_STATE_OVERHEAD = 32 * 1024
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spm.model",
    "sentencepiece.bpe.model",
    "special_tokens_map.json",
    "tokenizer_config.json",
)
#: the recipes' students, for a plan made before they are downloaded: (vocabulary, positions,
#: token types, hidden, layers, intermediate) from their published config.json
RECIPE_STUDENTS = {
    "bert-base-uncased": (30522, 512, 2, 768, 12, 3072),
    "roberta-base": (50265, 514, 1, 768, 12, 3072),
}


def checkpoint_sizes(weight_bytes: int, trained_parameters: int, other_bytes: int) -> dict:
    """``{"best": bytes, "last": bytes}``: best/ is the weights (student and heads, as trained)
    and the tokenizer; last/ adds AdamW's two fp32 moments per trained parameter."""
    best = weight_bytes + other_bytes + CHECKPOINT_OVERHEAD
    moments = OPTIMIZER_BYTES_PER_PARAMETER * trained_parameters
    return {"best": best, "last": best + moments + TRAINER_STATE_OVERHEAD}


def trained_sizes(student: Student, heads: nn.Module, tokenizer_folder: Path) -> dict[str, int]:
    """:func:`checkpoint_sizes` of a loaded run: the student's weights and ``heads`` (every
    head the run saves, the auxiliary task's too) as saved, AdamW's moments of every trained
    parameter, the tokenizer files in ``tokenizer_folder``."""
    tensors = [*student.encoder.backbone.state_dict().values(), *heads.state_dict().values()]
    weights = sum(v.numel() * v.element_size() for v in tensors)
    trained = {id(p): p for m in student.trained_modules() for p in m.parameters()}
    trained.update({id(p): p for p in heads.parameters()})
    parameters = sum(p.numel() for p in trained.values() if p.requires_grad)
    return checkpoint_sizes(weights, parameters, tokenizer_bytes(tokenizer_folder))


def tokenizer_bytes(folder: Path) -> int:
    """What the tokenizer files in ``folder`` take (a checkpoint copies them)."""
    return sum((folder / n).stat().st_size for n in TOKENIZER_FILES if (folder / n).is_file())


def checkpoint_estimate(model: str) -> dict | None:
    """:func:`checkpoint_sizes` of a run of the student ``model`` before it loads: its
    parameters counted from the safetensors headers (saved in fp32, as a run trains them; all
    trained), its tokenizer files as they are. The method's heads (a projection or two) are not
    counted. None when the student is not a local folder with safetensors weights."""
    from mmcse.rundir import resolve_model_dir

    folder = Path(resolve_model_dir(model))
    if not folder.is_dir():  # a hub id: its snapshot in the local hub cache, if there
        folder = hub_snapshot(model) or folder
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if files:
        parameters = sum(safetensors_parameters(f) for f in files)
    elif model in RECIPE_STUDENTS:
        parameters = bert_parameters(*RECIPE_STUDENTS[model])
    else:
        return None
    return checkpoint_sizes(4 * parameters, parameters, tokenizer_bytes(folder))


def bert_parameters(
    vocab: int, positions: int, types: int, hidden: int, layers: int, intermediate: int
) -> int:
    """Parameters of a BERT-style encoder with its pooler (as ``save_pretrained`` writes it):
    bert-base-uncased 109,482,240, roberta-base 124,645,632."""
    embeddings = (vocab + positions + types) * hidden + 2 * hidden  # + LayerNorm
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden
    feed_forward = 2 * hidden * intermediate + intermediate + hidden + 2 * hidden
    pooler = hidden * hidden + hidden
    return embeddings + layers * (attention + feed_forward) + pooler


def hub_snapshot(model: str) -> Path | None:
    """The folder of ``model``'s snapshot in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # not a valid repo id, no hub library: no snapshot to count
        return None
    return Path(found).parent if isinstance(found, str) else None


def safetensors_parameters(path: Path) -> int:
    """Elements in a safetensors file, from its JSON header (no tensor is read)."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def format_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            break
        count /= 1000
    return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
