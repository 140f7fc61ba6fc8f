"""Sentence poolers, named as in SimCSE's evaluation script, plus the student's own pooling.

``cls``: the backbone's pooler output ([CLS] through its dense+tanh, when it has one);
``cls_before_pooler``: last-layer [CLS] (SimCSE/MCSE's unsupervised setting); ``avg``: masked mean
of the last layer; ``avg_first_last``: masked mean of (first transformer layer + last layer)/2
(``hidden_states[1]``: index 0 is the embedding output); ``avg_top2``: the same for the last two;
``max``: masked max over the last layer (sentence-transformers' ``max``).
``mean`` is accepted for ``avg``. Note ``cls`` keeps SimCSE's meaning (with the pooler MLP);
sentence-transformers' ``cls`` is our ``cls_before_pooler``.

``auto`` (the training default) means: the pooling a training run recorded, else the pooling the
student ships as a sentence-transformers model (``1_Pooling/config.json``: all-MiniLM-L6-v2 is
``mean``), else SimCSE's ``cls_before_pooler``. :func:`mmcse.model.resolve_pooler` does this
before any model loads (it reads the run's record; this module reads no run and imports no
mmcse module but errors); :func:`check_pooler` validates a name.

Evaluation (and ``mmcse export``) encodes a sentence-transformers directory as
``SentenceTransformer(dir)`` does: its Pooling module and the modules after it (Dense,
Normalize; :func:`mmcse.model.resolve_encoding`). Training pools only; a student whose modules.json has a
Dense after pooling needs an explicit pooler there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmcse.errors import MmcseError

if TYPE_CHECKING:  # names are checked (TrainConfig) without importing torch
    from torch import Tensor

POOLERS = ("cls", "cls_before_pooler", "avg", "avg_first_last", "avg_top2", "max")
ALIASES = {"mean": "avg"}
AUTO = "auto"
DEFAULT_POOLER = "cls_before_pooler"  # SimCSE/MCSE's unsupervised evaluation setting

#: a sentence-transformers model directory lists its modules here
ST_MODULES_FILE = "modules.json"
#: ... and its Transformer module's settings (``max_seq_length``, ``do_lower_case``) here
ST_CONFIG_FILE = "sentence_bert_config.json"
#: sentence-transformers modules after Pooling that evaluation reproduces (:class:`StModule`)
ST_AFTER_POOLING = ("Dense", "Normalize")
#: sentence-transformers pooling mode -> our pooler (modes we can reproduce exactly)
ST_MODES = {"cls": "cls_before_pooler", "mean": "avg", "max": "max"}
_ST_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def check_pooler(name: str, allow_auto: bool = False) -> str:
    """The canonical pooler for ``name`` (``mean`` -> ``avg``) or one clear error."""
    if allow_auto and name in (AUTO, None):
        return AUTO
    canonical = ALIASES.get(name, name)
    if canonical not in POOLERS:
        names = [*POOLERS, *ALIASES] + ([AUTO] if allow_auto else [])
        raise MmcseError(f"--pooler {name!r}: unknown pooler; choose one of {', '.join(names)}")
    return canonical


@dataclass(frozen=True)
class StModule:
    """A sentence-transformers module after the Pooling one that mmcse's evaluation applies:
    ``Dense`` (a linear layer + activation, weights in ``folder``) or ``Normalize`` (unit L2)."""

    kind: str
    folder: Path


def _st_module_list(model_dir: Path) -> tuple[Path | None, list[StModule]] | None:
    """``(Pooling config, modules after it)`` of a sentence-transformers dir (its
    ``modules.json``); None when it has no modules.json. A module mmcse cannot reproduce (say
    a LayerNorm) is one error naming the file."""
    modules = model_dir / ST_MODULES_FILE
    if not modules.is_file():
        return None
    try:
        entries = json.loads(modules.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MmcseError(f"{modules} is not valid JSON") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MmcseError(f"{modules}: expected a list of module objects")
    kinds = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in entries]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", *ST_AFTER_POOLING)]
    if unknown:
        raise MmcseError(
            f"{modules}: sentence-transformers modules {', '.join(unknown)} are not supported; "
            "give --pooler to use the bare encoder"
        )
    pooling, after = None, []
    for kind, entry in zip(kinds, entries, strict=True):
        folder = model_dir / str(entry.get("path", ""))
        if kind == "Pooling" and pooling is None:
            pooling = folder / "config.json"
        elif kind in ST_AFTER_POOLING:
            if pooling is None:
                raise MmcseError(f"{modules}: a {kind} module before the Pooling one")
            after.append(StModule(kind, folder))
    return pooling, after


def _st_pooling_path(model_dir: Path) -> Path | None:
    """The Pooling module's config of a sentence-transformers dir (via modules.json), for
    training: a Dense after pooling is refused (training pools only; it would not encode as
    the model does)."""
    listed = _st_module_list(model_dir)
    if listed is not None:
        pooling, after = listed
        dense = [m.kind for m in after if m.kind != "Normalize"]
        if dense:
            raise MmcseError(
                f"{model_dir / ST_MODULES_FILE}: sentence-transformers modules "
                f"{', '.join(dense)} are not supported; give --pooler to use the bare encoder"
            )
        return pooling
    fallback = model_dir / "1_Pooling" / "config.json"
    return fallback if fallback.is_file() else None


def _pooler_of_config(path: Path) -> str:
    """Our pooler for a sentence-transformers Pooling config (legacy keys or ``pooling_mode``)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MmcseError(f"{path} is not valid JSON") from None
    modes = config.get("pooling_mode") if isinstance(config, dict) else None
    if modes is None and isinstance(config, dict):
        modes = [mode for key, mode in _ST_LEGACY_KEYS.items() if config.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes or [])
    if len(modes) != 1 or modes[0] not in ST_MODES:
        raise MmcseError(
            f"{path}: sentence-transformers pooling {'+'.join(map(str, modes))} is not "
            f"supported; give --pooler ({', '.join(POOLERS)})"
        )
    return ST_MODES[modes[0]]


def student_pooling(model_dir: str | Path) -> str | None:
    """Our pooler for the sentence-transformers pooling a model dir ships, or None if none."""
    path = _st_pooling_path(Path(model_dir))
    if path is None or not path.is_file():
        return None
    return _pooler_of_config(path)


def st_encoding(model_dir: str | Path) -> tuple[str, list[StModule]] | None:
    """How a sentence-transformers dir encodes: our pooler for its Pooling module and the
    modules after it (Dense, Normalize); None when the dir lists no modules with a Pooling."""
    listed = _st_module_list(Path(model_dir))
    if listed is None or listed[0] is None or not listed[0].is_file():
        return None
    pooling, after = listed
    return _pooler_of_config(pooling), after


def st_settings(folder: str | Path) -> dict:
    """A sentence-transformers dir's ``sentence_bert_config.json`` (empty when absent)."""
    path = Path(folder) / ST_CONFIG_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MmcseError(f"{path} is not valid JSON") from None
    return settings if isinstance(settings, dict) else {}


def masked_mean(states: Tensor, mask: Tensor) -> Tensor:
    mask = mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1)


def masked_max(states: Tensor, mask: Tensor) -> Tensor:
    # padding can never win the max (sentence-transformers fills it with -inf too)
    return states.masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values


def needs_hidden_states(pooler: str) -> bool:
    return pooler in ("avg_first_last", "avg_top2")


def pool(outputs, attention_mask: Tensor, pooler: str) -> Tensor:
    """Pool a HF ``BaseModelOutput`` into ``[B, H]`` sentence embeddings."""
    pooler = check_pooler(pooler)
    last = outputs.last_hidden_state
    if pooler == "cls":
        pooled = getattr(outputs, "pooler_output", None)
        return pooled if pooled is not None else last[:, 0]
    if pooler == "cls_before_pooler":
        return last[:, 0]
    if pooler == "avg":
        return masked_mean(last, attention_mask)
    if pooler == "max":
        return masked_max(last, attention_mask)
    hidden = outputs.hidden_states
    pair = (hidden[1], hidden[-1]) if pooler == "avg_first_last" else (hidden[-2], hidden[-1])
    return masked_mean((pair[0] + pair[1]) / 2.0, attention_mask)
