"""The model card (README.md) ``mmcse export`` writes: what the model is and how far to trust it.

It states method, student, data, training settings, the fingerprints of every set the run
trained on, the teachers that produced its features, the environment it ran in and its scores.
What makes a result not one -- a run that did not finish, teacher features from random weights
-- is said at the top, before anything else.

Teachers and environment are read from the run info when it records them (``teachers`` or
``provenance``: per feature set, the producer of its manifest; ``environment``), else, for the
teachers, from the manifests of the recorded feature sets when they are still where the run
read them and unchanged (same fingerprint). Whatever is not recorded is said to be unknown.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmcse.cache.manifest import Manifest
from mmcse.errors import CacheError
from mmcse.evaluation.report import COLUMN_TITLES
from mmcse.reports.results import run_result
from mmcse.rundir import RESULTS_FILE, RunDir, run_of_checkpoint

#: run-info keys that may hold the teachers' provenance per feature set
PROVENANCE_KEYS = ("teachers", "provenance")
#: producer fields shown for a teacher, in this order
TEACHER_FIELDS = (
    "teacher",
    "weights",
    "weights_source",
    "weights_sha256",
    "seed",
    "size",
    "compute_dtype",
    "code_version",
)


def _run_dir(run: Path, model_dir: Path) -> RunDir:
    """The training run whose results are the checkpoint's (its best/), else ``run`` itself."""
    return run_of_checkpoint(model_dir) or RunDir(run)


# ---- teachers -----------------------------------------------------------------------------------


def teachers(info: dict) -> dict[str, dict[str, Any]]:
    """Feature-set key (``feature:image``) → the producer of that set, as far as known."""
    found: dict[str, dict[str, Any]] = {}
    for name in PROVENANCE_KEYS:
        recorded = info.get(name)
        if isinstance(recorded, list):  # [{"key"/"role": ..., producer fields}, ...]
            recorded = {
                str(entry.get("key") or entry.get("role") or n): entry
                for n, entry in enumerate(recorded)
                if isinstance(entry, dict)
            }
        if isinstance(recorded, dict):
            for key, value in recorded.items():
                if isinstance(value, dict):
                    found.setdefault(_feature_key(str(key)), _producer(value))
    fingerprints = info.get("fingerprints")
    for key, entry in fingerprints.items() if isinstance(fingerprints, dict) else []:
        if not str(key).startswith("feature:") or key in found or not isinstance(entry, dict):
            continue
        producer = entry.get("producer") or _manifest_producer(entry)
        if isinstance(producer, dict):
            found[key] = producer
    return found


def _feature_key(key: str) -> str:
    """A teacher recorded by role (``image``) under the key of its feature set (``feature:image``,
    as in ``fingerprints``)."""
    return key if ":" in key else f"feature:{key}"


def _producer(value: dict) -> dict:
    """A recorded provenance entry: the producer itself, or an entry holding it."""
    inner = value.get("producer")
    return {**value, **inner} if isinstance(inner, dict) else value


def _manifest_producer(entry: dict) -> dict | None:
    """The producer of a recorded feature set, read from its manifest if it is still there and
    still the set the run read (same fingerprint)."""

    path = entry.get("path")
    if not path or not Path(path).is_dir():
        return None
    try:
        manifest = Manifest.read(path)
    except CacheError:
        return None
    return manifest.producer if manifest.fingerprint == entry.get("fingerprint") else None


def is_random(producer: dict) -> bool:
    """Features from randomly initialised weights (``weights="random"``): they mean nothing."""
    return (
        producer.get("weights") == "random"
        or producer.get("weights_sha256") == "random"
        or producer.get("teacher") == "random"
    )


def describe_teacher(producer: dict) -> str:
    shown = [f"{field} `{producer[field]}`" for field in TEACHER_FIELDS if field in producer]
    return ", ".join(shown) or json.dumps(producer, default=str)


def random_teachers(info: dict) -> list[tuple[str, str]]:
    """``(feature-set key, teacher description)`` of every feature set from random weights."""
    return [(key, describe_teacher(p)) for key, p in teachers(info).items() if is_random(p)]


def _teacher_lines(info: dict) -> list[str]:
    known = teachers(info)
    lines = [
        f"- `{key}`: {describe_teacher(producer)}"
        + (" — **random weights: these features mean nothing**" if is_random(producer) else "")
        for key, producer in known.items()
    ]
    fingerprints = info.get("fingerprints") if isinstance(info.get("fingerprints"), dict) else {}
    unknown = [k for k in fingerprints if str(k).startswith("feature:") and k not in known]
    lines += [
        f"- `{key}`: unknown (not recorded, and its feature set is gone or changed)"
        for key in unknown
    ]
    if lines:
        return lines
    return ["- none (the run read no teacher features)" if fingerprints else "- none recorded"]


# ---- environment, status, scores --------------------------------------------------------------


def _environment_lines(info: dict) -> list[str]:
    environment = info.get("environment")
    if isinstance(environment, dict) and environment:
        return [f"- {key}: `{_flat(_shown_paths(value))}`" for key, value in environment.items()]
    if environment:
        return [f"- `{_flat(environment)}`"]
    return ["- not recorded by this run"]


def _shown_paths(value: Any) -> Any:
    """An environment entry with its ``path`` (where mmcse was installed) shown relative."""
    if isinstance(value, dict) and "path" in value:
        return {**value, "path": shown_path(value["path"])}
    return value


def _flat(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


def _warning_lines(info: dict, unfinished: str | None, changed: str | None) -> list[str]:
    lines = []
    if changed:
        lines.append(
            f"> **Encoding changed**: {changed}. Vectors differ from the student's in norm or "
            "length limit; compare scores with that in mind."
        )
    if unfinished:
        of_total = f" of {info['total_steps']}" if info.get("total_steps") else ""
        lines.append(
            f"> **Unfinished run**: this checkpoint was saved at step {info.get('step', '?')}"
            f"{of_total}; the run did not finish (killed, or still running). Its scores are not "
            "those of the finished method."
        )
    for key, teacher in random_teachers(info):
        lines.append(
            f"> **Random teacher weights**: `{key}` came from a teacher with random weights "
            f"({teacher}). What this model learned from it is noise: not a result of the method."
        )
    return [*lines, ""] if lines else []


def _score_lines(results: dict | None) -> list[str]:

    if not results:
        return [f"No `{RESULTS_FILE}` in the run: no test scores recorded (run `mmcse eval`)."]
    tasks = [t for t in COLUMN_TITLES if t in results]
    titles = [COLUMN_TITLES[t] for t in tasks] + ["Avg."]
    values = [f"{results[t]:.2f}" if results[t] is not None else "-" for t in tasks]
    values.append(f"{results['avg']:.2f}" if results.get("avg") is not None else "-")
    details = results.get("details", {})
    protocol = {**details, **(details.get("protocol") or {})}  # an old flat file: details
    data = protocol.get("data")
    where = f", SentEval folder `{shown_path(data)}`" if data else ", SentEval folder not recorded"
    return [
        "SentEval STS, Spearman x 100 ('all' setting), as `mmcse eval` reported "
        f"(mode {protocol.get('mode', '?')}, pooler {protocol.get('pooler', '?')}{where}):",
        "",
        "| " + " | ".join(titles) + " |",
        "|" + "|".join("---:" for _ in titles) + "|",
        "| " + " | ".join(values) + " |",
    ]


def _normalised(modules: list[dict]) -> bool:
    return bool(modules) and modules[-1]["type"].endswith(".Normalize")


def shown_path(path: Any) -> Any:
    """A path as a card shows it: relative to the working folder when under it, else its last
    two parts (a card is published; the machine's folders are not its reader's)."""
    if not isinstance(path, str | Path) or not Path(path).is_absolute():
        return path
    path, here = Path(path), Path.cwd()
    if path.is_relative_to(here):
        return str(path.relative_to(here)) or "."
    return str(Path("…", *path.parts[-2:]))


def _score(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, int | float) else str(value)


def model_card(
    run: Path,
    model_dir: Path,
    pooler: str,
    modules: list[dict],
    info: dict,
    max_len: int,
    unfinished: str | None = None,
    encoding: tuple[str | None, bool] = (None, False),
    folder: str = ".",
) -> str:
    """The card; ``encoding``: how the export's encoding compares with the student's own
    sentence-transformers encoding (a line, and whether it changed), said at the top when it
    changed and under pooling when kept; ``folder``: the export's folder name (its usage line).
    Paths are :func:`shown_path`, scores rounded to 2 decimals."""
    note, changed = encoding
    config = info.get("config", {})
    method = info.get("method", {})
    name = method.get("name") or config.get("method") or "unknown (not an mmcse training run)"
    settings = {k: v for k, v in method.items() if k != "name"}
    chain = " → ".join(m["type"].rsplit(".", 1)[-1] for m in modules)
    norm = (
        "normalised to unit length (cosine = dot product)"
        if _normalised(modules)
        else "not normalised (the scores below are cosines of these vectors)"
    )
    of_total = f" of {info['total_steps']}" if info.get("total_steps") else ""
    status = ", unfinished run" if unfinished else ", finished run" if "step" in info else ""
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: sentence-similarity",
        "tags: [sentence-transformers, sentence-similarity, mmcse]",
        "---",
        "",
        f"# {run.name} (mmcse export)",
        "",
        *_warning_lines(info, unfinished, note if changed else None),
        f"- method: `{name}`" + (f" with {json.dumps(settings)}" if settings else ""),
        f"- student: `{shown_path(config.get('model', model_dir))}`",
        f"- checkpoint: `{shown_path(model_dir)}` (step {info.get('step', '?')}{of_total}{status}, "
        f"STS-B dev {_score(info.get('stsb_dev', '?'))})",
        f"- pooling: `{pooler}` as {chain}; max sequence length {max_len}; {norm}",
        *([f"- encoding: {note}"] if note and not changed else []),
        f"- text corpus: `{shown_path(config.get('text_corpus'))}`; caption corpus: "
        f"`{shown_path(config.get('caption_corpus'))}`; mixing `{config.get('mixing', '?')}`",
        f"- training: batch {config.get('batch_size', '?')}, lr {config.get('learning_rate', '?')}, "
        f"epochs {config.get('epochs', '?')}, max steps {config.get('max_steps', '?')}, "
        f"seed {config.get('seed', '?')}",
        "",
        "## Training cache fingerprints",
        "",
    ]
    fingerprints = info.get("fingerprints") or {}
    lines += [
        f"- `{key}`: `{value.get('fingerprint')}` ({shown_path(value.get('path', '-'))})"
        for key, value in fingerprints.items()
    ] or ["- none recorded"]
    lines += ["", "## Teachers", "", *_teacher_lines(info)]
    lines += ["", "## Environment", "", *_environment_lines(info)]
    lines += ["", "## Scores", "", *_score_lines(run_result(_run_dir(run, model_dir), "sts"))]
    lines += [
        "",
        "## Usage",
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        f"model = SentenceTransformer({folder!r})  # this folder",
        "vectors = model.encode(['A man is playing a guitar.'])",
        "```",
        "",
    ]
    return "\n".join(lines)
