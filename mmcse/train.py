"""The Stage-2 training loop: one plain loop, readable in one sitting.

Per step: gather a batch from the pre-tokenised corpus and the memory-mapped feature cache, encode
it twice in one forward (the two dropout views), let every active term of the method compute its
losses from the embeddings, step AdamW on the weighted sum. Every ``eval_steps`` the student is
scored on STS-B dev and the best checkpoint kept; at the end the best one is scored on the 7 STS
test sets. The same command runs under ``torchrun`` (DDP; in-batch negatives gathered across ranks).
"""

from __future__ import annotations

import json
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from mmcse import distributed as dist
from mmcse.config import TrainConfig
from mmcse.data import Batch, TrainData
from mmcse.errors import MmcseError
from mmcse.fastpath import apply_fast_paths, fused_adamw
from mmcse.losses.base import LossInputs
from mmcse.methods import Method, build_method
from mmcse.model import BEST_DIR, SentenceEncoder, load_tokenizer
from mmcse.registry import LOSSES


class Student(nn.Module):
    """The encoder plus the method's loss modules (their heads train with it)."""

    def __init__(self, encoder: SentenceEncoder, method: Method, feature_dims: dict[str, int]):
        super().__init__()
        self.encoder = encoder
        self.terms = method.active_terms()
        self.losses = nn.ModuleDict(
            {
                t.name: LOSSES.get(t.loss)(
                    hidden_size=encoder.hidden_size, feature_dims=feature_dims, **t.options
                )
                for t in self.terms
            }
        )
        self.needs_token_states = any(m.needs_token_states for m in self.losses.values())

    def forward(self, batch: Batch, extras: dict) -> dict[str, Tensor]:
        """Weighted total under ``"loss"`` plus every raw ``*_loss`` term of this batch."""
        n = batch.size
        out = self.encoder(
            input_ids=batch.input_ids.repeat(2, 1), attention_mask=batch.attention_mask.repeat(2, 1)
        )
        inputs = LossInputs(
            view1=out.sentence[:n],
            view2=out.sentence[n:],
            features=batch.features,
            batch_kind=batch.kind,
            token_states=(out.token_states[:n], out.token_states[n:])
            if self.needs_token_states
            else None,
            attention_mask=batch.attention_mask,
            extras=extras,
        )
        terms: dict[str, Tensor] = {}
        total = out.sentence.new_zeros(())
        for term in self.terms:
            if not term.applies_to(batch.kind):
                continue
            for key, value in self.losses[term.name](inputs).items():
                terms[key] = value
                total = total + term.weight * value
        return {"loss": total, **terms}


@dataclass
class RunResult:
    output_dir: Path
    best_dev: float | None
    best_step: int | None
    test: dict | None
    steps: int


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise MmcseError("--device cuda was asked for but no CUDA device is available")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast_for(device: torch.device, precision: str):
    """bf16 autocast on CUDA (unless fp32 is asked for), plain fp32 on CPU."""
    use_bf16 = device.type == "cuda" and precision in ("auto", "bf16")
    return torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else nullcontext()


def linear_schedule(optimizer, warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def resolve_eval_dir(cfg: TrainConfig) -> Path | None:
    """The SentEval dir for dev/test scoring; '' disables it, None finds the shared copy."""
    if cfg.eval_data == "":
        return None
    if cfg.eval_data:
        return Path(cfg.eval_data)
    from mmcse.evaluation.sts import default_data_dir

    return default_data_dir()


class Run:
    """State of one training run (kept small: the loop itself is :meth:`fit`)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        dist.init_from_env()
        self.device = pick_device(cfg.device)
        seed_everything(cfg.seed)
        self.method = build_method(cfg.method, **cfg.method_args)
        self.tokenizer = load_tokenizer(cfg.model)
        encoder = SentenceEncoder.from_pretrained(
            cfg.model, cfg.pooler, cfg.dropout, attn_implementation=cfg.attn_implementation
        )
        self.data = TrainData(cfg, self.tokenizer, self.method)
        dims = {role: int(fs.dim) for role, fs in self.data.feature_sets.items()}
        self.student = Student(encoder, self.method, dims).to(self.device)
        apply_fast_paths(cfg, encoder, self.device)
        self.model = self.student
        if dist.is_distributed():
            self.model = nn.parallel.DistributedDataParallel(
                self.student,
                find_unused_parameters=True,  # caption-only heads idle on text batches
            )
        self.aux = self.method.auxiliary_task(encoder, cfg, self.device)
        self.out = Path(cfg.output_dir)
        self.eval_dir = resolve_eval_dir(cfg)
        self.best_dev: float | None = None
        self.best_step: int | None = None

    @property
    def encoder(self) -> SentenceEncoder:
        return self.student.encoder

    def plan(self) -> tuple[int, int]:
        """(global batch, total optimizer steps)."""
        global_batch = self.cfg.batch_size * dist.world_size()
        per_epoch = sum(self.data.batches_per_epoch(global_batch).values())  # = len(schedule)
        total = per_epoch * self.cfg.epochs
        if self.cfg.max_steps > 0:
            total = min(total, self.cfg.max_steps)
        return global_batch, total

    def fit(self) -> RunResult:
        cfg = self.cfg
        global_batch, total = self.plan()
        if self.aux is not None:
            self.aux.total_steps = total  # the auxiliary task's own lr schedule spans the run
        optimizer = torch.optim.AdamW(
            self.student.parameters(),
            lr=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
            fused=fused_adamw(cfg, self.device),
        )
        scheduler = linear_schedule(optimizer, cfg.warmup_steps, total)
        self._prepare_output()
        bar = tqdm(
            total=total,
            desc=f"train {cfg.method}",
            unit="step",
            disable=not dist.is_main(),
            mininterval=0.2 if sys.stderr.isatty() else 30,  # logs get a line every 30 s
        )
        step, t0, log = 0, time.perf_counter(), self.out / "metrics.jsonl"
        for epoch in range(cfg.epochs):
            for kind, global_rows in self.data.schedule(epoch, global_batch):
                if step >= total:
                    break
                rows = global_rows[
                    dist.rank() * cfg.batch_size : (dist.rank() + 1) * cfg.batch_size
                ]
                record = self._step(kind, rows, optimizer, scheduler)
                step += 1
                record.update(step=step, epoch=epoch, kind=kind, lr=scheduler.get_last_lr()[0])
                if step % cfg.eval_steps == 0 or step == total:
                    record.update(self._evaluate(step))
                rate = step / (time.perf_counter() - t0)
                if dist.is_main() and (step % cfg.log_every == 0 or "stsb_dev" in record):
                    record["steps_per_s"] = rate
                    with log.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                bar.update(1)
                bar.set_postfix(
                    loss=f"{record['loss']:.4f}", dev=self._dev_text(), it_s=f"{rate:.2f}"
                )
        bar.close()
        return self._finish(step)

    def _step(self, kind: str, rows: np.ndarray, optimizer, scheduler) -> dict:
        record = self.aux.step() if self.aux is not None else {}  # Algorithm 1: aux, then text
        self.model.train()
        batch = self.data.batch(kind, rows, self.device)
        extras = self.method.batch_extras(self.data, batch)
        with autocast_for(self.device, self.cfg.precision):
            terms = self.model(batch, extras)
        if not torch.isfinite(terms["loss"]):
            raise MmcseError(f"loss became {terms['loss'].item()} at a {kind} batch; lower the lr")
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), self.cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        record.update({k: float(v.detach()) for k, v in terms.items()})
        return record

    def _dev_text(self) -> str:
        return "-" if self.best_dev is None else f"{self.best_dev:.2f}"

    def _prepare_output(self) -> None:
        if dist.is_main():
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "metrics.jsonl").write_text("")
            self.cfg.save(self.out / "config.json")

    def _evaluate(self, step: int) -> dict:
        """Score STS-B dev on rank 0; keep the best checkpoint. No eval data → keep the last."""
        score = None
        if dist.is_main():
            if self.eval_dir is not None:
                from mmcse.dev_eval import dev_score  # dev data prepared once per run

                score = dev_score(self.encoder, self.tokenizer, self.eval_dir)
            if score is None or self.best_dev is None or score > self.best_dev:
                self.best_dev, self.best_step = score, step
                self._save(BEST_DIR, step, score)
        if dist.is_distributed():
            torch.distributed.barrier()
        return {} if score is None else {"stsb_dev": score}

    def _save(self, name: str, step: int, dev: float | None) -> None:
        info = {
            "config": self.cfg.to_dict(),
            "method": self.method.to_dict(),
            "step": step,
            "stsb_dev": dev,
            "pooler": self.cfg.pooler,
            "fingerprints": self.data.fingerprints(),
        }
        heads = nn.ModuleDict({"losses": self.student.losses})
        if self.aux is not None:  # e.g. VisualCSE's patch embedding and image head
            heads["aux"] = self.aux.heads
            info["fingerprints"].update(
                {f"feature:{k}": {"fingerprint": v} for k, v in self.aux.fingerprint.items()}
            )
        self.encoder.save_checkpoint(self.out / name, self.tokenizer, heads, info)

    def _finish(self, steps: int) -> RunResult:
        test = None
        if dist.is_main() and self.cfg.final_eval and self.eval_dir is not None:
            from mmcse.evaluation import evaluate_sts, format_rows, write_report

            best = str(self.out / BEST_DIR)
            test = evaluate_sts(best, data_dir=self.eval_dir, device=str(self.device))
            write_report(test, self.out / "results.json")
            label = f"{self.cfg.method} (best step {self.best_step}, dev {self._dev_text()})"
            tqdm.write(format_rows({label: test}))
        return RunResult(self.out, self.best_dev, self.best_step, test, steps)


def train(cfg: TrainConfig) -> RunResult:
    return Run(cfg).fit()
