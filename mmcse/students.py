"""The student architectures mmcse trains (timm style: one registry, the tests parametrised over it).

Keyed by the Hugging Face ``model_type`` of the student's ``config.json`` (so BERT-shaped E5, BGE,
GTE, MiniLM and all-MiniLM are ``bert``; DeBERTa-v3 is ``deberta-v2``). Each entry says:

* ``attention``: the ``--attn-implementation`` choices transformers has for it, fastest first
  on a GPU (``varlen``/``flex_attention`` need one to train). ``auto`` (the default) takes
  ``sdpa`` where the student has it, else ``eager`` (:func:`default_attention`); a choice it
  lacks is refused in one line naming what it has, before the model loads.
* packing (``--packing``, :mod:`mmcse.packing`): proven (a packed step equals the padded one
  with dropout off, ``tests/training/test_students.py``) for the attention implementations in
  ``packed_attention``, or refused with ``packing_refused`` (the reason). Proven means the
  student's own ``position_ids`` restart per sentence (``positions_after_padding``: RoBERTa,
  XLM-R and MPNet count from ``pad id + 1``), attention stays inside each sentence, and its
  relative-position scheme (MPNet's buckets, ModernBERT's rotary and local window) sees the
  same distances as padded.
* ``dropout_fields``: the config fields ``--dropout`` is set on (SimCSE's augmentation is the
  encoder's own dropout; every method's text step takes its positives as two dropout views).
* ``pooler``: the default pooler (the method's, SimCSE's ``cls_before_pooler``: the first token's
  last state, which every architecture has; a student's own sentence-transformers pooling comes
  first); ``pooler_layer``: whether the ``cls`` pooler has a trained MLP to apply.

A ``model_type`` not registered here trains padded with what transformers has for it
(:func:`unregistered`): packing is refused (unproven), ``--dropout`` goes to whichever of the
usual dropout fields its config has, and one warning says so.

Torch-free: the checks run before anything heavy is imported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.registry import Registry
from mmcse.rundir import MODEL_CONFIG_FILE, resolve_model_dir

AUTO = "auto"
SDPA, EAGER, FLEX, VARLEN = "sdpa", "eager", "flex_attention", "varlen"
#: every attention a transformers encoder may have that mmcse runs (:mod:`mmcse.packing`)
ATTENTION_KINDS = (SDPA, EAGER, FLEX, VARLEN)
#: BERT's dropout fields (hidden states and attention probabilities), which most encoders share
BERT_DROPOUT = ("hidden_dropout_prob", "attention_probs_dropout_prob")
#: where an unregistered encoder's dropout is looked for (BERT's names, then DistilBERT's)
USUAL_DROPOUT = (*BERT_DROPOUT, "dropout", "attention_dropout")


@dataclass(frozen=True)
class Architecture:
    """What mmcse knows of one student architecture (see the module docstring)."""

    model_type: str
    name: str
    attention: tuple[str, ...]
    dropout_fields: tuple[str, ...] = BERT_DROPOUT
    #: why ``--packing`` is refused for it; empty: packing proven for ``packed_attention``
    packing_refused: str = ""
    #: the attention implementations a packed batch runs with (None: every one it has)
    packed_attention: tuple[str, ...] | None = None
    #: its position ids count from ``pad id + 1`` (RoBERTa-style embeddings)
    positions_after_padding: bool = False
    pooler: str = "cls_before_pooler"
    pooler_layer: bool = True
    notes: str = ""
    registered: bool = True

    @property
    def packs(self) -> bool:
        return not self.packing_refused

    def packs_with(self, attention: str) -> bool:
        return self.packs and attention in (self.packed_attention or self.attention)


STUDENTS = Registry("student architecture")
DEBERTA_REFUSAL = (
    "DeBERTa-v2/v3 multiplies its embeddings by the [batch, tokens] attention mask and builds its "
    "own attention mask from it, so the per-sentence mask a packed row needs cannot reach its "
    "attention (no extension point in transformers' DebertaV2Model)"
)

for _entry in (
    Architecture(
        "bert",
        "BERT",
        ATTENTION_KINDS,
        notes="also MiniLM, all-MiniLM, E5, BGE, GTE (BERT-shaped)",
    ),
    Architecture("roberta", "RoBERTa", ATTENTION_KINDS, positions_after_padding=True),
    Architecture(
        "xlm-roberta",
        "XLM-R",
        ATTENTION_KINDS,
        positions_after_padding=True,
        notes="SentencePiece (Unigram) tokenizer",
    ),
    Architecture(
        "distilbert",
        "DistilBERT",
        ATTENTION_KINDS,
        dropout_fields=("dropout", "attention_dropout"),
        pooler_layer=False,
    ),
    Architecture(
        "electra",
        "ELECTRA",
        ATTENTION_KINDS,
        pooler_layer=False,
        notes="the discriminator",
    ),
    Architecture(
        "mpnet",
        "MPNet",
        (EAGER,),
        positions_after_padding=True,
        notes="all-mpnet-base-v2; eager attention only (transformers has no sdpa)",
    ),
    Architecture(
        "deberta-v2",
        "DeBERTa-v2/v3",
        (EAGER,),
        packing_refused=DEBERTA_REFUSAL,
        pooler_layer=False,
        notes=(
            "DeBERTa-v3 too; eager attention only; packing refused (its embeddings and "
            "attention read the padding mask)"
        ),
    ),
    Architecture(
        "modernbert",
        "ModernBERT",
        ATTENTION_KINDS,
        packed_attention=(SDPA, EAGER),
        dropout_fields=("embedding_dropout", "attention_dropout", "mlp_dropout"),
        pooler_layer=False,
        notes=(
            "its config has every dropout at 0: --dropout sets them; packs with sdpa/eager "
            "(local window kept)"
        ),
    ),
):
    STUDENTS.register(_entry.model_type)(_entry)


def architecture(model_type: str | None) -> Architecture | None:
    """The registered entry of ``model_type`` (None: not registered)."""
    return STUDENTS.get(model_type) if model_type in STUDENTS else None


def unregistered(model_type: str, attention: tuple[str, ...], config: dict) -> Architecture:
    """An architecture mmcse has no entry for: padded, with the ``attention`` transformers has,
    ``--dropout`` on whichever usual dropout fields its config has."""
    return Architecture(
        model_type,
        model_type,
        attention,
        dropout_fields=tuple(f for f in USUAL_DROPOUT if f in config),
        packing_refused=f"packing is not proven for {model_type!r} (not in mmcse's registry)",
        pooler_layer=True,
        registered=False,
    )


def default_attention(entry: Architecture) -> str:
    """What ``--attn-implementation auto`` takes: ``sdpa`` where the student has it, else eager
    (``flex_attention``/``varlen`` are chosen explicitly: they need a GPU to train)."""
    return SDPA if SDPA in entry.attention else EAGER


def model_config(config_path: str | Path | None) -> dict:
    """A model's ``config.json`` as a dict ({} when there is none or it is no JSON object)."""
    if config_path is None or not Path(config_path).is_file():
        return {}
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def active_dropout(config: dict, fields: tuple[str, ...]) -> float:
    """The largest dropout probability among ``fields`` of ``config`` (0.0 when none is set)."""
    values = [config.get(f) for f in fields]
    return max((float(v) for v in values if isinstance(v, int | float)), default=0.0)


def config_dropout_fields(config: dict) -> tuple[str, ...]:
    """Every dropout field of a config (its name says so), for a model mmcse does not know."""
    return tuple(sorted(k for k in config if "dropout" in k))


def student_config(model: str) -> dict:
    """The ``config.json`` of ``--model`` without loading anything: a local folder (a run: its
    best/), or a hub id already in the Hugging Face cache; {} when neither is on disk yet."""
    try:
        local = Path(resolve_model_dir(model))
    except MmcseError:
        return {}  # the model checks report it
    if local.is_dir():
        return model_config(local / MODEL_CONFIG_FILE)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, MODEL_CONFIG_FILE)
    except ValueError:  # not a hub id either
        return {}
    return model_config(cached) if isinstance(cached, str) else {}


@dataclass(frozen=True)
class StudentChoice:
    """The student's architecture and what the run trains it with: its attention, the dropout
    set on its own fields, packing (proven for it or not asked for)."""

    architecture: Architecture
    attention: str
    #: ``"given"`` or why ``auto`` chose it
    attention_source: str
    #: the dropout the student trains with, and the config fields it was set on
    dropout: float
    dropout_fields: tuple[str, ...]
    #: the student's own config values of those fields (what --dropout replaced)
    config_dropout: dict
    warnings: tuple[str, ...] = ()

    def record(self) -> dict:
        """What the run records (plan.json ``student``)."""
        return {
            "model_type": self.architecture.model_type,
            "architecture": self.architecture.name,
            "registered": self.architecture.registered,
            "attention": self.attention,
            "attention_source": self.attention_source,
            "packing_proven": self.architecture.packs_with(self.attention),
            "dropout": self.dropout,
            "dropout_fields": list(self.dropout_fields),
            "config_dropout": self.config_dropout,
        }

    def describe(self) -> str:
        """The plan's student line."""
        entry = self.architecture
        where = (
            f"on {', '.join(self.dropout_fields)}" if self.dropout_fields else "its config's own"
        )
        own = ", ".join(f"{k} {v}" for k, v in self.config_dropout.items())
        return (
            f"student: {entry.name} (model_type {entry.model_type}), attention {self.attention} "
            f"({self.attention_source}), dropout {self.dropout} {where}"
            + (f" (its config: {own})" if own and self.dropout_fields else "")
        )


def described(entry: Architecture) -> str:
    return f"{entry.name} (model_type {entry.model_type})"


def choose_attention(entry: Architecture, attention: str) -> tuple[str, str]:
    """``(attention, why)`` for ``--attn-implementation``: ``auto`` resolved
    (:func:`default_attention`), a choice the student lacks refused naming what it has."""
    if attention == AUTO:
        chosen = default_attention(entry)
        return chosen, f"auto: the fastest {entry.name} has" + (
            "" if chosen == SDPA else " (no sdpa)"
        )
    if attention not in entry.attention:
        raise MmcseError(
            f"--attn-implementation {attention}: {described(entry)} has "
            f"{', '.join(entry.attention)} in transformers; use one of those or auto"
        )
    return attention, "given"


def choose_student(
    entry: Architecture, config: dict, attention: str, packing: bool, dropout: float
) -> StudentChoice:
    """Check the run's attention, packing and dropout against the student's architecture;
    refused in one line (:class:`~mmcse.errors.MmcseError`) when it cannot train so.

    Dropout: the text step's positives are two dropout views of each sentence (SimCSE's, and
    every method's text step), so a student with no active dropout would compare each sentence
    with itself. ``--dropout`` (SimCSE's 0.1 by default) is set on the architecture's own
    fields; an explicit ``--dropout 0`` trains (the paper's no-dropout ablation) with a warning;
    a student whose dropout fields mmcse does not know and whose config has none active is
    refused (nothing could set it)."""

    what = described(entry)
    chosen, source = choose_attention(entry, attention)
    if packing and not entry.packs:
        raise MmcseError(f"--packing is refused for {what}: {entry.packing_refused}; train padded")
    if packing and not entry.packs_with(chosen):
        packed = ", ".join(entry.packed_attention or entry.attention)
        raise MmcseError(
            f"--packing with --attn-implementation {chosen}: {what} packs with {packed} only"
        )
    warnings = []
    if not entry.registered:
        warnings.append(
            f"student model_type {entry.model_type!r} is not in mmcse's registry "
            f"({', '.join(STUDENTS.names())}): it trains padded with {chosen} attention, "
            f"--packing is refused, --dropout goes to "
            f"{', '.join(entry.dropout_fields) or 'none of its fields (its own dropout stays)'}"
        )
    fields = entry.dropout_fields
    config_dropout = {f: config[f] for f in fields if f in config}
    if fields:
        effective = dropout
    else:
        found = config_dropout_fields(config)
        effective = active_dropout(config, found)
        if effective == 0:
            raise MmcseError(
                f"{what} has no active dropout ({', '.join(found) or 'no dropout field'} "
                f"at 0) and mmcse does not know where to set it, so the two dropout views of "
                f"each sentence would be the sentence itself; pick a registered student "
                f"({', '.join(STUDENTS.names())}) or set its dropout in its config.json"
            )
    if effective == 0:
        warnings.append(
            f"--dropout 0: {entry.name} trains without dropout, so each sentence's two views "
            "(SimCSE's positives) are the same vector (SimCSE's no-dropout ablation)"
        )
    return StudentChoice(entry, chosen, source, effective, fields, config_dropout, tuple(warnings))
