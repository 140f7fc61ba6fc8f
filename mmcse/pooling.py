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
``mean``), else SimCSE's ``cls_before_pooler``. :func:`resolve_pooler` does this before any model
loads; :func:`check_pooler` validates a name.

Evaluation (and ``mmcse export``) encodes a sentence-transformers directory as
``SentenceTransformer(dir)`` does: its Pooling module and the modules after it (Dense,
Normalize; :func:`resolve_encoding`) and its ``max_seq_length`` (:func:`encoding_max_length`).
Training pools only; a student whose modules.json has a Dense after pooling needs an explicit
pooler there. A training checkpoint has no modules.json of its own; when it pooled as its student
(the run info's ``config.model``, a sentence-transformers dir still on disk or in the hub cache)
does, it encodes with the student's parameter-free modules (Normalize) and ``max_seq_length``
too (:func:`encoding_dir`): fine-tuning all-MiniLM-L6-v2 keeps its unit-length vectors and its
256-token limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmcse.errors import MmcseError
from mmcse.rundir import Checkpoint

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


def student_dir(model_dir: str | Path) -> Path | None:
    """The local folder of the student a training checkpoint started from (its run info's
    ``config.model``): a folder still on disk, or a hub id's snapshot in the hub cache."""
    info = Checkpoint(model_dir).read_info() or {}
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    name = config.get("model")
    if not isinstance(name, str) or not name:
        return None
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists() or name.startswith((".", "/", "~")):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, ST_MODULES_FILE)
    except ValueError:  # not a valid hub id either
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def encoding_dir(model_dir: str | Path) -> tuple[Path, str] | None:
    """``(sentence-transformers dir, in words)`` whose modules and settings ``model_dir``
    encodes with: its own, else (a training checkpoint) its student's, when the run pooled as the
    student does and the student's modules after pooling are parameter-free (a Dense the run
    did not train is not applied); None when neither."""
    model_dir = Path(model_dir)
    if st_encoding(model_dir) is not None:
        return model_dir, "the model's sentence-transformers modules"
    student = student_dir(model_dir)
    recorded = recorded_pooler(model_dir)
    if student is None or recorded is None:
        return None
    try:
        found = st_encoding(student)
    except MmcseError:  # modules mmcse cannot reproduce: the checkpoint is the bare encoder
        return None
    if found is None or found[0] != check_pooler(recorded):
        return None
    if any(module.kind != "Normalize" for module in found[1]):
        return None
    return student, f"its student's sentence-transformers modules ({student})"


def st_settings(folder: str | Path) -> dict:
    """A sentence-transformers dir's ``sentence_bert_config.json`` (empty when absent)."""
    path = Path(folder) / ST_CONFIG_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise MmcseError(f"{path} is not valid JSON") from None
    return settings if isinstance(settings, dict) else {}


def encoding_max_length(requested: str | None, model_dir: str | Path | None) -> int | None:
    """The ``max_seq_length`` a model encodes with when no pooler is given (its own or its
    student's sentence-transformers setting); None: what tokenizer and model allow."""
    if requested not in (None, AUTO) or model_dir is None or not Path(model_dir).is_dir():
        return None
    found = encoding_dir(model_dir)
    length = st_settings(found[0]).get("max_seq_length") if found else None
    return length if isinstance(length, int) and length > 0 else None


def resolve_encoding(
    requested: str | None, model_dir: str | Path | None, fallback: str = DEFAULT_POOLER
) -> tuple[str, str, list[StModule]]:
    """``(pooler, where it came from, modules after pooling)`` that evaluation encodes with.

    A given pooler is the bare encoder with that pooling. Otherwise a sentence-transformers
    dir (``modules.json``: all-MiniLM-L6-v2, an ``mmcse export``) encodes as its modules say,
    Dense and Normalize included, i.e. as ``SentenceTransformer(dir).encode`` does, and so does
    a checkpoint that pooled as its sentence-transformers student (:func:`encoding_dir`);
    anything else pools as :func:`resolve_pooler` says, with no module after it.
    """
    name = check_pooler(requested, allow_auto=True) if requested is not None else AUTO
    if name == AUTO and model_dir is not None and Path(model_dir).is_dir():
        found = encoding_dir(model_dir)
        if found is not None:
            pooler, modules = st_encoding(found[0])
            return pooler, found[1], modules
    pooler, source = resolve_pooler(requested, model_dir, fallback)
    return pooler, source, []


def recorded_pooler(model_dir: str | Path) -> str | None:
    """The pooler a training checkpoint recorded in its run info, if it is one."""
    info = Checkpoint(model_dir).read_info() or {}
    return info.get("pooler") or None


def resolve_pooler(
    requested: str | None, model_dir: str | Path | None, fallback: str = DEFAULT_POOLER
) -> tuple[str, str]:
    """``(pooler, where it came from)``; ``requested`` None/``auto`` looks at the model dir.

    Order: an explicit name > the run's recorded pooler > the student's sentence-transformers
    pooling config > ``fallback`` (the method's / SimCSE's ``cls_before_pooler``). Hub ids and
    missing dirs simply have no local config.
    """
    name = check_pooler(requested, allow_auto=True) if requested is not None else AUTO
    if name != AUTO:
        return name, "given"
    if model_dir is not None and Path(model_dir).is_dir():
        recorded = recorded_pooler(model_dir)
        if recorded:
            return check_pooler(recorded), "the run's recorded pooler"
        student = student_pooling(model_dir)
        if student:
            return student, "the student's sentence-transformers pooling config"
    return check_pooler(fallback), "default"


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
