"""Checks every input of a training run before any work starts (``train``, ``--dry-run``, recipes).

A run used to find a wrong ``--eval-data`` at its first evaluation (step 125, no checkpoint),
an unknown pooler after the model loaded, an offline hub id after ~60 s of retries, and to
overwrite an earlier run silently. :func:`preflight` looks at everything the run will read,
in the order of cost, and raises one :class:`~mmcse.errors.MmcseError` naming the setting (and
the fix, where there is one):

1. without loading torch (:func:`check_inputs`, which ``mmcse train`` runs before importing the
   loop): the pooler, corpora and feature-set folders exist and are readable (a sentence file in
   a format :mod:`mmcse.corpusfiles` reads), a named ``token_cache`` folder can be written, the
   model folder's config and weights (or a hub-like name); then the device;
2. torchrun variables, the method and its settings (at least one loss term for every batch kind
   the run trains on), every role the method reads is given, and every role given is one the
   method reads (a role it never reads is refused as a typo; one switched off is a warning);
3. the SentEval folder has STS-B dev (and, with ``final_eval``, every test file), parsed;
4. the student: a local HF folder (config, tokenizer, room for ``--max-seq-length``), or a hub
   id that resolves (cache, else a 3 s reachability probe; never the hub client's retries);
5. the output folder: refused when it holds files, unless ``--overwrite`` or resuming;
6. the data join: corpora opened and every role's ids matched to them, as training will
   (no tokenizer: nothing is tokenised, no text of a corpus table read), and at least one
   global batch per corpus; a set whose teacher had random weights is a warning;
7. resuming: ``last/`` against its integrity record, the run's settings and the fingerprints of
   every set now (:func:`mmcse.training.checkpoint.check_resumable`).

Setting types and ranges are checked earlier, by the config dataclasses (:mod:`mmcse.training.config`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmcse.cache.layout import MANIFEST_NAME
from mmcse.corpusfiles import detect_format, is_hf_name
from mmcse.devices import check_device, default_device_name
from mmcse.errors import MmcseError
from mmcse.hub import check_hub_id, load_tokenizer, local_or_hub_id
from mmcse.pooling import check_pooler as known_pooler
from mmcse.rundir import MODEL_CONFIG_FILE, is_model_dir, resolve_model_dir
from mmcse.training.config import (
    TOKEN_CACHE_AUTO,
    TOKEN_CACHE_OFF,
    SettingError,
    TrainConfig,
    packing_required,
)

# Modules that load torch (methods, data, evaluation, checkpoints: seconds, tens of seconds on a
# busy machine) are imported where used: the cheap checks, run first, answer a wrong path or
# setting in about a second.
if TYPE_CHECKING:
    from mmcse.methods import Method
    from mmcse.training.data import TrainData
    from mmcse.training.plan import RunPlan

logger = logging.getLogger(__name__)

#: files one of which holds a local model's weights (single file or sharded index)
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class Checked:
    """What preflight built while checking, kept by the run (nothing is built twice)."""

    method: Method
    data: TrainData  # every corpus opened and joined to its feature sets, not yet tokenised
    auxiliary: dict  # the auxiliary task's example sets by role (VisualCSE's images)
    run_plan: RunPlan  # the run's batch plan (:func:`mmcse.training.plan.plan_run`), kept by it
    preview: dict  # the plan's figures (:func:`mmcse.training.plan.preview`, --dry-run's)


def preflight(cfg: TrainConfig, *, resuming: bool | None = None) -> Checked:
    """Check the whole run; returns what it built and the plan's batch figures (warning about
    the plan). ``resuming`` defaults to ``cfg.resume``."""
    if resuming is None:
        resuming = bool(getattr(cfg, "resume", None))
    check_inputs(cfg)
    check_device(cfg.device)  # a GPU name loads torch to look
    check_distributed_env()  # the first check that loads torch
    check_attention_device(cfg)
    method = checked_method(cfg.method, cfg.method_args)
    check_roles(cfg, method)
    check_unread_roles(cfg, method)
    check_terms(cfg, method)
    check_eval_data(cfg)
    check_model(cfg.model, cfg.max_seq_length)
    check_student_settings(cfg)
    check_output_dir(cfg, resuming=resuming)
    data = check_join(cfg, method)
    from mmcse.training.plan import plan_run, plan_warnings, preview  # torch is loaded by now

    run_plan = plan_run(data)  # a corpus smaller than one global batch is refused here
    figures = preview(data, run_plan)
    for warning in plan_warnings(figures, method):
        logger.warning(warning)
    auxiliary = auxiliary_sets(cfg, method)
    warn_random_teachers(data.role_sets | {role: [fs] for role, fs in auxiliary.items()})
    if resuming:
        from mmcse.training.checkpoint import check_resumable

        check_resumable(cfg.to_dict(), input_fingerprints(data, auxiliary))
    return Checked(method, data, auxiliary, run_plan, figures)


def check_inputs(cfg: TrainConfig) -> None:
    """The checks that import neither torch nor transformers: the pooler, every corpus and
    feature-set path, a named token cache, the model folder's files (or that a path-like
    ``--model`` exists). ``mmcse train`` runs them before it imports the training loop, so a
    missing input is one line at the speed of a check, not after the loop's imports."""
    check_pooler(cfg.pooler)
    check_paths(cfg)
    check_token_cache(cfg.token_cache)
    check_model_files(cfg.model, cfg.max_seq_length)


def check_distributed_env() -> None:
    """torchrun's variables (:mod:`mmcse.distributed` imports torch, so not at module level)."""
    from mmcse import distributed

    distributed.check_env()


# ---- cheap checks --------------------------------------------------------------------------


def checked_method(name: str, settings: dict) -> Method:
    """The method with its ``--method-arg`` settings. :mod:`mmcse.methods` refuses a setting
    with a ValueError; here that is the user's error, one line naming it. A method left with no
    loss term (every weight 0) has nothing to train and is refused too."""
    from mmcse.methods import build_method

    try:
        method = build_method(name, **settings)
    except MmcseError:
        raise
    except ValueError as exc:
        raise SettingError(str(exc)) from None
    if not method.active_terms():
        zero = [f for f in method.weight_fields() if getattr(method, f) == 0]
        raise SettingError(
            f"method {name!r} has no loss term left to train ({', '.join(zero)} = 0); give at "
            "least one term a non-zero weight"
        )
    return method


def termless_kinds(cfg: TrainConfig, method: Method) -> list[str]:
    """Batch kinds this run trains on that no active term of ``method`` applies to."""
    terms = method.active_terms()
    return [k for k in sources_of(cfg) if not any(term.applies_to(k) for term in terms)]


def check_terms(cfg: TrainConfig, method: Method) -> None:
    """Every batch kind the run trains on has a term to learn from (else its loss is a
    constant and the step fails)."""
    for kind in termless_kinds(cfg, method):
        active = ", ".join(f"{t.name} (on {t.on} batches)" for t in method.active_terms())
        raise SettingError(
            f"method {method.name!r} has no active loss term for {kind} batches, which this "
            f"run trains on (mixing {cfg.mixing}); its active terms: {active}"
        )


def _released_teachers(cfg: TrainConfig) -> Method:
    """The method with DALR's released ``teachers_on=caption``."""
    from mmcse.methods import build_method

    return build_method(cfg.method, **{**cfg.method_args, "teachers_on": "caption"})


def check_pooler(name: str) -> None:
    """Known to :mod:`mmcse.pooling` (its poolers, aliases and ``auto``)."""

    known_pooler(name, allow_auto=True)


def _readable(path: Path, label: str, what: str) -> None:
    """``label`` is the flag as given (``--text-corpus X``, ``--feature image=X``)."""
    if not path.exists():
        raise MmcseError(f"{label}: no such {what}")
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise MmcseError(f"{label}: not readable (check its permissions)")


def check_paths(cfg: TrainConfig) -> None:
    """Corpora and feature-set folders exist and can be read."""
    for flag, value in (
        ("--text-corpus", cfg.text_corpus),
        ("--caption-corpus", cfg.caption_corpus),
    ):
        if value and not is_hf_name(value):
            _readable(Path(value), f"{flag} {value}", "file or folder")
            check_corpus_form(Path(value), flag)
    for role, dirs in cfg.features.items():
        parts = [d for d in dirs.split(",") if d.strip()]
        if not parts:
            raise MmcseError(f"--feature {role}= names no folder; give --feature {role}=DIR")
        for d in parts:
            _readable(Path(d), f"--feature {role}={d}", "folder")
        if role in cfg.expect_fingerprints and len(parts) > 1:
            raise MmcseError(
                f"--expect-fingerprint {role}: the role has {len(parts)} sets; a fingerprint "
                "pins one set, so give one set for the role or drop the check"
            )


def check_token_cache(setting: str) -> None:
    """A named ``token_cache`` folder can be created and written (the check writing an entry
    makes), so it fails here and not after tokenising a whole corpus. ``auto`` falls back to
    memory with a warning where it cannot write; ``off`` writes nothing."""
    from mmcse.cache.tokens import check_writable_folder

    if setting in (TOKEN_CACHE_AUTO, TOKEN_CACHE_OFF):
        return
    try:
        check_writable_folder(Path(setting))
    except MmcseError as exc:
        raise MmcseError(f"token_cache {exc}") from None


def check_corpus_form(path: Path, flag: str) -> None:
    """A corpus table, or (text corpus only) a file or folder in a format
    :mod:`mmcse.corpusfiles` reads, judged by its name and first bytes; its rows are read,
    under the read policy, when the data is joined."""
    if (path / MANIFEST_NAME).is_file():
        return
    if flag == "--caption-corpus":
        raise MmcseError(
            f"{flag} {path}: not a corpus table; a caption corpus is the table extract-images "
            "writes (its captions join their images' features by id): run `mmcse "
            "extract-images --dataset local --captions FILE` for a caption file in any format"
        )
    try:
        detect_format(path)
    except MmcseError as exc:
        raise MmcseError(f"{flag} {exc}") from None


def sources_of(cfg: TrainConfig) -> list[str]:
    """The corpus kinds a run trains on (as :class:`mmcse.training.data.TrainData` picks them)."""
    from mmcse.training.data import CAPTION, TEXT

    kinds = []
    if cfg.text_corpus and cfg.mixing != "caption-only":
        kinds.append(TEXT)
    if cfg.caption_corpus and cfg.mixing != "text-only":
        kinds.append(CAPTION)
    return kinds


def missing_roles(cfg: TrainConfig, method: Method) -> list[str]:
    """Feature roles the method reads on the run's corpora that no ``--feature`` gives."""
    from mmcse.training.data import CAPTION

    needed: list[str] = []
    for kind in sources_of(cfg):
        extra = method.caption_roles if kind == CAPTION else ()
        needed += [r for r in (*method.text_roles, *extra) if r not in needed]
    return [r for r in needed if r not in cfg.features]


def check_roles(cfg: TrainConfig, method: Method) -> None:
    """Every feature role the method reads is given a set."""
    missing = missing_roles(cfg, method)
    if missing:
        flags = " ".join(f"--feature {r}=DIR" for r in missing)
        hint = ""
        if getattr(method, "teachers_on", None) == "all":
            released = _released_teachers(cfg)
            passes = not missing_roles(cfg, released) and not termless_kinds(cfg, released)
            hint = _teachers_hint(method) if passes else ""
        made = "; ".join(f"{role}: {role_command(role)}" for role in missing)
        raise MmcseError(
            f"method {method.name!r} needs cached features: give {flags}{hint} (Stage 1 makes "
            f"them: {made})"
        )


#: the Stage-1 command that writes a feature role's set, by role name (the sets' folders are
#: named ``<kind>-<teacher>``, beside the captions table); every registered role is covered
ROLE_COMMANDS = {
    "image": "`mmcse extract-images --teacher TEACHER` writes image-TEACHER/",
    "clip_image": "`mmcse extract-images --teacher clip-vit-l14` writes image-clip-vit-l14/",
    "clip_text": "`mmcse extract-images --teacher clip-vit-l14` writes text-clip-vit-l14/",
    "object": "`mmcse extract-objects` writes object-TEACHER/",
    "image_tensor": "`mmcse extract-image-tensors` writes the image set",
    "audio_fbank": "`mmcse extract-audio` writes the audio set",
}
TEXT_TEACHER_ROLE = "text_teacher_"


def role_command(role: str) -> str:
    """How to make a feature role's set (``text_teacher_<name>``: that text teacher's set)."""
    if role.startswith(TEXT_TEACHER_ROLE):
        teacher = role.removeprefix(TEXT_TEACHER_ROLE)
        return f"`mmcse extract-text --corpus CAPTIONS_TABLE --teacher {teacher}` writes text-{teacher}/"
    return ROLE_COMMANDS.get(role, "see `mmcse recipes show` of a recipe of this method")


def roles_read(cfg: TrainConfig, method: Method) -> list[str]:
    """The feature roles this run reads: on its corpora, and by the auxiliary task."""
    from mmcse.training.data import CAPTION

    kinds = sources_of(cfg)
    roles = [*(method.text_roles if kinds else ())]
    roles += method.caption_roles if CAPTION in kinds else ()
    return list(dict.fromkeys([*roles, *method.auxiliary_roles()]))


def method_roles(method: Method) -> list[str]:
    """The feature roles ``method`` reads on some corpus (its weights as they are)."""
    roles = (*method.text_roles, *method.caption_roles, *method.auxiliary_roles())
    return list(dict.fromkeys(roles))


def _every_term_on(cfg: TrainConfig, method: Method) -> Method:
    """The method with each zero weight made 1: the roles it knows, switched-off terms too."""
    from mmcse.methods import build_method

    zero = {f: 1.0 for f in method.weight_fields() if getattr(method, f) == 0}
    if not zero:
        return method
    try:
        return build_method(cfg.method, **{**cfg.method_args, **zero})
    except (MmcseError, ValueError):
        return method


def check_unread_roles(cfg: TrainConfig, method: Method) -> None:
    """A ``--feature`` role the method never reads is refused (a typo, or another method's
    role); one it reads only with a term or a corpus this run leaves out is a warning."""
    read = roles_read(cfg, method)
    unread = [role for role in cfg.features if role not in read]
    if not unread:
        return
    known = method_roles(_every_term_on(cfg, method))
    for role in unread:
        if role not in known:
            roles = ", ".join(known) or "none (it reads no cached features)"
            raise MmcseError(
                f"--feature {role}={cfg.features[role]}: method {method.name!r} reads no role "
                f"{role!r}; its roles: {roles}"
            )
    for role in unread:
        why = (
            "it reads that role on caption batches and this run trains on none "
            f"(mixing {cfg.mixing})"
            if role in method_roles(method)
            else "the terms that read it have weight 0"
        )
        logger.warning(
            "--feature %s=%s is not read by this run: %s; roles read: %s",
            role,
            cfg.features[role],
            why,
            ", ".join(read) or "none",
        )


def _teachers_hint(method: Method) -> str:
    if getattr(method, "teachers_on", None) != "all":
        return ""
    return (
        f" ({method.name}'s teachers_on=all reads the text teachers on text batches too, so they "
        "must be cached for the text corpus as well as the captions, one set per corpus: "
        "--feature ROLE=TEXT_SET,CAPTION_SET; or pass --method-arg teachers_on=caption, the "
        "released code's setting, to distil on caption batches only)"
    )


def check_eval_data(cfg: TrainConfig) -> None:
    """The SentEval folder has STS-B dev (and every test file for the final evaluation)."""
    from mmcse.evaluation.sts import eval_data_dir, load_task, load_tasks, resolve_downstream

    eval_dir = eval_data_dir(cfg.eval_data)
    if eval_dir is None:
        return
    try:
        load_task(resolve_downstream(eval_dir), "STSBenchmark", split="dev")
        if cfg.final_eval:
            load_tasks(eval_dir, "test")
    except MmcseError as exc:
        raise MmcseError(
            f"--eval-data: {exc} (give the SentEval folder holding downstream/STS, "
            "or --eval-data '' to train without evaluation)"
        ) from None


def check_attention_device(cfg: TrainConfig) -> None:
    """``--attn-implementation varlen`` is CUDA's FlashAttention kernel
    (``torch.nn.attention.varlen``): on another device, or in fp32 (the step's ``--precision`` or
    the STS evaluation's ``--eval-precision``), it would die at the first forward in a traceback."""
    if cfg.attn_implementation != "varlen":
        return
    device = default_device_name() if cfg.device == "auto" else cfg.device
    if not device.startswith("cuda"):
        raise MmcseError(
            f"--attn-implementation varlen runs on CUDA only, and this run trains on {device}; "
            "use --attn-implementation sdpa or flex_attention"
        )
    fp32 = ["--precision"] if cfg.precision == "fp32" else []
    if cfg.eval_data != "" and cfg.eval_precision == "fp32":
        fp32.append("--eval-precision")
    if fp32:  # FlashAttention's kernel: it failed on an H200 in fp32 (BENCHMARKS.md)
        from mmcse.packing import VARLEN_DTYPES  # torch is loaded by now (the torchrun check)

        raise MmcseError(f"{VARLEN_DTYPES} (this run has {' and '.join(fp32)} fp32)")


# ---- the student ---------------------------------------------------------------------------


def check_student_settings(cfg: TrainConfig) -> None:
    """The attention, packing and dropout the student's architecture allows
    (:func:`mmcse.model.check_student`), before the data is joined and the model loads."""
    from mmcse.model import check_student  # torch is loaded by now

    check_student(cfg.model, cfg.attn_implementation, packing_required(cfg), cfg.dropout)


def check_model(name: str, max_seq_length: int | None = None) -> None:
    """A local HF model folder (or training run), or a hub id that can resolve now."""
    local = check_model_files(name, max_seq_length)
    if local is not None:
        check_tokenizer(local, name)
        return
    cached = check_hub_id(name, "--model")
    if cached is not None:
        check_positions(cached, name, max_seq_length)


def check_model_files(name: str, max_seq_length: int | None = None) -> Path | None:
    """The local model folder (its config, room for ``--max-seq-length``, weights), without
    loading anything; None for a name that is no local path, which must then look like a hub
    id (a path-like name that does not exist is refused, not looked up)."""
    path = Path(name).expanduser()
    if not path.exists():
        try:
            local_or_hub_id(name)
        except MmcseError as exc:
            raise MmcseError(f"--model {exc}") from None
        return None
    try:
        local = Path(resolve_model_dir(str(path)))
    except MmcseError as exc:
        raise MmcseError(f"--model {exc}") from None
    if not is_model_dir(local):
        raise MmcseError(f"--model {name}: no {MODEL_CONFIG_FILE} inside (not an HF model folder)")
    check_positions(local / MODEL_CONFIG_FILE, name, max_seq_length)
    check_weights(local, name)
    return local


def check_positions(config_path: Path, name: str, max_seq_length: int | None) -> None:
    """The model's config is JSON and has room for ``--max-seq-length`` tokens."""
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise MmcseError(f"--model {name}: {config_path} is not valid JSON ({exc})") from None
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if not isinstance(limit, int) or max_seq_length is None:
        return
    if "roberta" in str(config.get("model_type", "")):
        limit -= 2  # RoBERTa's positions start after the padding index
    if max_seq_length > limit:
        raise MmcseError(
            f"--max-seq-length {max_seq_length} is more than {name} can encode "
            f"({limit} positions); use --max-seq-length {limit} or less"
        )


def check_weights(local: Path, name: str) -> None:
    if not any((local / f).is_file() for f in WEIGHT_FILES):
        raise MmcseError(f"--model {name}: no weights inside ({' or '.join(WEIGHT_FILES[:2])})")


def check_tokenizer(local: Path, name: str) -> None:
    """The tokenizer loads and has a vocabulary (transformers builds an empty one silently)."""

    try:
        tokenizer = load_tokenizer(str(local))
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MmcseError(f"--model {name}: its tokenizer cannot be loaded: {first}") from None
    words = set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens)
    if not words:
        raise MmcseError(
            f"--model {name}: its tokenizer has no vocabulary beyond its special tokens; are the "
            f"tokenizer files (tokenizer.json or vocab.txt) missing from {local}?"
        )


# ---- output --------------------------------------------------------------------------------


def check_output_dir(cfg: TrainConfig, *, resuming: bool = False) -> None:
    """A new or empty folder we can write, unless ``--overwrite`` or resuming (main rank only)."""
    from mmcse import distributed

    if distributed.env_rank() != 0:
        return  # rank 0 may already have started writing it
    check_output_path(Path(cfg.output_dir), overwrite=cfg.overwrite or resuming)


def check_output_path(out: Path, *, overwrite: bool = False) -> None:
    """``out`` can hold a new run: absent or empty (or ``overwrite``: the run then removes only
    what a run writes, :meth:`mmcse.rundir.RunDir.clear`), and writable."""
    if out.exists() and not out.is_dir():
        raise MmcseError(f"--output-dir {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        held = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise MmcseError(
            f"--output-dir {out} is not empty (holds {held}); choose another folder, pass "
            "--overwrite to replace its run, or --resume it"
        )
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise MmcseError(f"--output-dir {out}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise MmcseError(f"--output-dir {out}: {existing} is not writable (choose another folder)")


# ---- the data join -------------------------------------------------------------------------


def check_join(cfg: TrainConfig, method: Method):
    """Open the corpora and sets and match every role's ids, exactly as training will, without
    tokenising (and reading only the id columns of a corpus table the join needs); returns the
    (untokenised) :class:`~mmcse.training.data.TrainData`."""
    from mmcse.training.data import TrainData

    try:
        return TrainData(cfg, None, method)
    except MmcseError as exc:  # same class (e.g. CacheError), the hint appended
        exc.args = (f"{exc}{_join_hint(cfg, method)}",)
        raise


def auxiliary_sets(cfg: TrainConfig, method: Method) -> dict:
    """The sets the method's auxiliary task reads (VisualCSE's images), opened, by role."""
    from mmcse.cache import FeatureSet

    return {
        role: FeatureSet.open(cfg.features[role])
        for role in method.auxiliary_roles()
        if cfg.features.get(role)
    }


def input_fingerprints(data, auxiliary: dict) -> dict[str, dict[str, str]]:
    """Every corpus and set the run reads, as its checkpoints record them (run info, integrity
    record): the data's, and the auxiliary task's under ``feature:<role>``."""
    out = data.fingerprints()
    for role, fs in auxiliary.items():
        out[f"feature:{role}"] = {"fingerprint": fs.fingerprint}
    return out


def warn_random_teachers(role_sets: dict) -> None:
    """A prominent warning for every set whose teacher ran with random weights (its manifest's
    ``producer`` says ``weights: random``, as ``--weights random`` extraction records)."""
    for role, sets in role_sets.items():
        for fs in sets:
            producer = fs.manifest.producer
            if producer.get("weights") == "random":
                logger.warning(
                    "--feature %s=%s holds features of a teacher with RANDOM weights (%s; its "
                    "manifest's producer says weights=random): this run distils from noise and "
                    "reproduces no published number (fine for a smoke test only)",
                    role,
                    fs.path,
                    producer.get("teacher", "teacher not named"),
                )


def _join_hint(cfg: TrainConfig, method: Method) -> str:
    """The teachers_on hint, when the run would pass with DALR's released setting (its ids
    joined, and a term for every batch kind)."""
    from mmcse.training.data import TrainData

    if getattr(method, "teachers_on", None) != "all":
        return ""

    released = _released_teachers(cfg)
    if termless_kinds(cfg, released):  # e.g. dalr-paper: no term left for text batches
        return ""
    try:
        TrainData(cfg, None, released)
    except MmcseError:
        return ""
    return _teachers_hint(method)
