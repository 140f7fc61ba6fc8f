"""Sentence and caption files in every accepted format, the refused ones, and the one read policy
(:mod:`mmcse.corpusfiles`), through the three readers: extract-text (the wiki1m loader),
training (:class:`mmcse.training.corpora.TextFileCorpus`) and the local caption loader."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmcse.corpusfiles import MAX_SENTENCE_CHARS, read_sentences
from mmcse.errors import MmcseError

SENTENCES = ["a dog runs in the park", "the cat sits, on a mat", "a red car"]


def write_plain(path: Path) -> Path:
    path.write_text("\n".join(SENTENCES) + "\n")
    return path


def write_jsonl(path: Path) -> Path:
    rows = [{"id": i, "text": s, "label": i % 2} for i, s in enumerate(SENTENCES)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_csv(path: Path) -> Path:
    sep = "\t" if path.suffix == ".tsv" else ","
    quoted = [f'"{s}"' if sep in s else s for s in SENTENCES]
    lines = [f"id{sep}sentence{sep}label"] + [
        f"{i}{sep}{s}{sep}{i % 2}" for i, s in enumerate(quoted)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path) -> Path:
    pq.write_table(pa.table({"sentence": SENTENCES, "n": [1, 2, 3]}), path)
    return path


def write_hf_folder(path: Path) -> Path:
    import datasets

    datasets.Dataset.from_dict({"text": SENTENCES, "label": [0, 1, 0]}).save_to_disk(str(path))
    return path


WRITERS = {
    "corpus.txt": write_plain,
    "corpus.jsonl": write_jsonl,
    "objects-named.txt": write_jsonl,  # JSON objects a line in a .txt: never read as plain text
    "corpus.csv": write_csv,
    "corpus.tsv": write_csv,
    "corpus.parquet": write_parquet,
    "hf-dataset": write_hf_folder,
}


@pytest.mark.parametrize("name", WRITERS)
def test_every_accepted_format_gives_the_sentences_themselves(tmp_path, name):
    """No JSON syntax, no header row, the column guessed (the one string column, or the one
    named like text when there are several)."""
    path = WRITERS[name](tmp_path / name)
    read = read_sentences(path)
    assert read.texts == SENTENCES
    assert read.dropped == [] and read.rows == [0, 1, 2]


def test_a_datasets_dict_takes_the_split(tmp_path):
    import datasets

    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": SENTENCES}),
            "test": datasets.Dataset.from_dict({"text": ["held out"]}),
        }
    ).save_to_disk(str(folder))
    assert read_sentences(folder).texts == SENTENCES
    assert read_sentences(folder, split="test").texts == ["held out"]
    with pytest.raises(MmcseError, match="no split 'dev'.*its splits: train, test"):
        read_sentences(folder, split="dev")


def test_an_hf_name_not_in_the_local_cache_is_one_line_without_the_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(MmcseError, match="hf:someone/absent: not in the local datasets cache"):
        read_sentences("hf:someone/absent")


def test_the_text_field_is_named_or_guessed_or_asked_for(tmp_path):
    path = tmp_path / "two.jsonl"
    rows = [{"premise": s, "hypothesis": s.upper()} for s in SENTENCES]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        MmcseError, match=r"give --text-field NAME \(candidates: premise, hypothesis\)"
    ):
        read_sentences(path)
    assert read_sentences(path, "hypothesis").texts == [s.upper() for s in SENTENCES]
    with pytest.raises(MmcseError, match="no column 'sentence' .*its columns: premise, hypothesis"):
        read_sentences(path, "sentence")


REFUSED = {
    "table.xlsx": (b"PK\x03\x04 spreadsheet", "is a zip file"),
    "corpus.txt.gz": (b"\x1f\x8b\x08 compressed", "gzip-compressed"),
    "fake.parquet": (b"id,text\n1,a\n", "named Parquet but not a Parquet file"),
    "corpus.doc": (b"a sentence\n", ".doc is not a format mmcse reads"),
    "array.json": (b'[{"text": "a"}]\n', "line 1 is not a JSON object, so not JSON lines"),
    "plain.jsonl": (b"just a sentence\n", "line 1 is not a JSON object"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_anything_else_is_refused_in_one_line_naming_the_formats(tmp_path, name):
    content, why = REFUSED[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(MmcseError, match=why) as error:
        read_sentences(path)
    message = str(error.value)
    assert "\n" not in message and "accepted: plain text" in message and "Parquet" in message


def test_parquet_bytes_under_a_text_name_are_refused(tmp_path):
    write_parquet(tmp_path / "real.parquet").rename(tmp_path / "corpus.txt")
    with pytest.raises(MmcseError, match="is a Parquet file, which its name"):
        read_sentences(tmp_path / "corpus.txt")


def test_a_folder_that_is_no_dataset_is_refused(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(MmcseError, match="neither a corpus table nor a datasets folder"):
        read_sentences(tmp_path)


# ---- the one read policy, in all three readers ----------------------------------------------

#: line 2 undecodable, line 3 blank, line 5 over-long: three rows of three kinds
BAD = b"first good line\ncaf\xe9 latin-1\n\nsecond good line\n" + b"x" * (MAX_SENTENCE_CHARS + 1)
KEPT = ["first good line", "second good line"]
LEFT_OUT = {"line 2": "undecodable", "line 3": "blank", "line 5": "over-long"}


def test_the_policy_skips_and_reports_or_refuses(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(BAD)
    read = read_sentences(path)
    assert read.texts == KEPT
    assert read.summary() == "3 left out (1 undecodable, 1 blank, 1 over-long)"
    with pytest.raises(
        MmcseError, match=r"bad.txt: line 2: undecodable: invalid UTF-8.*\(and 2 more\)"
    ):
        read_sentences(path, bad_lines="refuse")


def test_training_reads_with_the_same_policy(tmp_path, caplog):
    from support.corpora import read_corpus

    path = tmp_path / "bad.txt"
    path.write_bytes(BAD)
    ids, texts, _, _ = read_corpus(str(path))
    assert texts == KEPT and list(ids) == ["bad:0", "bad:3"]
    assert "3 left out (1 undecodable, 1 blank, 1 over-long) of 5 rows" in caplog.text
    with pytest.raises(MmcseError, match="line 2: undecodable: invalid UTF-8"):
        read_corpus(str(path), bad_lines="refuse")


def test_extract_text_reads_with_the_same_policy(tmp_path):
    from pipeline.datasets import DataSource, load_dataset

    path = tmp_path / "bad.txt"
    path.write_bytes(BAD)
    records = load_dataset("wiki1m", DataSource(text=path), "train")
    assert [s.text for s in records.sentences] == KEPT
    from pipeline.errors_log import reason_kind

    kinds = {e.reason.split(":")[0]: reason_kind(e.reason) for e in records.errors}
    assert kinds == LEFT_OUT  # the same three kinds the summary and errors.jsonl count
    with pytest.raises(MmcseError, match="line 2: undecodable: invalid UTF-8"):
        load_dataset("wiki1m", DataSource(text=path, bad_lines="refuse"), "train")


def test_the_caption_reader_reads_with_the_same_policy(tmp_path):
    from pipeline.datasets import DataSource, load_dataset

    (tmp_path / "a.jpg").write_bytes(b"")
    path = tmp_path / "captions.jsonl"
    rows = [
        b'{"image": "a.jpg", "caption": "first good line"}',
        b'{"image": "a.jpg", "caption": "caf\xe9 latin-1"}',
        b'{"image": "a.jpg", "caption": "  "}',
        b'{"image": "a.jpg", "caption": "second good line"}',
        b'{"image": "a.jpg", "caption": "' + b"x" * (MAX_SENTENCE_CHARS + 1) + b'"}',
    ]
    path.write_bytes(b"\n".join(rows) + b"\n")
    records = load_dataset("local", DataSource(tmp_path, path), "train")
    assert [r.captions for r in records.images] == [tuple(KEPT)]
    assert [e.id for e in records.errors] == list(LEFT_OUT)
    with pytest.raises(MmcseError, match="line 2: undecodable: invalid UTF-8.*--bad-lines refuse"):
        load_dataset("local", DataSource(tmp_path, path, bad_lines="refuse"), "train")


@pytest.mark.parametrize("name", ["captions.csv", "captions.parquet", "captions-hf"])
def test_local_captions_in_every_table_format(tmp_path, name):
    import datasets

    columns = {"image": ["a.jpg", "b.jpg", "a.jpg"], "caption": ["one", "two", "three"]}
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text(
            "image,caption\n"
            + "".join(f"{i},{c}\n" for i, c in zip(*columns.values(), strict=True))
        )
    elif name.endswith(".parquet"):
        pq.write_table(pa.table(columns), path)
    else:
        datasets.Dataset.from_dict(columns).save_to_disk(str(path))
    from pipeline.datasets import DataSource, load_dataset

    records = load_dataset("local", DataSource(tmp_path, path), "train")
    assert {r.image_id: r.captions for r in records.images} == {
        "a": ("one", "three"),
        "b": ("two",),
    }


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.csv"])
def test_extract_text_command_writes_the_sentences_of_jsonl_and_csv(
    tmp_path, name, monkeypatch, capsys
):
    from support.cli import run_main_output

    from mmcse.cache import Corpus

    path = WRITERS[name](tmp_path / name)
    out = tmp_path / "out"
    args = ["extract-text", "--corpus", "wiki1m", "--text-file", str(path), "--teacher", "none",
            "--out", str(out)]  # fmt: skip
    code, stdout, _ = run_main_output(args, monkeypatch, capsys)
    assert code == 0
    assert Corpus.open(out / "sentences").texts == SENTENCES


def test_a_caption_corpus_must_be_a_table_and_a_bad_format_is_refused_before_the_model(
    tmp_path, monkeypatch, capsys
):
    """Both refused by preflight's path checks, before any model or torch work."""
    from support.cli import assert_one_error, run_main

    (tmp_path / "c.doc").write_text("a sentence\n")
    write_plain(tmp_path / "caps.txt")
    missing_model = str(tmp_path / "no-model")
    base = ["train", "--model", missing_model, "--output-dir", str(tmp_path / "run")]
    code, err = run_main([*base, "--text-corpus", str(tmp_path / "c.doc")], monkeypatch, capsys)
    assert_one_error(code, err, "--text-corpus", ".doc is not a format", "accepted: plain text")
    args = [*base, "--method", "mcse", "--caption-corpus", str(tmp_path / "caps.txt")]
    code, err = run_main(args, monkeypatch, capsys)
    assert_one_error(code, err, "--caption-corpus", "not a corpus table", "extract-images")


def test_extract_text_summary_counts_the_lines_left_out(tmp_path, monkeypatch, capsys):
    """It used to print "2 rows, 0 errors" with the undecodable line in errors.jsonl only."""
    from support.cli import run_main_output

    path = tmp_path / "bad.txt"
    path.write_bytes(BAD)
    out = tmp_path / "out"
    args = ["extract-text", "--corpus", "wiki1m", "--text-file", str(path), "--teacher", "none",
            "--out", str(out)]  # fmt: skip
    code, stdout, _ = run_main_output(args, monkeypatch, capsys)
    assert code == 0
    logged = (out / "errors.jsonl").read_text().splitlines()
    assert stdout.splitlines() == [
        f"{out / 'sentences'}: 2 rows, fingerprint " + stdout.split("fingerprint ")[1][:12],
        f"left out: {len(logged)} in all, every one in {out / 'errors.jsonl'}: 1 sentences "
        "(blank), 1 sentences (over-long), 1 sentences (undecodable)",
    ]
