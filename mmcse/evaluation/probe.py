"""SentEval's logistic-regression probe and its three validation schemes, re-implemented.

This follows SentEval (Conneau & Kiela, 2018; ``senteval/tools/classifier.py`` and
``validation.py``) with ``usepytorch=True`` and ``nhid=0`` — the setting SimCSE's
``evaluation.py`` uses — so the numbers are the ones SimCSE/MCSE/DALR print:

* :class:`LinearProbe`: one ``nn.Linear(D, C)`` trained with cross-entropy averaged over the
  batch and the optimizer's ``weight_decay = l2reg`` (SentEval sets ``size_average = False``
  *after* building the loss, which PyTorch >= 0.4.1 ignores; SimCSE ran such versions); passes of ``epoch_size`` epochs over shuffled
  mini-batches, scored on a validation set after each pass, the best-scoring weights kept.
  Training stops once the validation accuracy failed to improve more than ``tenacity`` times
  *in total* (SentEval never resets that counter) or after ``max_epoch`` epochs.
  ``fit(..., validation_split=0.05)`` holds out a random 5 % for that early stopping.
* :func:`inner_kfold` (MR, CR, SUBJ, MPQA): an outer stratified k-fold; in each outer training
  part an inner stratified k-fold picks ``l2reg`` from ``10^-5 ... 10^-2``; the probe refits on
  the outer training part and is scored on the held-out fold; the test accuracy is the mean over
  folds. SentEval early-stops the inner probes on the inner test fold itself; kept as is.
* :func:`kfold` (TREC, MRPC): k-fold on the train set picks ``l2reg``; refit on all of train
  (5 % early-stopping split); score the given test set.
* :func:`split` (SST-2): ``l2reg`` picked on the dev set; refit early-stopping on dev; score test.

Same seeds and call order as SentEval, so the folds and mini-batch orders are SentEval's (the
folds as drawn by the installed scikit-learn); the weights can still differ in the last bits
from a GPU run of SentEval, which is where the published numbers were measured. Seeds as in
SentEval: folds ``StratifiedKFold(shuffle=True, random_state=1111)``; every probe
reseeds its own NumPy stream and torch's initialisation with 1111 (SentEval calls
``np.random.seed``/``torch.manual_seed``; here a private ``RandomState`` and a forked torch RNG
give the same streams without touching global state). Accuracies are rounded to 2 decimals where
SentEval rounds them.

A probe run takes minutes (CR in test mode: 410 probes); :class:`Progress` is told after every
probe fitted and at every milestone (an outer fold, a regulariser tried), which
:mod:`mmcse.evaluation.transfer` shows as a bar and log lines.

``backend="sklearn"`` is SentEval's ``usepytorch=False`` path
(``LogisticRegression(C=reg, random_state=seed)``, ``C`` in ``2^-2 ... 2^3``, or ``2^-1 ... 2^5``
for :func:`kfold`); it exists so the validation loops can be checked against scikit-learn.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from torch import nn

from mmcse.errors import MmcseError

SEED = 1111
TORCH_L2_GRID = tuple(10.0**t for t in range(-5, -1))
SKLEARN_C_GRID = tuple(2.0**t for t in range(-2, 4))
SKLEARN_C_GRID_KFOLD = tuple(2.0**t for t in range(-1, 6))


@dataclass(frozen=True)
class ProbeSettings:
    """SentEval ``params``: ``kfold`` and the ``classifier`` dict (``nhid`` is always 0)."""

    kfold: int
    optim: str  # "adam" | "rmsprop" (torch defaults: lr 1e-3 / 1e-2, as SentEval)
    batch_size: int
    tenacity: int
    epoch_size: int
    max_epoch: int = 200
    seed: int = SEED
    backend: str = "torch"  # "torch" (usepytorch=True) | "sklearn" (usepytorch=False)
    device: str = "cpu"


#: SimCSE ``evaluation.py``: ``fasttest``/``dev`` and ``test`` (the paper's numbers)
SETTINGS: dict[str, ProbeSettings] = {
    "fasttest": ProbeSettings(kfold=5, optim="rmsprop", batch_size=128, tenacity=3, epoch_size=2),
    "test": ProbeSettings(kfold=10, optim="adam", batch_size=64, tenacity=5, epoch_size=4),
}

_OPTIMIZERS = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}


def check_mode(mode: str) -> ProbeSettings:
    """The settings of a ``--transfer-mode``, or one error line naming the choices."""
    if mode not in SETTINGS:
        raise MmcseError(
            f"--transfer-mode {mode!r}: unknown transfer mode; choose {' or '.join(SETTINGS)}"
        )
    return SETTINGS[mode]


def _nothing(*_args) -> None:
    return None


@dataclass(frozen=True)
class Progress:
    """What a validation loop reports: ``fitted()`` after each probe trained, ``milestone(text)``
    when an outer fold or a regulariser's cross-validation is done (``"fold 3/10: 79.10"``)."""

    fitted: Callable[[], None] = _nothing
    milestone: Callable[[str], None] = _nothing


SILENT = Progress()


def fits(scheme: str, settings: ProbeSettings) -> int:
    """Probes that ``scheme`` (``inner_kfold``, ``kfold``, ``split``) trains: the bar's total."""
    k, regs = settings.kfold, len(_grid(settings, kfold_grid=scheme == "kfold"))
    return {"inner_kfold": k * (k * regs + 1), "kfold": k * regs + 1, "split": regs + 1}[scheme]


def one_thread(function):
    """Run on one CPU thread: the probe's ops are tiny, and intra-op threads only add
    synchronisation (20x slower measured on a busy 2-core machine)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return function(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


class LinearProbe:
    """SentEval's ``MLP`` with ``nhid=0``: logistic regression trained by mini-batch descent."""

    def __init__(self, settings: ProbeSettings, dim: int, classes: int, l2reg: float) -> None:
        self.s = settings
        self.rng = np.random.RandomState(settings.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(settings.seed)
            self.model = nn.Linear(dim, classes).to(settings.device)
        self.loss = nn.CrossEntropyLoss()
        self.optimizer = _OPTIMIZERS[settings.optim](self.model.parameters())
        self.optimizer.param_groups[0]["weight_decay"] = l2reg
        self.epochs_run = 0

    def _tensors(self, x: np.ndarray, y: np.ndarray):
        device = self.s.device
        return (
            torch.as_tensor(x, dtype=torch.float32, device=device),
            torch.as_tensor(y, dtype=torch.int64, device=device),
        )

    @one_thread
    def fit(self, x, y, validation_data=None, validation_split: float | None = None) -> float:
        """Train with early stopping on ``validation_data`` (or a random split); best dev acc."""
        if validation_data is None:
            order = self.rng.permutation(len(x))
            cut = int(validation_split * len(x))
            validation_data = (x[order[:cut]], y[order[:cut]])
            x, y = x[order[cut:]], y[order[cut:]]
        train_x, train_y = self._tensors(x, y)
        dev_x, dev_y = self._tensors(*validation_data)
        best, best_state, misses = -1.0, None, 0
        while self.epochs_run <= self.s.max_epoch:
            self._train_pass(train_x, train_y)
            accuracy = self._accuracy(dev_x, dev_y)
            if accuracy > best:
                best, best_state = accuracy, copy.deepcopy(self.model.state_dict())
            else:  # SentEval: the counter is never reset by an improvement
                if misses >= self.s.tenacity:
                    break
                misses += 1
        self.model.load_state_dict(best_state)
        return best

    def _train_pass(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        for _ in range(self.s.epoch_size):
            order = torch.from_numpy(self.rng.permutation(len(x))).to(x.device)
            for start in range(0, len(x), self.s.batch_size):
                rows = order[start : start + self.s.batch_size]
                loss = self.loss(self.model(x[rows]), y[rows])
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.epochs_run += self.s.epoch_size

    @torch.no_grad()
    def predict(self, x) -> np.ndarray:
        self.model.eval()
        x = torch.as_tensor(x, dtype=torch.float32, device=self.s.device)
        return self.model(x).argmax(dim=1).cpu().numpy()

    def _accuracy(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.model.eval()
        with torch.no_grad():
            return float((self.model(x).argmax(dim=1) == y).sum()) / len(y)

    def score(self, x, y) -> float:
        return float((self.predict(x) == np.asarray(y)).mean())


class SklearnProbe:
    """SentEval's ``usepytorch=False`` probe (``C`` is the inverse regularisation)."""

    def __init__(self, settings: ProbeSettings, c: float) -> None:
        self.model = LogisticRegression(C=c, random_state=settings.seed)

    def fit(self, x, y, validation_data=None, validation_split=None) -> None:
        self.model.fit(x, y)

    def predict(self, x) -> np.ndarray:
        return self.model.predict(x)

    def score(self, x, y) -> float:
        return float(self.model.score(x, y))


def _grid(settings: ProbeSettings, kfold_grid: bool = False) -> tuple[float, ...]:
    if settings.backend == "torch":
        return TORCH_L2_GRID
    if settings.backend == "sklearn":
        return SKLEARN_C_GRID_KFOLD if kfold_grid else SKLEARN_C_GRID
    raise ValueError(f"unknown probe backend {settings.backend!r}; choose torch or sklearn")


def make_probe(settings: ProbeSettings, dim: int, classes: int, reg: float):
    if settings.backend == "sklearn":
        return SklearnProbe(settings, reg)
    return LinearProbe(settings, dim, classes, reg)


def _classes(*labels: np.ndarray) -> int:
    return int(max(int(np.max(y)) for y in labels)) + 1


def _folds(settings: ProbeSettings, x: np.ndarray, y: np.ndarray):
    skf = StratifiedKFold(n_splits=settings.kfold, shuffle=True, random_state=settings.seed)
    return skf.split(x, y)


def _kfold_score(
    settings: ProbeSettings, x: np.ndarray, y: np.ndarray, classes, reg, progress: Progress
) -> float:
    """Mean held-out accuracy x 100 (rounded as SentEval does) of probes with L2 ``reg`` over
    the stratified folds of ``(x, y)``, each stopped early on its held-out fold."""
    fold_scores = []
    for train_idx, test_idx in _folds(settings, x, y):
        probe = make_probe(settings, x.shape[1], classes, reg)
        held_out = (x[test_idx], y[test_idx])
        probe.fit(x[train_idx], y[train_idx], validation_data=held_out)
        fold_scores.append(probe.score(*held_out))
        progress.fitted()
    return round(100 * float(np.mean(fold_scores)), 2)


@one_thread
def inner_kfold(
    x: np.ndarray, y: np.ndarray, settings: ProbeSettings, progress: Progress = SILENT
) -> dict:
    """MR/CR/SUBJ/MPQA: nested stratified k-fold; ``{"devacc", "acc"}`` x 100."""
    regs, classes = _grid(settings), _classes(y)
    dev_results, test_results, chosen = [], [], []
    for fold, (train_idx, test_idx) in enumerate(_folds(settings, x, y), start=1):
        x_train, y_train = x[train_idx], y[train_idx]
        scores = [_kfold_score(settings, x_train, y_train, classes, r, progress) for r in regs]
        best = regs[int(np.argmax(scores))]
        chosen.append(best)
        dev_results.append(max(scores))
        probe = make_probe(settings, x.shape[1], classes, best)
        probe.fit(x_train, y_train, validation_split=0.05)
        progress.fitted()
        test_results.append(round(100 * probe.score(x[test_idx], y[test_idx]), 2))
        progress.milestone(
            f"fold {fold}/{settings.kfold}: test {test_results[-1]:.2f} (reg {best:g})"
        )
    return {
        "devacc": round(float(np.mean(dev_results)), 2),
        "acc": round(float(np.mean(test_results)), 2),
        "reg_per_fold": chosen,
    }


@one_thread
def kfold(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    settings: ProbeSettings,
    progress: Progress = SILENT,
) -> dict:
    """TREC/MRPC: k-fold on train picks the regulariser; ``{"devacc", "acc", "predictions"}``."""
    regs, classes = _grid(settings, kfold_grid=True), _classes(train_y, test_y)
    scores = []
    for reg in regs:
        scores.append(_kfold_score(settings, train_x, train_y, classes, reg, progress))
        progress.milestone(f"reg {reg:g}: {settings.kfold}-fold {scores[-1]:.2f}")
    best = regs[int(np.argmax(scores))]
    probe = make_probe(settings, train_x.shape[1], classes, best)
    probe.fit(train_x, train_y, validation_split=0.05)
    progress.fitted()
    predictions = probe.predict(test_x)
    return {
        "devacc": max(scores),
        "acc": round(100 * float((predictions == test_y).mean()), 2),
        "reg": best,
        "predictions": predictions,
    }


@one_thread
def split(
    x: dict[str, np.ndarray],
    y: dict[str, np.ndarray],
    settings: ProbeSettings,
    progress: Progress = SILENT,
) -> dict:
    """SST-2: the regulariser picked on ``valid``; ``{"devacc", "acc"}`` x 100."""
    regs, classes = _grid(settings), _classes(*y.values())
    dim = x["train"].shape[1]
    scores = []
    for reg in regs:
        probe = make_probe(settings, dim, classes, reg)
        probe.fit(x["train"], y["train"], validation_data=(x["valid"], y["valid"]))
        scores.append(round(100 * probe.score(x["valid"], y["valid"]), 2))
        progress.fitted()
        progress.milestone(f"reg {reg:g}: dev {scores[-1]:.2f}")
    best = regs[int(np.argmax(scores))]
    probe = make_probe(settings, dim, classes, best)
    probe.fit(x["train"], y["train"], validation_data=(x["valid"], y["valid"]))
    progress.fitted()
    return {
        "devacc": max(scores),
        "acc": round(100 * probe.score(x["test"], y["test"]), 2),
        "reg": best,
    }
