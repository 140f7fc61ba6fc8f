"""Training configuration: one dataclass, filled from defaults < ``--config`` file < CLI flags.

The resolved config is saved in the run directory, so a run can be repeated from it alone.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmcse.errors import MmcseError

MIXINGS = ("interleave", "proportional-random", "caption-only", "text-only")
PRECISIONS = ("auto", "bf16", "fp32")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


@dataclass
class TrainConfig:
    """Everything a Stage-2 run needs. Defaults follow SimCSE/MCSE (BERT, Table 3)."""

    model: str = "bert-base-uncased"  # local HF dir or hub id
    method: str = "simcse"
    method_args: dict[str, Any] = field(default_factory=dict)
    text_corpus: str | None = None  # corpus table dir, or a .txt with one sentence per line
    caption_corpus: str | None = None  # corpus table dir with image_id per caption
    features: dict[str, str] = field(default_factory=dict)  # role -> feature set dir
    expect_fingerprints: dict[str, str] = field(default_factory=dict)  # role -> fingerprint
    mixing: str = "interleave"
    output_dir: str = "runs/latest"
    batch_size: int = 64  # per process; under torchrun the global batch is this × world size
    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    epochs: int = 1
    max_steps: int = 0  # > 0 stops early (and sets the schedule length)
    max_seq_length: int = 32
    warmup_steps: int = 0
    grad_clip: float = 1.0
    seed: int = 42
    eval_steps: int = 125
    eval_data: str | None = None  # SentEval-layout dir; None = ../shared/data/senteval if present
    final_eval: bool = True
    pooler: str = "cls_before_pooler"
    dropout: float = 0.1
    device: str = "auto"
    precision: str = "auto"
    attn_implementation: str = "sdpa"  # encoder attention: sdpa (fused kernel) | eager (HF's)
    compile_encoder: bool = False  # torch.compile the encoder (slow first steps)
    fused_adamw: bool = True  # AdamW's fused kernel on CUDA (same update; ignored on CPU)
    tf32: bool = False  # TF32 matmuls in fp32 runs on CUDA (faster, ~1e-3 relative error)
    dynamic_padding: bool = True  # pad a batch to its longest sentence, not max_seq_length
    log_every: int = 10

    def __post_init__(self) -> None:
        if self.mixing not in MIXINGS:
            raise MmcseError(f"--mixing must be one of {', '.join(MIXINGS)}, not {self.mixing!r}")
        if self.precision not in PRECISIONS:
            raise MmcseError(f"--precision must be one of {', '.join(PRECISIONS)}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise MmcseError(
                f"--attn-implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, "
                f"not {self.attn_implementation!r}"
            )
        if self.batch_size < 2:
            raise MmcseError("--batch-size must be at least 2 (in-batch negatives)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A JSON or TOML file of TrainConfig fields (a ``[train]`` TOML table is also accepted)."""
    p = Path(path)
    if not p.is_file():
        raise MmcseError(f"config file {p} does not exist")
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise MmcseError(f"config file {p} is not valid {p.suffix[1:] or 'JSON'}: {exc}") from None
    return data.get("train", data)


def resolve_config(file: str | Path | None = None, **overrides: Any) -> TrainConfig:
    """Defaults < config file < overrides (``None`` overrides mean 'not given')."""
    values = read_config_file(file) if file else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise MmcseError(f"unknown training setting(s): {', '.join(unknown)}")
    return TrainConfig(**values)


def parse_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}`` with a clear error for malformed items."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MmcseError(f"{what} expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_value(text: str) -> Any:
    """Method hyperparameters from the CLI: JSON literals when they parse, else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
