"""Training on the token cache: written by the first run beside the corpus, mapped by the next,
a new entry for a new key, the same losses with or without it, and a preflight that tokenises
nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.runs import tiny_mcse_settings

from mmcse.cache import Corpus, FeatureSet
from mmcse.errors import MmcseError
from mmcse.hub import load_tokenizer
from mmcse.methods import build_method
from mmcse.rundir import METRICS_FILE
from mmcse.tiny import build_tiny_bert
from mmcse.training import corpora
from mmcse.training.batch_order import CAPTION, TEXT
from mmcse.training.config import TrainConfig
from mmcse.training.data import TrainData
from mmcse.training.loop import train
from mmcse.training.preflight import preflight


@pytest.fixture
def world(tiny_world, tmp_path) -> dict[str, str]:
    """A private copy of the tiny world (its token entries start cold)."""
    root = tmp_path / "world"
    root.mkdir()
    copied = {}
    for name, path in tiny_world.items():
        source = Path(path)
        target = root / source.name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
        copied[name] = str(target)
    return copied


def mcse_config(tiny_model, world, out, **overrides) -> TrainConfig:
    return TrainConfig(**tiny_mcse_settings(tiny_model, world, out, **overrides))


def load(cfg: TrainConfig, model) -> TrainData:
    return TrainData(cfg, load_tokenizer(str(model)), build_method(cfg.method))


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def token_rows(data: TrainData, kind: str) -> np.ndarray:
    source = data.sources[kind]
    return np.concatenate([source.lengths[:, None], source.input_ids], axis=1)


def no_encoding(*_args, **_kwargs):
    raise AssertionError("tokenised although the token cache is warm")


def test_first_run_writes_entries_in_the_cache_and_the_next_maps_them(
    tiny_model, world, tmp_path, monkeypatch, project_cache
):
    """A corpus table's entry goes beside it (in the cache); the user's own sentence file's goes
    to the project's cache/tokens/, never beside the user's data."""
    cfg = mcse_config(tiny_model, world, tmp_path / "run")
    cold = load(cfg, tiny_model)
    root = Path(world["text"]).parent
    where = {CAPTION: root / "tokens", TEXT: project_cache / "tokens"}
    assert [name.split("-")[0] for name in entries(where[CAPTION])] == ["captions"]
    assert [name.split("-")[0] for name in entries(where[TEXT])] == ["wiki"]
    for folder in where.values():
        manifest = FeatureSet.open(folder / entries(folder)[0]).manifest
        assert manifest.kind == "tokens" and manifest.producer["max_length"] == 32

    monkeypatch.setattr(corpora, "encode_rows", no_encoding)
    warm = load(cfg, tiny_model)
    for kind in (TEXT, CAPTION):
        np.testing.assert_array_equal(token_rows(warm, kind), token_rows(cold, kind))
        assert warm.sources[kind].tokens.path.parent == where[kind]
    monkeypatch.undo()

    off = load(mcse_config(tiny_model, world, tmp_path / "run", token_cache="off"), tiny_model)
    for kind in (TEXT, CAPTION):
        assert off.sources[kind].tokens.path is None
        np.testing.assert_array_equal(token_rows(off, kind), token_rows(cold, kind))
    # the ids the old per-run path gave: the tokenizer's own call on every sentence
    tokenizer = load_tokenizer(str(tiny_model))
    texts = cold.sources[TEXT].texts
    for row, text in zip(token_rows(cold, TEXT), texts, strict=True):
        ids = tokenizer(text, max_length=32, truncation=True)["input_ids"]
        assert row[0] == len(ids) and row[1 : 1 + len(ids)].tolist() == ids


def test_a_new_corpus_tokenizer_or_max_length_gets_its_own_entry(
    tiny_model, world, tmp_path, project_cache
):
    text_only = {"method": "simcse", "mixing": "text-only", "features": {}}
    cfg = mcse_config(tiny_model, world, tmp_path / "run", **text_only)
    folder = project_cache / "tokens"
    first = load(cfg, tiny_model)
    assert len(entries(folder)) == 1

    load(
        mcse_config(tiny_model, world, tmp_path / "run", max_seq_length=16, **text_only), tiny_model
    )
    assert len(entries(folder)) == 2
    other = build_tiny_bert(tmp_path / "other-model", texts=["another vocabulary entirely"])
    load(cfg, other)
    assert len(entries(folder)) == 3
    with open(world["text"], "a", encoding="utf-8") as handle:
        handle.write("a brand new sentence\n")
    edited = load(cfg, tiny_model)
    assert len(entries(folder)) == 4
    assert len(edited.sources[TEXT]) == len(first.sources[TEXT]) + 1


def test_a_named_folder_holds_the_entries_and_off_writes_none(tiny_model, world, tmp_path):
    named = tmp_path / "token-cache"
    load(mcse_config(tiny_model, world, tmp_path / "run", token_cache=str(named)), tiny_model)
    assert len(entries(named)) == 2
    assert not (Path(world["text"]).parent / "tokens").exists()
    load(mcse_config(tiny_model, world, tmp_path / "run", token_cache="off"), tiny_model)
    assert not (Path(world["text"]).parent / "tokens").exists()


def test_a_named_folder_that_cannot_be_written_is_one_error_line(tiny_model, world, tmp_path):
    (tmp_path / "file").write_text("x")
    cfg = mcse_config(tiny_model, world, tmp_path / "run", token_cache=str(tmp_path / "file"))
    with pytest.raises(MmcseError, match="cannot create the folder") as error:
        load(cfg, tiny_model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_preflight_refuses_a_token_cache_folder_the_run_could_not_write(
    where, tiny_model, world, tmp_path, monkeypatch, capsys
):
    """Before any work: `--dry-run` fails with one line, not the run after tokenising."""
    from support.cli import assert_one_error, run_main

    (tmp_path / "file").write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # read-only even for root (mmcse.cache.tokens.writable)
    folder = tmp_path / "file" / "tokens" if where == "under-a-file" else locked / "tokens"
    cfg = mcse_config(tiny_model, world, tmp_path / "run", token_cache=str(folder))
    try:
        with pytest.raises(MmcseError, match=f"token_cache {folder}: cannot create the folder"):
            preflight(cfg)
        config = tmp_path / "train.json"
        config.write_text(json.dumps(cfg.to_dict()))
        code, stderr = run_main(
            ["train", "--config", str(config), "--dry-run"], monkeypatch, capsys
        )
        assert_one_error(code, stderr, f"token_cache {folder}")
        monkeypatch.setattr(corpora, "encode_rows", no_encoding)  # refused before tokenising
        with pytest.raises(MmcseError, match="cannot create the folder"):
            load(cfg, tiny_model)
    finally:
        locked.chmod(0o755)
    assert not folder.exists()


def test_token_cache_setting_is_checked():
    with pytest.raises(MmcseError, match="token_cache"):
        TrainConfig(token_cache="  ")


def test_preflight_reads_neither_tokens_nor_texts(tiny_model, world, tmp_path, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("preflight tokenised or read the texts")

    monkeypatch.setattr(corpora, "encode_rows", refuse)
    monkeypatch.setattr(Corpus, "texts", property(refuse))
    monkeypatch.setattr(Corpus, "ids", property(refuse))  # captions join by image id only
    cfg = mcse_config(tiny_model, world, tmp_path / "run")
    assert preflight(cfg).method.name == "mcse"
    assert not (Path(world["text"]).parent / "tokens").exists()


def losses(out: Path) -> list[float]:
    lines = (out / METRICS_FILE).read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if "loss" in json.loads(line)]


def test_runs_with_and_without_the_token_cache_log_the_same_losses(tiny_model, world, tmp_path):
    runs = {
        "off": {"token_cache": "off"},
        "cold": {"token_cache": str(tmp_path / "tokens")},
        "warm": {"token_cache": str(tmp_path / "tokens")},
    }
    logged = {}
    for name, overrides in runs.items():
        out = tmp_path / name
        train(mcse_config(tiny_model, world, out, max_steps=6, log_every=1, **overrides))
        logged[name] = losses(out)
    assert len(logged["off"]) == 6
    assert logged["off"] == logged["cold"] == logged["warm"]
