"""Fault injection on the training side: every bad input is one ``error:`` line, exit 2, early.

Each case runs ``mmcse train`` (or ``eval``) through the real entry point and checks the exit
status, that stderr has exactly one ``error:`` line naming the setting or file and no traceback,
and that nothing was written that could pass for a run (no output folder at all for inputs
refused before the first step).
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import cli
from mmcse.cache import Corpus, write_feature_set
from mmcse.errors import MmcseError, naming_os_errors
from mmcse.model import SentenceEncoder
from mmcse.rundir import BEST_DIR

FIXTURE_SENTEVAL = Path(__file__).parents[1] / "fixtures" / "senteval_mini"


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int, list[str], str]:
    """``mmcse ARGS`` in-process: (exit code, its ``error:`` lines, all of stderr)."""
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main()
        raise SystemExit(0)
    err = capsys.readouterr().err
    return info.value.code, [line for line in err.splitlines() if line.startswith("error")], err


def train_args(tiny_model, tiny_world, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--model", str(tiny_model),
        "--method", "mcse",
        "--text-corpus", tiny_world["text"],
        "--caption-corpus", tiny_world["captions"],
        "--feature", f"image={tiny_world['image']}",
        "--batch-size", "8",
        "--max-steps", "2",
        "--eval-steps", "2",
        "--eval-data", "",
        "--no-final-eval",
        "--device", "cpu",
        "--output-dir", str(out),
        *extra,
    ]  # fmt: skip


def refused(args, monkeypatch, capsys, *words: str) -> str:
    """Assert one ``error:`` line holding every word, exit 2, no traceback; return the line."""
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 2, err
    assert len(errors) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# ---- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--lr", "0"], ["learning_rate (--lr)", "above 0"]),
        (["--epochs", "0"], ["epochs (--epochs)"]),
        (["--epochs", "-3"], ["epochs (--epochs)"]),
        (["--eval-steps", "0"], ["eval_steps"]),
        (["--max-seq-length", "0"], ["max_seq_length"]),
        (["--device", "bogus"], ["--device", "bogus"]),
        (["--pooler", "bogus"], ["--pooler 'bogus'", "cls_before_pooler"]),
        (["--mixing", "sideways"], ["mixing"]),
        (["--expect-fingerprint", "imgae=" + "0" * 64], ["imgae", "roles: image"]),
        (["--method-arg", "temperature=warm"], ["temperature", "must be a number"]),
        (["--method-arg", "tempreature=0.1"], ["no setting tempreature"]),
        (["--method", "mcsee"], ["unknown method 'mcsee'"]),
    ],
)
def test_bad_setting_is_one_line_before_the_model_loads(
    flags, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    out = tmp_path / "run"
    refused(train_args(tiny_model, tiny_world, out, *flags), monkeypatch, capsys, *words)
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"batch_size": "64"}', ["batch_size", "'64'"]),
        ('{"learning_rate": "x"}', ["learning_rate", "'x'"]),
        ("[1, 2, 3]", ["must hold an object"]),
    ],
)
def test_bad_config_file_is_one_line(
    text, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    config = tmp_path / "run.json"
    config.write_text(text)
    args = [*train_args(tiny_model, tiny_world, tmp_path / "run"), "--config", str(config)]
    refused(args, monkeypatch, capsys, str(config), *words)


@pytest.mark.parametrize("var", ["RANK", "WORLD_SIZE", "LOCAL_RANK"])
def test_garbage_torchrun_variable_is_one_line(
    var, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv(var, "abc")
    out = tmp_path / "run"
    refused(train_args(tiny_model, tiny_world, out), monkeypatch, capsys, f"{var}='abc'")
    assert not out.exists()


def test_cuda_device_without_cuda_is_refused_early(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--device", "cuda:1")
    refused(args, monkeypatch, capsys, "--device cuda:1", "no CUDA device", "--device cpu")


# ---- inputs ----------------------------------------------------------------------------------


def test_wrong_eval_data_is_found_before_training(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    wrong = tmp_path / "not-senteval"
    wrong.mkdir()
    out = tmp_path / "run"
    args = train_args(tiny_model, tiny_world, out, "--eval-data", str(wrong))
    refused(args, monkeypatch, capsys, "--eval-data", str(wrong), "--eval-data ''")
    assert not out.exists()


def test_eval_data_without_stsb_dev_is_refused(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    data = tmp_path / "senteval"
    shutil.copytree(FIXTURE_SENTEVAL, data)
    (data / "downstream" / "STS" / "STSBenchmark" / "sts-dev.csv").unlink()
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--eval-data", str(data))
    refused(args, monkeypatch, capsys, "sts-dev.csv")


def test_final_eval_files_are_checked_before_training(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    data = tmp_path / "senteval"
    shutil.copytree(FIXTURE_SENTEVAL, data)
    (data / "downstream" / "STS" / "STSBenchmark" / "sts-test.csv").write_text("")
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--eval-data", str(data))
    args.remove("--no-final-eval")
    refused(args, monkeypatch, capsys, "sts-test.csv")


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--text-corpus", ["--text-corpus", "no such file"]),
        ("--caption-corpus", ["--caption-corpus", "no such file"]),
        ("--feature", ["--feature image=", "no such folder"]),
    ],
)
def test_missing_data_path_is_named(
    flag, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    args = train_args(tiny_model, tiny_world, tmp_path / "run")
    missing = str(tmp_path / "nowhere")
    args[args.index(flag) + 1] = f"image={missing}" if flag == "--feature" else missing
    refused(args, monkeypatch, capsys, missing, *words)


def test_dry_run_refuses_missing_roles(tiny_model, tiny_world, tmp_path, monkeypatch, capsys):
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--dry-run")
    i = args.index("--feature")
    del args[i : i + 2]
    refused(args, monkeypatch, capsys, "--feature image=DIR")


@pytest.mark.parametrize(
    ("method", "words"),
    [
        ("kdmcse", ["--feature clip_image=DIR --feature clip_text=DIR",
                    "clip_image: `mmcse extract-images --teacher clip-vit-l14` writes image-clip"]),
        ("dalr", ["--feature text_teacher_simcse=DIR",
                  "`mmcse extract-text --corpus CAPTIONS_TABLE --teacher simcse` writes text-simcse/"]),
    ],
)  # fmt: skip
def test_missing_roles_name_the_command_that_makes_them(
    method, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--dry-run", "--method", method)
    i = args.index("--feature")
    del args[i : i + 2]
    refused(args, monkeypatch, capsys, *words)


def test_every_registered_role_has_its_stage1_command():
    from mmcse.methods import build_method
    from mmcse.registry import METHODS
    from mmcse.training.preflight import ROLE_COMMANDS, TEXT_TEACHER_ROLE

    roles = set()
    for name in METHODS.names():
        method = build_method(name)
        roles |= {*method.text_roles, *method.caption_roles, *method.auxiliary_roles()}
    assert roles and all(r in ROLE_COMMANDS or r.startswith(TEXT_TEACHER_ROLE) for r in roles)


def test_dry_run_passes_and_writes_nothing(tiny_model, tiny_world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    code, errors, _ = run_main(
        train_args(tiny_model, tiny_world, out, "--dry-run"), monkeypatch, capsys
    )
    assert code == 0 and not errors and not out.exists()


def test_dry_run_checks_ids_cover_the_corpus(tiny_model, tiny_world, tmp_path, monkeypatch, capsys):
    partial = tmp_path / "image-half"
    write_feature_set(
        partial,
        ["img0", "img1"],
        np.zeros((2, 16), np.float16),
        kind="image",
        dim=16,
        dtype="float16",
        dataset="tiny",
        split="train",
        producer={"teacher": "random"},
    )
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--dry-run")
    args[args.index("--feature") + 1] = f"image={partial}"
    refused(args, monkeypatch, capsys, "are not in", str(partial))


@pytest.fixture
def caption_teachers(tiny_world, tmp_path) -> dict[str, str]:
    """DALR's two text teachers, cached for the caption corpus only (what Stage 1 writes)."""
    ids = list(Corpus.open(tiny_world["captions"]).ids)
    roles = {}
    for role in ("text_teacher_simcse", "text_teacher_diffcse"):
        write_feature_set(
            tmp_path / role,
            ids,
            np.ones((len(ids), 12), np.float16),
            kind="text",
            dim=12,
            dtype="float16",
            dataset="tiny",
            split="train",
            producer={"teacher": role},
        )
        roles[role] = str(tmp_path / role)
    return roles


def test_dalr_default_teachers_point_at_teachers_on_caption(
    tiny_model, tiny_world, caption_teachers, tmp_path, monkeypatch, capsys
):
    # dalr-paper distils on every batch (eq. 14 has no text-only term); the released `dalr` on
    # caption batches only, so the caption teachers Stage 1 writes suffice for it
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--dry-run")
    for role, path in caption_teachers.items():
        args += ["--feature", f"{role}={path}"]
    code, errors, _ = run_main([*args, "--method", "dalr"], monkeypatch, capsys)
    assert code == 0 and not errors
    args += ["--method", "dalr-paper", "--method-arg", "simcse_weight=1"]
    refused(args, monkeypatch, capsys, "are not in", "teachers_on=caption")
    code, errors, _ = run_main([*args, "--method-arg", "teachers_on=caption"], monkeypatch, capsys)
    assert code == 0 and not errors


def test_dalr_paper_on_captions_only_leaves_text_batches_nothing_to_learn(
    tiny_model, tiny_world, caption_teachers, tmp_path, monkeypatch, capsys
):
    """dalr-paper has no ℓ_text: with teachers_on=caption no term applies to a text batch, and
    the real run used to end in "element 0 of tensors does not require grad" at its first one;
    so it is refused, and the teachers_on hint is not given for it."""
    args = train_args(
        tiny_model, tiny_world, tmp_path / "run", "--dry-run", "--method", "dalr-paper"
    )
    for role, path in caption_teachers.items():
        args += ["--feature", f"{role}={path}"]
    line = refused(args, monkeypatch, capsys, "are not in")
    assert "teachers_on" not in line
    args += ["--method-arg", "teachers_on=caption"]
    refused(args, monkeypatch, capsys, "'dalr-paper' has no active loss term for text batches")
    code, errors, _ = run_main([*args, "--mixing", "caption-only"], monkeypatch, capsys)
    assert code == 0 and not errors


def test_missing_image_role_gets_no_teachers_hint(
    tiny_model, tiny_world, caption_teachers, tmp_path, monkeypatch, capsys
):
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--method", "dalr", "--dry-run")
    i = args.index("--feature")
    del args[i : i + 2]
    for role, path in caption_teachers.items():
        args += ["--feature", f"{role}={path}"]
    line = refused(args, monkeypatch, capsys, "--feature image=DIR")
    assert "teachers_on" not in line


def test_corpus_smaller_than_a_batch_is_refused_before_training(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    # the last partial batch is kept by default (one partial batch); --drop-last leaves none
    args = train_args(
        tiny_model, tiny_world, tmp_path / "run", "--batch-size", "4096", "--drop-last"
    )
    refused(args, monkeypatch, capsys, "fewer than one global batch", "--batch-size")


# ---- the student -------------------------------------------------------------------------------


def test_missing_model_path_is_one_line(tiny_model, tiny_world, tmp_path, monkeypatch, capsys):
    missing = str(tmp_path / "no-model")
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--model", missing)
    refused(args, monkeypatch, capsys, "--model", missing, "no such folder")


def test_folder_without_config_is_not_a_model(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--model", str(tmp_path))
    refused(args, monkeypatch, capsys, "--model", "config.json")


def test_hub_id_offline_is_one_fast_line(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_id = "mmcse-test-org/no-such-model"
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--model", hub_id)
    refused(args, monkeypatch, capsys, hub_id, "HF_HUB_OFFLINE", "--model DIR")


def test_unreachable_hub_is_one_line_without_retries(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    import socket

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def unreachable(address, timeout=None):
        calls.append(address)
        raise OSError(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--model", "bert-base-uncased")
    refused(args, monkeypatch, capsys, "bert-base-uncased", "cannot be reached")
    assert len(calls) == 1  # one probe, not the hub client's retry loop


# ---- the output folder -------------------------------------------------------------------------


def test_non_empty_output_dir_is_refused_then_overwritten(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    stale = out / BEST_DIR
    stale.mkdir(parents=True)
    (stale / "mmcse_run.json").write_text(json.dumps({"step": 999}))
    (out / "metrics.jsonl").write_text('{"step": 999}\n')
    (out / "notes.txt").write_text("mine")
    args = train_args(tiny_model, tiny_world, out)
    refused(args, monkeypatch, capsys, str(out), "not empty", "--overwrite", "--resume")
    refused([*args, "--dry-run"], monkeypatch, capsys, "not empty")
    assert (out / "metrics.jsonl").read_text() == '{"step": 999}\n'  # untouched

    code, errors, err = run_main([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and not errors, err
    info = json.loads((out / BEST_DIR / "mmcse_run.json").read_text())
    assert info["step"] == 2  # the stale checkpoint is gone, not mixed in
    assert all(
        json.loads(line)["step"] <= 2 for line in (out / "metrics.jsonl").read_text().splitlines()
    )
    assert (out / "notes.txt").read_text() == "mine"  # only what a run writes is replaced


def test_a_run_folder_another_process_trains_into_is_refused(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """Two processes would write one run (two ``recipes run`` of a table into one folder):
    the second is refused in one line before it writes anything; once the first is gone the
    folder is free."""
    from mmcse.rundir import RunDir

    out = tmp_path / "run"
    args = train_args(tiny_model, tiny_world, out, "--overwrite")
    with RunDir(out).lock():  # what a training process holds (its own open file description)
        refused(args, monkeypatch, capsys, str(out), "is in use", "--output-dir")
        assert list(out.iterdir()) == []
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 0 and not errors, err


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_varlen_attention_off_cuda_is_one_line(
    device, tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    """It died at the first forward in ``aten::_flash_attention_forward`` (CPU backend)."""
    monkeypatch.setattr("mmcse.training.preflight.default_device_name", lambda: "cpu")
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--packing", "--dropout", "0",
                      "--attn-implementation", "varlen", "--device", device)  # fmt: skip
    refused(args, monkeypatch, capsys, "varlen runs on CUDA only", "on cpu", "sdpa")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "precisions, named",
    [
        (["--precision", "fp32"], "--precision fp32"),  # no evaluation: --eval-data ''
        (["--eval-data", "sts"], "--eval-precision fp32"),  # the STS evaluation's default
        (["--precision", "fp32", "--eval-data", "sts"], "--precision and --eval-precision fp32"),
        (["--eval-data", "sts", "--eval-precision", "bf16"], None),  # refused later: no sts/
    ],
)
def test_varlen_attention_in_fp32_is_one_line(
    precisions, named, tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    """On an H200 it died at the first forward: "FlashAttention only support fp16 and bf16"."""
    monkeypatch.setattr("mmcse.training.preflight.default_device_name", lambda: "cuda:0")
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--packing", "--dropout", "0",
                      "--attn-implementation", "varlen", "--device", "auto", *precisions)  # fmt: skip
    if named is None:
        refused(args, monkeypatch, capsys, "--eval-data")
    else:
        refused(args, monkeypatch, capsys, "bf16/fp16 only", named)
    assert not (tmp_path / "run").exists()


def test_output_dir_that_is_a_file_is_refused(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    refused(train_args(tiny_model, tiny_world, blocker), monkeypatch, capsys, "is a file")
    args = train_args(tiny_model, tiny_world, blocker / "run")
    refused(args, monkeypatch, capsys, str(blocker), "is a file")


# ---- OS errors during training -----------------------------------------------------------------


class SafetensorError(Exception):
    """What safetensors' Rust writer raises on a full disk (same message shape)."""


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), ["No space left", "free some space"]),
        (
            SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            ),
            ["No space left", "free some space"],
        ),
        (
            RuntimeError(
                "[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file data/0: file write failed"
            ),
            ["writing a file failed"],
        ),
    ],
)
def test_full_disk_during_training_names_the_folder(
    error, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    def full_disk(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(SentenceEncoder, "save_checkpoint", full_disk)
    out = tmp_path / "run"
    refused(train_args(tiny_model, tiny_world, out), monkeypatch, capsys, str(out), *words)


def test_read_only_file_is_named_with_its_path(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "run" / BEST_DIR / "model.safetensors"

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(target))

    monkeypatch.setattr(SentenceEncoder, "save_checkpoint", read_only)
    args = train_args(tiny_model, tiny_world, tmp_path / "run")
    refused(args, monkeypatch, capsys, str(target), "Read-only file system", "write elsewhere")


def test_programming_errors_keep_their_traceback(tmp_path):
    with pytest.raises(ZeroDivisionError), naming_os_errors(tmp_path):
        _ = 1 / 0
    with pytest.raises(RuntimeError, match="unrelated"), naming_os_errors(tmp_path):
        raise RuntimeError("unrelated")
    with pytest.raises(MmcseError, match=str(tmp_path)), naming_os_errors(tmp_path):
        raise OSError(errno.ENOSPC, "No space left on device")


# ---- eval data faults --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("relative", "content", "words"),
    [
        ("STS/STSBenchmark/sts-test.csv", "", ["sts-test.csv", "0 scored sentence pair"]),
        ("STS/STS13-en-test/STS.gs.FNWN.txt", "\n\n\n", ["STS.gs.FNWN.txt", "0 scored"]),
        ("STS/STS15-en-test/STS.gs.images.txt", "nan\n\n2.8\n", ["STS.gs.images.txt:1", "finite"]),
        ("SICK/SICK_test_annotated.txt", "header\n", ["SICK_test_annotated.txt", "0 scored"]),
    ],
)
def test_eval_refuses_broken_test_files_naming_them(
    relative, content, words, tiny_model, tmp_path, monkeypatch, capsys
):
    data = tmp_path / "senteval"
    shutil.copytree(FIXTURE_SENTEVAL, data)
    (data / "downstream" / relative).write_text(content)
    args = ["eval", "--model", str(tiny_model), "--data", str(data), "--device", "cpu"]
    refused(args, monkeypatch, capsys, *words)


# ---- recipes and ablations: refused before the first seed trains ------------------------------


@pytest.fixture
def mcse_cache(tmp_path):
    from support.worlds import write_tiny_cache

    from mmcse.recipes import get_recipe

    recipe = get_recipe("mcse/wiki+flickr/bert")
    write_tiny_cache(recipe, tmp_path / "cache")
    return recipe, tmp_path / "cache"


def test_recipe_with_offline_hub_id_is_one_line(
    mcse_cache, tmp_path, monkeypatch, capsys, no_model_load
):
    recipe, cache = mcse_cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_id = "mmcse-test-org/no-such-model"
    args = ["recipes", "run", recipe.name, "--cache-root", str(cache), "--model", hub_id,
            "--seeds", "0", "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    refused(args, monkeypatch, capsys, hub_id, "HF_HUB_OFFLINE")
    assert not (tmp_path / "runs" / "seed0").exists()


def test_used_seed_folder_is_refused_before_any_seed_trains(
    mcse_cache, tmp_path, monkeypatch, capsys
):
    from mmcse.recipes import runs as recipes

    recipe, cache = mcse_cache
    trained = []
    monkeypatch.setattr(recipes, "train_one", lambda cfg: trained.append(cfg.output_dir))
    (tmp_path / "runs" / "seed1").mkdir(parents=True)
    (tmp_path / "runs" / "seed1" / "metrics.jsonl").write_text("{}\n")
    args = ["recipes", "run", recipe.name, "--cache-root", str(cache), "--seeds", "0,1",
            "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    refused(args, monkeypatch, capsys, "seed1", "not empty", "--overwrite")
    assert trained == []
    code, errors, err = run_main([*args, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and not errors, err
    assert [Path(p).name for p in trained] == ["seed0", "seed1"]


def test_ablation_checks_every_row_before_the_first_trains(
    mcse_cache, tmp_path, monkeypatch, capsys
):
    from mmcse.recipes import runs as recipes

    recipe, cache = mcse_cache
    trained = []
    monkeypatch.setattr(recipes, "train_one", lambda cfg: trained.append(cfg.output_dir))
    used = tmp_path / "abl" / "wo-image_text" / "seed0"
    used.mkdir(parents=True)
    (used / "config.json").write_text("{}")
    args = ["ablate", "--recipe", recipe.name, "--drop", "image_text", "--cache-root", str(cache),
            "--seeds", "0", "--output-dir", str(tmp_path / "abl")]  # fmt: skip
    refused(args, monkeypatch, capsys, str(used), "not empty")
    assert trained == []


# ---- more classes: text encodings, model folders, role values ---------------------------------


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"a dog runs\nthe cat \xff sits\n", ["line 2", "invalid UTF-8", "--bad-lines skip"]),
        ("a dog runs\n\ud800".encode("utf-16", "surrogatepass"), [":2:", "not valid utf-16"]),
        ("a dog runs\n".encode("utf-16-le"), ["NUL bytes", "convert it to UTF-8"]),
        ("a dog runs\n".encode("utf-16-be"), ["NUL bytes", "convert it to UTF-8"]),
        (b"a dog runs\nthe cat \x00 sits\na bird\n", ["line 2", "a NUL byte at byte 8"]),
    ],
)
def test_text_corpus_that_does_not_decode_is_refused_naming_the_line(
    content, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """Under ``--bad-lines refuse`` (a UTF-16/32 file without a BOM, or with a bad unit, is
    refused whatever the policy: it is decoded whole)."""
    corpus = tmp_path / "wiki.txt"
    corpus.write_bytes(content)
    args = train_args(
        tiny_model, tiny_world, tmp_path / "run", "--text-corpus", str(corpus),
        "--bad-lines", "refuse",
    )  # fmt: skip
    refused(args, monkeypatch, capsys, "--text-corpus", str(corpus), *words)


def test_max_seq_length_beyond_the_models_positions_is_refused(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    limit = json.loads((Path(tiny_model) / "config.json").read_text())["max_position_embeddings"]
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--max-seq-length", str(limit + 1))
    refused(args, monkeypatch, capsys, f"--max-seq-length {limit + 1}", f"{limit} or less")


def test_model_folder_without_tokenizer_or_with_broken_config(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    bare = tmp_path / "bare-model"
    bare.mkdir()
    shutil.copy(Path(tiny_model) / "config.json", bare / "config.json")
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--model", str(bare))
    refused(args, monkeypatch, capsys, str(bare), "no weights")
    shutil.copy(Path(tiny_model) / "model.safetensors", bare / "model.safetensors")
    refused(args, monkeypatch, capsys, str(bare), "no vocabulary beyond its special tokens")
    (bare / "config.json").write_text("{not json")
    refused(args, monkeypatch, capsys, str(bare / "config.json"), "not valid JSON")


def test_empty_feature_value_and_pinned_multi_set_role(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    args = train_args(tiny_model, tiny_world, tmp_path / "run")
    i = args.index("--feature") + 1
    args[i] = "image="
    refused(args, monkeypatch, capsys, "--feature image=", "names no folder")
    args[i] = f"image={tiny_world['image']},{tiny_world['image']}"
    pinned = [*args, "--expect-fingerprint", "image=" + "0" * 64]
    refused(pinned, monkeypatch, capsys, "--expect-fingerprint image", "2 sets")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--device", "bogus"], ["--device", "'bogus'"]),
        (["--batch-size", "0"], ["--batch-size", "at least 1"]),
    ],
)
def test_eval_settings_are_one_line(flags, words, tiny_model, monkeypatch, capsys, no_model_load):
    args = ["eval", "--model", str(tiny_model), "--data", str(FIXTURE_SENTEVAL), *flags]
    refused(args, monkeypatch, capsys, *words)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_text_corpus_file_is_decoded_by_its_byte_order_mark(tmp_path, encoding):
    """A ``.txt`` corpus in UTF-16/32 with a BOM (or UTF-8 with one) gives the sentences
    themselves, never U+FFFD garbage; ids are the same line numbers in every encoding."""
    from support.corpora import read_corpus

    path = tmp_path / "wiki.txt"
    path.write_bytes("héllo wörld\n\nzweite Zeile — 東京\n".encode(encoding))
    ids, texts, image_ids, _ = read_corpus(str(path))
    assert texts == ["héllo wörld", "zweite Zeile — 東京"]
    assert list(ids) == ["wiki:0", "wiki:2"] and image_ids is None


def test_text_corpus_that_is_not_utf8_is_one_read_policy(tmp_path, caplog):
    """read_corpus never keeps U+FFFD rows: a line that is not UTF-8 is left out and reported
    (``skip``), or refuses the file naming the line (``refuse``)."""
    from support.corpora import read_corpus

    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line\nsecond line\ncaf\u00e9 au lait\n".encode("latin-1"))
    ids, texts, _, _ = read_corpus(str(bad))
    assert texts == ["first line", "second line"] and list(ids) == ["latin1:0", "latin1:1"]
    assert (
        "1 left out (1 undecodable) of 3 rows, e.g. line 3: undecodable: invalid UTF-8"
        in caplog.text
    )
    with pytest.raises(MmcseError, match=f"{bad}: line 3: undecodable: invalid UTF-8 at byte 3"):
        read_corpus(str(bad), bad_lines="refuse")


# ---- feature sets a run does not read, or that came from random weights ---------------------


def test_feature_role_the_method_never_reads_is_refused(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    out = tmp_path / "run"
    args = train_args(tiny_model, tiny_world, out, "--feature", f"imgae={tiny_world['image']}")
    refused(args, monkeypatch, capsys, "--feature imgae=", "reads no role 'imgae'", "roles: image")
    assert not out.exists()


def test_feature_role_this_run_leaves_unread_is_a_warning(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """MCSE reads image features on caption batches only; a text-only run never opens them."""
    args = train_args(
        tiny_model, tiny_world, tmp_path / "run", "--dry-run", "--mixing", "text-only"
    )
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 0 and not errors, err
    warned = [line for line in err.splitlines() if "not read by this run" in line]
    assert len(warned) == 1 and f"--feature image={tiny_world['image']}" in warned[0]
    assert "trains on none (mixing text-only)" in warned[0]
    code, errors, err = run_main(args[:-2], monkeypatch, capsys)  # interleave: it is read
    assert code == 0 and "not read by this run" not in err


def test_features_of_a_random_weight_teacher_are_a_warning(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    random_set = tmp_path / "random-image"
    ids = [f"img{i}" for i in range(32)]
    write_feature_set(
        random_set, ids, np.zeros((32, 16), np.float16), kind="image", dim=16, dtype="float16",
        dataset="tiny", split="train",
        producer={"teacher": "clip-vit-b32", "weights": "random", "weights_sha256": "random"},
    )  # fmt: skip
    args = train_args(tiny_model, tiny_world, tmp_path / "run", "--dry-run")
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 0 and "RANDOM weights" not in err  # the tiny world's teacher is not named so
    args[args.index("--feature") + 1] = f"image={random_set}"
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 0 and not errors, err
    warned = [line for line in err.splitlines() if "RANDOM weights" in line]
    assert len(warned) == 1 and str(random_set) in warned[0] and "clip-vit-b32" in warned[0]


# ---- recipes and ablations: refused up front as the real run refuses -----------------------


@pytest.mark.parametrize(
    "command",
    [
        ["recipes", "run", "mcse:table1"],
        ["recipes", "run", "mcse/wiki+flickr/bert"],
        ["ablate", "--recipe", "mcse/wiki+flickr/bert", "--drop", "image_text"],
    ],
)
def test_every_dry_run_checks_its_students_load(
    command, tmp_path, monkeypatch, capsys, no_model_load
):
    """Offline, a recipe's hub-id student cannot load: the dry run says so in one line instead
    of planning runs that would each fail at their start (as ``train --dry-run`` does)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = [*command, "--dry-run", "--seeds", "0", "--cache-root", str(tmp_path / "cache"),
            "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    refused(args, monkeypatch, capsys, "mcse/wiki+flickr/bert", "bert-base-uncased",
            "HF_HUB_OFFLINE")  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_a_tables_dry_run_checks_each_student_once(tmp_path, monkeypatch, capsys):
    from mmcse.training import preflight

    asked = []
    monkeypatch.setattr(preflight, "check_hub_id", lambda name, flag: asked.append(name))
    args = ["recipes", "run", "mcse:table1", "--dry-run", "--cache-root", str(tmp_path / "c"),
            "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    code, errors, err = run_main(args, monkeypatch, capsys)
    assert code == 0 and not errors, err
    assert sorted(asked) == ["bert-base-uncased", "roberta-base"]  # 50 runs, 2 students


@pytest.mark.parametrize("dry_run", [True, False])
def test_recipe_unknown_method_arg_is_refused_in_the_dry_run_as_in_the_run(
    dry_run, mcse_cache, tiny_model, tmp_path, monkeypatch, capsys, no_model_load
):
    recipe, cache = mcse_cache
    out = tmp_path / "runs"
    args = ["recipes", "run", recipe.name, "--cache-root", str(cache), "--model", str(tiny_model),
            "--seeds", "0", "--output-dir", str(out), "--set", 'method_args={"lambda_": 0.1}',
            *(["--dry-run"] if dry_run else [])]  # fmt: skip
    refused(args, monkeypatch, capsys, recipe.name, "lambda_")
    assert not out.exists()


def test_recipe_seed_given_twice_is_refused_up_front(
    mcse_cache, tmp_path, monkeypatch, capsys, no_model_load
):
    recipe, cache = mcse_cache
    args = ["recipes", "run", recipe.name, "--cache-root", str(cache), "--seeds", "0,1,0",
            "--output-dir", str(tmp_path / "runs")]  # fmt: skip
    refused(args, monkeypatch, capsys, "--seeds 0,1,0", "seed 0 given more than once")
    refused([*args, "--dry-run"], monkeypatch, capsys, "seed 0 given more than once")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("drop", "words"),
    [
        ("simcse+image_text", ["w/o simcse & image_text:", "no loss term left"]),
        ("simcse", ["w/o simcse:", "no active loss term for text batches"]),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_ablation_row_with_nothing_to_train_is_refused_before_any_row_trains(
    drop, words, dry_run, mcse_cache, tmp_path, monkeypatch, capsys
):
    from mmcse.recipes import runs as recipes

    recipe, cache = mcse_cache
    trained = []
    monkeypatch.setattr(recipes, "train_one", lambda cfg: trained.append(cfg.output_dir))
    args = ["ablate", "--recipe", recipe.name, "--drop", f"image_text,{drop}",
            "--cache-root", str(cache), "--seeds", "0", "--output-dir", str(tmp_path / "abl"),
            *(["--dry-run"] if dry_run else [])]  # fmt: skip
    refused(args, monkeypatch, capsys, *words)
    assert trained == [] and not (tmp_path / "abl").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--method-arg", "temperature=0"], ["temperature", "above 0", "got 0.0"]),
        (["--method-arg", "image_temperature=-0.05"], ["image_temperature", "above 0"]),
        (["--method-arg", "temperature=NaN"], ["temperature", "finite", "nan"]),
        (["--lr", "nan"], ["--lr", "finite", "nan"]),
        (["--lr", "-1e-5"], ["--lr", "above 0"]),
        (["--lr", "inf"], ["--lr", "finite"]),
        (["--method-arg", "image_text_weight=-1"], ["image_text_weight", "at least 0"]),
    ],
)
def test_impossible_settings_are_refused_at_preflight_naming_them(
    flags, words, tiny_model, tiny_world, tmp_path, monkeypatch, capsys, no_model_load
):
    """A temperature of 0 used to fail at step 1 as "loss became nan ... lower the lr"."""
    out = tmp_path / "run"
    refused(train_args(tiny_model, tiny_world, out, *flags), monkeypatch, capsys, *words)
    assert not out.exists()
