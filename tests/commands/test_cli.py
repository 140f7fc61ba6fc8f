"""The command line stays thin and honest: its size, its error policy, its flags.

* the CLI layer (``cli.py`` + ``mmcse/commands``) fits its line budget;
* ``main()`` turns only user errors (:class:`MmcseError`, OS errors) into one ``error:`` line;
  a bug inside a command keeps its traceback;
* ``train``'s flags are :class:`TrainConfig`'s fields, made from their metadata (a field added
  there is a flag with no CLI change), and every flag name of the past still works;
* each Stage-1 command's flags are its job's fields;
* library log records reach stderr as plain lines while a command runs, and only then.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
from support.cli import assert_one_error, run_main
from typer.main import get_command
from typer.testing import CliRunner

import cli
from mmcse.commands import extract
from mmcse.commands.flags import with_flags
from mmcse.errors import MmcseError
from mmcse.registry import METHODS, UnknownNameError
from mmcse.training.config import GivenSettings, TrainConfig

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 640  # lines of cli.py + mmcse/commands (+40: --help at 80 columns, rank 0 prints)


def test_cli_layer_fits_its_line_budget():
    files = [ROOT / "cli.py", *sorted((ROOT / "mmcse" / "commands").rglob("*.py"))]
    lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
    assert lines <= BUDGET, f"CLI layer: {lines} lines in {len(files)} files (budget {BUDGET})"


# ---- errors --------------------------------------------------------------------------------------


def _handled(function: ast.FunctionDef) -> set[str]:
    names = set()
    for handler in (n for n in ast.walk(function) if isinstance(n, ast.ExceptHandler)):
        caught = handler.type
        items = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        names |= {"<bare>" if i is None else ast.unparse(i) for i in items}
    return names


def test_main_turns_only_user_errors_into_error_lines():
    tree = ast.parse((ROOT / "cli.py").read_text(encoding="utf-8"))
    main = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert _handled(main) == {"MmcseError", "OSError", "KeyboardInterrupt"}


BUGGY_METHODS = """
import sys
import cli
import mmcse.reports.overview as overview

def broken():
    return {}["a bug"]

overview.methods_overview = broken
sys.argv = ["mmcse", "methods"]
cli.main()
"""


def test_a_bug_in_a_command_keeps_its_traceback():
    done = subprocess.run(
        [sys.executable, "-c", BUGGY_METHODS], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    assert done.returncode not in (0, 2), done.stderr
    assert "Traceback" in done.stderr and "KeyError: 'a bug'" in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("error:")]


def test_a_bug_in_process_propagates_and_a_user_error_is_one_line(monkeypatch, capsys):
    import mmcse.reports.overview as overview

    monkeypatch.setattr(overview, "methods_overview", lambda: {}["a bug"])
    monkeypatch.setattr(sys, "argv", ["mmcse", "methods"])
    with pytest.raises(KeyError):
        cli.main()
    assert "error:" not in capsys.readouterr().err

    def refuse():
        raise MmcseError("no methods today")

    monkeypatch.setattr(overview, "methods_overview", refuse)
    code, stderr = run_main(["methods"], monkeypatch, capsys)
    assert_one_error(code, stderr, "no methods today")


def test_unknown_names_are_user_errors_and_still_key_errors(monkeypatch, capsys):
    with pytest.raises(UnknownNameError) as info:
        METHODS.get("mcsee")
    assert isinstance(info.value, MmcseError) and isinstance(info.value, KeyError)
    assert str(info.value).startswith("unknown method 'mcsee'; known:")
    argv = ["extract-text", "--teacher", "nope", "--corpus", os.devnull]
    code, stderr = run_main(argv, monkeypatch, capsys)
    assert_one_error(code, stderr, "unknown teacher 'nope'")


# ---- train's flags are TrainConfig's fields ------------------------------------------------------


def _options(command_name: str) -> dict[str, object]:
    group = get_command(cli.app)
    command = group.commands[command_name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


PAST_TRAIN_FLAGS = (
    "--config", "--model", "--method", "--method-arg", "--text-corpus", "--caption-corpus",
    "--feature", "--expect-fingerprint", "--mixing", "--output-dir", "--overwrite",
    "--batch-size", "--lr", "--learning-rate", "--epochs", "--max-steps", "--max-seq-length",
    "--seed", "--eval-steps", "--eval-data", "--final-eval", "--no-final-eval", "--pooler",
    "--device", "--precision", "--adam-eps", "--drop-last", "--keep-last",
    "--attn-implementation", "--compile", "--no-compile", "--fused-adamw", "--no-fused-adamw",
    "--tf32", "--no-tf32", "--dynamic-padding", "--no-dynamic-padding", "--dry-run", "--resume",
    "--save-every", "--log-every", "--report-to",
)  # fmt: skip


def test_every_config_field_is_a_train_flag_with_its_default_in_the_help():
    options = _options("train")
    fields = [f for f in dataclasses.fields(TrainConfig) if f.init]
    assert set(options) == {f.name for f in fields} | {"config", "dry_run", "resume"}
    for f in fields:
        option = options[f.name]
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        assert flag in option.opts and set(f.metadata.get("aliases", ())) <= set(option.opts)
        assert option.default is None, f.name  # unset: a --config file may fill it
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert option.help.endswith(f"(default: {default!r})"), option.help
        if f.metadata.get("help"):
            assert option.help.startswith(f.metadata["help"])
    spelled = {s for o in options.values() for s in (*o.opts, *o.secondary_opts)}
    assert set(PAST_TRAIN_FLAGS) <= spelled


def test_train_flags_reach_the_launcher_as_settings(monkeypatch):
    import mmcse.training.launch as launch

    seen = {}

    def fake(config, settings, *, resume=None, dry_run=False):
        given = {f.name: settings.values.get(f.name) for f in dataclasses.fields(TrainConfig)}
        seen.update(given, config=config, dry_run=dry_run)
        yield "launched"

    monkeypatch.setattr(launch, "launch", fake)
    result = CliRunner().invoke(cli.app, [
        "train", "--config", "run.toml", "--learning-rate", "0.1", "--keep-last", "--no-compile",
        "--method-arg", "temperature=0.1", "--method-arg", "views=mean", "--feature", "image=/x",
        "--expect-fingerprint", "image=abc", "--dry-run",
    ])  # fmt: skip
    assert result.exit_code == 0 and result.stdout == "launched\n", result.output
    assert seen.pop("config") == "run.toml" and seen.pop("dry_run") is True
    assert seen.pop("learning_rate") == 0.1 and seen.pop("drop_last") is False
    assert seen.pop("compile_encoder") is False
    assert seen.pop("method_args") == {"temperature": 0.1, "views": "mean"}  # JSON, else text
    assert seen.pop("features") == {"image": "/x"}
    assert seen.pop("expect_fingerprints") == {"image": "abc"}
    assert set(seen.values()) == {None}  # every other setting left to the file and defaults


def test_a_bad_batch_size_is_refused_at_the_cli_before_the_launcher(monkeypatch, capsys):
    import mmcse.training.launch as launch

    def never(*args, **kwargs):
        raise AssertionError("launched with a bad setting")

    monkeypatch.setattr(launch, "launch", never)
    code, err = run_main(["train", "--batch-size", "1", "--dry-run"], monkeypatch, capsys)
    assert_one_error(code, err, "setting batch_size (--batch-size) must be at least 2, got 1")


def test_batch_size_reaches_the_config_through_given_settings(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """`mmcse train --batch-size 7 --dry-run`: the flag travels as GivenSettings to
    resolve_config, over the config file's value, and the run's config holds 7."""
    from support.cli import run_main_output

    import mmcse.training.launch as launch

    resolved = []

    def spy(file, given=None):
        assert isinstance(given, GivenSettings) and given.values["batch_size"] == 7
        resolved.append(real(file, given))
        return resolved[-1]

    real = launch.resolve_config
    monkeypatch.setattr(launch, "resolve_config", spy)
    config = tmp_path / "run.json"
    config.write_text('{"batch_size": 16}')
    args = ["train", "--config", str(config), "--model", str(tiny_model), "--method", "simcse",
            "--text-corpus", tiny_world["text"], "--batch-size", "7", "--eval-data", "",
            "--device", "cpu", "--output-dir", str(tmp_path / "run"), "--dry-run"]  # fmt: skip
    code, out, err = run_main_output(args, monkeypatch, capsys)
    assert code == 0, err
    assert [cfg.batch_size for cfg in resolved] == [7] and '"batch_size": 7' in out


def test_a_new_settings_field_is_a_flag_with_no_cli_change():
    @dataclass
    class Settings:
        ratio: float = field(default=0.5, metadata={"help": "how much", "flag": "--r"})
        name: str | None = None
        pairs: dict[str, int] = field(default_factory=dict, metadata={"flag": "--pair"})
        loud: bool = field(default=False, metadata={"negative": "--soft"})

    app, seen = typer.Typer(), {}

    @app.command()
    @with_flags(Settings, into="settings")
    def run(settings=None) -> None:
        seen.update(settings)

    runner = CliRunner()
    assert runner.invoke(app, ["--r", "2", "--pair", "a=3", "--soft"]).exit_code == 0
    assert seen == {"ratio": 2.0, "name": None, "pairs": {"a": 3}, "loud": False}
    bad = runner.invoke(app, ["--pair", "a"])
    assert isinstance(bad.exception, MmcseError)
    assert "--pair expects KEY=VALUE" in str(bad.exception)
    ratio = next(p for p in get_command(app).params if p.name == "ratio")
    assert ratio.help == "how much (default: 0.5)" and ratio.opts == ["--r"]


def test_bad_pairs_on_the_command_line_are_one_error_line(monkeypatch, capsys):
    code, stderr = run_main(["train", "--feature", "image"], monkeypatch, capsys)
    assert_one_error(code, stderr, "--feature expects KEY=VALUE", "'image'")


@pytest.mark.parametrize(("name", "job"), list(extract.COMMANDS.items()))
def test_each_stage1_command_has_its_jobs_fields_as_flags(name, job):
    fields = {f.name: f for f in dataclasses.fields(job)}
    options = _options(name)
    assert set(options) == set(fields)
    for field_name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        assert options[field_name].required == required, field_name


# ---- library logs ------------------------------------------------------------------------------


def test_library_logs_are_plain_stderr_lines_while_a_command_runs(monkeypatch, capsys):
    import mmcse.reports.overview as overview

    logger = logging.getLogger("mmcse.reports.overview")

    def chatty() -> str:
        logger.info("working on it")
        logger.warning("this looks odd")
        return "the result"

    monkeypatch.setattr(overview, "methods_overview", chatty)
    code, stderr = run_main(["methods"], monkeypatch, capsys)
    assert code == 0 and stderr == ["working on it", "warning: this looks odd"]
    monkeypatch.setattr(sys, "argv", ["mmcse", "--quiet", "methods"])
    with pytest.raises(SystemExit):
        cli.main()
        raise SystemExit(0)
    captured = capsys.readouterr()
    assert captured.out == "the result\n" and captured.err == "warning: this looks odd\n"
    assert not logging.getLogger("mmcse").handlers  # shown only while the command ran


# `mmcse ARGS` in a fresh interpreter; prints the heavy modules it imported
HEAVY_IMPORTS = """
import sys
sys.path.insert(0, {root!r})
sys.argv = ["mmcse", *sys.argv[1:]]
import cli
try:
    cli.main()
except SystemExit:
    pass
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["train", "--help"],
        ["train", "--batch-size", "0", "--dry-run"],  # a setting's range
        ["train", "--text-corpus", "missing.txt", "--dry-run"],  # preflight's first checks
    ],
)
def test_help_and_early_errors_import_neither_torch_nor_transformers(args, tmp_path):
    """`--help` and an error in a setting or path answer in about a second: torch and
    transformers (tens of seconds on a busy machine) load only when a command needs them."""
    script = HEAVY_IMPORTS.format(root=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout + proc.stderr
    assert "error:" in proc.stderr or "Usage:" in proc.stdout


def test_train_help_groups_its_flags_and_shows_brackets_as_written(monkeypatch):
    from mmcse.training import config

    panels = {v for k, v in vars(config).items() if k.startswith("PANEL_")}
    assert all(f.metadata.get("panel") in panels for f in dataclasses.fields(TrainConfig))
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(cli.app, ["train", "--help"])
    assert result.exit_code == 0, result.output
    titles = [line.strip("╭─╮ ").split(" ─")[0] for line in result.output.splitlines()]
    assert {*panels, "Run"} <= set(titles)
    assert "one [train] table" in result.output  # not eaten as a rich style tag
    assert "tokens per sentence ([CLS], a token, [SEP])" in result.output


# ---- --help at 80 columns ----------------------------------------------------------------------


def every_command(command=None, path=()) -> list[tuple[tuple[str, ...], object]]:
    """``(words, click command)`` of every command and group of ``mmcse``."""
    command = command or get_command(cli.app)
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += every_command(sub, (*path, name))
    return found


@pytest.mark.parametrize("path", [p for p, _ in every_command()], ids=lambda p: " ".join(p))
def test_help_at_80_columns_cuts_no_option_name_and_has_one_label_convention(
    path, monkeypatch, capsys
):
    """Every option and flag name appears whole at 80 columns, nothing is cut with an ellipsis,
    no line is wider than 80, and types read TEXT/INT/FLOAT (typer's <str>/<bool> nowhere)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    monkeypatch.setattr(sys, "argv", ["mmcse", *path, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None), out
    command = dict(every_command())[path]
    names = [o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    words = set(out.replace("│", " ").replace(",", " ").split())
    assert not [n for n in names if n not in words], out
    assert not re.search(r"\S…", out) and max(map(len, out.splitlines())) <= 80, out
    assert not [t for t in ("<str>", "<bool>", "<int>", "<float>", "<list") if t in out], out


def test_under_torchrun_only_rank_0_prints_the_runs_lines(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """A faked torchrun environment: rank 1 prints neither the dry run's config and plan nor its
    log lines; rank 0 prints both; an error still shows on every rank."""
    from support.cli import run_main_output

    args = ["train", "--model", str(tiny_model), "--method", "simcse", "--text-corpus",
            tiny_world["text"], "--batch-size", "8", "--eval-data", "", "--device", "cpu",
            "--output-dir", str(tmp_path / "run"), "--dry-run"]  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    lines = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        code, out, err = run_main_output(args, monkeypatch, capsys)
        assert code == 0, err
        lines[rank] = (out, err)
    assert '"method": "simcse"' in lines["0"][0] and "plan:" in lines["0"][0] + lines["0"][1]
    assert lines["1"] == ("", "")
    code, _, err = run_main_output([*args[:-1], "--batch-size", "-1"], monkeypatch, capsys)
    assert code == 2 and err.startswith("error:")


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 130)])
def test_a_run_stopped_by_a_signal_exits_128_plus_its_number(signum, code):
    """A job script must see SIGTERM as 143, not typer's 130 for any KeyboardInterrupt."""
    from mmcse.commands import show
    from mmcse.training.stop import TrainingInterrupted

    def lines():
        yield "step 1"
        raise TrainingInterrupted("stopped", signum=signum)

    with pytest.raises(typer.Exit) as stopped:
        show(lines())
    assert stopped.value.exit_code == code
