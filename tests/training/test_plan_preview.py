"""The plan before a run: `--dry-run` prints the batches of each kind, and preflight warns when a
multimodal method would barely see captions or a corpus is smaller than one batch."""

from __future__ import annotations

import random

import pytest
from support.cli import run_main_output
from support.worlds import sentences

from mmcse.training.plan import total_steps


def dry_run(tiny_model, tiny_world, tmp_path, monkeypatch, capsys, *extra: str):
    args = [
        "train", "--model", str(tiny_model), "--method", "mcse",
        "--text-corpus", tiny_world["text"], "--caption-corpus", tiny_world["captions"],
        "--feature", f"image={tiny_world['image']}", "--batch-size", "8",
        "--eval-data", "", "--no-final-eval", "--device", "cpu",
        "--output-dir", str(tmp_path / "run"), "--dry-run", *extra,
    ]  # fmt: skip
    code, out, err = run_main_output(args, monkeypatch, capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    return out, warnings


def test_dry_run_shows_the_batches_of_each_kind(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    out, warnings = dry_run(tiny_model, tiny_world, tmp_path, monkeypatch, capsys)
    # 96 text and 64 caption sentences in batches of 8, interleaved, one epoch
    assert "per epoch: 12 text, 8 caption batches of 8 x 1 epoch(s) -> 20 steps" in out
    assert "this run: 12 text + 8 caption batches in 20 steps" in out
    assert not warnings


def test_a_multimodal_run_with_few_caption_batches_is_warned(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(sentences(1600, seed=3)) + "\n")  # 200 text batches, 8 caption
    out, warnings = dry_run(
        tiny_model, tiny_world, tmp_path, monkeypatch, capsys, "--text-corpus", str(text)
    )
    assert "this run: 200 text + 8 caption batches in 208 steps" in out
    (warning,) = warnings
    assert "mcse will train 8 caption batches in 208 steps (3.8 %, under 5%)" in warning


def test_a_batch_larger_than_the_corpus_is_said_as_what_it_trains(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """Not refused (the released loaders keep a partial batch, so a small caption set is one
    batch), but the plan and a warning say the batch really trained."""
    out, warnings = dry_run(
        tiny_model, tiny_world, tmp_path, monkeypatch, capsys, "--batch-size", "100000"
    )
    said = [
        f"the {kind} corpus has {n} sentences, fewer than a batch of 100000: each pass trains "
        f"it as one batch of {n} ({n - 1} in-batch negatives, not 99999)"
        for kind, n in (("text", 96), ("caption", 64))
    ]
    assert all(f"note: {line}" in out for line in said)
    assert warnings == [f"warning: {line}" for line in said]
    # the plan's batch line names the batch trained, never 100000 alone (issue 32)
    assert "batches of 96, 64 (the whole text and caption corpus; the batch size asked, " in out


def test_the_plan_printed_by_a_run_says_the_true_batch():
    from mmcse.training.metrics import describe_plan

    plan = {
        "method": "simcse", "device": "cpu", "precision": "fp32", "world_size": 1,
        "sentences": {"text": 12}, "mixing": "text-only", "global_batch": 100000,
        "batches_per_epoch": {"text": 1}, "steps_per_epoch": 1, "epochs": 1, "max_steps": 0,
        "total_steps": 1, "eval_data": None, "eval_steps": 125, "evals": 0,
        "final_eval": False, "save_every": 125,
    }  # fmt: skip
    text = describe_plan(plan)
    assert "1 text batches of 12 (the whole text corpus; the batch size asked, 100000, is" in text
    mixed = {**plan, "sentences": {"text": 200000, "caption": 12}, "global_batch": 64}
    assert "batches of 64 (caption: 12, its whole corpus)" in describe_plan(mixed)


def test_the_published_mcse_mix_is_not_warned_a_barely_multimodal_one_is():
    from mmcse.methods import build_method
    from mmcse.training.plan import plan_warnings

    mcse, simcse = build_method("mcse"), build_method("simcse")
    published = {  # Wiki1M + Flickr30k (random-one), batch 64, one epoch of train_mix.py
        "sentences": {"text": 1_000_000, "caption": 29_000},
        "global_batch": 64,
        "batches_in_run": {"text": 15_605, "caption": 473},
    }
    assert plan_warnings(published, mcse) == []
    barely = {**published, "batches_in_run": {"text": 23, "caption": 1}}  # the run
    (warning,) = plan_warnings(barely, mcse)
    assert "1 caption batches in 24 steps (4.2 %" in warning
    assert plan_warnings(barely, simcse) == []  # no caption-only term: nothing is missed


@pytest.mark.parametrize(
    ("epochs", "max_steps", "want"),
    [(1, 0, 20), (3, 0, 60), (3, 25, 25), (1, 50, 20)],  # 12 + 8 batches an epoch
)
def test_a_runs_steps_are_every_epochs_batches_cut_at_max_steps(epochs, max_steps, want):
    """The one count of the loop's plan and of ``--dry-run``'s preview."""
    assert total_steps({"text": 12, "caption": 8}, epochs, max_steps) == want


def test_the_trainer_keeps_preflights_plan(tiny_model, tiny_world, tmp_path, monkeypatch):
    """The plan is computed once, by preflight; the trainer keeps that object, and tokenising
    the corpora changes none of its counts."""
    from support.runs import tiny_mcse_settings

    from mmcse.training import loop
    from mmcse.training.config import TrainConfig
    from mmcse.training.plan import plan_run

    checked = []
    real_preflight = loop.preflight

    def kept_preflight(*args, **kwargs):
        checked.append(real_preflight(*args, **kwargs))
        return checked[-1]

    monkeypatch.setattr(loop, "preflight", kept_preflight)
    settings = tiny_mcse_settings(tiny_model, tiny_world, tmp_path)
    trainer = loop.Trainer(TrainConfig(**settings)).setup()
    (preflight,) = checked
    assert trainer.run_plan is preflight.run_plan
    assert trainer.run_plan == plan_run(trainer.data)  # the tokenised data plan the same
    assert (trainer.global_batch, trainer.total) == (8, trainer.run_plan.total_steps)
    assert preflight.preview["total_steps"] == trainer.total


def test_the_plan_names_the_dev_split_its_folder_names(tmp_path):
    """STS-B dev unless the --eval-data folder says what sits in its place (the demo's held-out
    scene pairs: issue 41)."""
    from mmcse.demo.world import DEV_NAME, write_tasks
    from mmcse.evaluation.sts import STSB_DEV, dev_set_name
    from mmcse.training.metrics import describe_plan

    plan = {
        "method": "simcse", "device": "cpu", "precision": "fp32", "world_size": 1,
        "sentences": {"text": 12}, "mixing": "text-only", "global_batch": 4,
        "batches_per_epoch": {"text": 3}, "steps_per_epoch": 3, "epochs": 1, "max_steps": 0,
        "total_steps": 3, "eval_steps": 1, "evals": 3, "final_eval": False, "save_every": 1,
    }  # fmt: skip
    senteval = tmp_path / "senteval"
    senteval.mkdir()
    assert dev_set_name(senteval) == dev_set_name(None) == STSB_DEV
    assert f"{STSB_DEV} every 1 steps" in describe_plan({**plan, "eval_data": str(senteval)})
    write_tasks(tmp_path, random.Random(0), pairs_per_task=3)  # the demo's world
    assert dev_set_name(senteval) == DEV_NAME
    shown = describe_plan({**plan, "eval_data": str(senteval)})
    assert f"{DEV_NAME} every 1 steps" in shown and STSB_DEV not in shown
