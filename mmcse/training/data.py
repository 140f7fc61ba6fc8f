"""A run's training data: its corpora (:mod:`mmcse.training.corpora`) with their token rows,
the teacher features joined to their sentences by id, and a batch gathered from both; the order
of the batches is :mod:`mmcse.training.batch_order`'s.

Each feature role is joined to a corpus **by id** once at start-up (image sets by ``image_id``,
text sets by sentence id) into row numbers, so a step gathers features with one ``take`` per role
and never touches a teacher. A batch is a vectorised row gather, trimmed to its longest sentence.
Columns are read only when something needs them: a SimCSE run on a warm token cache reads
neither the texts nor the ids of its corpus.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from mmcse.cache import FeatureSet
from mmcse.cache.layout import MANIFEST_NAME
from mmcse.cache.tokenizer import tokenizer_fingerprint
from mmcse.cache.tokens import TokenTable
from mmcse.devices import to_device
from mmcse.errors import MissingIdsError, MmcseError
from mmcse.methods.base import Method
from mmcse.packing import PackedTokens, pack_tokens, packed_row_width, rows_needed
from mmcse.training.batch_order import CAPTION, TEXT, BatchOrder
from mmcse.training.config import TrainConfig
from mmcse.training.corpora import CorpusView, corpus_tokens, open_corpus

#: feature-set kinds joined on the caption's image id; every other kind joins on the sentence id
IMAGE_KEYED_KINDS = ("image",)
#: feature-set kinds the generic join leaves to the method (e.g. MCSEO's per-phrase objects)
METHOD_JOINED_KINDS = ("object", "objects", "image_tensor", "audio_fbank")


@dataclass
class Source:
    """One corpus with its token rows and, per role, the feature rows of each of its sentences.

    ``tokens`` is None when only the joins are checked (preflight: nothing is tokenised).
    """

    kind: str
    corpus: CorpusView
    tokens: TokenTable | None = None
    feature_rows: dict[str, np.ndarray] = field(default_factory=dict)
    feature_sets: dict[str, FeatureSet] = field(default_factory=dict)  # the set each role joins

    def __len__(self) -> int:
        return len(self.tokens) if self.tokens is not None else len(self.corpus)

    @property
    def ids(self) -> np.ndarray:
        return self.corpus.ids

    @property
    def texts(self) -> list[str]:
        return self.corpus.texts

    @property
    def image_ids(self) -> np.ndarray | None:
        return self.corpus.image_ids

    @property
    def fingerprint(self) -> str:
        return self.corpus.fingerprint

    def token_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids [n, max_len], lengths [n])`` int32 of ``rows``, right-padded."""
        if self.tokens is None:
            raise MmcseError(f"the {self.kind} corpus was opened without a tokenizer")
        return self.tokens.take(rows)

    @property
    def input_ids(self) -> np.ndarray:
        """``[N, max_len]`` int32 of every sentence (a copy; a step takes its rows only)."""
        return self.token_rows(np.arange(len(self)))[0]

    @property
    def lengths(self) -> np.ndarray:
        return self.token_rows(np.arange(len(self)))[1]


@dataclass
class Batch:
    kind: str
    rows: np.ndarray
    input_ids: Tensor
    attention_mask: Tensor
    features: dict[str, Tensor]
    #: the method's per-batch extras (MCSEO's phrase spans), gathered with the batch
    extras: dict[str, Tensor] = field(default_factory=dict)
    #: both dropout views packed end to end (``--packing``; :mod:`mmcse.packing`), else None
    packed: PackedTokens | None = None

    def tensors(self) -> list[Tensor]:
        """Every tensor of the batch, the packed ones included (what a copy to a device must
        keep alive)."""
        packed = self.packed.tensors() if self.packed is not None else []
        fixed = [self.input_ids, self.attention_mask]
        return [*fixed, *self.features.values(), *self.extras.values(), *packed]

    def map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        """The same batch with ``fn`` applied to every tensor (a copy to a device, pinning)."""
        return dataclasses.replace(
            self,
            input_ids=fn(self.input_ids),
            attention_mask=fn(self.attention_mask),
            features={role: fn(t) for role, t in self.features.items()},
            extras={key: fn(t) for key, t in self.extras.items()},
            packed=self.packed.map(fn) if self.packed is not None else None,
        )


class TrainData(BatchOrder):
    """The corpora and feature sets of one run, joined by id, and the batch order over them.

    With ``tokenizer=None`` the corpora are opened and joined but not tokenised (preflight).
    """

    def __init__(self, cfg: TrainConfig, tokenizer, method: Method) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.method = method
        #: rows per packed dropout view by batch kind: the run's budget for static shapes
        #: (:meth:`fix_pack_budgets`); a kind not here packs each batch into the rows it needs
        self.pack_budgets: dict[str, int] = {}
        self.sources: dict[str, Source] = {}
        if cfg.text_corpus and cfg.mixing != "caption-only":
            self.sources[TEXT] = self._load_source(TEXT, cfg.text_corpus)
        if cfg.caption_corpus and cfg.mixing != "text-only":
            self.sources[CAPTION] = self._load_source(CAPTION, cfg.caption_corpus)
        if not self.sources:
            raise MmcseError(
                "no training data: give --text-corpus and/or --caption-corpus (mixing "
                f"{cfg.mixing!r} uses {'captions' if cfg.mixing == 'caption-only' else 'text'})"
            )
        self.feature_sets = self._open_feature_sets()
        for source in self.sources.values():
            self._join_features(source)

    # -- loading ---------------------------------------------------------------------------
    def _load_source(self, kind: str, path: str) -> Source:
        if kind == CAPTION and not (Path(path) / MANIFEST_NAME).is_file():
            raise MmcseError(
                f"--caption-corpus {path}: a caption corpus is the table extract-images writes "
                "(its captions join their images' features by id); for a caption file in any "
                "format, run `mmcse extract-images --dataset local --captions FILE` first"
            )
        try:
            corpus = open_corpus(path, self.cfg.text_field, self.cfg.bad_lines)
            len(corpus)  # a sentence file is read here, under the read policy
        except MmcseError as exc:
            raise MmcseError(f"--{kind}-corpus {exc}") from None
        if kind == CAPTION and corpus.image_ids is None:
            raise MmcseError(f"caption corpus {path} has no image_id column values")
        if self.tokenizer is None:
            return Source(kind, corpus)
        return Source(kind, corpus, self._tokens(kind, corpus))

    def _tokens(self, kind: str, corpus: CorpusView) -> TokenTable:
        cfg = self.cfg
        return corpus_tokens(
            corpus,
            self.tokenizer,
            cfg.max_seq_length,
            cfg.token_cache,
            self.tokenizer_fingerprint,
            desc=f"tokenise {kind}",
        )

    def tokenise(self, tokenizer, cfg: TrainConfig) -> TrainData:
        """Tokenise the corpora of data opened without a tokenizer (preflight's join, which the
        run then keeps instead of opening and joining everything again); ``cfg``: the run's
        resolved config (capture turns dynamic padding off)."""
        self.tokenizer, self.cfg = tokenizer, cfg
        for kind, source in self.sources.items():
            if source.tokens is None:
                source.tokens = self._tokens(kind, source.corpus)
        return self

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)

    def roles_for(self, kind: str) -> tuple[str, ...]:
        extra = self.method.caption_roles if kind == CAPTION else ()
        return tuple(dict.fromkeys((*self.method.text_roles, *extra)))

    def _open_feature_sets(self) -> dict[str, FeatureSet]:
        """Open every role's set(s); ``DIR1,DIR2`` gives one role a set per corpus."""
        needed = {r for kind in self.sources for r in self.roles_for(kind)}
        missing = sorted(needed - set(self.cfg.features))
        if missing:
            flags = " ".join(f"--feature {r}=DIR" for r in missing)
            raise MmcseError(f"method {self.method.name!r} needs cached features: give {flags}")
        self.role_sets: dict[str, list[FeatureSet]] = {}
        for role in sorted(needed):
            sets = [FeatureSet.open(d) for d in self.cfg.features[role].split(",") if d]
            if len({(fs.manifest.kind, fs.shape) for fs in sets}) > 1:
                raise MmcseError(f"the sets given for role {role!r} differ in kind or shape")
            expected = self.cfg.expect_fingerprints.get(role)
            if expected and len(sets) == 1:
                sets[0].require_fingerprint(expected)
            self.role_sets[role] = sets
        return {role: sets[0] for role, sets in self.role_sets.items()}

    def _join_features(self, source: Source) -> None:
        for role in self.roles_for(source.kind):
            if self.feature_sets[role].manifest.kind in METHOD_JOINED_KINDS:
                continue
            keyed_by_image = self.feature_sets[role].manifest.kind in IMAGE_KEYED_KINDS
            keys = source.image_ids if keyed_by_image else source.ids
            fs, rows = self._first_set_with(role, keys)
            source.feature_sets[role], source.feature_rows[role] = fs, rows

    def _first_set_with(self, role: str, keys: np.ndarray) -> tuple[FeatureSet, np.ndarray]:
        """The first of the role's sets that holds every key (errors name the first set's gap)."""
        first_error = None
        for fs in self.role_sets[role]:
            try:
                return fs, fs.rows_for(keys)
            except MissingIdsError as exc:
                first_error = first_error or exc
        raise first_error

    # -- batches ---------------------------------------------------------------------------
    def batch(self, kind: str, rows: np.ndarray, device: torch.device) -> Batch:
        src = self.sources[kind]
        input_ids, lengths = src.token_rows(rows)
        width = batch_width(lengths, self.cfg.max_seq_length, self.cfg.dynamic_padding)
        ids = torch.from_numpy(input_ids[:, :width].astype(np.int64))
        lengths = torch.from_numpy(np.ascontiguousarray(lengths))
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        packed = self.pack(kind, ids, mask) if self.cfg.packing else None
        features = {
            role: torch.from_numpy(
                np.ascontiguousarray(src.feature_sets[role].take(frows[rows]))
            ).float()
            for role, frows in src.feature_rows.items()
        }
        batch = Batch(kind, rows, ids, mask, features, packed=packed)
        return to_device(batch, device)

    # -- packing ---------------------------------------------------------------------------
    def pack(self, kind: str, input_ids: Tensor, attention_mask: Tensor) -> PackedTokens:
        """A batch's two dropout views packed into rows of :attr:`pack_width` tokens."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        rows = self.pack_budgets.get(kind)
        return pack_tokens(input_ids, attention_mask, self.pack_width, pad, rows, copies=2)

    @property
    def pack_width(self) -> int:
        """Tokens per packed row (:func:`mmcse.packing.packed_row_width`)."""
        return packed_row_width(self.cfg.max_seq_length)

    def fix_pack_budgets(self, batches) -> dict[str, int]:
        """Fix each batch kind's packed rows once per run (static shapes: one captured graph
        per kind): the most rows any of ``batches`` (``(kind, rows)``, this rank's part of every
        batch the run draws) needs, so none overflows."""
        lengths = {kind: src.lengths for kind, src in self.sources.items()}
        budgets: dict[str, int] = {}
        for kind, rows in batches:
            need = rows_needed(lengths[kind][rows], self.pack_width)
            budgets[kind] = max(budgets.get(kind, 0), need)
        self.pack_budgets = budgets
        return budgets

    def fingerprints(self) -> dict[str, dict[str, str]]:
        """What a checkpoint records: every corpus and feature set it trained on."""
        out = {
            f"corpus:{k}": {
                "path": str(getattr(self.cfg, f"{k}_corpus")),
                "fingerprint": s.fingerprint,
            }
            for k, s in self.sources.items()
        }
        for role, sets in self.role_sets.items():
            for i, fs in enumerate(sets):
                key = f"feature:{role}" + (f"[{i}]" if len(sets) > 1 else "")
                out[key] = {"path": str(fs.path), "fingerprint": fs.fingerprint}
        return out

    def teachers(self) -> dict[str, dict]:
        """The provenance of every feature set (:meth:`mmcse.cache.Manifest.provenance`), keyed
        as in :meth:`fingerprints`."""
        return {
            f"feature:{role}" + (f"[{i}]" if len(sets) > 1 else ""): fs.manifest.provenance()
            for role, sets in self.role_sets.items()
            for i, fs in enumerate(sets)
        }


def batch_width(lengths: np.ndarray, max_length: int, dynamic: bool) -> int:
    """Padded width of a batch: its longest sentence (dynamic padding: no work on padding
    columns every row has), else ``max_length`` (one static shape, e.g. for ``--compile``)."""
    return int(lengths.max()) if dynamic else max_length
