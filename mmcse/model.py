"""The student: any Hugging Face encoder (BERT, RoBERTa, MiniLM, ...) behind one class.

Loading takes a local directory or a hub id; with ``HF_HUB_OFFLINE=1`` (or no network) only local
directories and already-cached ids resolve. A training checkpoint is an ordinary HF model
directory (``save_pretrained`` of the backbone + tokenizer, safetensors) plus
``mmcse_heads.safetensors`` (the loss heads, training-only) and ``mmcse_run.json`` (resolved
config and the fingerprints of every feature set it trained on), so any HF tool can load it
(the layout: :mod:`mmcse.rundir`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from mmcse.errors import MmcseError
from mmcse.hub import local_or_hub_id, quiet_transformers
from mmcse.packing import VARLEN, PackedTokens, packed_forward, register_varlen
from mmcse.pooling import (
    AUTO,
    DEFAULT_POOLER,
    ST_MODULES_FILE,
    StModule,
    check_pooler,
    needs_hidden_states,
    pool,
    st_encoding,
    st_settings,
    student_pooling,
)
from mmcse.rundir import Checkpoint
from mmcse.students import (
    Architecture,
    StudentChoice,
    architecture,
    choose_attention,
    choose_student,
    student_config,
    unregistered,
)


@dataclass
class EncoderOutput:
    sentence: Tensor  # [B, H] pooled sentence embedding
    token_states: Tensor  # [B, L, H] last layer


class SentenceEncoder(nn.Module):
    """Wraps an HF ``AutoModel``; ``forward`` returns pooled sentences and last-layer states."""

    def __init__(
        self,
        backbone: nn.Module,
        pooler: str = "cls_before_pooler",
        post_pooling: nn.Module | None = None,
    ) -> None:
        """``post_pooling``: sentence-transformers modules after pooling (Dense, Normalize) that
        evaluation applies to a model shipping them (:func:`mmcse.model.resolve_encoding`);
        training never sets it."""
        super().__init__()
        self.backbone = backbone
        self.pooler = pooler
        self.post_pooling = post_pooling
        self.max_length: int | None = None  # a sentence-transformers max_seq_length (evaluation)

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: str,
        pooler: str | None = "cls_before_pooler",
        dropout: float | None = None,
        attn_implementation: str | None = None,
    ) -> SentenceEncoder:
        """``attn_implementation``: ``"auto"`` (sdpa where the student's architecture has it,
        else eager: :mod:`mmcse.students`), ``"sdpa"`` (PyTorch's fused attention kernels; the
        same function as ``"eager"``, HF's reference matmul–softmax–matmul),
        ``"flex_attention"``, ``"varlen"`` (packed batches only, CUDA: :mod:`mmcse.packing`),
        ``None`` = HF default; one the architecture lacks is refused in one line.
        ``dropout``: set on the architecture's own dropout fields (the registry's)."""
        from transformers import AutoConfig, AutoModel

        quiet_transformers()
        source = local_or_hub_id(path_or_id)  # a local path's typo is not sent to the hub
        if pooler in (None, "auto"):  # the run's / the student's own pooling
            pooler = resolve_pooler(None, source)[0]
        config = AutoConfig.from_pretrained(source)
        entry = student_architecture(config.to_dict())
        if dropout is not None:  # SimCSE's augmentation is the encoder's own dropout
            for key in entry.dropout_fields:
                setattr(config, key, dropout)
        kwargs = {}
        if attn_implementation:  # checked here too: transformers' own check is a traceback
            attention = choose_attention(entry, attn_implementation)[0]
            if attention == VARLEN:
                register_varlen()
            kwargs["attn_implementation"] = attention
        return cls(AutoModel.from_pretrained(source, config=config, **kwargs), pooler)

    @property
    def architecture(self) -> Architecture:
        """The student's registry entry (:mod:`mmcse.students`)."""
        return student_architecture(self.backbone.config.to_dict())

    @property
    def packs(self) -> bool:
        """Whether a packed batch encodes as a padded one for this student and its attention
        (evaluation pads otherwise)."""
        return backbone_packs(self.backbone)

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        packed: PackedTokens | None = None,
        **kwargs,
    ) -> EncoderOutput:
        """``packed``: the batch's sentences packed into rows (:mod:`mmcse.packing`; then
        ``input_ids``/``attention_mask`` are not read); the outputs are in the padded layout
        either way (``token_states`` ``[sentences, L, H]``)."""
        if packed is not None:
            out = packed_forward(
                self.backbone, packed, self.pooler, needs_hidden_states(self.pooler)
            )
            return self._pooled(out, packed.mask)
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_hidden_states=needs_hidden_states(self.pooler),
            return_dict=True,
            **kwargs,
        )
        if attention_mask is None:
            attention_mask = torch.ones(
                out.last_hidden_state.shape[:2], device=out.last_hidden_state.device
            )
        return self._pooled(out, attention_mask)

    def _pooled(self, out, attention_mask: Tensor) -> EncoderOutput:
        sentence = pool(out, attention_mask, self.pooler)
        if self.post_pooling is not None:
            sentence = self.post_pooling(sentence)
        return EncoderOutput(sentence, out.last_hidden_state)

    def save_checkpoint(
        self,
        out_dir: str | Path,
        tokenizer,
        heads: dict[str, Tensor],
        run_info: dict,
        weights: dict[str, Tensor] | None = None,
    ) -> None:
        """Write an HF model dir + training heads + run info (:class:`mmcse.rundir.Checkpoint`;
        the trainer writes it into a temp dir renamed into place). ``heads``: the training
        heads' state dict; ``weights``: the backbone's, as snapshotted (default: its own now)."""
        from safetensors.torch import save_file

        checkpoint = Checkpoint(out_dir)
        checkpoint.path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(checkpoint.path, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(checkpoint.path)
        # cloned: safetensors refuses tensors that share storage (a module saved under two names)
        state = {k: v.detach().cpu().contiguous().clone() for k, v in heads.items()}
        save_file(state, str(checkpoint.heads))
        checkpoint.write_info(run_info)


def transformers_attention(model_type: str) -> tuple[str, ...]:
    """The attention implementations transformers' model class of ``model_type`` declares
    (``varlen`` runs through its attention interface), sdpa first."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    try:
        model_class = MODEL_MAPPING[CONFIG_MAPPING[model_type]]
    except (KeyError, ValueError):
        return ("eager",)
    declared = {
        "sdpa": getattr(model_class, "_supports_sdpa", False),
        "eager": True,
        "flex_attention": getattr(model_class, "_supports_flex_attn", False),
        "varlen": getattr(model_class, "_supports_attention_backend", False),
    }
    return tuple(name for name, has in declared.items() if has)


def student_architecture(config: dict) -> Architecture:
    """The registry's entry for a student's config (a dict), else an unregistered one with the
    attention transformers has for its ``model_type``."""
    model_type = str(config.get("model_type") or "unknown")
    entry = architecture(model_type)
    if entry is not None:
        return entry
    return unregistered(model_type, transformers_attention(model_type), config)


def backbone_packs(backbone: nn.Module) -> bool:
    """Whether packing is proven for an HF backbone's architecture and attention."""
    config = backbone.config
    return student_architecture(config.to_dict()).packs_with(config._attn_implementation)


def check_student(
    model: str, attention: str, packing: bool, dropout: float
) -> StudentChoice | None:
    """The run's attention, packing and dropout checked against ``--model``'s architecture
    before it loads (:func:`mmcse.students.choose_student`; one ``error:`` line when refused);
    None for a hub id not downloaded yet, or a config without a ``model_type`` (its load
    checks the attention, or reports the config)."""
    config = student_config(model)
    if not isinstance(config.get("model_type"), str):
        return None
    return choose_student(student_architecture(config), config, attention, packing, dropout)


# ---- which pooling a model directory is encoded with ------------------------------------------


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
