"""Sentence and caption files in every accepted format, the refused ones, and the one read policy
(:mod:`mmcse.corpusfiles`), through the three readers: extract-text (the wiki1m loader),
training (:class:`mmcse.training.corpora.TextFileCorpus`) and the local caption loader."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
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
    "array.json": (b'[{"text": "a"}]\n', r"is one JSON document \(an array\).*jq -c"),
    "pretty.jsonl": (b'[\n {"text": "a"}\n]\n', r"is one JSON document \(an array\)"),
    "broken.json": (b'[{"text": "a"}\n', "line 1 is not a JSON object, so not JSON lines"),
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


# ---- the column, the quoting and the encoding a file is written with (issue 41) --------------


@pytest.mark.parametrize("odd", [42, ["a", "list"], {"an": "object"}])
def test_a_text_value_that_is_no_string_is_a_bad_row_never_a_switch_of_column(tmp_path, odd):
    """It used to read the ``id`` column as the text (``w0``, ``w1`` … trained) when one of the
    first 1,000 ``text`` values was not a string; ``--bad-lines refuse`` did not catch it."""
    path = tmp_path / "ids.jsonl"
    rows = [{"id": f"w{i}", "text": f"sentence {i} of the corpus"} for i in range(1200)]
    rows[5]["text"] = odd
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = read_sentences(path)
    assert read.text_field == "text" and len(read.texts) == 1199
    assert not any(text.startswith("w") for text in read.texts)
    assert [(row, reason.split(":")[0]) for row, reason in read.dropped] == [(5, "undecodable")]
    with pytest.raises(MmcseError, match=r"ids.jsonl: line 6: undecodable: .*expected text"):
        read_sentences(path, bad_lines="refuse")


def test_an_unnamed_column_is_not_guessed_away_by_a_value(tmp_path):
    """No column named like text: two columns holding strings are asked for, whatever a few
    values of one hold; one string column stays chosen though a value in it is a number."""
    path = tmp_path / "body.jsonl"
    rows = [{"key": f"k{i}", "body": f"sentence {i}"} for i in range(20)]
    rows[0]["body"] = 7
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(MmcseError, match=r"candidates: key, body"):
        read_sentences(path)
    path.write_text(
        "".join(json.dumps({"n": i, "body": r["body"]}) + "\n" for i, r in enumerate(rows))
    )
    read = read_sentences(path)
    assert read.text_field == "body" and len(read.texts) == 19


def write_unquoted_tsv(path: Path, n: int = 2000) -> list[str]:
    """As ``"\\t".join`` writes it: sentences sometimes starting (never ending) with a quote."""
    texts = [f'"Hello, {i}," she said' if i % 300 == 7 else f"sentence {i}" for i in range(n)]
    lines = ["id\ttext", *(f"{i}\t{t}" for i, t in enumerate(texts))]
    path.write_text("\n".join(lines) + "\n")
    return texts


def test_an_unquoted_tsv_is_read_as_written(tmp_path):
    """It used to be read with ``"`` as a quote: 2,000 lines became 1,993 sentences, one of
    them 7 source lines with ids and tabs inside."""
    path = tmp_path / "plain.tsv"
    texts = write_unquoted_tsv(path)
    read = read_sentences(path)
    assert read.texts == texts and read.dropped == []
    path.write_text(path.read_text() + "2000\textra\tfield\n\n")
    read = read_sentences(path)
    assert read.dropped == [(2000, "undecodable: 3 fields, expected 2"), (2001, "blank")]
    with pytest.raises(MmcseError, match=r"plain.tsv: line 2002: undecodable: 3 fields"):
        read_sentences(path, bad_lines="refuse")


def test_a_tsv_quoted_throughout_is_read_as_quoted_and_an_open_quote_refused(tmp_path):
    import csv

    path = tmp_path / "quoted.tsv"
    texts = ['he said "hi"', "second, with a comma", "third"]
    with path.open("w", newline="") as file:
        writer = csv.writer(file, delimiter="\t", quoting=csv.QUOTE_ALL)
        writer.writerows([["id", "text"], *([str(i), t] for i, t in enumerate(texts))])
    assert read_sentences(path).texts == texts
    path.write_text('"id"\t"text"\n"0"\t"an open quote\n"1"\t"next"\n"2"\t"last"\n')
    with pytest.raises(MmcseError, match=r"quoted.tsv: a row runs over a line break inside quo"):
        read_sentences(path)
    path.write_text('"id"\t"text"\n"0"\t"a value over\ntwo lines"\n"1"\t"next"\n')
    with pytest.raises(MmcseError, match=r"quoted.tsv: row 1: its 'text' value holds a line"):
        read_sentences(path)


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_quoted_value_keeps_working_and_an_open_quote_is_refused_in_csv(tmp_path, suffix):
    """A quoted CSV (commas and doubled quotes inside values) reads as a researcher expects; a
    quote left open, which merges the lines after it, is refused naming the row."""
    path = tmp_path / f"c{suffix}"
    if suffix == ".tsv":  # unquoted: the open quote is a character of its sentence
        path.write_text('id\ttext\n0\t"an open quote\n1\tnext\n')
        assert read_sentences(path).texts == ['"an open quote', "next"]
        return
    path.write_text('id,text\n0,"a, b and ""c"""\n1,plain\n')
    assert read_sentences(path).texts == ['a, b and "c"', "plain"]
    path.write_text('id,text\n0,"an open quote\n1,next\n2,last\n')
    with pytest.raises(MmcseError, match=r"c.csv: row 1: its 'text' value holds a line break"):
        read_sentences(path)


def test_csv_style_quotes_in_an_unquoted_tsv_are_kept_and_said(tmp_path, caplog):
    path = tmp_path / "pandas.tsv"
    path.write_text('id\ttext\n0\t"a ""quoted"" word"\n1\tplain\n')
    assert read_sentences(path).texts == ['"a ""quoted"" word"', "plain"]
    assert "1 values are wrapped in quotes" in caplog.text and "QUOTE_ALL" in caplog.text


def write_cp1252(path: Path, n: int = 2000) -> None:
    lines = [f"sentence {i} au caf\u00e9" if i % 8 == 0 else f"sentence {i}" for i in range(n)]
    path.write_bytes(("\n".join(lines) + "\n").encode("cp1252"))


@pytest.mark.parametrize("name", ["wiki.txt", "wiki.jsonl", "wiki.csv", "wiki.tsv"])
def test_a_file_in_another_encoding_is_refused_with_the_command_converting_it(tmp_path, name):
    """A whole cp1252 file used to lose every accented row (265 of 2,000) with a warning."""
    path = tmp_path / name
    lines = [f"sentence {i} au caf\u00e9" if i % 8 == 0 else f"sentence {i}" for i in range(40)]
    if name.endswith(".jsonl"):
        lines = [json.dumps({"text": line}, ensure_ascii=False) for line in lines]
    elif not name.endswith(".txt"):
        sep = "," if name.endswith(".csv") else "\t"
        lines = [f"id{sep}text", *(f"{i}{sep}{line}" for i, line in enumerate(lines))]
    path.write_bytes(("\n".join(lines) + "\n").encode("cp1252"))
    with pytest.raises(MmcseError) as error:
        read_sentences(path)
    message = str(error.value)
    assert "not UTF-8 text" in message and "Windows-1252" in message, message
    assert f"iconv -f CP1252 -t UTF-8 {path}" in message and "\n" not in message


def test_a_training_run_records_the_rows_it_left_out(
    tiny_model, tiny_world, tmp_path, monkeypatch, capsys
):
    """The rows the read policy left out are in the run folder, not only printed: counted in
    plan.json (and the printed plan), every one in left_out.jsonl."""
    from support.cli import run_main_output

    corpus = tmp_path / "wiki.txt"
    good = Path(tiny_world["text"]).read_bytes()
    corpus.write_bytes(good + b"caf\xe9 latin-1\n\n" + b"x" * (MAX_SENTENCE_CHARS + 1) + b"\n")
    rows = len(good.splitlines()) + 3
    run = tmp_path / "run"
    args = ["train", "--model", str(tiny_model), "--method", "simcse", "--text-corpus", str(corpus),
            "--batch-size", "8", "--max-steps", "1", "--eval-data", "", "--no-final-eval",
            "--device", "cpu", "--output-dir", str(run)]  # fmt: skip
    code, _, err = run_main_output(args, monkeypatch, capsys)
    assert code == 0, err
    plan = json.loads((run / "plan.json").read_text())
    assert plan["left_out"] == {
        "text": {
            "source": str(corpus),
            "rows": rows,
            "left_out": 3,
            "by_reason": {"undecodable": 1, "blank": 1, "over-long": 1},
        }
    }
    left = [json.loads(line) for line in (run / "left_out.jsonl").read_text().splitlines()]
    assert [(r["corpus"], r["where"], r["why"].split(":")[0]) for r in left] == [
        ("text", f"line {rows - 2}", "undecodable"),
        ("text", f"line {rows - 1}", "blank"),
        ("text", f"line {rows}", "over-long"),
    ]
    assert f"left out: 3 of {rows} text rows" in err and "left_out.jsonl" in err


# ---- messages that name the real fix (issue 41) ----------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("empty.txt", b"", "has no rows (an empty file)"),
        ("empty.jsonl", b"", "has no rows (an empty file)"),
        ("empty.csv", b"", "has no rows"),
        ("header.csv", b"id,text\n", "has a header line (id, text) and no rows below it"),
        ("header.tsv", b"id\ttext\n", "has a header line (id, text) and no rows below it"),
    ],
)
def test_a_file_without_rows_says_so(tmp_path, name, content, why):
    """It used to ask "which column holds the text? give --text-field NAME (candidates: text)"."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(MmcseError, match=re.escape(why)) as error:
        read_sentences(path)
    assert "--text-field" not in str(error.value)


def test_a_gzip_file_named_gz_is_refused_with_the_command_unpacking_it(tmp_path):
    """It used to say the file "is gzip-compressed, which its name (.gz) does not say"."""
    path = tmp_path / "wiki.txt.gz"
    path.write_bytes(gzip.compress(b"a sentence\n"))
    with pytest.raises(MmcseError) as error:
        read_sentences(path)
    message = str(error.value)
    assert "is gzip-compressed, as its name says" in message and "does not say" not in message
    assert f"gunzip -c {path} > {tmp_path / 'wiki.txt'}" in message


def test_training_a_datasets_folder_without_train_does_not_ask_for_split(tmp_path):
    """Training has no --split: the message says how to give the split instead."""
    import datasets
    from support.corpora import read_corpus

    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {"validation": datasets.Dataset.from_dict({"text": SENTENCES})}
    ).save_to_disk(str(folder))
    with pytest.raises(MmcseError, match="has no 'train' split") as error:
        read_corpus(str(folder))
    message = str(error.value)
    assert "--split" not in message and "['validation'].save_to_disk" in message
    with pytest.raises(MmcseError, match="no split 'train'.*give --split"):
        read_sentences(folder)  # extract-text has --split


# ---- a file read as what it is, and a token cache that sees an edit (issue 41) ---------------


@pytest.mark.parametrize("indent", [None, 2])
def test_a_json_document_saved_as_txt_is_refused_not_trained_line_by_line(tmp_path, indent):
    path = tmp_path / "corpus.txt"
    path.write_text(json.dumps([{"text": s} for s in SENTENCES], indent=indent))
    with pytest.raises(MmcseError, match=r"is one JSON document \(an array\).*jq -c"):
        read_sentences(path)
    path.write_text("[citation needed] is a sentence\n{braces} too\n")
    assert read_sentences(path).texts == ["[citation needed] is a sentence", "{braces} too"]


def test_cr_only_line_endings_split_sentences(tmp_path):
    """An old-Mac file used to be one sentence holding ``\\r``."""
    path = tmp_path / "mac.txt"
    path.write_bytes("\r".join(SENTENCES).encode() + b"\r")
    read = read_sentences(path)
    assert read.texts == SENTENCES and read.rows == [0, 1, 2]
    path.write_bytes(b"a\r\nb\rc\n")
    assert read_sentences(path).texts == ["a", "b", "c"]


def test_a_datasets_folder_edited_in_place_is_another_fingerprint(tmp_path):
    """Its arrow file rewritten, ``state.json`` (datasets' fingerprint) kept: the token cache
    used to train the old tokens."""
    folder = write_hf_folder(tmp_path / "hf")
    before = read_sentences(folder).records.fingerprint
    (arrow,) = folder.glob("*.arrow")
    import datasets

    edited = datasets.Dataset.from_dict({"text": ["other", "words", "here"], "label": [0, 1, 0]})
    edited.save_to_disk(str(tmp_path / "edited"))
    arrow.write_bytes(next((tmp_path / "edited").glob("*.arrow")).read_bytes())
    read = read_sentences(folder)
    assert read.texts == ["other", "words", "here"]
    assert read.records.fingerprint != before


def test_the_token_cache_sees_a_datasets_folder_edited_in_place(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from mmcse.training.corpora import corpus_tokens, open_corpus

    monkeypatch.chdir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    folder = write_hf_folder(tmp_path / "hf")
    first = corpus_tokens(open_corpus(str(folder)), tokenizer, 16)
    old_ids = first.take(np.arange(3))[0].copy()
    import datasets

    datasets.Dataset.from_dict({"text": ["zzz"] * 3, "label": [0, 1, 0]}).save_to_disk(
        str(tmp_path / "edited")
    )
    (arrow,) = folder.glob("*.arrow")
    arrow.write_bytes(next((tmp_path / "edited").glob("*.arrow")).read_bytes())
    again = corpus_tokens(open_corpus(str(folder)), tokenizer, 16)
    fresh = corpus_tokens(open_corpus(str(folder)), tokenizer, 16, token_cache="off")
    assert again.path != first.path
    assert (again.take(np.arange(3))[0] == fresh.take(np.arange(3))[0]).all()
    assert not (again.take(np.arange(3))[0] == old_ids).all()
