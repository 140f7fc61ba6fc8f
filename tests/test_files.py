"""mmcse.files: the one atomic write (fsync the file, rename, fsync the folder), and every writer
of both stages goes through it: a failed write leaves the old file whole and no temp behind."""

from __future__ import annotations

import json
import os
import stat

import pytest

from mmcse.cache.layout import write_json_atomically
from mmcse.errors import MmcseError
from mmcse.files import sha256_file, write_json, write_text_atomically
from mmcse.rundir import Checkpoint
from pipeline.datasets.base import RecordError
from pipeline.errors_log import read_sidecar, write_sidecar


def run_info(path, value):
    Checkpoint(path.parent).write_info({"step": value})


def layout_json(path, value):
    write_json_atomically(path, {"step": value})


def plain_json(path, value):
    write_json(path, {"step": value})


def sidecar(path, value):
    write_sidecar(path, [RecordError(f"id{value}", "x.jpg", "unreadable")])


#: every atomic writer: run info (Stage 2), a cache manifest (the contract), a Stage-1 sidecar
WRITERS = {"run_info": run_info, "cache_json": layout_json, "json": plain_json, "sidecar": sidecar}


def target(tmp_path, name):
    return tmp_path / ("mmcse_run.json" if name == "run_info" else f"{name}.json")


@pytest.fixture
def fsyncs(monkeypatch):
    """``"file"`` or ``"dir"`` per fsync, in order."""
    seen = []
    real = os.fsync

    def record(fd):
        seen.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return seen


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_writer_fsyncs_the_file_then_the_folder(name, tmp_path, fsyncs):
    WRITERS[name](target(tmp_path, name), 1)
    assert fsyncs == ["file", "dir"]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_write_that_raises_leaves_the_old_file_whole_and_no_temp(name, tmp_path, monkeypatch):
    path = target(tmp_path, name)
    WRITERS[name](path, 1)
    before = path.read_bytes()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises((OSError, MmcseError)):
        WRITERS[name](path, 2)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_write_that_fails_half_way_leaves_no_partial_file(tmp_path):
    path = tmp_path / "notes.txt"
    with pytest.raises(UnicodeEncodeError):
        write_text_atomically(path, "whole line\n" + "\ud800")  # not encodable: fails mid-write
    assert list(tmp_path.iterdir()) == []


def test_written_content_and_its_hash(tmp_path):
    path = write_text_atomically(tmp_path / "deep" / "a.txt", "abc")
    assert path.read_text() == "abc"
    assert sha256_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    sidecar(tmp_path / "s.jsonl", 3)
    assert [e.id for e in read_sidecar(tmp_path / "s.jsonl")] == ["id3"]
    plain_json(tmp_path / "j.json", 4)
    assert json.loads((tmp_path / "j.json").read_text()) == {"step": 4}
