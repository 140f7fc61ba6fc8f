"""The cache contract: round trips, id joins, refusals, atomicity, verification, CLI."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

import cli
from mmcse.cache import (
    Corpus,
    FeatureSet,
    FeatureSetWriter,
    Manifest,
    list_sets,
    merge,
    remove,
    verify,
    write_corpus,
    write_feature_set,
)
from mmcse.errors import CacheError, MissingIdsError

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["arrow", "hdf5"]
META = {"kind": "image", "dataset": "toy", "split": "train", "producer": {"teacher": "toy"}}


def rows_and_ids(num_rows: int, shape: tuple[int, ...], dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "u":
        values = rng.integers(0, 256, size=(num_rows, *shape), dtype=dtype)
    else:
        values = rng.standard_normal((num_rows, *shape)).astype(dtype)
    return [f"item-{i:04d}" for i in range(num_rows)], values


def write(path: Path, ids, values, backend: str = "arrow", shard_rows: int = 7, **overrides):
    shape = list(values.shape[1:])
    meta = {**META, "dim": int(np.prod(shape)), "shape": shape, "dtype": values.dtype.name}
    return write_feature_set(path, ids, values, shard_rows, backend=backend, **meta | overrides)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("shape", "dtype"), [((16,), "float16"), ((16,), "float32"), ((3, 4, 5), "uint8")]
)
def test_round_trip(tmp_path, backend, shape, dtype):
    ids, values = rows_and_ids(30, shape, dtype)
    manifest = write(tmp_path / "set", ids, values, backend)

    features = FeatureSet.open(tmp_path / "set")
    assert manifest == Manifest.read(tmp_path / "set")
    assert len(features) == 30 and features.shape == shape and features.dtype == np.dtype(dtype)
    assert len(manifest.shards) == 5  # 30 rows in shards of 7
    assert list(features.ids) == ids
    read = features.take(np.arange(30))
    assert read.dtype == np.dtype(dtype) and read.shape == (30, *shape)
    np.testing.assert_array_equal(read, values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_by_ids_matches_an_independent_lookup(tmp_path, backend):
    ids, values = rows_and_ids(50, (8,), "float32")
    write(tmp_path / "set", ids, values, backend)
    expected_by_id = {}
    for identifier, row in zip(ids, values, strict=True):
        expected_by_id[identifier] = row
    rng = np.random.default_rng(1)
    query = [ids[i] for i in rng.integers(0, 50, size=40)]  # random order, repeats

    gathered = FeatureSet.open(tmp_path / "set").gather(query)

    for identifier, row in zip(query, gathered, strict=True):
        np.testing.assert_array_equal(row, expected_by_id[identifier])


def test_rerun_is_byte_identical_and_fingerprint_tracks_content(tmp_path):
    ids, values = rows_and_ids(20, (4,), "float16")
    first = write(tmp_path / "a", ids, values)
    again = write(tmp_path / "b", ids, values)
    changed_values = values.copy()
    changed_values[3, 0] += 1
    changed = write(tmp_path / "c", ids, changed_values)
    retagged = write(tmp_path / "d", ids, values, producer={"teacher": "other"})

    for name in ["manifest.json", "shard-00000.arrow", "shard-00002.arrow"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert first.fingerprint == again.fingerprint
    assert len({first.fingerprint, changed.fingerprint, retagged.fingerprint}) == 3
    assert "time" not in (tmp_path / "a" / "manifest.json").read_text()


def test_missing_ids_are_refused_naming_set_and_ids(tmp_path):
    ids, values = rows_and_ids(10, (4,), "float32")
    write(tmp_path / "set", ids, values)
    features = FeatureSet.open(tmp_path / "set")
    absent = [f"ghost-{i}" for i in range(8)]

    with pytest.raises(MissingIdsError) as error:
        features.gather(["item-0001", *absent])

    message = str(error.value)
    assert "\n" not in message
    assert str(tmp_path / "set") in message and "8 of 9 ids" in message
    assert "'ghost-0'" in message and "(+3 more)" in message


def test_fingerprint_mismatch_is_refused(tmp_path):
    ids, values = rows_and_ids(10, (4,), "float32")
    manifest = write(tmp_path / "set", ids, values)
    features = FeatureSet.open(tmp_path / "set")

    assert features.require_fingerprint(manifest.fingerprint) is features
    with pytest.raises(CacheError, match="fingerprint.*run expects"):
        features.require_fingerprint("0" * 64)


def test_unfinished_writer_leaves_no_valid_set(tmp_path):
    ids, values = rows_and_ids(10, (4,), "float32")
    writer = FeatureSetWriter(tmp_path / "set", dim=4, dtype="float32", **META)
    writer.write_shard(0, ids[:5], values[:5])

    with pytest.raises(CacheError, match="no manifest.json.*unfinished"):
        FeatureSet.open(tmp_path / "set")
    assert verify(tmp_path / "set") != []


def test_leftover_temp_file_is_ignored_then_cleaned(tmp_path):
    ids, values = rows_and_ids(10, (4,), "float32")
    writer = FeatureSetWriter(tmp_path / "set", dim=4, dtype="float32", **META)
    writer.write_shard(0, ids, values)
    leftover = tmp_path / "set" / ".shard-00001.arrow.tmp-999-dead"
    leftover.write_bytes(b"half a shard")

    assert not writer.has_shard(1)
    manifest = writer.finalize()

    assert [shard.file for shard in manifest.shards] == ["shard-00000.arrow"]
    assert not leftover.exists()
    np.testing.assert_array_equal(FeatureSet.open(tmp_path / "set").gather(ids), values)


CRASHING_WRITER = """
import itertools, sys
import numpy as np
sys.path.insert(0, {root!r})
from mmcse.cache import FeatureSetWriter
writer = FeatureSetWriter({path!r}, kind="image", dataset="toy", split="train",
                          producer={{"teacher": "toy"}}, dim=4096, dtype="float32")
rows = np.ones((256, 4096), np.float32)
for index in itertools.count():  # never finalizes: the parent kills it mid-way
    writer.write_shard(index, [f"{{index}}-{{i}}" for i in range(256)], rows * index)
"""


def test_killed_writer_leaves_no_set_and_resumes(tmp_path):
    path = tmp_path / "set"
    script = CRASHING_WRITER.format(root=str(ROOT), path=str(path))
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)])
    try:
        deadline = time.monotonic() + 60
        while not (path / "shard-00002.arrow").exists():
            assert child.poll() is None and time.monotonic() < deadline, "writer did not start"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    with pytest.raises(CacheError, match="not a feature set"):
        FeatureSet.open(path)
    writer = FeatureSetWriter(
        path, kind="image", dataset="toy", split="train", producer={"teacher": "toy"},
        dim=4096, dtype="float32",
    )  # fmt: skip
    finished = [index for index in range(100) if writer.has_shard(index)]
    assert finished == list(range(len(finished))) and len(finished) >= 3
    manifest = writer.finalize(num_shards=len(finished))
    features = FeatureSet.open(path)
    assert len(features) == 256 * len(finished) == manifest.num_rows
    last = len(finished) - 1
    np.testing.assert_array_equal(features.gather([f"{last}-7"]), np.full((1, 4096), last))


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_names_the_corrupted_shard(tmp_path, backend):
    ids, values = rows_and_ids(21, (4,), "float32")
    write(tmp_path / "set", ids, values, backend)
    assert verify(tmp_path / "set") == []
    shard = next((tmp_path / "set").glob("shard-00001.*"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    problems = verify(tmp_path / "set")

    assert len(problems) == 1 and shard.name in problems[0] and "sha256" in problems[0]


def test_cli_verify_exit_code_and_one_line_error(tmp_path):
    ids, values = rows_and_ids(21, (4,), "float32")
    write(tmp_path / "set", ids, values)
    runner = CliRunner()
    ok = runner.invoke(cli.app, ["cache", "verify", str(tmp_path / "set")])
    assert ok.exit_code == 0 and ok.stdout.startswith("ok:")

    shard = tmp_path / "set" / "shard-00002.arrow"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    bad = runner.invoke(cli.app, ["cache", "verify", str(tmp_path / "set")])
    assert isinstance(bad.exception, CacheError) and "shard-00002.arrow" in str(bad.exception)

    result = subprocess.run(
        [sys.executable, "cli.py", "cache", "verify", str(tmp_path / "set")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("error:") and "shard-00002.arrow" in result.stderr


def test_duplicate_ids_refused_at_finalize(tmp_path):
    ids, values = rows_and_ids(6, (4,), "float32")
    writer = FeatureSetWriter(tmp_path / "set", dim=4, dtype="float32", **META)
    writer.write_shard(0, ids[:4], values[:4])
    writer.write_shard(1, ids[2:], values[2:])

    with pytest.raises(CacheError, match="2 ids occur more than once: 'item-0002', 'item-0003'"):
        writer.finalize()
    assert not (tmp_path / "set" / "manifest.json").exists()


def test_ranks_write_disjoint_shards_into_one_set(tmp_path):
    ids, values = rows_and_ids(40, (4,), "float32")
    path = tmp_path / "set"
    rank_writers = [FeatureSetWriter(path, dim=4, dtype="float32", **META) for _ in range(2)]
    for rank, writer in enumerate(rank_writers):
        for shard in range(rank, 4, 2):
            writer.write_shard(shard, ids[shard * 10 : shard * 10 + 10], values[shard * 10 :][:10])
    with pytest.raises(CacheError, match="differs in producer"):
        FeatureSetWriter(path, dim=4, dtype="float32", **META | {"producer": {"teacher": "x"}})
    with pytest.raises(CacheError, match=r"shards missing: \[4\]"):
        rank_writers[0].finalize(num_shards=5)

    FeatureSetWriter.reopen(path).finalize(num_shards=4)

    features = FeatureSet.open(path)
    assert list(features.ids) == ids
    np.testing.assert_array_equal(features.take(np.arange(40)), values)


def test_corpus_round_trip_and_join_by_id(tmp_path):
    ids = ["s0", "s1", "s2", "s3"]
    texts = ["A dog runs.", "Ünïcode ✓", "no image here", "A cat sleeps."]
    image_ids = ["img-b", "img-a", None, "img-b"]
    write_corpus(
        tmp_path / "corpus", ids, texts, image_ids, ["coco", "coco", "wiki", "coco"],
        dataset="toy", split="train", shard_rows=3,
    )  # fmt: skip
    image_values = np.arange(12, dtype=np.float32).reshape(3, 4)
    write(tmp_path / "images", ["img-a", "img-b", "img-c"], image_values)

    corpus = Corpus.open(tmp_path / "corpus")
    images = FeatureSet.open(tmp_path / "images")

    assert (list(corpus.ids), corpus.texts, corpus.image_ids) == (ids, texts, image_ids)
    assert corpus.sources == ["coco", "coco", "wiki", "coco"] and len(corpus) == 4
    with_image = [image for image in corpus.image_ids if image is not None]
    expected = [image_values[{"img-a": 0, "img-b": 1}[image]] for image in with_image]
    np.testing.assert_array_equal(images.gather(with_image), np.stack(expected))
    np.testing.assert_array_equal(corpus.rows_for(["s3", "s0"]), [3, 0])
    with pytest.raises(MissingIdsError, match="'s9'"):
        corpus.rows_for(["s9"])
    with pytest.raises(CacheError, match="is a corpus"):
        FeatureSet.open(tmp_path / "corpus")
    with pytest.raises(CacheError, match="not a corpus"):
        Corpus.open(tmp_path / "images")
    assert verify(tmp_path / "corpus") == []


def test_external_hdf5_shard_is_read_through_the_backend(tmp_path):
    from mmcse.cache import hdf5

    features = np.arange(24, dtype=np.float16).reshape(4, 2, 3)
    with h5py.File(tmp_path / "external.h5", "w") as handle:
        handle.create_dataset("ids", data=np.array(["a", "b", "c", "d"], dtype=object),
                              dtype=h5py.string_dtype())  # fmt: skip
        handle.create_dataset("features", data=features, chunks=(1, 2, 3))

    shard = hdf5.Shard(tmp_path / "external.h5", width=6)

    assert list(shard.read_ids()) == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(
        shard.take(np.array([3, 0, 3])), features[[3, 0, 3]].reshape(3, 6)
    )
    # a chunked file cannot be memory-mapped: a scan reads it block by block through h5py
    blocks = list(shard.iter_rows(block_rows=3))
    assert [len(b) for b in blocks] == [3, 1]
    np.testing.assert_array_equal(np.concatenate(blocks), features.reshape(4, 6))


def test_merge_combines_sets_of_one_producer(tmp_path):
    ids, values = rows_and_ids(30, (4,), "float32")
    write(tmp_path / "a", ids[:12], values[:12])
    write(tmp_path / "b", ids[12:], values[12:])
    write(tmp_path / "other", ["x"], values[:1], producer={"teacher": "other"})

    manifest = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")

    assert manifest.num_rows == 30 and len(manifest.extra["merged_from"]) == 2
    np.testing.assert_array_equal(FeatureSet.open(tmp_path / "ab").gather(ids[::-1]), values[::-1])
    with pytest.raises(CacheError, match="differ in producer"):
        merge([tmp_path / "a", tmp_path / "other"], tmp_path / "bad")


def test_ls_and_rm(tmp_path):
    ids, values = rows_and_ids(5, (4,), "float32")
    write(tmp_path / "coco" / "done", ids, values)
    FeatureSetWriter(tmp_path / "coco" / "unfinished", dim=4, dtype="float32", **META)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")

    entries = {entry.path.name: entry.manifest for entry in list_sets(tmp_path)}
    assert set(entries) == {"done", "unfinished"} and entries["unfinished"] is None
    listing = CliRunner().invoke(cli.app, ["cache", "ls", str(tmp_path)])
    assert listing.exit_code == 0, listing.output
    done_row = next(line for line in listing.output.splitlines() if "done" in line)
    assert " 5 " in done_row and "unfinished" in listing.output

    with pytest.raises(CacheError, match="not a feature set"):
        remove(tmp_path / "notes")
    (tmp_path / "coco" / "done" / "mine.txt").write_text("not the writer's")
    with pytest.raises(CacheError, match="mine.txt"):
        remove(tmp_path / "coco" / "done")
    (tmp_path / "coco" / "done" / "mine.txt").unlink()
    remove(tmp_path / "coco" / "done")
    remove(tmp_path / "coco" / "unfinished")
    assert list((tmp_path / "coco").iterdir()) == [] and (tmp_path / "notes" / "todo.txt").exists()


@pytest.mark.parametrize(
    ("values", "overrides", "message"),
    [
        (np.ones((3, 5), np.float32), {}, "rows must have shape"),
        (np.full((3, 4), np.nan, np.float32), {}, "non-finite"),
        (np.full((3, 4), 1e6, np.float32), {"dtype": "float16"}, "non-finite"),
        (np.ones((3, 4), np.float32), {"dtype": "uint8"}, "refusing to cast"),
        (np.ones((3, 4), np.float32), {"normalized": True}, "unit norm"),
    ],
)
def test_writer_refuses_bad_rows(tmp_path, values, overrides, message):
    settings = {**META, "dim": 4, "dtype": "float32"} | overrides
    writer = FeatureSetWriter(tmp_path / "set", **settings)
    with pytest.raises(CacheError, match=message):
        writer.write_shard(0, ["a", "b", "c"], values)
    assert not writer.has_shard(0)


def test_feature_set_pickles_by_path(tmp_path):
    ids, values = rows_and_ids(9, (4,), "float16")
    write(tmp_path / "set", ids, values)
    clone = pickle.loads(pickle.dumps(FeatureSet.open(tmp_path / "set")))
    np.testing.assert_array_equal(clone.gather(["item-0008"]), values[8:])
