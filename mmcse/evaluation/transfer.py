"""SentEval transfer tasks (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC) as SimCSE reports them.

A frozen sentence embedding is probed with SentEval's logistic regression
(:mod:`mmcse.evaluation.probe`); the table is SimCSE's Table 2 / DALR's transfer table: test
accuracy x 100 per task and their average (of the printed 2-decimal values, as SimCSE's
``evaluation.py``). Two settings, SimCSE's ``--mode``:

* ``test`` (the papers' numbers): ``kfold=10``, Adam, batch 64, tenacity 5, epoch_size 4;
* ``fasttest``: ``kfold=5``, RMSprop, batch 128, tenacity 3, epoch_size 2.

Protocol per task (SentEval ``binary.py``, ``sst.py``, ``trec.py``, ``mrpc.py``):

* MR, CR, SUBJ, MPQA: ``pos`` then ``neg`` file (SUBJ: objective = label 1), read as Latin-1,
  whitespace-tokenised; nested k-fold cross-validation (``kfold`` outer and inner folds).
* SST-2 (``SST/binary``): the given train/dev/test; the regulariser and early stopping on dev.
* TREC: coarse labels (6 classes) of ``train_5500.label``; k-fold on train, test on
  ``TREC_10.label``.
* MRPC: features ``[|u - v|, u * v]`` of the two sentences (SentEval's ``mrpc.py`` — u and v
  themselves are not concatenated); k-fold on train, test on the test file; accuracy is the
  table's number, F1 is kept in the details.

With ``progress``, each task logs what it will train and its result, shows a bar of the probes
fitted (CR in test mode: 410, minutes on a CPU) and logs every outer fold or regulariser tried.

Each split is sorted by (token count, label) before embedding, as SentEval does; the order
decides the folds, so it is kept to reproduce SentEval's splits exactly. Sentences reach the
encoder joined with single spaces (SimCSE's batcher).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.metrics import f1_score
from tqdm.auto import tqdm

from mmcse.environment import environment
from mmcse.errors import MmcseError
from mmcse.evaluation import probe
from mmcse.evaluation.encode import encode_sentences, encoder_device
from mmcse.evaluation.report import _render
from mmcse.evaluation.sts import (
    average_of_printed,
    checked_pooler,
    resolve_downstream,
    resolve_encoder,
)
from mmcse.precision import precision_name

TRANSFER_TASKS: tuple[str, ...] = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
TRANSFER_TITLES = {task: ("SST" if task == "SST2" else task) for task in TRANSFER_TASKS}
BINARY_FILES = {
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}
TREC_CLASSES = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Split:
    """Tokenised sentences (or sentence pairs for MRPC) and integer labels, SentEval-sorted."""

    sentences: list[list[str]]
    labels: np.ndarray
    second: list[list[str]] | None = None  # MRPC's sentence B


@dataclass(frozen=True)
class TransferTask:
    name: str
    splits: dict[str, Split]  # "all" (cross-validated) or "train"/"dev"/"test"

    def texts(self) -> list[str]:
        out = []
        for split in self.splits.values():
            out += [" ".join(s) for s in split.sentences]
            out += [" ".join(s) for s in split.second or []]
        return out


# ---- reading SentEval's files ------------------------------------------------------------------


def _lines(path: Path, encoding: str) -> list[str]:
    if not path.is_file():
        raise MmcseError(f"missing SentEval transfer file {path}")
    try:
        return path.read_text(encoding=encoding).splitlines()
    except UnicodeDecodeError as exc:
        raise MmcseError(f"{path}: not {encoding} (byte {exc.start})") from None


def _sorted(sentences, labels, second=None) -> Split:
    if second is None:
        order = sorted(range(len(labels)), key=lambda i: (len(sentences[i]), labels[i]))
        return Split([sentences[i] for i in order], np.asarray([labels[i] for i in order]))
    order = sorted(range(len(labels)), key=lambda i: (len(sentences[i]), len(second[i]), labels[i]))
    return Split(
        [sentences[i] for i in order],
        np.asarray([labels[i] for i in order]),
        [second[i] for i in order],
    )


def load_binary(downstream: Path, name: str) -> TransferTask:
    folder, positive, negative = BINARY_FILES[name]
    pos = [line.split() for line in _lines(downstream / folder / positive, "latin-1")]
    neg = [line.split() for line in _lines(downstream / folder / negative, "latin-1")]
    return TransferTask(name, {"all": _sorted(pos + neg, [1] * len(pos) + [0] * len(neg))})


def load_sst2(downstream: Path) -> TransferTask:
    splits = {}
    for key, file in (("train", "train"), ("dev", "dev"), ("test", "test")):
        path = downstream / "SST" / "binary" / f"sentiment-{file}"
        sentences, labels = [], []
        for number, line in enumerate(_lines(path, "utf-8"), start=1):
            cells = line.strip().split("\t")
            if len(cells) != 2 or cells[1] not in ("0", "1"):
                raise MmcseError(f"{path}:{number}: expected 'sentence<TAB>0|1'")
            sentences.append(cells[0].split())
            labels.append(int(cells[1]))
        splits[key] = _sorted(sentences, labels)
    return TransferTask("SST2", splits)


def load_trec(downstream: Path) -> TransferTask:
    splits = {}
    for key, file in (("train", "train_5500.label"), ("test", "TREC_10.label")):
        path = downstream / "TREC" / file
        sentences, labels = [], []
        for number, line in enumerate(_lines(path, "latin-1"), start=1):
            target, _, rest = line.strip().partition(":")
            if target not in TREC_CLASSES or " " not in rest:
                raise MmcseError(f"{path}:{number}: expected 'COARSE:fine question'")
            sentences.append(rest.split(" ", 1)[1].split())
            labels.append(TREC_CLASSES[target])
        splits[key] = _sorted(sentences, labels)
    return TransferTask("TREC", splits)


def load_mrpc(downstream: Path) -> TransferTask:
    splits = {}
    for key, file in (("train", "msr_paraphrase_train.txt"), ("test", "msr_paraphrase_test.txt")):
        path = downstream / "MRPC" / file
        first, second, labels = [], [], []
        for number, line in enumerate(_lines(path, "utf-8")[1:], start=2):
            cells = line.strip().split("\t")
            if len(cells) < 5 or cells[0] not in ("0", "1"):
                raise MmcseError(f"{path}:{number}: expected 'label<TAB>id<TAB>id<TAB>s1<TAB>s2'")
            first.append(cells[3].split())
            second.append(cells[4].split())
            labels.append(int(cells[0]))
        splits[key] = _sorted(first, labels, second)
    return TransferTask("MRPC", splits)


TASK_FOLDERS = {
    **{n: f for n, (f, _, _) in BINARY_FILES.items()},
    "SST2": "SST",
    "TREC": "TREC",
    "MRPC": "MRPC",
}


def load_transfer_task(downstream: Path, name: str) -> TransferTask:
    folder = downstream / TASK_FOLDERS.get(name, name)
    if name in TASK_FOLDERS and not folder.is_dir():
        raise MmcseError(f"SentEval task folder {folder} is missing (task {name})")
    if name in BINARY_FILES:
        return check_classes(load_binary(downstream, name), downstream)
    loaders = {"SST2": load_sst2, "TREC": load_trec, "MRPC": load_mrpc}
    if name not in loaders:
        raise MmcseError(f"unknown transfer task {name!r}; choose from {', '.join(TRANSFER_TASKS)}")
    return check_classes(loaders[name](downstream), downstream)


#: the files of each split of the tasks that ship their splits (for error messages)
SPLIT_FILES = {
    "SST2": {k: f"SST/binary/sentiment-{k}" for k in ("train", "dev", "test")},
    "TREC": {"train": "TREC/train_5500.label", "test": "TREC/TREC_10.label"},
    "MRPC": {k: f"MRPC/msr_paraphrase_{k}.txt" for k in ("train", "test")},
}


def class_names(name: str) -> dict[int, str]:
    """Label → what SentEval's files call it (MR's 1 is ``rt-polarity.pos``, TREC's 0 ABBR)."""
    if name in BINARY_FILES:
        _, positive, negative = BINARY_FILES[name]
        return {0: negative, 1: positive}
    if name == "TREC":
        return {label: coarse for coarse, label in TREC_CLASSES.items()}
    return {0: "label 0", 1: "label 1"}


def check_classes(task: TransferTask, downstream: Path) -> TransferTask:
    """Refuse a split that leaves a class empty: a probe trained or tested on the other
    classes only scores nothing (MR from its negatives alone is 100.00)."""
    names = class_names(task.name)
    for key, split in task.splits.items():
        counts = {label: int((split.labels == label).sum()) for label in names}
        empty = [label for label, count in counts.items() if count == 0]
        if not empty:
            continue
        if task.name in BINARY_FILES:
            folder = BINARY_FILES[task.name][0]
            where = " and ".join(str(downstream / folder / names[label]) for label in empty)
        else:
            where = str(downstream / SPLIT_FILES[task.name][key])
        shown = ", ".join(f"{names[label]} {count}" for label, count in counts.items())
        raise MmcseError(
            f"transfer task {task.name}: {where} gives no sentence of class "
            f"{', '.join(names[label] for label in empty)} (class counts: {shown}); a probe "
            "on the other classes alone scores nothing"
        )
    return task


# ---- probing -----------------------------------------------------------------------------------


def _embed(split: Split, vectors: np.ndarray, row: dict[str, int], second: bool = False):
    sentences = split.second if second else split.sentences
    return vectors[[row[" ".join(s)] for s in sentences]]


def mrpc_features(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """SentEval's MRPC pair features ``[|a - b|, a * b]``."""
    return np.c_[np.abs(a - b), a * b]


def scheme_of(task: TransferTask) -> str:
    """The validation loop of ``task`` (:mod:`mmcse.evaluation.probe`)."""
    if "all" in task.splits:
        return "inner_kfold"
    return "split" if task.name == "SST2" else "kfold"


SCHEMES = {
    "inner_kfold": "nested {k}-fold cross-validation",
    "kfold": "{k}-fold cross-validation on train, then the test set",
    "split": "regulariser chosen on dev, then the test set",
}


def probe_task(
    task: TransferTask,
    vectors: np.ndarray,
    row: dict[str, int],
    settings: probe.ProbeSettings,
    progress: probe.Progress = probe.SILENT,
) -> dict:
    """Run SentEval's classifier of ``task`` on precomputed ``vectors[row[sentence]]``."""
    s = task.splits
    if "all" in s:
        x, y = _embed(s["all"], vectors, row), s["all"].labels
        out = probe.inner_kfold(x, y, settings, progress)
        return {**out, "ndev": len(y), "ntest": len(y)}
    if task.name == "SST2":
        x = {
            name: _embed(s[key], vectors, row)
            for name, key in (("train", "train"), ("valid", "dev"), ("test", "test"))
        }
        y = {"train": s["train"].labels, "valid": s["dev"].labels, "test": s["test"].labels}
        out = probe.split(x, y, settings, progress)
        return {**out, "ndev": len(y["valid"]), "ntest": len(y["test"])}
    if task.name == "MRPC":
        feats = {
            k: mrpc_features(_embed(s[k], vectors, row), _embed(s[k], vectors, row, second=True))
            for k in ("train", "test")
        }
    else:
        feats = {k: _embed(s[k], vectors, row) for k in ("train", "test")}
    out = probe.kfold(
        feats["train"], s["train"].labels, feats["test"], s["test"].labels, settings, progress
    )
    predictions = out.pop("predictions")
    if task.name == "MRPC":
        out["f1"] = round(100 * float(f1_score(s["test"].labels, predictions)), 2)
    return {**out, "ndev": len(s["train"].labels), "ntest": len(s["test"].labels)}


def parse_tasks(tasks: Sequence[str] | str | None) -> list[str]:
    if tasks is None:
        return list(TRANSFER_TASKS)
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks)]
    names = ["SST2" if n.upper() in ("SST", "SST-2", "SST2") else n.upper() for n in names if n]
    unknown = [n for n in names if n not in TRANSFER_TASKS]
    if unknown or not names:
        raise MmcseError(
            f"unknown transfer task(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(TRANSFER_TASKS)}"
        )
    return names


def check_task_folders(data_dir, names: Sequence[str]) -> Path:
    """Fail early (before any model work) when a task's folder is missing."""
    downstream = resolve_downstream(data_dir, needs=None)
    for name in names:
        folder = downstream / TASK_FOLDERS[name]
        if not folder.is_dir():
            raise MmcseError(f"SentEval task folder {folder} is missing (task {name})")
    return downstream


def load_transfer_tasks(data_dir, names: Sequence[str]) -> list[TransferTask]:
    downstream = resolve_downstream(data_dir, needs=None)
    return [load_transfer_task(downstream, name) for name in names]


def evaluate_transfer(
    encoder_or_path,
    tokenizer=None,
    data_dir: str | Path | None = None,
    mode: str = "test",
    tasks: Sequence[str] | str | None = None,
    pooler: str | None = None,
    batch_size: int = 128,
    device: str | None = None,
    probe_device: str = "cpu",
    progress: bool = False,
) -> dict:
    """SentEval transfer accuracies x 100: ``{task: acc, ..., "avg": ..., "details": {...}}``.

    ``mode`` is SimCSE's ``test`` or ``fasttest`` (:data:`mmcse.evaluation.probe.SETTINGS`).
    ``details`` holds SentEval's ``devacc``/``acc`` (and MRPC's ``f1``), the regulariser chosen,
    sizes, settings and seconds. ``probe_device`` trains the probes (``cuda`` where available).
    """
    started = time.perf_counter()
    settings = probe.check_mode(mode)
    pooler = checked_pooler(pooler)
    settings = probe.ProbeSettings(**{**settings.__dict__, "device": probe_device})
    loaded = load_transfer_tasks(data_dir, parse_tasks(tasks))  # bad data fails before the model
    encoder, tokenizer, pooler, model_name = resolve_encoder(
        encoder_or_path, tokenizer, pooler, device, "evaluate_transfer"
    )

    unique = list(dict.fromkeys(t for task in loaded for t in task.texts()))
    vectors = encode_sentences(
        encoder,
        tokenizer,
        unique,
        batch_size=batch_size,
        device=device,
        pooler=pooler,
        progress=progress,
    )
    row = {sentence: i for i, sentence in enumerate(unique)}
    encoded = time.perf_counter()
    details = {}
    for number, task in enumerate(loaded, start=1):
        t0 = time.perf_counter()
        with _reporting(task, f"{number} of {len(loaded)}", settings, progress) as report:
            details[task.name] = probe_task(task, vectors, row, settings, report)
        details[task.name]["seconds"] = round(time.perf_counter() - t0, 2)
        if progress:
            logger.info(
                f"{task.name}: {details[task.name]['acc']:.2f} "
                f"(dev {details[task.name]['devacc']:.2f}, {details[task.name]['seconds']:.0f} s)"
            )
    results: dict = {name: details[name]["acc"] for name in details}
    results["avg"] = average_of_printed(results[name] for name in details)
    used = encoder_device(encoder, device)
    data = str(resolve_downstream(data_dir, needs=None).resolve())
    results["details"] = {
        "model": str(model_name),
        "pooler": pooler,
        "mode": mode,
        "settings": {k: v for k, v in settings.__dict__.items() if k != "device"},
        "sentences_encoded": len(unique),
        "encode_seconds": round(encoded - started, 2),
        "seconds": round(time.perf_counter() - started, 2),
        "tasks": details,
        "protocol": {"mode": mode, "pooler": pooler, "data": data},
        "environment": environment(used, precision_name(used)),
    }
    return results


@contextmanager
def _reporting(task: TransferTask, ordinal: str, settings: probe.ProbeSettings, shown: bool):
    """The task's progress: a log line, a bar of probes fitted, a log line per milestone."""
    if not shown:
        yield probe.SILENT
        return
    scheme, total = scheme_of(task), probe.fits(scheme_of(task), settings)
    how = SCHEMES[scheme].format(k=settings.kfold)
    logger.info(f"{task.name} ({ordinal}): {how}, {total} logistic-regression probes to train")
    with tqdm(
        total=total, desc=f"{task.name} probes", unit="probe", file=sys.stderr, leave=False
    ) as bar:

        def milestone(text: str) -> None:
            bar.set_postfix_str(text.split(":")[0], refresh=False)
            logger.info(f"{task.name} {text}")

        yield probe.Progress(fitted=bar.update, milestone=milestone)


def format_transfer_table(results: dict) -> str:
    """SimCSE Table 2 layout: ``MR CR SUBJ MPQA SST TREC MRPC Avg.`` plus a summary line."""

    tasks = [t for t in TRANSFER_TASKS if t in results]
    titles = [TRANSFER_TITLES[t] for t in tasks] + ["Avg."]
    values = [f"{results[t]:.2f}" for t in tasks] + [f"{results['avg']:.2f}"]
    lines = _render(titles, [values])
    d = results["details"]
    lines.append(
        f"transfer {d['mode']} (SentEval LR probe, kfold {d['settings']['kfold']}, "
        f"{d['settings']['optim']}) | model {d['model']} | pooler {d['pooler']} | "
        f"{d['sentences_encoded']} sentences | {d['seconds']:.1f} s"
    )
    return "\n".join(lines)
