"""Training data from the cache: token ids cached once per corpus, teacher features joined by id.

A corpus (a corpus table, or a file of one sentence per line) is opened without reading its texts;
its token ids come from the token cache (:mod:`mmcse.cache.tokens`: written by the first run,
memory-mapped by every later one, seed, recipe and ablation), or are encoded in memory with
``token_cache = "off"``. A batch is a vectorised row gather, trimmed to its longest sentence.
Each feature role is joined to a corpus **by id** once at start-up (image sets by ``image_id``,
text sets by sentence id) into row numbers, so a step gathers features with one ``take`` per role
and never touches a teacher. Columns are read only when something needs them: a SimCSE run on a
warm token cache reads neither the texts nor the ids of its corpus.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from mmcse import corpusfiles
from mmcse import distributed as dist
from mmcse.cache import Corpus, FeatureSet
from mmcse.cache.layout import MANIFEST_NAME
from mmcse.cache.tokenizer import encode_rows, tokenizer_fingerprint
from mmcse.cache.tokens import TokenKey, TokenTable, cached_tokens, entry_path
from mmcse.errors import MissingIdsError, MmcseError
from mmcse.methods.base import Method
from mmcse.packing import PackedTokens, pack_tokens, rows_needed
from mmcse.training.config import TOKEN_CACHE_AUTO, TOKEN_CACHE_OFF, TrainConfig

logger = logging.getLogger(__name__)

TEXT, CAPTION = "text", "caption"
#: feature-set kinds joined on the caption's image id; every other kind joins on the sentence id
IMAGE_KEYED_KINDS = ("image",)
#: feature-set kinds the generic join leaves to the method (e.g. MCSEO's per-phrase objects)
METHOD_JOINED_KINDS = ("object", "objects", "image_tensor", "audio_fbank")
#: how :func:`read_corpus` turns a sentence file's bytes into sentences; change it whenever that
#: changes (decoding, stripping, skipping): token-cache entries of sentence files are keyed by it
SENTENCE_FILE_READER = "corpusfiles-1/strip/max10000"
#: what a corpus may be, for errors
CORPUS_FORMS = f"give a corpus table folder or a sentence file: {corpusfiles.FORMATS}"


class CorpusView(Protocol):
    """What training reads of a corpus; every column is read on first use only."""

    path: Path
    fingerprint: str

    def __len__(self) -> int: ...
    @property
    def ids(self) -> np.ndarray: ...
    @property
    def texts(self) -> list[str]: ...
    @property
    def image_ids(self) -> np.ndarray | None: ...


class TableCorpus:
    """A corpus table, memory-mapped: its manifest gives the size, ids hash and fingerprint."""

    reader = ""  # the fingerprint fixes every sentence

    def __init__(self, path: Path) -> None:
        self.path = path
        self.table = Corpus.open(path)
        self.fingerprint = self.table.fingerprint
        self.num_rows: int | None = len(self.table)
        self.ids_sha256: str | None = self.table.manifest.ids_sha256
        self.dataset, self.split = self.table.manifest.dataset, self.table.manifest.split

    def __len__(self) -> int:
        return len(self.table)

    @cached_property
    def ids(self) -> np.ndarray:
        return self.table.ids

    @cached_property
    def texts(self) -> list[str]:
        return self.table.texts

    @cached_property
    def image_ids(self) -> np.ndarray | None:
        """Object array (None where a row has none); None when the first 1000 rows have none."""
        image_ids = self.table.column("image_id")
        return image_ids if any(i not in (None, "") for i in image_ids[:1000]) else None


class TextFileCorpus:
    """A sentence file in any format :mod:`mmcse.corpusfiles` reads (plain text, JSON lines,
    CSV/TSV, Parquet, a ``datasets`` dataset), read once under the read policy; its id is
    ``<stem>:<row>`` (the 0-based line of a text file), fingerprinted by its bytes."""

    def __init__(self, path: Path | str, text_field: str | None = None, bad_lines: str = "skip"):
        self.path = Path(path) if not corpusfiles.is_hf_name(path) else path
        self.text_field, self.bad_lines = text_field, bad_lines
        self.ids_sha256: str | None = None
        self.dataset, self.split = corpus_stem(path), "train"
        self.image_ids = None

    @cached_property
    def read(self) -> corpusfiles.Sentences:
        read = corpusfiles.read_sentences(self.path, self.text_field, self.bad_lines)
        if not read.texts:
            raise MmcseError(f"corpus {self.path} has no sentences ({read.summary() or 'empty'})")
        if read.dropped:
            row, reason = read.dropped[0]
            logger.warning(
                f"corpus {self.path}: {read.summary()} of {read.records.num_rows} rows, "
                f"e.g. {read.records.where(row)}: {reason} (--bad-lines refuse to refuse such "
                "a file)"
            )
        return read

    @property
    def fingerprint(self) -> str:
        return self.read.records.fingerprint

    @property
    def num_rows(self) -> int:
        return len(self.read.texts)

    @property
    def reader(self) -> str:
        """What turned the file into sentences (token-cache entries are keyed by it)."""
        read = self.read
        return f"{SENTENCE_FILE_READER}/{read.records.format}/{read.text_field}/{self.bad_lines}"

    def __len__(self) -> int:
        return len(self.read.texts)

    @cached_property
    def ids(self) -> np.ndarray:
        stem = self.dataset  # once, not per line (1.7 s of a 1M-line file)
        return np.asarray([f"{stem}:{row}" for row in self.read.rows], dtype=object)

    @property
    def texts(self) -> list[str]:
        return self.read.texts


def corpus_stem(path: Path | str) -> str:
    """The name a file's sentence ids start with: its stem (an ``hf:`` name's last part)."""
    if corpusfiles.is_hf_name(path):
        return str(path)[len(corpusfiles.HF_PREFIX) :].split(":")[0].split("/")[-1]
    return Path(path).stem


@dataclass
class InMemoryCorpus:
    """A corpus given as arrays (tests, tools)."""

    ids: np.ndarray
    texts: list[str]
    image_ids: np.ndarray | None = None
    fingerprint: str = ""
    path: Path = Path("<memory>")

    def __len__(self) -> int:
        return len(self.ids)


def open_corpus(
    path: str, text_field: str | None = None, bad_lines: str = "skip"
) -> TableCorpus | TextFileCorpus:
    """A corpus table folder (opened without reading its texts) or a sentence file in any
    format :mod:`mmcse.corpusfiles` reads (read once, when first asked)."""
    if corpusfiles.is_hf_name(path):
        return TextFileCorpus(path, text_field, bad_lines)
    p = Path(path)
    if (p / MANIFEST_NAME).is_file():
        return TableCorpus(p)
    if not p.exists():
        raise MmcseError(f"corpus {p} does not exist ({CORPUS_FORMS})")
    return TextFileCorpus(p, text_field, bad_lines)


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

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])


def read_corpus(
    path: str, text_field: str | None = None, bad_lines: str = "skip"
) -> tuple[np.ndarray, list[str], np.ndarray | None, str]:
    """(ids, texts, image_ids, fingerprint) of a corpus table dir or a sentence file."""
    corpus = open_corpus(path, text_field, bad_lines)
    image_ids = corpus.image_ids
    return np.asarray(corpus.ids, dtype=object), list(corpus.texts), image_ids, corpus.fingerprint


def corpus_tokens(
    corpus: TableCorpus | TextFileCorpus | str,
    tokenizer,
    max_length: int,
    token_cache: str = TOKEN_CACHE_AUTO,
    tokenizer_fp: str | None = None,
    desc: str = "tokenise",
) -> TokenTable:
    """The token rows of ``corpus`` (a corpus or its path): from the token cache, written first
    if needed (``token_cache``: ``auto``, a folder, or ``off`` to encode in memory). Training calls
    it per corpus; calling it ahead (e.g. before launching a table of runs) warms the cache."""
    if isinstance(corpus, str | Path):
        corpus = open_corpus(str(corpus))

    def encode() -> np.ndarray:
        return encode_rows(tokenizer, corpus.texts, max_length, desc)

    if token_cache == TOKEN_CACHE_OFF:
        return TokenTable(encode())
    key = TokenKey(
        corpus.fingerprint,
        tokenizer_fp or tokenizer_fingerprint(tokenizer),
        max_length,
        tokenizer=Path(str(getattr(tokenizer, "name_or_path", ""))).name,
        num_rows=corpus.num_rows,
        ids_sha256=corpus.ids_sha256,
        corpus_reader=corpus.reader,
    )
    named = token_cache != TOKEN_CACHE_AUTO
    desc = f"{desc} into the token cache (once)"
    return cached_tokens(
        entry_path(corpus.path, key, token_cache if named else None),
        key,
        lambda: (corpus.ids, encode()),
        dataset=corpus.dataset,
        split=corpus.split,
        must_write=named,
    )


class TrainData:
    """The corpora and feature sets of one run, and the batch schedule over them.

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

    # -- schedule --------------------------------------------------------------------------
    def batches_per_pass(self, global_batch: int) -> dict[str, int]:
        """Batches in one pass over each corpus: full ones, plus the last partial one if kept."""
        counts = {}
        for kind, src in self.sources.items():
            partial = self._keeps_partial(len(src), global_batch)
            counts[kind] = len(src) // global_batch + int(partial)
            if counts[kind] == 0:
                raise MmcseError(
                    f"the {kind} corpus has {len(src)} sentences, fewer than one "
                    f"global batch ({global_batch}); lower --batch-size"
                )
        return counts

    def _keeps_partial(self, n: int, global_batch: int) -> bool:
        """Keep the last partial batch (torch's DataLoader default, which the released loaders
        use) unless --drop-last; it needs 2 rows for in-batch negatives, and under DDP it is
        dropped because it cannot be split into equal per-rank batches."""
        return not self.cfg.drop_last and n % global_batch >= 2 and dist.world_size() == 1

    def batches_per_epoch(self, global_batch: int) -> dict[str, int]:
        """Batches per corpus in one epoch of the schedule; their sum is the epoch's steps."""
        passes = self.batches_per_pass(global_batch)
        if self.cfg.mixing == "mcse-train-mix" and len(passes) == 2:
            return train_mix_counts(passes[TEXT], passes[CAPTION])
        return passes

    def schedule(self, epoch: int, global_batch: int) -> list[tuple[str, np.ndarray]]:
        """Global batches of one epoch: (kind, row indices), identical on every rank."""
        if self.cfg.mixing == "mcse-train-mix" and len(self.sources) == 2:
            return self._train_mix_schedule(epoch, global_batch)
        rng = np.random.default_rng([self.cfg.seed, epoch])
        chunks = {}
        for kind, n in self.batches_per_pass(global_batch).items():
            order = rng.permutation(len(self.sources[kind]))
            chunks[kind] = [order[i * global_batch : (i + 1) * global_batch] for i in range(n)]
        return mix_batches(chunks.get(TEXT, []), chunks.get(CAPTION, []), self.cfg.mixing, rng)

    def _train_mix_schedule(self, epoch: int, global_batch: int) -> list[tuple[str, np.ndarray]]:
        """MCSE's ``train_mix.py``: step ``s`` of the epoch takes the next caption batch when
        ``s % ⌊N_text/N_caption⌋ == 0``, else the next text batch, from two endless loaders
        (each re-shuffled per pass, continuing across epochs)."""
        passes = self.batches_per_pass(global_batch)
        counts = self.batches_per_epoch(global_batch)
        every = passes[TEXT] // passes[CAPTION]
        streams = {
            kind: self._endless_batches(kind, global_batch, epoch * counts[kind], counts[kind])
            for kind in (TEXT, CAPTION)
        }
        steps = counts[TEXT] + counts[CAPTION]
        return [
            (kind, next(streams[kind]))
            for kind in (CAPTION if s % every == 0 else TEXT for s in range(steps))
        ]

    def _endless_batches(self, kind: str, global_batch: int, start: int, count: int):
        """Batches ``start .. start+count-1`` of an endless loader over one corpus."""
        n = len(self.sources[kind])
        per_pass = self.batches_per_pass(global_batch)[kind]
        order, current = None, -1
        for i in range(start, start + count):
            pass_index, j = divmod(i, per_pass)
            if pass_index != current:
                key = [self.cfg.seed, (TEXT, CAPTION).index(kind), pass_index]
                order, current = np.random.default_rng(key).permutation(n), pass_index
            yield order[j * global_batch : (j + 1) * global_batch]

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
            role: torch.from_numpy(np.ascontiguousarray(src.feature_sets[role].take(frows[rows])))
            .to(device, non_blocking=True)
            .float()
            for role, frows in src.feature_rows.items()
        }
        batch = Batch(kind, rows, ids.to(device, non_blocking=True), mask.to(device), features)
        batch.packed = packed.map(lambda t: t.to(device)) if packed is not None else None
        return batch

    # -- packing ---------------------------------------------------------------------------
    def pack(self, kind: str, input_ids: Tensor, attention_mask: Tensor) -> PackedTokens:
        """A batch's two dropout views packed into rows of ``max_seq_length`` tokens."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        rows = self.pack_budgets.get(kind)
        return pack_tokens(input_ids, attention_mask, self.cfg.max_seq_length, pad, rows, copies=2)

    def fix_pack_budgets(self, batches) -> dict[str, int]:
        """Fix each batch kind's packed rows once per run (static shapes: one captured graph
        per kind): the most rows any of ``batches`` (``(kind, rows)``, this rank's part of every
        batch the run's schedule draws) needs, so none overflows."""
        lengths = {kind: src.lengths for kind, src in self.sources.items()}
        budgets: dict[str, int] = {}
        for kind, rows in batches:
            need = rows_needed(lengths[kind][rows], self.cfg.max_seq_length)
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


def train_mix_counts(text_batches: int, caption_batches: int) -> dict[str, int]:
    """Batches per kind in one epoch of MCSE's ``train_mix.py`` schedule.

    The released loop runs ``N_t + N_c`` steps per epoch (``N`` = ``len(DataLoader)``, i.e.
    batches per pass, the last partial one included) and takes a caption batch at every step
    ``s`` with ``s % ⌊N_t/N_c⌋ == 0``: ``⌈(N_t + N_c)/⌊N_t/N_c⌋⌉`` caption batches, the rest text.
    """
    if text_batches < caption_batches:
        raise MmcseError(
            f"--mixing mcse-train-mix needs at least as many text batches as caption batches "
            f"per pass (got {text_batches} text, {caption_batches} caption): the released "
            "train_mix.py divides by ⌊N_text/N_caption⌋ = 0 here; use --mixing interleave"
        )
    every = text_batches // caption_batches
    steps = text_batches + caption_batches
    captions = (steps - 1) // every + 1
    return {TEXT: steps - captions, CAPTION: captions}


def batch_width(lengths: np.ndarray, max_length: int, dynamic: bool) -> int:
    """Padded width of a batch: its longest sentence (dynamic padding: no work on padding
    columns every row has), else ``max_length`` (one static shape, e.g. for ``--compile``)."""
    return int(lengths.max()) if dynamic else max_length


def mix_batches(
    text: list[np.ndarray], caption: list[np.ndarray], mixing: str, rng: np.random.Generator
) -> list[tuple[str, np.ndarray]]:
    """Order text and caption batches that each use their corpus once (one pass per epoch).

    ``interleave``: a caption batch before every ⌊N_text/N_caption⌋-th text batch, leftovers at
    the end — mmcse's own schedule, *not* MCSE's released one (that is ``mcse-train-mix``,
    :meth:`TrainData.schedule`, which revisits captions and skips part of the text corpus);
    ``proportional-random``: batch kinds shuffled, so each kind appears in proportion to its
    size; ``text-only``/``caption-only``: one corpus.
    """
    if mixing == "text-only" or not caption:
        return [(TEXT, b) for b in text]
    if mixing == "caption-only" or not text:
        return [(CAPTION, b) for b in caption]
    if mixing == "proportional-random":
        kinds = np.array([TEXT] * len(text) + [CAPTION] * len(caption))
        rng.shuffle(kinds)
        its = {TEXT: iter(text), CAPTION: iter(caption)}
        return [(k, next(its[k])) for k in kinds]
    every = max(1, len(text) // len(caption))
    out: list[tuple[str, np.ndarray]] = []
    cap = iter(caption)
    used = 0
    for i, b in enumerate(text):
        if i % every == 0 and used < len(caption):
            out.append((CAPTION, next(cap)))
            used += 1
        out.append((TEXT, b))
    out.extend((CAPTION, b) for b in cap)
    return out
