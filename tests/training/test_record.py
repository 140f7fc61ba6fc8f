"""RunRecord alone: what it writes (last/'s trainer state, best/, the plan record, run info),
what resuming returns and restores, the extension check and the interruption messages — built
from a tiny encoder and small stand-ins for the updates and the data, without a trainer."""

from __future__ import annotations

import dataclasses
import json
import logging
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from mmcse.errors import MmcseError
from mmcse.hub import load_tokenizer
from mmcse.model import SentenceEncoder
from mmcse.rundir import RunDir
from mmcse.training import checkpoint as ckpt
from mmcse.training.config import TrainConfig
from mmcse.training.metrics import LossWindow
from mmcse.training.plan import RunPlan
from mmcse.training.record import RunRecord
from mmcse.training.resolved import ResolvedRun
from mmcse.training.run_state import RunState

#: trainer_state.pt's keys, in the order runs before issue 30 wrote them (old last/ dirs resume),
#: and eval_pending (issue 41; a last/ without it resumes as evaluated)
TRAINER_STATE_KEYS = [
    *("step", "epoch", "next_index", "optimizer", "scheduler", "grad_scaler"),
    *("rng", "window", "best_dev", "best_step", "aux", "eval_pending"),
]
#: plan.json's keys as the trainer wrote them before issue 30 (reports and tests read them), then
#: issue 41's batch sizes as trained and packing
PLAN_KEYS = [
    *("method", "device", "precision", "world_size", "sentences", "mixing", "global_batch"),
    *("batches_per_epoch", "steps_per_epoch", "epochs", "max_steps", "total_steps"),
    *("eval_data", "eval_steps", "evals", "final_eval", "save_every", "resumed_from_step"),
    *("capture", "student", "extended_from", "checkpoint_bytes", "keep_last_checkpoint"),
    "left_out",
    *("mixing_rule", "batches_in_run", "batch_sizes", "packing"),
]
#: run info's keys
INFO_KEYS = [
    *("config", "method", "step", "total_steps", "finished", "stsb_dev", "pooler"),
    *("pooler_source", "fingerprints", "term_heads", "teachers", "environment"),
]


class FakeUpdates:
    """The updates as the record sees them (issue 30's contract 2), with a state of its own."""

    def __init__(self, moment: float) -> None:
        self.moment = moment
        self.loaded: dict | None = None
        self.extended_to: int | None = None

    def state_dict(self) -> dict:
        return {
            "optimizer": {"state": {0: {"exp_avg": torch.full((2,), self.moment)}}},
            "scheduler": {"last_epoch": 4},
            "grad_scaler": {},
            "aux": {"steps_taken": 4},
        }

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state
        self.moment = float(state["optimizer"]["state"][0]["exp_avg"][0])

    def extend_schedule(self, total: int) -> float:
        self.extended_to = total
        return 1.25e-5


class FakeData:
    """Three text batches an epoch, with fingerprints and teachers to record."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.sources = {"text": list(range(12))}

    def batches_per_pass(self, global_batch: int) -> dict[str, int]:
        return {"text": 12 // global_batch}

    def batch_order(self, epoch: int, global_batch: int) -> list:
        return [("text", [epoch, i]) for i in range(12 // global_batch)]

    def fingerprints(self) -> dict:
        return {"text": {"fingerprint": "f00d"}}

    def teachers(self) -> dict:
        return {"feature:image": {"teacher": "clip-vit-b32"}}


@pytest.fixture(scope="module")
def student_parts(tiny_model):
    encoder = SentenceEncoder.from_pretrained(str(tiny_model), "cls")
    return encoder, load_tokenizer(str(tiny_model))


def make_record(
    student_parts,
    tiny_model,
    out,
    *,
    resuming=False,
    max_steps=6,
    moment=0.5,
    head_value=1.0,
    **settings,
):
    encoder, tokenizer = student_parts
    cfg = TrainConfig(
        method="simcse",
        model=str(tiny_model),
        output_dir=str(out),
        eval_data="",
        pooler="cls",
        epochs=2,
        max_steps=max_steps,
        eval_steps=2,
        **settings,
    )
    heads = nn.ModuleDict({"mlp": nn.Linear(2, 2)})
    nn.init.constant_(heads["mlp"].weight, head_value)
    student = SimpleNamespace(
        encoder=encoder,
        heads=heads,
        term_heads={"simcse": ["mlp"]},
        trained_modules=lambda: [encoder.backbone],
    )
    plan = RunPlan(global_batch=4, batches_per_epoch={"text": 3}, total_steps=min(max_steps, 6))
    return RunRecord(
        cfg,
        plan,
        ResolvedRun(pooler_source="given", capture="off", precision="fp32"),
        resuming=resuming,
        device=torch.device("cpu"),
        method=SimpleNamespace(to_dict=lambda: {"name": "simcse"}),
        student=student,
        tokenizer=tokenizer,
        aux=None,
        data=FakeData(cfg),
        auxiliary_sets={},
        updates=FakeUpdates(moment),
        window=LossWindow(),
    )


def add_steps(window: LossWindow, steps: list[int]) -> None:
    for step in steps:
        window.add_step(step, "text", [(("loss", "simcse"), torch.tensor([0.5 * step, 1.0]))])


def test_run_state_keeps_the_best_score():
    state = RunState(step=1, epoch=1, next_index=3)
    assert state.improves(60.0)  # the first evaluation keeps its step
    state.keep_best(60.0)
    assert (state.best_dev, state.best_step) == (60.0, 1)
    state.step += 1
    assert not state.improves(59.0) and not state.improves(60.0) and state.improves(60.5)
    assert state.improves(None)  # no dev data: every evaluation keeps the last step


def test_save_last_writes_the_run_state_and_what_it_was_given(student_parts, tiny_model, tmp_path):
    record = make_record(student_parts, tiny_model, tmp_path / "run")
    assert record.restore(None) == RunState()  # a new run starts at step 0
    add_steps(record.window, [3, 4])
    state = RunState(step=4, epoch=1, next_index=2, best_dev=71.5, best_step=3)
    record.save_last(state)
    record.writer.wait()

    last = RunDir(tmp_path / "run").last
    saved = torch.load(last.trainer_state, weights_only=False)
    assert list(saved) == TRAINER_STATE_KEYS
    assert (saved["step"], saved["epoch"], saved["next_index"]) == (4, 1, 2)
    assert (saved["best_dev"], saved["best_step"]) == (71.5, 3)
    assert torch.equal(saved["optimizer"]["state"][0]["exp_avg"], torch.full((2,), 0.5))
    assert saved["scheduler"] == {"last_epoch": 4} and saved["aux"] == {"steps_taken": 4}
    assert saved["window"]["steps"] == [(3, "text"), (4, "text")]
    assert torch.equal(saved["window"]["sums"]["loss"], torch.tensor(3.5))
    info = last.read_info()
    assert list(info) == INFO_KEYS
    assert (info["step"], info["stsb_dev"], info["total_steps"]) == (4, 71.5, 6)
    assert ckpt.read_integrity(RunDir(tmp_path / "run"))["step"] == 4
    weights = load_file(str(last.path / "model.safetensors"))
    live = student_parts[0].backbone.state_dict()
    assert weights.keys() and all(torch.equal(weights[k], live[k]) for k in weights)
    assert torch.equal(load_file(str(last.heads))["heads.mlp.weight"], torch.ones(2, 2))


def test_restore_returns_the_saved_state_and_loads_the_objects_it_was_given(
    student_parts, tiny_model, tmp_path
):
    first = make_record(student_parts, tiny_model, tmp_path / "run", moment=0.5, head_value=1.0)
    first.restore(None)
    add_steps(first.window, [4])
    state = RunState(step=4, epoch=1, next_index=2, best_dev=71.5, best_step=3)
    first.save_last(state)
    first.writer.wait()
    after_save = torch.rand(3)  # the random stream a resumed run continues with

    second = make_record(
        student_parts, tiny_model, tmp_path / "run", resuming=True, moment=0.0, head_value=0.0
    )
    restored = second.restore(ckpt.load_trainer_state(tmp_path / "run"))
    assert restored == state and restored is not state
    assert second.resumed_from == 4 and second.extended_from is None
    assert second.updates.moment == 0.5 and list(second.updates.loaded) == TRAINER_STATE_KEYS
    assert torch.equal(second.heads["heads"]["mlp"].weight, torch.ones(2, 2))
    assert second.window.steps == [(4, "text")]
    assert torch.equal(torch.rand(3), after_save)


def test_the_plan_record_and_run_info_say_what_the_run_is(student_parts, tiny_model, tmp_path):
    record = make_record(student_parts, tiny_model, tmp_path / "run")
    record.restore(None)
    with record.open_log():
        pass
    plan = json.loads(RunDir(tmp_path / "run").plan.read_text())
    assert list(plan) == PLAN_KEYS
    assert plan["sentences"] == {"text": 12} and plan["global_batch"] == 4
    assert plan["batches_per_epoch"] == {"text": 3} and plan["steps_per_epoch"] == 3
    assert (plan["epochs"], plan["max_steps"], plan["total_steps"]) == (2, 6, 6)
    assert plan["evals"] == 3 and plan["eval_data"] is None and plan["final_eval"] is False
    assert plan["save_every"] == 2  # no --save-every: every evaluation step
    assert plan["resumed_from_step"] is None and plan["extended_from"] is None
    assert plan["capture"] == "off (--capture auto on cpu): eager step"
    assert plan["mixing_rule"] == "text batches only" and plan["batches_in_run"] == {"text": 6}
    assert plan["checkpoint_bytes"]["last"] > plan["checkpoint_bytes"]["best"] > 0
    assert plan["left_out"] == {}  # corpora in memory: nothing read, nothing left out
    assert plan["batch_sizes"] == {"text": 4}
    assert plan["packing"] == "padded to the longest sentence of each batch"

    info = record.run_info(3, 70.0)
    assert info["config"] == record.cfg.to_dict() and info["method"] == {"name": "simcse"}
    shown = (info["step"], info["total_steps"], info["finished"], info["stsb_dev"])
    assert shown == (3, 6, False, 70.0)
    assert info["pooler"] == "cls" and info["pooler_source"] == "given"
    assert info["fingerprints"] == {"text": {"fingerprint": "f00d"}}
    assert info["term_heads"] == {"simcse": ["mlp"]}
    assert info["teachers"] == {"feature:image": {"teacher": "clip-vit-b32"}}
    assert info["environment"]["numerics"]["precision"] == "fp32"


def test_plan_json_keeps_the_recipes_mixing_where_the_mixing_plan_put_it(
    student_parts, tiny_model, tmp_path
):
    """A two-corpus run that mixes otherwise than the recipes has ``recipes_mixing`` right after
    ``batches_in_run`` (where ``**mixing_plan(...)`` put it before the plan was typed); a run
    without it has no such key."""
    record = make_record(student_parts, tiny_model, tmp_path / "run")
    record.restore(None)
    plain = record.plan_record()
    assert list(plain.as_json()) == PLAN_KEYS
    recipes = {"mixing": "mcse-train-mix", "batches_per_epoch": {"text": 3, "caption": 1}}
    mixed = dataclasses.replace(plain, recipes_mixing=recipes).as_json()
    at = PLAN_KEYS.index("batches_in_run") + 1
    assert list(mixed) == [*PLAN_KEYS[:at], "recipes_mixing", *PLAN_KEYS[at:]]
    assert mixed["recipes_mixing"] == recipes


def finished_run(student_parts, tiny_model, out) -> None:
    """A run of 4 steps that finished, its last/ kept."""
    record = make_record(student_parts, tiny_model, out, max_steps=4)
    record.restore(None)
    state = RunState(step=4, epoch=1, next_index=1, best_dev=70.0, best_step=4)
    record.save_best(state)
    record.save_last(state)
    record.finish(state)


def test_a_larger_max_steps_extends_a_finished_run_and_the_same_one_is_refused(
    student_parts, tiny_model, tmp_path, caplog
):
    finished_run(student_parts, tiny_model, tmp_path / "run")
    saved = ckpt.load_trainer_state(tmp_path / "run")
    longer = make_record(student_parts, tiny_model, tmp_path / "run", resuming=True)
    assert longer.extended_from == {"step": 4, "max_steps": 4, "epochs": 2}
    with caplog.at_level(logging.WARNING, logger="mmcse.training.record"):
        assert longer.restore(saved).step == 4
    assert longer.updates.extended_to == 6
    assert "from step 4 to 6" in caplog.text and "continues at lr 1.25e-05" in caplog.text

    same = make_record(student_parts, tiny_model, tmp_path / "run", resuming=True, max_steps=4)
    with pytest.raises(MmcseError, match="still end the run at step 4, where it finished"):
        same.restore(saved)


def test_finish_returns_the_states_result_and_marks_the_run_finished(
    student_parts, tiny_model, tmp_path
):
    record = make_record(student_parts, tiny_model, tmp_path / "run", keep_last_checkpoint=False)
    record.restore(None)
    state = RunState(step=6, epoch=1, next_index=3, best_dev=72.0, best_step=4)
    record.save_best(state)
    record.save_last(state)
    result = record.finish(state)
    assert (result.steps, result.best_dev, result.best_step, result.test) == (6, 72.0, 4, None)
    run = RunDir(tmp_path / "run")
    assert run.best.read_info()["finished"] is True and not run.last.path.exists()


def test_interruption_messages_name_the_step_and_what_last_holds(
    student_parts, tiny_model, tmp_path
):
    record = make_record(student_parts, tiny_model, tmp_path / "run")
    record.restore(None)
    resume = f"Continue with: mmcse train --resume {tmp_path / 'run'}"
    assert record.aborted_message(RunState(step=3)) == (
        "interrupted at step 3; no last/ was saved, nothing to resume: start the run again "
        "(--overwrite)"
    )
    record.save_last(RunState(step=4))
    record.writer.wait()
    assert record.aborted_message(RunState(step=5)) == (
        f"interrupted at step 5 of 6; last/ holds step 4. {resume}"
    )
    record.save_last(RunState(step=6))
    record.writer.wait()
    assert record.aborted_message(RunState(step=6)) == (
        f"interrupted at step 6 of 6; last/ holds step 6 (the final evaluation is left). {resume}"
    )
    assert record.interrupted_message(RunState(step=5)) == (
        f"interrupted after step 5 of 6; last/ saved. {resume}"
    )


def test_plan_json_records_the_batch_a_small_corpus_trains_with():
    """plan.json said global_batch 100000 for a 12-sentence corpus (the printed plan: 12)."""
    from mmcse.training.plan import batch_sizes

    assert batch_sizes(100000, {"text": range(12), "caption": range(500)}) == {
        "text": 12,
        "caption": 500,
    }
    assert batch_sizes(64, {"text": range(12), "caption": range(500)}) == {
        "text": 12,
        "caption": 64,
    }
