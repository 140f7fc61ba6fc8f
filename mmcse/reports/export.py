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

No Normalize module: ``mmcse eval`` scores cosines of unnormalised vectors, so the exported model
returns the same unnormalised vectors. The model card (README.md) states method, data, the
fingerprints of the training cache and the scores (the run's STS results, when recorded).
The Pooling config uses the legacy ``pooling_mode_*`` keys, which every sentence-transformers
release reads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mmcse.errors import MmcseError
from mmcse.pooling import resolve_pooler
from mmcse.rundir import (
    RESULTS_FILE,
    Checkpoint,
    RunDir,
    resolve_model_dir,
    run_of_checkpoint,
)

ST_POOLING_MODE = {"cls_before_pooler": "cls", "cls": "cls", "avg": "mean", "max": "max"}
_LEGACY_KEY = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
}


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise MmcseError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise MmcseError(f"{out} is not empty; pass --overwrite to replace it")
        shutil.rmtree(out)


def _run_dir(run: Path, model_dir: Path) -> RunDir:
    """The training run whose results are the checkpoint's (its best/), else ``run`` itself."""
    return run_of_checkpoint(model_dir) or RunDir(run)


def _pooling_modules(out: Path, mode: str, dim: int) -> list[dict]:
    pooling = {"word_embedding_dimension": dim, **{k: False for k in _LEGACY_KEY.values()}}
    pooling["pooling_mode_mean_sqrt_len_tokens"] = False
    pooling[_LEGACY_KEY[mode]] = True
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    return [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]


def _dense_from_pooler(out: Path, backbone_pooler) -> dict:
    """BERT's pooler (dense + tanh over [CLS]) as a sentence-transformers Dense module."""
    from safetensors.torch import save_file

    dense = backbone_pooler.dense
    folder = out / "2_Dense"
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
    return {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}


def export_run(
    run: str | Path, out: str | Path, pooler: str | None = None, overwrite: bool = False
):
    """Write the sentence-transformers directory ``out`` for a run / checkpoint / HF model dir.

    Returns ``(out, pooler)``. ``pooler=None`` exports the pooler ``mmcse eval`` would use.
    """
    from mmcse.evaluation.encode import model_max_length
    from mmcse.evaluation.sts import load_encoder

    run, out = Path(run), Path(out)
    if not run.exists():
        raise MmcseError(f"{run} does not exist")
    model_dir = Path(resolve_model_dir(str(run)))
    pooler, _ = resolve_pooler(pooler, model_dir)
    if pooler not in ST_POOLING_MODE:
        raise MmcseError(
            f"pooler {pooler} has no faithful sentence-transformers equivalent (it averages two "
            f"layers); export with --pooler cls_before_pooler|avg|max|cls, knowing it then "
            f"encodes differently from what mmcse scored"
        )
    _check_out(out, overwrite)
    encoder, tokenizer, _, _ = load_encoder(model_dir, pooler, "cpu")
    backbone = encoder.backbone
    out.mkdir(parents=True, exist_ok=True)
    backbone.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    max_len = model_max_length(tokenizer, backbone)  # what mmcse eval truncates to
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_len, "do_lower_case": False}, indent=2) + "\n"
    )
    modules = _pooling_modules(out, ST_POOLING_MODE[pooler], backbone.config.hidden_size)
    backbone_pooler = getattr(backbone, "pooler", None)
    if pooler == "cls" and backbone_pooler is not None:
        modules.append(_dense_from_pooler(out, backbone_pooler))
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    info = Checkpoint(model_dir).read_info() or {}
    info["pooler"] = pooler  # so `mmcse eval OUT` uses the same pooling
    Checkpoint(out).write_info(info)
    (out / "README.md").write_text(model_card(run, model_dir, pooler, modules, info, max_len))
    return out, pooler


def _score_lines(results: dict | None) -> list[str]:
    from mmcse.evaluation.report import COLUMN_TITLES

    if not results:
        return [f"No `{RESULTS_FILE}` in the run: no test scores recorded (run `mmcse eval`)."]
    tasks = [t for t in COLUMN_TITLES if t in results]
    titles = [COLUMN_TITLES[t] for t in tasks] + ["Avg."]
    values = [f"{results[t]:.2f}" if results[t] is not None else "-" for t in tasks]
    values.append(f"{results['avg']:.2f}" if results.get("avg") is not None else "-")
    details = results.get("details", {})
    return [
        "SentEval STS, Spearman x 100 ('all' setting), as `mmcse eval` reported "
        f"(mode {details.get('mode', '?')}, pooler {details.get('pooler', '?')}):",
        "",
        "| " + " | ".join(titles) + " |",
        "|" + "|".join("---:" for _ in titles) + "|",
        "| " + " | ".join(values) + " |",
    ]


def model_card(run: Path, model_dir: Path, pooler: str, modules, info: dict, max_len: int) -> str:
    config = info.get("config", {})
    method = info.get("method", {})
    name = method.get("name") or config.get("method") or "unknown (not an mmcse training run)"
    settings = {k: v for k, v in method.items() if k != "name"}
    chain = " → ".join(m["type"].rsplit(".", 1)[-1] for m in modules)
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, sentence-similarity, mmcse]",
        "---",
        "",
        f"# {run.name} (mmcse export)",
        "",
        f"- method: `{name}`" + (f" with {json.dumps(settings)}" if settings else ""),
        f"- student: `{config.get('model', model_dir)}`",
        f"- checkpoint: `{model_dir}` (step {info.get('step', '?')}, "
        f"STS-B dev {info.get('stsb_dev', '?')})",
        f"- pooling: `{pooler}` as {chain}; max sequence length {max_len}; not normalised "
        "(the scores below are cosines of these vectors)",
        f"- text corpus: `{config.get('text_corpus')}`; caption corpus: "
        f"`{config.get('caption_corpus')}`; mixing `{config.get('mixing', '?')}`",
        f"- training: batch {config.get('batch_size', '?')}, lr {config.get('learning_rate', '?')}, "
        f"epochs {config.get('epochs', '?')}, max steps {config.get('max_steps', '?')}, "
        f"seed {config.get('seed', '?')}",
        "",
        "## Training cache fingerprints",
        "",
    ]
    fingerprints = info.get("fingerprints") or {}
    lines += [
        f"- `{key}`: `{value.get('fingerprint')}` ({value.get('path', '-')})"
        for key, value in fingerprints.items()
    ] or ["- none recorded"]
    lines += ["", "## Scores", "", *_score_lines(_run_dir(run, model_dir).read_results("sts"))]
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "model = SentenceTransformer('PATH/TO/THIS/DIR')",
        "vectors = model.encode(['A man is playing a guitar.'])",
        "```",
        "",
    ]
    return "\n".join(lines)
