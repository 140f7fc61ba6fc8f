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
Normalize) keeps its own modules after pooling (Dense, Normalize), because ``mmcse eval`` encodes
with them too (:func:`mmcse.model.resolve_encoding`); a checkpoint of a training run has none
(training pools only), so its export returns the same unnormalised vectors ``mmcse eval`` scores.
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
from mmcse.model import resolve_encoding
from mmcse.pooling import ST_MODULES_FILE, StModule
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
    with naming_os_errors(out), atomic_dir(target) as tmp:
        _write(tmp, model_dir, pooler, student_modules, info, run, unfinished)
    return out, pooler


def _write(
    tmp: Path, model_dir: Path, pooler: str, student_modules: list[StModule], info: dict,
    run: Path, unfinished: str | None,
) -> None:  # fmt: skip

    encoder, tokenizer, _, _ = load_encoder(model_dir, pooler, "cpu")  # the bare encoder
    backbone = encoder.backbone
    backbone.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    max_len = model_max_length(tokenizer, backbone)  # what mmcse eval truncates to
    (tmp / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_len, "do_lower_case": False}, indent=2) + "\n"
    )
    modules = _pooling_modules(tmp, ST_POOLING_MODE[pooler], backbone.config.hidden_size)
    backbone_pooler = getattr(backbone, "pooler", None)
    if pooler == "cls" and backbone_pooler is not None:
        modules.append(_dense_from_pooler(tmp, backbone_pooler, len(modules)))
    for module in student_modules:
        modules.append(_student_module(tmp, module, len(modules)))
    (tmp / ST_MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    exported = {**info, "pooler": pooler}  # a student trained from OUT pools the same way
    Checkpoint(tmp).write_info(exported)
    card = model_card(run, model_dir, pooler, modules, info, max_len, unfinished=unfinished)
    (tmp / "README.md").write_text(card)
