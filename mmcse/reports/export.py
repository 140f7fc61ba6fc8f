"""``mmcse export RUN OUT``: a sentence-transformers model directory that encodes as mmcse scored.

``SentenceTransformer(OUT).encode(sentences)`` gives the vectors ``mmcse eval RUN`` computes: the
same backbone and tokenizer (module ``0``, files at OUT's root), the same truncation length, and
the pooler the run is evaluated with, written as sentence-transformers modules:

=====================  ==========================================================================
our pooler             sentence-transformers modules
=====================  ==========================================================================
``cls_before_pooler``  Pooling ``cls`` (last-layer [CLS], no MLP: SimCSE/MCSE's unsup. setting)
``avg`` (``mean``)     Pooling ``mean``
``max``                Pooling ``max``
``cls``                Pooling ``cls`` + Dense with the backbone's pooler weights and tanh
                       (BERT's pooler output); a backbone without a pooler is ``cls_before_pooler``
``avg_first_last``,    refused: they average two layers, which no stock module reproduces; pass
``avg_top2``           ``--pooler`` to export another pooling (it then scores differently)
=====================  ==========================================================================

A source that is itself a sentence-transformers dir (all-MiniLM-L6-v2: Pooling ``mean`` then
Normalize, ``max_seq_length`` 256) keeps its own modules after pooling (Dense, Normalize) and its
``max_seq_length``, because ``mmcse eval`` encodes with them too
(:func:`mmcse.model.resolve_encoding`). So does a run fine-tuned from one: its checkpoint
pooled as the student does, so it keeps the student's Normalize and ``max_seq_length``
(:func:`mmcse.model.encoding_dir`), and eval and export agree. Where the run (or ``--pooler``)
changed the student's encoding -- another pooling, so its Normalize/Dense no longer apply, or
another length -- the export says what changed, in the log and at the top of the model card.
A given ``--pooler`` exports the bare encoder with that pooling, as ``mmcse eval --pooler`` does.

The model card (README.md, :mod:`mmcse.reports.model_card`) states method, data, the fingerprints
and teachers of the training cache, the environment and the scores, and says so prominently when
the run did not finish or its teacher features came from random weights.

OUT is written beside itself and renamed into place (:func:`mmcse.files.atomic_dir`): a failed
export leaves no half-written folder, and ``--overwrite`` replaces OUT only once the new one is
complete. OUT may not be the exported run or checkpoint, lie inside it or contain it. Files get
the permissions a plain ``open`` gives (umask respected). The Pooling config uses the legacy
``pooling_mode_*`` keys, which every sentence-transformers release reads.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from mmcse.errors import MmcseError, naming_os_errors
from mmcse.evaluation.encode import model_max_length
from mmcse.evaluation.evaluate import unfinished_warning
from mmcse.evaluation.sts import load_encoder
from mmcse.files import atomic_dir
from mmcse.hub import missing_path_message
from mmcse.model import encoding_dir, encoding_max_length, resolve_encoding, student_dir
from mmcse.pooling import ST_MODULES_FILE, StModule, st_encoding, st_settings
from mmcse.reports.model_card import model_card, random_teachers
from mmcse.rundir import Checkpoint, resolve_model_dir

logger = logging.getLogger(__name__)

ST_POOLING_MODE = {"cls_before_pooler": "cls", "cls": "cls", "avg": "mean", "max": "max"}
_LEGACY_KEY = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
}
_ST_TYPE = "sentence_transformers.models."


def _check_not_source(out: Path, sources: list[Path]) -> None:
    """Refuse an OUT that is, lies inside or contains what is exported (symlinks resolved):
    ``--overwrite`` would delete the checkpoint being read."""
    target = out.resolve()
    for source in sources:
        real = source.resolve()
        if target == real or real in target.parents or target in real.parents:
            relation = (
                "is" if target == real else "is inside" if real in target.parents else "contains"
            )
            raise MmcseError(
                f"{out} {relation} {source}, which is being exported; write OUT elsewhere"
            )


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise MmcseError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise MmcseError(f"{out} is not empty; pass --overwrite to replace it")


def _module(idx: int, kind: str, path: str) -> dict:
    return {"idx": idx, "name": str(idx), "path": path, "type": _ST_TYPE + kind}


def _pooling_modules(out: Path, mode: str, dim: int) -> list[dict]:
    pooling = {"word_embedding_dimension": dim, **{k: False for k in _LEGACY_KEY.values()}}
    pooling["pooling_mode_mean_sqrt_len_tokens"] = False
    pooling[_LEGACY_KEY[mode]] = True
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    return [_module(0, "Transformer", ""), _module(1, "Pooling", "1_Pooling")]


def _dense_from_pooler(out: Path, backbone_pooler, idx: int) -> dict:
    """BERT's pooler (dense + tanh over [CLS]) as a sentence-transformers Dense module."""
    from safetensors.torch import save_file

    dense = backbone_pooler.dense
    folder = out / f"{idx}_Dense"
    folder.mkdir()
    config = {
        "in_features": dense.in_features,
        "out_features": dense.out_features,
        "bias": dense.bias is not None,
        "activation_function": "torch.nn.modules.activation.Tanh",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {"linear.weight": dense.weight.detach().contiguous()}
    if dense.bias is not None:
        weights["linear.bias"] = dense.bias.detach().contiguous()
    save_file(weights, str(folder / "model.safetensors"))
    return _module(idx, "Dense", folder.name)


def _student_module(out: Path, module: StModule, idx: int) -> dict:
    """One of the source's own modules after pooling, copied as it is."""
    folder = out / f"{idx}_{module.kind}"
    if module.folder.is_dir():
        shutil.copytree(module.folder, folder)
    else:  # Normalize has no files (all-MiniLM-L6-v2 ships no folder for it)
        folder.mkdir()
    return _module(idx, module.kind, folder.name)


def export_run(
    run: str | Path, out: str | Path, pooler: str | None = None, overwrite: bool = False
):
    """Write the sentence-transformers directory ``out`` for a run / checkpoint / HF model dir.

    Returns ``(out, pooler)``. ``pooler=None`` exports the encoding ``mmcse eval`` would use.
    Everything is checked before anything is written; nothing is deleted before the new OUT is
    complete.
    """

    if not Path(run).exists():
        raise MmcseError(
            missing_path_message(str(run))
            or f"{run}: no such folder (export reads a local run or model folder, not a hub id)"
        )
    run, out = Path(run), Path(out)
    model_dir = Path(resolve_model_dir(str(run)))  # a run without best/ is refused here
    _check_not_source(out, [run, model_dir])
    requested = pooler
    pooler, _, student_modules = resolve_encoding(pooler, model_dir)
    if pooler not in ST_POOLING_MODE:
        raise MmcseError(
            f"pooler {pooler} has no faithful sentence-transformers equivalent (it averages two "
            f"layers); export with --pooler cls_before_pooler|avg|max|cls, knowing it then "
            f"encodes differently from what mmcse scored"
        )
    _check_out(out, overwrite)
    info = Checkpoint(model_dir).read_info() or {}
    unfinished = unfinished_warning(model_dir)
    if unfinished:
        logger.warning(unfinished + "; the model card says so")
    for key, teacher in random_teachers(info):
        logger.warning(
            f"{key} of this run came from a teacher with random weights ({teacher}): the "
            "exported model is not a real result; the model card says so"
        )
    target = out.resolve() if out.is_symlink() else out
    encoding = Encoding(model_dir, requested, pooler, student_modules)
    with naming_os_errors(out), atomic_dir(target) as tmp:
        _write(tmp, encoding, info, run, unfinished, out.name)
    return out, pooler


class Encoding:
    """How the export encodes (pooling, modules after it, max length) and how that compares
    with the student's own sentence-transformers encoding, when the student has one."""

    def __init__(self, model_dir: Path, requested: str | None, pooler: str, modules) -> None:
        self.model_dir, self.pooler, self.modules = model_dir, pooler, list(modules)
        self.max_length = encoding_max_length(requested, model_dir)  # None: the model's limit
        own = encoding_dir(model_dir) if requested is None else None
        self.settings = st_settings(own[0]) if own else {}
        self.student = model_dir if st_encoding(model_dir) else student_dir(model_dir)

    def student_encoding(self) -> tuple[str, list[str], int | None] | None:
        """The student's ``(pooler, module kinds after pooling, max_seq_length)``; None when it
        is no (readable) sentence-transformers dir."""
        if self.student is None:
            return None
        try:
            found = st_encoding(self.student)
        except MmcseError:
            return None
        if found is None:
            return None
        length = st_settings(self.student).get("max_seq_length")
        return found[0], [m.kind for m in found[1]], length if isinstance(length, int) else None

    def changes(self, max_len: int) -> list[str] | None:
        """What the export changed from the student's encoding ([] nothing; None: no student
        sentence-transformers encoding to compare with)."""
        student = self.student_encoding()
        if student is None:
            return None
        pooler, kinds, length = student
        exported = [m.kind for m in self.modules]
        changed = []
        if pooler != self.pooler:
            changed.append(f"pooling {pooler} -> {self.pooler} (the run's)")
        if kinds != exported:
            changed.append(
                f"modules after pooling {' → '.join(kinds) or 'none'} -> "
                f"{' → '.join(exported) or 'none'}"
            )
        if length is not None and length != max_len:
            changed.append(f"max_seq_length {length} -> {max_len}")
        return changed

    def note(self, max_len: int) -> tuple[str | None, bool]:
        """``(a line for the log and the card, whether the student's encoding changed)``."""
        changes = self.changes(max_len)
        if changes is None:
            return None, False
        if changes:
            return (
                f"the export does not encode as its student {self.student} does: "
                f"{'; '.join(changes)}"
            ), True
        chain = " → ".join([f"pooling {self.pooler}", *(m.kind for m in self.modules)])
        return (
            f"the export keeps its student's sentence-transformers encoding ({chain}, "
            f"max_seq_length {max_len}; from {self.student})"
        ), False


def _write(
    tmp: Path, encoding: Encoding, info: dict, run: Path, unfinished: str | None, folder: str
) -> None:
    model_dir, pooler = encoding.model_dir, encoding.pooler
    encoder, tokenizer, _, _ = load_encoder(model_dir, pooler, "cpu")  # the bare encoder
    backbone = encoder.backbone
    backbone.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    # what mmcse eval truncates to: the student's max_seq_length, else the model's limit
    max_len = encoding.max_length or model_max_length(tokenizer, backbone)
    lower = bool(encoding.settings.get("do_lower_case", False))
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_len, "do_lower_case": lower}, indent=2) + "\n"
    )
    note, changed = encoding.note(max_len)
    if note:
        (logger.warning if changed else logger.info)(
            note + ("; the model card says so" if changed else "")
        )
    student_modules = encoding.modules
    modules = _pooling_modules(tmp, ST_POOLING_MODE[pooler], backbone.config.hidden_size)
    backbone_pooler = getattr(backbone, "pooler", None)
    if pooler == "cls" and backbone_pooler is not None:
        modules.append(_dense_from_pooler(tmp, backbone_pooler, len(modules)))
    for module in student_modules:
        modules.append(_student_module(tmp, module, len(modules)))
    (tmp / ST_MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    exported = {**info, "pooler": pooler}  # a student trained from OUT pools the same way
    Checkpoint(tmp).write_info(exported)
    card = model_card(
        run,
        model_dir,
        pooler,
        modules,
        info,
        max_len,
        unfinished=unfinished,
        encoding=(note, changed),
        folder=folder,
    )
    (tmp / "README.md").write_text(card)
