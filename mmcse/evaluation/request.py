"""What ``mmcse eval`` is asked, as one object (its flags are made from it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EvalRequest:
    """What ``mmcse eval`` is asked: the flags are made from these fields
    (:func:`mmcse.commands.flags.with_flags`) and the request travels as one object through
    :func:`evaluate_model` to every suite."""

    model: str = field(metadata={"help": "training run directory (uses run/best) or HF model dir"})
    tasks: str = field(
        default="sts",
        metadata={
            "help": "comma-separated: sts, transfer (or some of MR, CR, SUBJ, MPQA, "
            "SST2, TREC, MRPC), retrieval"
        },
    )
    data: str | None = field(
        default=None,
        metadata={
            "help": "SentEval folder (holds downstream/STS); unset: the senteval folder of "
            "$MMCSE_SHARED_DATA, else of ../shared/data"
        },
    )
    out: str | None = field(default=None, metadata={"help": "write the results as JSON here"})
    mode: str = field(
        default="test",
        metadata={"choices": ("test", "dev"), "help": "STS: the 7 tasks, or STS-B/SICK-R dev"},
    )
    pooler: str | None = field(
        default=None,
        metadata={
            "help": "cls | cls_before_pooler | avg (= mean) | max | avg_first_last | "
            "avg_top2 | auto (None: the run's, else the student's own 1_Pooling "
            "config, else cls_before_pooler)"
        },
    )
    batch_size: int = field(default=128, metadata={"help": "sentences per forward pass"})
    precision: str = field(
        default="fp32",
        metadata={
            "choices": ("fp32", "auto", "bf16", "fp16"),
            "help": "fp32 (the released evaluations) or autocast on CUDA (auto/bf16: bf16)",
        },
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu, cuda, cuda:1, ... (None: cuda if any)"}
    )
    align_uniform: bool = field(
        default=False, metadata={"help": "STS: also alignment and uniformity"}
    )
    transfer_mode: str = field(
        default="test",
        metadata={"choices": ("test", "fasttest"), "help": "the papers' 10-fold Adam, or fast"},
    )
    images_features: str | None = field(
        default=None, metadata={"help": "retrieval: held-out images' feature set (by id)"}
    )
    captions: str | None = field(
        default=None, metadata={"help": "retrieval: their caption corpus (--caption-policy all)"}
    )
    head: str | None = field(
        default=None, metadata={"help": "retrieval: which loss term's heads (None: the first)"}
    )
