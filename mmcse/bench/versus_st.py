"""mmcse's SimCSE training step against sentence-transformers' Trainer, side by side in one process.

Both sides train the same random student (the bench world's model dir) on the same caption texts
at the same batch and length, in the same precision:

* **mmcse**: the real trainer's SimCSE step as :class:`mmcse.bench.train_step.BenchState` drives
  it (its data prefetch, both dropout views in one forward, the [CLS] MLP head, InfoNCE τ = 0.05,
  clipping, AdamW; on CUDA the whole update captured);
* **sentence-transformers**: ``SentenceTransformer(Transformer(model dir), Pooling(cls))`` trained by
  ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss(scale=20)`` on (s, s) pairs:
  with dropout on, that is unsupervised SimCSE (scale = 1/τ), as its documentation says.

Each rate is measured the same way: warm-up steps run and dropped (the compile, the allocator,
the Trainer's start-up), then the wall time of the timed steps between two device
synchronisations. The Trainer's rate is read inside its run by a :class:`StepClock` callback.
The ratio is derived from the two measured rates and named so.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import statistics
import tempfile
import time
from pathlib import Path

import torch

from mmcse.bench.timing import synchronize, timed
from mmcse.errors import BadValueError

logger = logging.getLogger(__name__)

ST_MISSING = "sentence-transformers is not installed (pip install sentence-transformers)"
TRAINER_MISSING = (
    "sentence-transformers' Trainer needs datasets and accelerate "
    "(pip install 'sentence-transformers[train]')"
)
SCALE = 20.0  # MultipleNegativesRankingLoss' scale = 1/τ with SimCSE's τ = 0.05
#: the fewest warm-up steps of a captured step: compile, CUDA graph record, first replay
CAPTURED_WARMUP = 3


def unavailable() -> str | None:
    """Why sentence-transformers' Trainer cannot run here, or None when it can."""
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return ST_MISSING
    try:
        import accelerate  # noqa: F401
        import datasets  # noqa: F401
    except ImportError:
        return TRAINER_MISSING
    return None


@dataclasses.dataclass
class SideRate:
    """One side's measured rate: ``steps`` timed steps after ``warmup`` dropped ones."""

    steps_per_s: float
    seconds: float
    steps: int
    warmup: int
    mean_width: float  # the padded token width the encoder saw (measured, not assumed)


def bench_versus_st(
    world, batch: int, seq_len: int, device: str, steps: int, warmup: int, capture: str
) -> dict:
    """Steps/s of mmcse's SimCSE step and of sentence-transformers' Trainer on the bench world
    ``world`` (:func:`mmcse.demo.synthetic.synthetic_world`), their ratio (derived), and what
    is the same and what differs. ``capture``: the mmcse trainer's flag (``on`` | ``off``); a
    captured step warms up for at least :data:`CAPTURED_WARMUP` steps, and so does the other side."""
    if min(steps, warmup, batch, seq_len) < 1:
        raise BadValueError("versus sentence-transformers: steps, warm-up, batch and length ≥ 1")
    if capture != "off":
        warmup = max(warmup, CAPTURED_WARMUP)
    mmcse, run = mmcse_rate(world, batch, seq_len, device, steps, warmup, capture)
    texts = corpus_texts(run.cfg.caption_corpus)
    st, st_info = st_rate(
        Path(run.cfg.model),
        texts,
        batch,
        seq_len,
        device,
        steps,
        warmup,
        run.precision,
        run.cfg.learning_rate,
    )
    return {
        "mmcse_steps_per_s": mmcse.steps_per_s,
        "st_steps_per_s": st.steps_per_s,
        "ratio_mmcse_over_st_derived": mmcse.steps_per_s / st.steps_per_s,
        "batch": batch,
        "seq_len": seq_len,
        "precision": run.precision,
        "capture": run.capture,
        "mmcse": {**dataclasses.asdict(mmcse), "first_step_s": run.first_step_s},
        "sentence_transformers": {**dataclasses.asdict(st), **st_info},
        "versions": versions(),
        "settings": settings(run, st_info, len(texts)),
    }


@dataclasses.dataclass(frozen=True)
class MmcseRun:
    """What the mmcse side ran: its config and what the trainer resolved from it."""

    cfg: object  # mmcse.training.config.TrainConfig
    precision: str
    capture: str
    fused_adamw: bool
    first_step_s: float  # the first warm-up step (the compile, when captured)


def mmcse_rate(world, batch, seq_len, device, steps, warmup, capture) -> tuple[SideRate, MmcseRun]:
    """The trainer's SimCSE step (:class:`~mmcse.bench.train_step.BenchState`): its rate and
    what it ran (the settings the other side copies)."""
    from mmcse.bench.train_step import BenchState

    torch._dynamo.reset()  # a fresh Dynamo cache, as a new run has
    state = BenchState.of(
        world,
        "simcse",
        batch,
        seq_len,
        device,
        "auto",
        capture=capture,
        dynamic_padding=capture == "off",  # a captured step has one shape per batch kind
    )
    first_step_s = timed(state.step, device)  # the compile, when captured
    for _ in range(warmup - 1):
        state.step()
    state.reset()
    seconds = timed(functools.partial(run_steps, state, steps), device)
    trainer = state.trainer
    fused = trainer.cfg.fused_adamw and trainer.device.type == "cuda"
    run = MmcseRun(trainer.cfg, trainer.precision, trainer.capture, fused, first_step_s)
    rate = SideRate(steps / seconds, seconds, steps, warmup, statistics.fmean(state.widths))
    del state, trainer
    release(device)
    return rate, run


def run_steps(state, steps: int) -> None:
    for _ in range(steps):
        state.step()


def release(device: str) -> None:
    """Free the side just measured, so the next starts with the device's memory free."""
    torch._dynamo.reset()  # drops the compiled graphs (and their CUDA graph pools)
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def corpus_texts(corpus: str | Path) -> list[str]:
    """The texts of the corpus the mmcse side trains on, in its row order."""
    from mmcse.cache import Corpus

    return Corpus.open(corpus).texts


def pair_dataset(texts: list[str]):
    """(anchor, positive) = (s, s): the Trainer's unsupervised SimCSE data."""
    from datasets import Dataset

    return Dataset.from_dict({"anchor": list(texts), "positive": list(texts)})


def st_classes():
    """Transformer, Pooling, the loss, Trainer and its arguments, from their current homes
    (sentence-transformers ≥ 6) or the 3.x-5.x ``models``/``losses`` modules."""
    import sentence_transformers as st

    try:
        from sentence_transformers.sentence_transformer.losses import (
            MultipleNegativesRankingLoss,
        )
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from sentence_transformers.models import Pooling, Transformer
    return (
        st.SentenceTransformer,
        Transformer,
        Pooling,
        MultipleNegativesRankingLoss,
        st.SentenceTransformerTrainer,
        st.SentenceTransformerTrainingArguments,
    )


def st_model(model_dir: Path, seq_len: int, device: str):
    """``SentenceTransformer(Transformer(model_dir), Pooling(cls))``: the same student, [CLS]."""
    model_cls, transformer_cls, pooling_cls, *_ = st_classes()
    transformer = transformer_cls(str(model_dir), max_seq_length=seq_len)
    dim = transformer.auto_model.config.hidden_size
    return model_cls(modules=[transformer, pooling_cls(dim, pooling_mode="cls")], device=device)


def step_clock_class():
    """:class:`StepClock`, built on transformers' ``TrainerCallback`` when first asked for (the
    module imports without transformers' Trainer stack)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """The wall time between the end of step ``start`` and the end of step ``end``, the
        device synchronised at both: the Trainer's start-up and warm-up left out."""

        def __init__(self, start: int, end: int, device: str) -> None:
            self.start, self.end, self.device = start, end, device
            self.times: dict[int, float] = {}

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (self.start, self.end):
                synchronize(self.device)
                self.times[state.global_step] = time.perf_counter()

        @property
        def seconds(self) -> float:
            return self.times[self.end] - self.times[self.start]

    return StepClock


def st_rate(
    model_dir: Path,
    texts: list[str],
    batch: int,
    seq_len: int,
    device: str,
    steps: int,
    warmup: int,
    precision: str,
    learning_rate: float,
) -> tuple[SideRate, dict]:
    """sentence-transformers' Trainer: its rate over ``steps`` steps after ``warmup``, and what
    it ran (optimizer, forwards per step, attention). ``precision``: the mmcse side's, as
    :func:`mmcse.precision.precision_name` names it (bf16/fp16 autocast on CUDA, else fp32)."""
    from transformers import PrinterCallback

    *_, loss_cls, trainer_cls, args_cls = st_classes()
    model = st_model(model_dir, seq_len, device)
    widths: list[int] = []
    # the token embedding sees every encoder forward's ids (the encoder's own forward is called
    # as a method by sentence-transformers, so hooks on it would not fire)
    embedding = model[0].auto_model.get_input_embeddings()
    hook = embedding.register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    clock = step_clock_class()(warmup, warmup + steps, device)
    cuda = torch.device(device).type == "cuda"
    with tempfile.TemporaryDirectory(prefix="mmcse-bench-st-") as out:
        args = args_cls(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=warmup + steps,
            learning_rate=learning_rate,
            bf16=cuda and precision.startswith("bf16"),
            fp16=cuda and precision.startswith("fp16"),
            use_cpu=not cuda,
            save_strategy="no",
            eval_strategy="no",
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,  # mmcse gathers in the main process too
            dataloader_pin_memory=cuda,
        )
        trainer = trainer_cls(
            model=model,
            args=args,
            train_dataset=pair_dataset(texts),
            loss=loss_cls(model, scale=SCALE),
            callbacks=[clock],
        )
        trainer.remove_callback(PrinterCallback)  # it prints the run's summary dict to stdout
        trainer.train()
    hook.remove()
    timed_widths = widths[len(widths) * warmup // (warmup + steps) :]
    info = {
        "optimizer": getattr(args.optim, "value", str(args.optim)),
        "max_grad_norm": args.max_grad_norm,
        "lr_scheduler": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "bf16": args.bf16,
        "fp16": args.fp16,
        "attention": model[0].auto_model.config._attn_implementation,
        "encoder_forwards_per_step": len(widths) / (warmup + steps),
        "rows": len(texts),
    }
    del trainer, model
    release(device)
    rate = SideRate(
        steps / clock.seconds, clock.seconds, steps, warmup, statistics.fmean(timed_widths)
    )
    return rate, info


def versions() -> dict:
    import sentence_transformers
    import transformers

    return {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def settings(run: MmcseRun, st_info: dict, rows: int) -> dict:
    """What the two sides share and where they differ, in one short dict."""
    cfg = run.cfg
    return {
        "same": f"student {Path(cfg.model).name} (random init, one dir), {rows} caption texts, "
        f"batch {cfg.batch_size}, max length {cfg.max_seq_length}, {run.precision}, "
        f"dropout {cfg.dropout}, peak lr {cfg.learning_rate}, in-batch negatives at "
        f"1/τ = {SCALE:g}",
        "mmcse": f"SimCSE InfoNCE over a [CLS] MLP head, both views in one forward, AdamW eps "
        f"{cfg.adam_eps}{' fused' if run.fused_adamw else ''}, clip {cfg.grad_clip}, attention "
        f"{cfg.attn_implementation}, capture {run.capture}, batches gathered ahead from the "
        "token cache",
        "sentence_transformers": f"MultipleNegativesRankingLoss (scale {SCALE:g}) over [CLS], "
        f"{st_info['encoder_forwards_per_step']:g} encoder forwards per step, "
        f"{st_info['optimizer']}, clip {st_info['max_grad_norm']}, attention "
        f"{st_info['attention']}, texts tokenised per batch in its collator",
        "timing": "each side: timed steps after its warm-up steps, device synchronised at both "
        "ends; sentence-transformers' inside its run (a TrainerCallback)",
    }
