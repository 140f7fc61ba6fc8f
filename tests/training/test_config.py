"""Settings are checked where they are read: types from annotations, ranges from field metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

import pytest
from support.cli import assert_one_error, run_main

from mmcse import distributed
from mmcse.errors import MmcseError
from mmcse.methods import build_method
from mmcse.registry import METHODS
from mmcse.settings import SettingError, check_settings
from mmcse.training.config import GivenSettings, TrainConfig, resolve_config

BAD_SETTINGS = [
    ("batch_size", "64", "must be an integer"),
    ("batch_size", 1, "at least 2"),
    ("batch_size", 8.0, "must be an integer"),
    ("batch_size", True, "must be an integer"),
    ("learning_rate", "x", "must be a number"),
    ("learning_rate", 0, "above 0"),
    ("learning_rate", -1e-5, "above 0"),
    ("epochs", 0, "at least 1"),
    ("epochs", -2, "at least 1"),
    ("eval_steps", 0, "at least 1"),
    ("max_seq_length", 0, "at least 3"),
    ("max_steps", -1, "at least 0"),
    ("warmup_steps", -1, "at least 0"),
    ("weight_decay", -0.1, "at least 0"),
    ("grad_clip", -1.0, "at least 0"),
    ("seed", -1, "at least 0"),
    ("seed", 2**32, "at most"),
    ("dropout", 1.0, "below 1"),
    ("log_every", 0, "at least 1"),
    ("device", "bogus", "auto, cpu, cuda"),
    ("device", "cuda:x", "auto, cpu, cuda"),
    ("mixing", "random", "one of interleave"),
    ("precision", "fp8", "one of auto"),
    ("final_eval", "yes", "true or false"),
    ("features", ["image"], "an object"),
    ("features", {"image": 3}, "an object"),
    ("method_args", "temperature=0.1", "an object"),
    ("text_corpus", 5, "a string or null"),
    ("overwrite", 1, "true or false"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD_SETTINGS)
def test_bad_setting_is_refused_naming_it(name, value, words):
    with pytest.raises(SettingError, match=words) as info:
        TrainConfig(**{name: value})
    message = str(info.value)
    assert f"setting {name} (--" in message and "\n" not in message
    assert isinstance(info.value, MmcseError) and isinstance(info.value, ValueError)


def test_lr_flag_is_named_as_the_cli_spells_it():
    with pytest.raises(SettingError, match=r"learning_rate \(--lr\)"):
        TrainConfig(learning_rate=0.0)


def test_int_for_float_is_stored_as_float_and_good_values_pass():
    cfg = TrainConfig(learning_rate=1, dropout=0, device="cuda:1", seed=0, max_seq_length=3)
    assert cfg.learning_rate == 1.0 and isinstance(cfg.learning_rate, float)
    assert cfg.device == "cuda:1"


def test_typo_in_expect_fingerprint_role_names_the_known_roles():
    with pytest.raises(MmcseError, match="imgae.*roles: image"):
        TrainConfig(features={"image": "x"}, expect_fingerprints={"imgae": "0" * 64})
    with pytest.raises(MmcseError, match=r"no --feature given"):
        TrainConfig(expect_fingerprints={"image": "0" * 64})


# ---- config files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"batch_size": "64"}', "batch_size .*must be an integer, got '64'"),
        ('{"learning_rate": "x"}', "learning_rate .*must be a number"),
        ('{"eval_steps": 0}', "eval_steps .*at least 1"),
        ("[1, 2]", "must hold an object of settings"),
        ('"just a string"', "must hold an object of settings"),
        ('{"train": [1]}', "must hold an object of settings"),
        ('{"batch_sise": 64}', "unknown training setting.*batch_sise"),
        ('{"batch_size": 64,}', r"run.json:1:19: not valid JSON: Expecting property name"),
        ('{"train": {"batch_size": 8}, "lr": 1}', r"lr outside \[train\]"),
    ],
)
def test_bad_config_file_is_one_error_naming_the_file(tmp_path, text, words):
    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(MmcseError, match=words) as info:
        resolve_config(path)
    assert str(path) in str(info.value)


def test_toml_train_table_is_checked_too(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nbatch_size = "64"\n')
    with pytest.raises(MmcseError, match=f"{path}.*batch_size"):
        resolve_config(path)
    path.write_bytes(b"\xff\xfe[train]\n")
    with pytest.raises(MmcseError, match="not UTF-8"):
        resolve_config(path)


def test_toml_keys_outside_train_are_refused_naming_them_and_where_they_go(
    tmp_path, monkeypatch, capsys
):
    """``learning_rate = 0.5`` above ``[train]`` used to be dropped without a word."""
    path = tmp_path / "run.toml"
    path.write_text("learning_rate = 0.5\n\n[train]\nbatch_size = 16\n")
    code, stderr = run_main(["train", "--config", str(path), "--dry-run"], monkeypatch, capsys)
    assert_one_error(code, stderr, str(path), "learning_rate outside [train]", "goes in it")
    path.write_text("[train]\nbatch_size = 16\n\n[eval]\nsteps = 3\n")
    with pytest.raises(MmcseError, match=r"eval outside \[train\]"):
        resolve_config(path)
    path.write_text("[train]\nbatch_size = 16\nlearning_rat = 0.5\n")
    with pytest.raises(
        MmcseError, match=r"unknown training setting\(s\) in \[train\]: learning_rat"
    ):
        resolve_config(path)
    path.write_text("batch_size = 16\n\n[eval]\nsteps = 3\n")  # no [train]: a table is a key
    with pytest.raises(MmcseError, match=r"setting\(s\): eval \(eval: only \[train\] is read\)"):
        resolve_config(path)
    path.write_text("learning_rate = 0.5\nbatch_size = 16\n")  # top level only: read
    assert resolve_config(path).learning_rate == 0.5
    path.write_text("[train]\nlearning_rate = 0.5\n")  # [train] only: read
    assert resolve_config(path).learning_rate == 0.5


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".cfg", ""])
def test_config_formats_are_chosen_by_suffix(tmp_path, monkeypatch, capsys, suffix):
    """A YAML file was "not valid yaml" after being parsed as JSON."""
    path = tmp_path / f"run{suffix}"
    path.write_text("batch_size: 16\n")
    code, stderr = run_main(["train", "--config", str(path), "--dry-run"], monkeypatch, capsys)
    line = assert_one_error(code, stderr, str(path), "JSON (.json) or TOML (.toml)")
    assert "not valid" not in line


def test_syntax_errors_name_file_line_and_column(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{\n  "batch_size": 16\n  "epochs": 2\n}\n')
    with pytest.raises(MmcseError, match=r"run.json:3:3: not valid JSON: Expecting ','"):
        resolve_config(path)
    path = tmp_path / "run.toml"
    path.write_text("[train]\nbatch_size = = 16\n")
    with pytest.raises(MmcseError, match=r"run.toml:2:14: not valid TOML: Invalid value$"):
        resolve_config(path)


def test_flag_overrides_are_checked_after_the_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"batch_size": 16}))
    assert resolve_config(path, GivenSettings({"epochs": 2})).batch_size == 16
    with pytest.raises(SettingError, match="epochs"):
        resolve_config(path, GivenSettings({"epochs": 0}))


def test_given_settings_are_checked_once_when_made_and_lie_over_the_file(tmp_path):
    """The settings a user gave are one typed object: an unknown name or a bad value is refused
    when it is made (one line), values are converted there, and it lays them over a file's."""
    with pytest.raises(MmcseError, match=r"^unknown training setting\(s\): batch_sise$"):
        GivenSettings({"batch_sise": 7})
    bad = r"^setting batch_size \(--batch-size\) must be at least 2, got 1$"
    with pytest.raises(SettingError, match=bad):
        GivenSettings({"batch_size": 1})
    with pytest.raises(SettingError, match=r"batch_size \(--batch-size\) must be an integer"):
        GivenSettings({"batch_size": "7"})
    given = GivenSettings({"batch_size": 7, "learning_rate": 1, "model": None})  # None: not given
    assert dict(given.values) == {"batch_size": 7, "learning_rate": 1.0}
    assert type(given.values["learning_rate"]) is float
    with pytest.raises(TypeError):
        given.values["batch_size"] = 8  # type: ignore[index]  # frozen: checked once, kept
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"batch_size": 16, "epochs": 2}))
    cfg = resolve_config(path, given)
    assert (cfg.batch_size, cfg.epochs, cfg.learning_rate) == (7, 2, 1.0)
    assert resolve_config(path).batch_size == 16 and resolve_config(None, given).batch_size == 7


# ---- the mechanism itself, on a dataclass another helper might add ------------------------------


@dataclass
class Extra:
    count: int = field(default=1, metadata={"min": 1, "max": 10})
    ratio: float = field(default=0.5, metadata={"above": 0, "below": 1})
    mode: Literal["a", "b"] = "a"
    pairs: tuple[tuple[str, float], ...] = ()
    names: list[str] = field(default_factory=list)
    limit: float | None = None
    flagged: int = field(default=0, metadata={"flag": "--flagged-thing", "choices": (0, 2)})


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"count": 0}, "count must be at least 1"),
        ({"count": 11}, "count must be at most 10"),
        ({"count": "3"}, "count must be an integer"),
        ({"ratio": 1}, "ratio must be below 1"),
        ({"ratio": 0.0}, "ratio must be above 0"),
        ({"mode": "c"}, "mode must be one of 'a', 'b'"),
        ({"pairs": [["x", "y"]]}, r"pairs must be a list of \[string, number\] pairs"),
        ({"pairs": [["x"]]}, "pairs must be"),
        ({"names": ["a", 1]}, "names must be a list of strings"),
        ({"limit": "none"}, "limit must be a number or null"),
        ({"flagged": 1}, "flagged must be one of 0, 2"),
    ],
)
def test_new_fields_are_checked_from_annotation_and_metadata(values, words):
    with pytest.raises(SettingError, match=words):
        check_settings(Extra, values, "extra setting")


def test_mechanism_converts_and_accepts_json_shapes():
    got = check_settings(Extra, {"ratio": 0.25, "pairs": [["x", 1]], "limit": None, "count": 3})
    assert got == {"ratio": 0.25, "pairs": (("x", 1.0),), "limit": None, "count": 3}
    with pytest.raises(SettingError, match=r"--flagged-thing"):
        check_settings(Extra, {"flagged": 1})


# ---- method hyperparameters ---------------------------------------------------------------------


@pytest.mark.parametrize("name", METHODS.names())
def test_every_method_builds_with_its_defaults(name):
    assert build_method(name).name == name


@pytest.mark.parametrize(
    ("method", "args", "words"),
    [
        ("dalr", {"temperature": "x"}, "method 'dalr' setting temperature must be a number"),
        ("dalr", {"teachers_on": "text"}, "teachers_on must be one of 'all', 'caption'"),
        ("dalr", {"proj_dim": 2.5}, "proj_dim must be an integer"),
        ("dalr", {"text_teachers": "simcse"}, "text_teachers must be a list"),
        (
            "kdmcse",
            {"false_negative_threshold": "0.3"},
            "false_negative_threshold must be a number",
        ),
        ("mcse", {"image_text_weight": None}, "image_text_weight must be a number"),
    ],
)
def test_bad_method_argument_is_refused_naming_it(method, args, words):
    with pytest.raises(SettingError, match=words):
        build_method(method, **args)


def test_method_argument_from_json_is_converted():
    method = build_method("dalr", text_teachers=[["t", 1]], temperature=1)
    assert method.text_teachers == (("t", 1.0),) and method.temperature == 1.0


# ---- torchrun variables ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
    ],
)
def test_garbage_torchrun_variables_are_named(monkeypatch, env, name):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(MmcseError, match=f"{name}=") as info:
        distributed.init_from_env()
    assert "\n" not in str(info.value)
