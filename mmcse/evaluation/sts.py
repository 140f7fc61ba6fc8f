"""The STS evaluation of SimCSE, MCSE, KDMCSE, DALR and MCSEO (their Table 1), on SentEval data.

Data: a SentEval data folder, i.e. the one holding ``downstream/STS`` and ``downstream/SICK``
(the folder itself or its ``downstream`` may be given). Without ``data_dir`` we use
``$MMCSE_SHARED_DATA/senteval``, else ``../shared/data/senteval`` beside the project root.

Protocol, matched to the code the papers ran:

* STS12-STS16 -- facebookresearch/SentEval ``senteval/sts.py`` (``STSEval.loadFile``): subset
  ``S`` of year ``YY`` is ``STS/STSYY-en-test/STS.input.S.txt`` (UTF-8, ``read().splitlines()``,
  one tab between the two sentences) with gold scores line by line in ``STS.gs.S.txt``; pairs
  whose gold line is empty are dropped (STS15/16 ship unscored pairs). Subsets are SentEval's
  lists (:data:`STS_YEAR_SUBSETS`; STS13 has no SMT, which is LDC-licensed).
* Sentences are whitespace-tokenised by SentEval (``str.split``) and re-joined with single
  spaces by the batcher of princeton-nlp/SimCSE ``evaluation.py``; no further lowercasing or
  cleaning (the SentEval files are already Moses-tokenised).
* STS-B and SICK-R are evaluated without training, like STS12-16 (SimCSE's
  ``SentEval/senteval/sts.py`` makes ``STSBenchmarkEval`` and ``SICKRelatednessEval`` subclasses
  of ``STSEval``): each line ``strip()``-ed and split on tabs; ``sts-test.csv`` has the score in
  column 4 and the sentences in 5 and 6 (0-based); ``SICK_test_annotated.txt`` has a header
  line (and CRLF endings), sentences in columns 1 and 2, score in 3. ``mode="dev"`` uses
  ``sts-dev.csv`` and ``SICK_trial.txt`` instead, as SimCSE's ``--mode dev``.
* A pair's system score is the cosine of its two embeddings (``nan`` -> 0, as SentEval).
* Each task's number is Spearman x 100 in the "all" setting: SimCSE's ``STSEval.run`` pools the
  scored pairs of every subset into one list and ``evaluation.py`` reports
  ``results[task]['all']['spearman']['all']`` (STS-B and SICK-R have a single subset).
  SentEval's original aggregates -- ``wmean`` (per-subset Spearman weighted by pairs) and
  ``mean`` -- and the per-subset numbers are kept in ``details``.
* ``avg`` is the mean of the task numbers each rounded to two decimals, because SimCSE's
  ``evaluation.py`` averages the values it prints with ``"%.2f"``.

Spearman does not depend on pair order, so each distinct sentence across all tasks is encoded
once, in length-sorted batches (:func:`mmcse.evaluation.encode.encode_sentences`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from mmcse.devices import check_device, default_device_name
from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation.align_uniform import align_uniform
from mmcse.evaluation.encode import encode_sentences, encoder_device, post_pooling_modules
from mmcse.hub import load_tokenizer, resolve_model_source
from mmcse.model import SentenceEncoder, encoding_max_length, resolve_encoding
from mmcse.pooling import check_pooler
from mmcse.precision import precision_name

STS_YEAR_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
TASKS_BY_MODE: dict[str, tuple[str, ...]] = {
    "test": (*STS_YEAR_SUBSETS, "STSBenchmark", "SICKRelatedness"),
    "dev": ("STSBenchmark", "SICKRelatedness"),
}
STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
SICK_FILES = {"dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
DEFAULT_POOLER = "cls_before_pooler"

Embedder = Callable[[Sequence[str]], np.ndarray]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subset:
    """Scored sentence pairs of one file (an STS year's subset, or an STS-B/SICK split)."""

    name: str
    pairs: list[tuple[str, str]]
    gold: np.ndarray  # float64 [len(pairs)]


@dataclass(frozen=True)
class StsTask:
    name: str  # SentEval's task name, e.g. "STS12", "STSBenchmark"
    subsets: list[Subset]

    def sentences(self) -> Iterable[str]:
        return (s for subset in self.subsets for pair in subset.pairs for s in pair)


# ---- locating and reading SentEval files -------------------------------------------------------


def default_data_dir() -> Path | None:
    """``senteval`` inside the shared data folder, when that exists."""
    project_root = Path(__file__).resolve().parents[2]
    shared = os.environ.get("MMCSE_SHARED_DATA") or project_root.parent / "shared" / "data"
    candidate = Path(shared) / "senteval"
    return candidate if candidate.is_dir() else None


#: the dev split the trainer selects checkpoints on (``STSBenchmark/sts-dev.csv``), by name
STSB_DEV = "STS-B dev"
#: a file in an ``--eval-data`` folder naming the data it keeps at STS-B dev's place (the demo's
#: held-out scene pairs), so logs and plans do not call it STS-B dev
DEV_NAME_FILE = "dev-name.txt"


def dev_set_name(data_dir: str | Path | None) -> str:
    """What the run's dev split is called: :data:`STSB_DEV`, unless the folder names it."""
    named = Path(data_dir) / DEV_NAME_FILE if data_dir else None
    if named is not None and named.is_file():
        return named.read_text(encoding="utf-8").strip() or STSB_DEV
    return STSB_DEV


def eval_data_dir(setting: str | None) -> Path | None:
    """The SentEval folder an ``--eval-data`` setting names (training and the bench): ``''``
    none (no evaluation), unset the shared copy (:func:`default_data_dir`; None when absent),
    else the folder given."""
    if setting == "":
        return None
    if setting:
        return Path(setting)
    return default_data_dir()


def resolve_downstream(data_dir: str | Path | None, needs: str | None = "STS") -> Path:
    """The ``downstream`` folder of a SentEval data folder (or of the default one): the first of
    ``DIR/downstream`` and ``DIR`` that holds the folder ``needs`` (STS scoring: ``STS``); with
    ``needs`` None (transfer tasks, each checked by name) the first that exists. Every suite
    resolves its folder here, so they agree on which folder ``--data`` names."""
    if data_dir is None:
        data_dir = default_data_dir()
        if data_dir is None:
            raise MmcseError(
                "no SentEval data found (looked for $MMCSE_SHARED_DATA/senteval and "
                "../shared/data/senteval); pass --data DIR, the folder holding downstream/STS"
            )
    root = Path(data_dir)
    if not root.is_dir():
        raise MmcseError(f"{root} is not a SentEval data folder: it does not exist")
    candidates = [folder for folder in (root / "downstream", root) if folder.is_dir()]
    if needs is None:
        return candidates[0]
    for candidate in candidates:
        if (candidate / needs).is_dir():
            return candidate
    raise MmcseError(f"{root} is not a SentEval data folder: no downstream/{needs} inside it")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MmcseError(f"missing SentEval file {path}") from None
    except UnicodeDecodeError as exc:
        raise MmcseError(f"{path}: not UTF-8 (byte {exc.start})") from None


def _score(text: str, path: Path, line_number: int) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MmcseError(f"{path}:{line_number}: gold score {text!r} is not a number") from None
    if not np.isfinite(value):  # a nan gold score turns every average into nan
        raise MmcseError(f"{path}:{line_number}: gold score {text!r} is not a finite number")
    return value


def _scored(subset: Subset, path: Path) -> Subset:
    """The subset, refused when nothing in it is scored (an empty or truncated file)."""
    if len(subset.pairs) < 2:
        raise MmcseError(
            f"{path}: {len(subset.pairs)} scored sentence pair(s); Spearman needs at least 2 "
            "(is the file empty or truncated?)"
        )
    return subset


def _join_tokens(sentence: str) -> str:
    # SentEval splits on whitespace, SimCSE's batcher joins with ' '
    return " ".join(sentence.split())


def load_sts_subset(folder: Path, subset: str) -> Subset:
    """One subset of an STS12-16 year; pairs with an empty gold line are skipped."""
    input_path = folder / f"STS.input.{subset}.txt"
    gold_path = folder / f"STS.gs.{subset}.txt"
    lines = _read_text(input_path).splitlines()
    gold_lines = _read_text(gold_path).splitlines()
    if len(gold_lines) != len(lines):
        raise MmcseError(
            f"{gold_path}: {len(gold_lines)} gold lines for {len(lines)} pairs in {input_path.name}"
        )
    pairs, gold = [], []
    for number, (line, gold_text) in enumerate(zip(lines, gold_lines, strict=True), start=1):
        columns = line.split("\t")
        if len(columns) != 2:
            raise MmcseError(f"{input_path}:{number}: expected 2 tab-separated sentences")
        if not gold_text.strip():  # unscored pair
            continue
        pairs.append((_join_tokens(columns[0]), _join_tokens(columns[1])))
        gold.append(_score(gold_text, gold_path, number))
    scored = Subset(subset, pairs, np.asarray(gold, dtype=np.float64))
    return _scored(scored, gold_path if lines else input_path)


def load_tsv_pairs(
    path: Path, name: str, sentence_columns: tuple[int, int], score_column: int, header: bool
) -> Subset:
    """A SentEval STS-B/SICK file: ``strip()`` each line, split on tabs, pick three columns."""
    if not path.is_file():
        raise MmcseError(f"missing SentEval file {path}")
    needed = max(*sentence_columns, score_column) + 1
    pairs, gold = [], []
    with path.open(encoding="utf-8") as lines:
        try:
            for number, line in enumerate(lines, start=1):
                if header and number == 1:
                    continue
                columns = line.strip().split("\t")
                if len(columns) < needed:
                    raise MmcseError(
                        f"{path}:{number}: expected at least {needed} tab-separated columns"
                    )
                first, second = (_join_tokens(columns[i]) for i in sentence_columns)
                pairs.append((first, second))
                gold.append(_score(columns[score_column], path, number))
        except UnicodeDecodeError as exc:
            raise MmcseError(f"{path}: not UTF-8 (byte {exc.start})") from None
    return _scored(Subset(name, pairs, np.asarray(gold, dtype=np.float64)), path)


def load_stsbenchmark(downstream: Path, split: str) -> Subset:
    path = downstream / "STS" / "STSBenchmark" / STSB_FILES[split]
    return load_tsv_pairs(path, split, sentence_columns=(5, 6), score_column=4, header=False)


def load_sick(downstream: Path, split: str) -> Subset:
    path = downstream / "SICK" / SICK_FILES[split]
    return load_tsv_pairs(path, split, sentence_columns=(1, 2), score_column=3, header=True)


def load_task(downstream: Path, name: str, split: str = "test") -> StsTask:
    """A SentEval task by name; ``split`` picks the STS-B/SICK file (STS12-16 are test only)."""
    if name in STS_YEAR_SUBSETS:
        folder = downstream / "STS" / f"{name}-en-test"
        return StsTask(name, [load_sts_subset(folder, subset) for subset in STS_YEAR_SUBSETS[name]])
    if name == "STSBenchmark":
        return StsTask(name, [load_stsbenchmark(downstream, split)])
    if name == "SICKRelatedness":
        return StsTask(name, [load_sick(downstream, split)])
    raise MmcseError(f"unknown STS task {name!r}")


def load_tasks(data_dir: str | Path | None = None, mode: str = "test") -> list[StsTask]:
    """The tasks of ``mode`` ("test": all seven; "dev": STS-B and SICK-R dev splits)."""
    if mode not in TASKS_BY_MODE:
        raise MmcseError(f"unknown mode {mode!r}; choose one of {', '.join(TASKS_BY_MODE)}")
    downstream = resolve_downstream(data_dir)
    return [load_task(downstream, name, split=mode) for name in TASKS_BY_MODE[mode]]


# ---- scoring ---------------------------------------------------------------------------------


def embed_unique(sentences: Iterable[str], embed: Embedder) -> tuple[np.ndarray, dict[str, int]]:
    """Embed each distinct sentence once; returns the vectors and a sentence -> row map."""
    unique = list(dict.fromkeys(sentences))
    return embed(unique), {sentence: row for row, sentence in enumerate(unique)}


def embed_tasks(
    tasks: Sequence[StsTask], extra: list[str], embed: Embedder, progress: bool
) -> tuple[np.ndarray, dict[str, int]]:
    """Each distinct sentence of ``tasks`` (then ``extra``) embedded once. With ``progress``,
    task by task, each task's new sentences after a line naming it (a final evaluation that
    takes minutes says which task it is on); else in one pass."""
    if not progress:
        return embed_unique([*(s for task in tasks for s in task.sentences()), *extra], embed)
    groups = [(task.name, task.sentences()) for task in tasks]
    groups += [("STS-B for alignment/uniformity", extra)] if extra else []
    row: dict[str, int] = {}
    parts = []
    for number, (name, sentences) in enumerate(groups, start=1):
        new = [s for s in dict.fromkeys(sentences) if s not in row]
        logger.info(f"STS {number}/{len(groups)}: {name}, encoding {len(new):,} new sentences")
        first = len(row)
        row.update((sentence, first + k) for k, sentence in enumerate(new))
        if new:
            parts.append(embed(new))
    return np.concatenate(parts), row


def paired_cosine(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Row-wise cosine; ``nan`` (a zero vector) becomes 0 like SentEval's ``np.nan_to_num``."""
    left = np.nan_to_num(left.astype(np.float64))
    right = np.nan_to_num(right.astype(np.float64))
    norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.nan_to_num((left * right).sum(axis=1) / norms)


def spearman_x100(system: np.ndarray, gold: np.ndarray) -> float:
    return float(spearmanr(system, gold).statistic) * 100.0


def score_task(task: StsTask, vectors: np.ndarray, row: dict[str, int]) -> dict:
    """'all' Spearman plus SentEval's per-subset, ``wmean`` and ``mean`` numbers (all x 100)."""
    subsets, system_scores = {}, []
    for subset in task.subsets:
        left = vectors[[row[a] for a, _ in subset.pairs]]
        right = vectors[[row[b] for _, b in subset.pairs]]
        system_scores.append(paired_cosine(left, right))
        subsets[subset.name] = {
            "spearman": spearman_x100(system_scores[-1], subset.gold),
            "pairs": len(subset.pairs),
        }
    per_subset = np.array([s["spearman"] for s in subsets.values()])
    weights = np.array([s["pairs"] for s in subsets.values()])
    return {
        "all": spearman_x100(
            np.concatenate(system_scores), np.concatenate([s.gold for s in task.subsets])
        ),
        "wmean": float(np.average(per_subset, weights=weights)),
        "mean": float(per_subset.mean()),
        "pairs": int(weights.sum()),
        "subsets": subsets,
    }


def average_of_printed(scores: Iterable[float]) -> float:
    values = [float(f"{score:.2f}") for score in scores]
    return sum(values) / len(values)


# ---- end to end --------------------------------------------------------------------------------


def load_encoder(path: str | Path, pooler: str | None, device: str | None):
    """Encoder, tokenizer, pooler and resolved directory for a run directory or HF model.

    ``pooler=None`` encodes as the model does (:func:`mmcse.model.resolve_encoding`): a
    sentence-transformers dir with its own modules after pooling (Dense, Normalize), a run with
    its recorded pooler; a given pooler is the bare encoder with that pooling."""

    model_dir = resolve_model_source(str(path))
    requested = pooler
    pooler, source, modules = resolve_encoding(pooler, model_dir, DEFAULT_POOLER)
    if modules:
        chain = " → ".join(["pooling " + pooler, *(m.kind for m in modules)])
        logger.info(f"{model_dir}: encoding as {source} ({chain})")
    try:
        encoder = SentenceEncoder.from_pretrained(model_dir, pooler=pooler)
        tokenizer = load_tokenizer(model_dir)
    except OSError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MmcseError(f"cannot load model {path}: {first_line}") from None
    encoder.post_pooling = post_pooling_modules(modules)
    encoder.max_length = encoding_max_length(requested, model_dir)
    return encoder.to(device or default_device_name()), tokenizer, pooler, model_dir


def checked_pooler(pooler: str | None) -> str | None:
    """A known pooler name made canonical (``mean`` -> ``avg``); ``None``/``auto``: the model's."""
    if pooler is None:
        return None
    pooler = check_pooler(pooler, allow_auto=True)
    return None if pooler == "auto" else pooler


def resolve_encoder(encoder_or_path, tokenizer, pooler: str | None, device, caller: str):
    """``(encoder, tokenizer, pooler, model name)``: a path is loaded (with its own pooling when
    ``pooler`` is None); an in-memory encoder is used as is and needs its tokenizer."""
    if isinstance(encoder_or_path, str | Path):
        return load_encoder(encoder_or_path, pooler, device)
    if tokenizer is None:
        raise MmcseError(f"{caller} needs a tokenizer with an in-memory encoder")
    encoder = encoder_or_path
    model_name = getattr(getattr(encoder, "backbone", encoder).config, "name_or_path", "")
    return encoder, tokenizer, pooler or getattr(encoder, "pooler", DEFAULT_POOLER), model_name


def evaluate_sts(
    encoder_or_path,
    tokenizer=None,
    data_dir: str | Path | None = None,
    mode: str = "test",
    pooler: str | None = None,
    batch_size: int = 128,
    device: str | None = None,
    max_length: int | None = None,
    with_align_uniform: bool = False,
    progress: bool = False,
) -> dict:
    """Evaluate a run directory / HF model directory, or an in-memory encoder + tokenizer.

    Returns ``{task: 'all' Spearman x 100, ..., "avg": ..., "details": {...}}`` with SentEval task
    names (``STS12`` ... ``STS16``, ``STSBenchmark``, ``SICKRelatedness``; dev mode: the last
    two); ``details`` holds per-subset Spearman, ``wmean``, ``mean``, pair counts, pooler, model,
    seconds, the ``protocol`` (mode, pooler, data folder: what makes two results comparable)
    and the ``environment`` (:mod:`mmcse.environment`). ``with_align_uniform`` adds ``"align_uniform"`` (see
    :mod:`mmcse.evaluation.align_uniform`). ``pooler=None`` keeps the run's (or the encoder's)
    pooler; ``device=None`` keeps an in-memory encoder where it is.
    """
    started = time.perf_counter()
    pooler = checked_pooler(pooler)
    device = None if device == "auto" else device
    check_eval_settings(batch_size, device)
    tasks = load_tasks(data_dir, mode)  # fail on bad data before loading a model
    encoder, tokenizer, pooler, model_name = resolve_encoder(
        encoder_or_path, tokenizer, pooler, device, "evaluate_sts"
    )

    # alignment/uniformity use the full STS-B; its sentences join the one encoding pass
    full_stsb = []
    if with_align_uniform:
        downstream = resolve_downstream(data_dir)
        full_stsb = [load_stsbenchmark(downstream, split) for split in STSB_FILES]
    embed = functools.partial(
        encode_sentences,
        encoder,
        tokenizer,
        batch_size=batch_size,
        max_length=max_length,
        device=device,
        pooler=pooler,
        progress=progress,
    )
    extra = [s for subset in full_stsb for pair in subset.pairs for s in pair]
    vectors, row = embed_tasks(tasks, extra, embed, progress)
    scores = {task.name: score_task(task, vectors, row) for task in tasks}

    results: dict = {name: scores[name]["all"] for name in scores}
    results["avg"] = average_of_printed(results[name] for name in scores)
    if full_stsb:
        pairs = [pair for subset in full_stsb for pair in subset.pairs]
        gold = np.concatenate([subset.gold for subset in full_stsb])
        results["align_uniform"] = {
            **align_uniform(pairs, gold, vectors, row),
            "stsb_splits": list(STSB_FILES),
        }
    used = encoder_device(encoder, device)
    protocol = {"mode": mode, "pooler": pooler, "data": str(resolve_downstream(data_dir).resolve())}
    results["details"] = {
        "model": str(model_name),
        "pooler": pooler,
        "mode": mode,
        "sentences_encoded": len(row),
        "seconds": round(time.perf_counter() - started, 2),
        "tasks": scores,
        "protocol": protocol | ({"max_length": max_length} if max_length else {}),
        "environment": environment(used, precision_name(used)),
    }
    return results


def check_eval_settings(batch_size: int, device: str | None) -> None:
    """``--batch-size`` and ``--device`` refused with one line before any file or model loads."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MmcseError(f"--batch-size must be an integer of at least 1, got {batch_size!r}")
    if device is not None:
        check_device(device)


@functools.lru_cache(maxsize=4)
def load_stsb_dev(downstream: Path) -> tuple[StsTask, tuple[str, ...]]:
    """STS-B dev and its distinct sentences in first-seen order (read once per folder)."""
    task = load_task(downstream, "STSBenchmark", split="dev")
    return task, tuple(dict.fromkeys(task.sentences()))
