"""Fault injection against the cache: every corruption is refused when a set is opened (so
training never reads it), reported by ``mmcse cache verify`` as one ``error:`` line naming the
file (exit 2), and nothing corrupt is left looking valid."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from support.cli import assert_one_error, run_main

from mmcse import files
from mmcse.cache import (
    Corpus,
    FeatureSet,
    FeatureSetWriter,
    integrity,
    layout,
    list_sets,
    write_corpus,
)
from mmcse.cache import write_feature_set as write_set
from mmcse.cache.arrow import write_shard
from mmcse.cache.layout import (
    sha256_ids,
)
from mmcse.errors import CacheError
from mmcse.files import sha256_file, temp_path

META = dict(kind="image", dim=4, dtype="float16", dataset="d", split="train", producer={"t": 1})


def make_set(path: Path, rows: int = 6, shard_rows: int = 3, **meta) -> Path:
    values = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) / 10
    write_set(
        path, [f"id{i}" for i in range(rows)], values, shard_rows=shard_rows, **{**META, **meta}
    )
    return path


def edit_manifest(path: Path, change) -> None:
    manifest = path / "manifest.json"
    payload = json.loads(manifest.read_text())
    payload = change(payload)
    manifest.write_text(json.dumps(payload))


def refused_everywhere(path: Path, monkeypatch, capsys, *fragments: str) -> None:
    """Opening the set fails (so `train` cannot read it) and `cache verify` exits 2."""
    with pytest.raises(CacheError) as info:
        FeatureSet.open(path)
    for fragment in fragments:
        assert fragment in str(info.value)
    code, stderr = run_main(["cache", "verify", str(path)], monkeypatch, capsys)
    assert_one_error(code, stderr, *fragments)


# ---- shard content ---------------------------------------------------------------------------


def test_flipped_byte_is_refused_on_open_and_by_verify(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    FeatureSet.open(path)  # verified once and recorded
    shard = path / "shard-00001.arrow"
    data = bytearray(shard.read_bytes())
    data[-200] ^= 0xFF
    shard.write_bytes(bytes(data))
    refused_everywhere(path, monkeypatch, capsys, str(shard), "sha256 differs")


def test_edit_with_restored_size_and_mtime_is_still_caught(tmp_path):
    """The recorded state cannot be kept by restoring a shard's mtime (its ctime moves)."""
    path = make_set(tmp_path / "s")
    FeatureSet.open(path)
    shard = path / "shard-00000.arrow"
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-300] ^= 0x01
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert shard.stat().st_size == stat.st_size and shard.stat().st_mtime_ns == stat.st_mtime_ns
    with pytest.raises(CacheError, match="sha256 differs"):
        FeatureSet.open(path)


def test_replaced_shard_is_refused(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    other = make_set(tmp_path / "other", rows=6)
    (path / "shard-00000.arrow").write_bytes((other / "shard-00001.arrow").read_bytes())
    refused_everywhere(path, monkeypatch, capsys, "shard-00000.arrow", "sha256 differs")


def test_cached_open_does_not_rehash_but_a_changed_manifest_does(tmp_path, monkeypatch):
    path = make_set(tmp_path / "s")
    FeatureSet.open(path)
    calls = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: calls.append(p) or real(p))
    FeatureSet.open(path)
    assert calls == []  # a few stat() calls, no hashing
    edit_manifest(path, lambda m: {**m, "dataset": "edited"})
    FeatureSet.open(path)  # a valid edit: re-checked (and passes), then recorded again
    assert len(calls) == 2


def _forge(path: Path, ids: list[str], rows: np.ndarray) -> None:
    """Replace shard 0 with other rows and fix every hash in the manifest: only the checks
    that do not rely on hashes can catch it."""
    shard = path / "shard-00000.arrow"
    write_shard(shard, ids, rows)

    def change(m):
        m["shards"] = [{"file": shard.name, "num_rows": len(ids), "sha256": sha256_file(shard)}]
        m["num_rows"], m["ids_sha256"] = len(ids), sha256_ids(ids)
        return m

    for extra in path.glob("shard-0000[1-9].arrow"):
        extra.unlink()
    edit_manifest(path, change)


def test_nan_and_inf_rows_are_reported_by_verify_and_refused(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    rows = np.ones((3, 4), np.float16)
    rows[1, 2], rows[2, 0] = np.nan, np.inf
    _forge(path, ["a", "b", "c"], rows)
    refused_everywhere(path, monkeypatch, capsys, "2 rows hold NaN or Inf", "'b', 'c'")


def test_duplicate_ids_are_reported(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    _forge(path, ["a", "a", "c"], np.ones((3, 4), np.float16))
    refused_everywhere(path, monkeypatch, capsys, "ids occur more than once", "'a'")


def test_writer_refuses_nan_rows(tmp_path):
    values = np.ones((2, 4), np.float32)
    values[1, 1] = np.nan
    with pytest.raises(CacheError, match="non-finite"):
        write_set(tmp_path / "s", ["a", "b"], values, **META)
    assert not (tmp_path / "s" / "manifest.json").exists()


# ---- manifest edits --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda m: {**m, "dtype": "int8"}, "stores float16 values, the manifest says int8"),
        (lambda m: {**m, "dtype": "float32"}, "the manifest says float32"),
        (lambda m: {**m, "dim": 2, "shape": [2]}, "expected 2 values/row"),
        (lambda m: {**m, "shape": [2, 2]}, "rows of shape [4], the manifest says [2, 2]"),
        (lambda m: {**m, "num_rows": 7}, "do not add up to num_rows=7"),
        (lambda m: [m], "expected a JSON object, got a JSON list"),
        (lambda m: {k: v for k, v in m.items() if k != "dtype"}, "missing fields ['dtype']"),
        (lambda m: {**m, "num_rows": "6"}, "num_rows must be a JSON integer"),
        (lambda m: {**m, "normalized": 1}, "normalized must be a JSON boolean"),
        (lambda m: {**m, "schema_version": 99}, "schema_version 99 is not 1"),
        (lambda m: {**m, "dtype": "object"}, "not a numeric feature dtype"),
        (
            lambda m: {
                **m,
                "shards": [{**m["shards"][0], "file": "../c/shard-00000.arrow"}, *m["shards"][1:]],
            },
            "must be plain names inside the set",
        ),
        (lambda m: {**m, "shards": m["shards"][::-1]}, "listed out of order"),
        (lambda m: {**m, "shards": [{**m["shards"][0], "num_rows": -3}]}, "must not be negative"),
        (lambda m: {**m, "shards": [m["shards"][0]["file"]]}, "shards[0] must be an object"),
    ],
)
def test_edited_manifest_is_one_clear_error(tmp_path, monkeypatch, capsys, change, fragment):
    path = make_set(tmp_path / "s")
    FeatureSet.open(path)
    edit_manifest(path, change)
    refused_everywhere(path, monkeypatch, capsys, fragment)
    code, _ = run_main(["cache", "ls", str(tmp_path)], monkeypatch, capsys)
    assert code == 0  # ls lists it (marked when the manifest itself is invalid)
    (entry,) = list_sets(tmp_path)
    if "manifest says" not in fragment and "values/row" not in fragment:  # shard-level
        assert entry.manifest is None and fragment in entry.problem


def test_manifest_that_is_not_json(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    (path / "manifest.json").write_text("{not json")
    refused_everywhere(path, monkeypatch, capsys, str(path / "manifest.json"), "not JSON")


#: files opened by Python code (``open``, ``os.open``, ``Path.read_bytes``…) under a watched
#: folder; an audit hook sees every one of them, whichever function opens the file
_OPENED_UNDER: dict[str, list[str]] = {}


def _record_opens(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        name = os.path.normpath(os.path.abspath(os.fsdecode(args[0])))
        for folder, opened in _OPENED_UNDER.items():
            if name.startswith(folder):
                opened.append(name)


@pytest.fixture
def opens_under():
    """``opens_under(folder)`` → the list of files opened under ``folder`` from now on."""
    if not _OPENED_UNDER.get("hooked"):
        sys.addaudithook(_record_opens)  # cannot be removed; inert once the dict is emptied
        _OPENED_UNDER["hooked"] = ["hooked"]
    yield lambda folder: _OPENED_UNDER.setdefault(str(folder), [])
    for key in [k for k in _OPENED_UNDER if k != "hooked"]:
        del _OPENED_UNDER[key]


@pytest.mark.parametrize("where", ["set", "tree"])
def test_escaping_shard_path_is_refused_before_anything_is_opened(
    tmp_path, monkeypatch, capsys, opens_under, where
):
    """A manifest naming ``../outside/shard-00000.arrow`` (a real, readable shard of another
    set): open and ``cache verify`` refuse it naming the manifest and the entry, and the
    outside file is never opened (not even to hash it)."""
    outside = make_set(tmp_path / "outside")
    path = make_set(tmp_path / "cache" / "s")
    escape = "../../outside/shard-00000.arrow"
    edit_manifest(
        path, lambda m: {**m, "shards": [{**m["shards"][0], "file": escape}, *m["shards"][1:]]}
    )
    opened = opens_under(outside)
    with pytest.raises(CacheError, match=r"shards\[0\]\.file '\.\./\.\./outside/shard-00000"):
        FeatureSet.open(path)
    target = path if where == "set" else tmp_path / "cache"
    code, stderr = run_main(["cache", "verify", str(target)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(path / "manifest.json"), f"shards[0].file {escape!r}")
    assert opened == []
    assert (outside / "shard-00000.arrow").read_bytes()  # the watch itself works
    assert opened == [str(outside / "shard-00000.arrow")]


def test_symlinked_shard_is_refused(tmp_path):
    other = make_set(tmp_path / "other")
    path = make_set(tmp_path / "s")
    shard = path / "shard-00000.arrow"
    shard.unlink()
    shard.symlink_to(other / "shard-00000.arrow")
    with pytest.raises(CacheError, match="a symlink"):
        FeatureSet.open(path)


def test_fingerprint_is_still_enforced_after_a_valid_edit(tmp_path):
    path = make_set(tmp_path / "s")
    recorded = FeatureSet.open(path).fingerprint
    edit_manifest(path, lambda m: {**m, "producer": {"t": 2}})
    with pytest.raises(CacheError, match="the run expects"):
        FeatureSet.open(path).require_fingerprint(recorded)


def test_hdf5_shard_without_its_ids_dataset(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s", backend="hdf5", rows=3)
    shard = path / "shard-00000.h5"
    with h5py.File(shard, "w") as handle:
        handle["features"] = np.ones((3, 4), np.float16)
    edit_manifest(
        path, lambda m: {**m, "shards": [{**m["shards"][0], "sha256": sha256_file(shard)}]}
    )
    refused_everywhere(path, monkeypatch, capsys, str(shard), "'ids'")


def test_corpus_edits_are_refused(tmp_path):
    path = tmp_path / "c"
    write_corpus(path, ["a", "b"], ["x", "y"], dataset="d", split="train")
    Corpus.open(path)
    shard = path / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[-150] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.raises(CacheError, match="sha256 differs"):
        Corpus.open(path)


# ---- verify ROOT, rm, OS errors, temp files, empty sets ---------------------------------------


def test_verify_root_checks_every_set(tmp_path, monkeypatch, capsys):
    good = make_set(tmp_path / "root" / "a" / "good")
    bad = make_set(tmp_path / "root" / "b" / "bad")
    (bad / "shard-00000.arrow").write_bytes(b"garbage")
    code, stderr = run_main(["cache", "verify", str(tmp_path / "root")], monkeypatch, capsys)
    assert_one_error(code, stderr, str(bad / "shard-00000.arrow"))
    code, _ = run_main(["cache", "verify", str(good.parent)], monkeypatch, capsys)
    assert code == 0
    code, stderr = run_main(["cache", "verify", str(tmp_path)], monkeypatch, capsys)
    assert code == 2


def test_verify_of_a_folder_without_sets(tmp_path, monkeypatch, capsys):
    code, stderr = run_main(["cache", "verify", str(tmp_path)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(tmp_path), "no feature set or corpus")


def test_rm_refuses_a_symlink_and_leaves_the_target_intact(tmp_path, monkeypatch, capsys):
    target = make_set(tmp_path / "target")
    before = sorted(p.name for p in target.iterdir())
    link = tmp_path / "link"
    link.symlink_to(target)
    code, stderr = run_main(["cache", "rm", str(link)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(link), "symbolic link")
    assert sorted(p.name for p in target.iterdir()) == before
    FeatureSet.open(target)


def test_rm_checks_everything_before_deleting(tmp_path, monkeypatch, capsys):
    path = make_set(tmp_path / "s")
    (path / "notes").mkdir()
    code, stderr = run_main(["cache", "rm", str(path)], monkeypatch, capsys)
    assert_one_error(code, stderr, "no writer made")
    (path / "notes").rmdir()
    monkeypatch.setattr(os, "access", lambda *a, **k: False)  # a read-only folder
    code, stderr = run_main(["cache", "rm", str(path)], monkeypatch, capsys)
    assert_one_error(code, stderr, "not writable", "nothing was deleted")
    monkeypatch.undo()
    FeatureSet.open(path)  # untouched
    code, _ = run_main(["cache", "rm", str(path)], monkeypatch, capsys)
    assert code == 0 and not path.exists()


@pytest.mark.parametrize(
    ("error", "fragment"),
    [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "read-only"), (errno.EACCES, "permission")],
)
def test_os_errors_while_writing_name_the_path(tmp_path, monkeypatch, error, fragment):
    def fail(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(CacheError) as info:
        make_set(tmp_path / "s")
    assert str(tmp_path / "s") in str(info.value) and fragment in str(info.value)
    monkeypatch.undo()
    assert not (tmp_path / "s" / "manifest.json").exists()
    assert not [p for p in (tmp_path / "s").iterdir() if layout.is_temp_file(p)]


def test_os_error_in_the_cli_is_one_line(tmp_path, monkeypatch, capsys):
    source = make_set(tmp_path / "src")

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("mmcse.cache.ops.shutil.copyfile", full_disk)
    out = tmp_path / "merged"
    code, stderr = run_main(["cache", "merge", str(source), "--out", str(out)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(out), "the disk is full")
    assert not (out / "manifest.json").exists()


def test_stale_temp_files_of_dead_writers_are_cleaned(tmp_path):
    path = tmp_path / "s"
    path.mkdir()
    host = files.HOST
    dead = path / f".shard-00000.arrow.tmp-{host}-{2**22 + 12345}-abcd"  # beyond pid_max
    alive = path / f".shard-00001.arrow.tmp-{host}-{os.getpid()}-abcd"
    foreign = path / ".shard-00002.arrow.tmp-otherhost-1-abcd"
    for file in (dead, alive, foreign):
        file.write_bytes(b"partial")
    FeatureSetWriter(path, **META)
    assert not dead.exists() and alive.exists() and foreign.exists()
    assert temp_path(path / "x").name.startswith(f".x.tmp-{host}-{os.getpid()}-")


def test_a_set_with_zero_rows_is_not_written(tmp_path):
    writer = FeatureSetWriter(tmp_path / "s", **META)
    writer.write_shard(0, [], np.zeros((0, 4), np.float16))
    with pytest.raises(CacheError, match="0 rows"):
        writer.finalize(num_shards=1)
    assert not (tmp_path / "s" / "manifest.json").exists()


def test_train_refuses_a_corrupted_set_even_with_its_recorded_fingerprint(
    tiny_model, tiny_world, tmp_path
):
    """The issue's case: verify caught a flipped byte, train used the set anyway."""
    import shutil

    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import train

    images = tmp_path / "image-feats"
    shutil.copytree(tiny_world["image"], images)
    fingerprint = FeatureSet.open(images).fingerprint
    shard = images / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[-250] ^= 0x40
    shard.write_bytes(bytes(data))
    cfg = TrainConfig(
        model=str(tiny_model),
        method="mcse",
        text_corpus=tiny_world["text"],
        caption_corpus=tiny_world["captions"],
        features={"image": str(images)},
        expect_fingerprints={"image": fingerprint},  # the manifest is unchanged: it matches
        batch_size=8,
        max_steps=2,
        eval_data="",
        final_eval=False,
        output_dir=str(tmp_path / "run"),
    )
    with pytest.raises(CacheError, match=f"{shard}: sha256 differs"):
        train(cfg)
    assert not (tmp_path / "run" / "best").exists()
