"""``mmcse eval``'s flags are made from :class:`EvalRequest`, and the request travels as one object
from the command through ``evaluate_model`` to the suites beyond STS."""

from __future__ import annotations

import dataclasses

from support.cli import run_main_output

import mmcse.evaluation.evaluate as evaluate_mod
import mmcse.evaluation.suites as suites_mod
from mmcse.evaluation.request import EvalRequest

#: one value per field, none of them a default
GIVEN = {
    "model": "some/model", "tasks": "sts,MR,retrieval", "data": "/senteval", "out": "/o.json",
    "mode": "dev", "pooler": "avg", "batch_size": 7, "device": "cpu", "align_uniform": True,
    "transfer_mode": "fasttest", "images_features": "/imgs", "captions": "/caps", "head": "t",
    "precision": "bf16",
}  # fmt: skip


def flag_args() -> list[str]:
    args = []
    for name, value in GIVEN.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def test_every_field_is_a_flag_and_the_command_builds_one_request(monkeypatch, capsys):
    assert set(GIVEN) == {f.name for f in dataclasses.fields(EvalRequest)}
    seen = []
    monkeypatch.setattr(evaluate_mod, "evaluate_model", lambda request: seen.append(request) or [])
    code, _, err = run_main_output(["eval", *flag_args()], monkeypatch, capsys)
    assert code == 0, err
    assert seen == [EvalRequest(**GIVEN)]


def test_defaults_are_the_request_s(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(evaluate_mod, "evaluate_model", lambda request: seen.append(request) or [])
    run_main_output(["eval", "--model", "m"], monkeypatch, capsys)
    assert seen == [EvalRequest("m")]


def test_the_suites_read_the_request(monkeypatch):
    calls = {}
    monkeypatch.setattr(suites_mod, "evaluate_transfer", lambda *a, **k: calls.update(t=(a, k)))
    monkeypatch.setattr(suites_mod, "evaluate_retrieval", lambda *a, **k: calls.update(r=(a, k)))
    monkeypatch.setattr(suites_mod, "format_transfer_table", lambda result: "")
    monkeypatch.setattr(suites_mod, "format_retrieval_table", lambda result: "")
    monkeypatch.setattr(suites_mod, "record", lambda *a: iter(()))
    request = EvalRequest(**GIVEN)
    list(suites_mod.run_extra_suites(request, {"transfer": ["MR"], "retrieval": None}, {}))
    args, kwargs = calls["t"]
    assert args == ("some/model",) and kwargs["mode"] == "fasttest" and kwargs["tasks"] == ["MR"]
    assert (kwargs["data_dir"], kwargs["pooler"], kwargs["batch_size"]) == ("/senteval", "avg", 7)
    args, kwargs = calls["r"]
    assert args == ("some/model", "/imgs", "/caps") and kwargs["head"] == "t"
