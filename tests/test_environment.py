"""The environment record: what it holds, where two records differ, git state outside a checkout."""

from __future__ import annotations

import json
import platform
import subprocess

import torch
import transformers

from mmcse import environment as env


def test_the_record_holds_the_versions_device_and_numerics_of_this_process():
    record = env.environment("cpu", "fp32")
    json.dumps(record)  # JSON-ready as it stands
    assert record["python"]["version"] == platform.python_version()
    assert record["packages"]["torch"] == torch.__version__
    assert record["packages"]["transformers"] == transformers.__version__
    assert record["cuda"]["version"] == torch.version.cuda
    assert record["cuda"]["available"] == torch.cuda.is_available()
    assert record["device"]["name"] == "cpu" and record["device"]["world_size"] == 1
    numerics = record["numerics"]
    assert numerics["precision"] == "fp32"
    assert numerics["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert numerics["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert set(record["mmcse"]) == {"version", "commit", "dirty", "path"}


def test_numerics_follow_the_switches_as_set_now():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert env.numerics()["float32_matmul_precision"] == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_git_state_is_null_outside_a_checkout_and_the_commit_inside_one(tmp_path):
    env.git_state.cache_clear()
    assert env.git_state(tmp_path) == {"commit": None, "dirty": None}
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                              text=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    (repo / "a.txt").write_text("a")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
    head = git("rev-parse", "HEAD")
    assert env.git_state(repo) == {"commit": head, "dirty": False}
    (repo / "a.txt").write_text("b")
    env.git_state.cache_clear()
    assert env.git_state(repo) == {"commit": head, "dirty": True}
    env.git_state.cache_clear()
    assert env.git_state(repo / "sub") == {"commit": None, "dirty": None}  # not its top


def _record(torch_version: str, device_model: str = "Xeon") -> dict:
    return {
        "mmcse": {"version": "0.1", "commit": "a" * 40, "dirty": False},
        "python": {"version": "3.11.9"},
        "packages": {"torch": torch_version},
        "device": {"name": "cpu", "model": device_model, "count": 1},
        "numerics": {"precision": "fp32"},
    }


def test_differences_name_each_differing_fact_and_its_holders():
    records = {"a": _record("2.14.1"), "b": _record("2.14.1"), "c": _record("2.13.0", "EPYC")}
    found = env.differences(records)
    assert found == [
        "torch 2.14.1 (a, b) vs 2.13.0 (c)",
        "device cpu (Xeon) (a, b) vs cpu (EPYC) (c)",
    ]
    assert env.differences({"a": _record("2.14.1"), "b": _record("2.14.1")}) == []
    assert env.differences({"a": _record("2.14.1"), "b": None}) == []  # unrecorded: no part


def test_notes_describe_the_first_record_and_list_differences():
    notes = env.record_notes({"a": _record("2.14.1"), "b": _record("2.13.0")})
    assert (
        notes[0].startswith("Environment: mmcse 0.1 (aaaaaaaaaaaa)") and "torch 2.14.1" in notes[0]
    )
    assert notes[1] == "Environments differ: torch 2.14.1 (a) vs 2.13.0 (b)."
    assert env.record_notes({"a": None}) == []
