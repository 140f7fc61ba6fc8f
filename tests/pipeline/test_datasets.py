"""Dataset loaders: every registered loader on a generated fixture, then on the real caption files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cli import assert_one_error, run_main

from mmcse.errors import MmcseError
from pipeline.datasets import (
    DATASETS,
    DataSource,
    ImageRecord,
    caption_id,
    load_dataset,
    select_captions,
)

SHARED = Path(
    os.environ.get(
        "MMCSE_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data"
    )
)
CAPTIONS = SHARED / "captions"
COCO_MINI = SHARED / "images" / "coco_mini"

# image id → captions, the ground truth every fixture below is written from
TRUTH = {
    "1000092795": ["Two men in a yard.", "Friends outside.", "Guys with shaggy hair look on."],
    "10002456": ["Workers on a pulley.", "Men in hard hats."],
    "1000268201": ["A child climbing stairs.", "A girl going into a wooden building."],
}
TRAIN, TEST = ["1000092795", "10002456"], ["1000268201"]


def _karpathy(path: Path, coco: bool) -> None:
    images = []
    for n, (stem, caps) in enumerate(TRUTH.items()):
        split = "test" if stem in TEST else ("restval" if n == 1 else "train")
        entry = {"filename": f"{stem}.jpg", "split": split, "sentences": [{"raw": c} for c in caps]}
        if coco:
            entry |= {"filepath": "val2014", "cocoid": int(stem)}
        images.append(entry)
    path.write_text(json.dumps({"images": images}))


def _flickr30k(tmp: Path) -> tuple[DataSource, str]:
    _karpathy(tmp / "dataset_flickr30k.json", coco=False)
    return DataSource(images=tmp, captions=tmp / "dataset_flickr30k.json"), "train"


def _coco(tmp: Path) -> tuple[DataSource, str]:
    _karpathy(tmp / "dataset_coco.json", coco=True)
    return DataSource(images=tmp, captions=tmp / "dataset_coco.json"), "train"


def _token_lines(stems: list[str]) -> str:
    return "".join(f"{s}.jpg#{k}\t{c}\n" for s in stems for k, c in enumerate(TRUTH[s]))


def _flickr8k(tmp: Path) -> tuple[DataSource, str]:
    (tmp / "Flickr8k.token.txt").write_text(_token_lines(list(TRUTH)))
    (tmp / "Flickr_8k.trainImages.txt").write_text("".join(f"{s}.jpg\n" for s in TRAIN))
    return DataSource(images=tmp, captions=tmp / "Flickr8k.token.txt"), "train"


def _local(tmp: Path) -> tuple[DataSource, str]:
    rows = [{"image": f"{s}.jpg", "caption": c} for s in TRAIN for c in TRUTH[s]]
    rows += [{"image": f"{s}.jpg", "caption": c, "split": "test"} for s in TEST for c in TRUTH[s]]
    (tmp / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DataSource(images=tmp, captions=tmp / "captions.jsonl"), "train"


def _wiki1m(tmp: Path) -> tuple[DataSource, str]:
    (tmp / "wiki.txt").write_text("first sentence\n\nthird one\n")
    return DataSource(text=tmp / "wiki.txt"), "train"


FIXTURES = {
    "flickr30k": _flickr30k,
    "coco": _coco,
    "flickr8k": _flickr8k,
    "local": _local,
    "wiki1m": _wiki1m,
}


def test_every_registered_dataset_has_a_fixture():
    assert sorted(FIXTURES) == DATASETS.names()


@pytest.mark.parametrize("name", DATASETS.names())
def test_loader_reads_its_fixture(name, tmp_path):
    source, split = FIXTURES[name](tmp_path)
    records = load_dataset(name, source, split)
    if name == "wiki1m":
        assert [(s.id, s.text) for s in records.sentences] == [
            ("wiki1m-0000000", "first sentence"),
            ("wiki1m-0000002", "third one"),
        ]
        assert [e.reason for e in records.errors] == ["line 2: blank"]
        return
    got = {r.image_id: list(r.captions) for r in records.images}
    assert got == {s: TRUTH[s] for s in TRAIN}  # Karpathy "train" includes "restval"
    folder = tmp_path / "val2014" if name == "coco" else tmp_path  # Karpathy COCO "filepath"
    assert all(r.path == folder / f"{r.image_id}.jpg" for r in records.images)
    assert records.errors == []


def test_token_file_with_unreadable_rows(tmp_path):
    text = _token_lines(TRAIN) + "garbage line without a tab\nnohash.jpg\tcaption\n\n"
    (tmp_path / "results.token").write_text(text)
    source = DataSource(images=tmp_path, captions=tmp_path / "results.token")
    records = load_dataset("flickr30k", source, "all")
    assert {r.image_id for r in records.images} == set(TRAIN)
    assert [(e.id, e.reason) for e in records.errors] == [
        ("line 6", "unreadable caption row"),
        ("line 7", "unreadable caption row"),
    ]


def test_token_file_with_split_list_reports_images_without_captions(tmp_path):
    (tmp_path / "results.token").write_text(_token_lines(TRAIN))
    (tmp_path / "train.txt").write_text("1000092795\n999\n")  # Entities lists: ids, no suffix
    source = DataSource(tmp_path, tmp_path / "results.token", tmp_path / "train.txt")
    records = load_dataset("flickr30k", source, "train")
    assert [r.image_id for r in records.images] == ["1000092795"]
    assert [(e.id, e.reason) for e in records.errors] == [("999", "no captions for this image")]


def test_local_csv_and_tsv_with_a_bad_row(tmp_path):
    """A CSV row is named by its row, a TSV one (read line by line) by its line."""
    for suffix, sep, where in ((".csv", ",", "row 3"), (".tsv", "\t", "line 4")):
        lines = [f"image{sep}caption", f"a.jpg{sep}first", f"a.jpg{sep}second", f"b.png{sep}"]
        (tmp_path / f"c{suffix}").write_text("\n".join(lines) + "\n")
        records = load_dataset("local", DataSource(tmp_path, tmp_path / f"c{suffix}"), "train")
        assert [(r.image_id, r.captions) for r in records.images] == [("a", ("first", "second"))]
        assert [(e.id, e.reason) for e in records.errors] == [(where, "blank")]


def test_local_jsonl_broken_line_is_an_error_not_a_crash(tmp_path):
    (tmp_path / "c.jsonl").write_text('{"image": "a.jpg", "caption": "x"}\n{not json\n')
    records = load_dataset("local", DataSource(tmp_path, tmp_path / "c.jsonl"), "train")
    assert [r.image_id for r in records.images] == ["a"]
    assert [e.id for e in records.errors] == ["line 2"]


def test_flickr30k_parquet_route_unpacks_embedded_images(tmp_path):
    names = [f"{s}.jpg" for s in TRUTH]
    table = pa.table(
        {
            "filename": names,
            "caption": [TRUTH[s] for s in TRUTH],
            "image": [{"bytes": f"jpeg-{n}".encode(), "path": None} for n in names],
        }
    )
    pq.write_table(table, tmp_path / "test-00000.parquet")
    (tmp_path / "train.txt").write_text("\n".join(TRAIN))
    images = tmp_path / "images"
    source = DataSource(images, tmp_path / "test-00000.parquet", tmp_path / "train.txt")
    records = load_dataset("flickr30k", source, "train")
    assert {r.image_id: list(r.captions) for r in records.images} == {s: TRUTH[s] for s in TRAIN}
    assert sorted(p.name for p in images.iterdir()) == sorted(f"{s}.jpg" for s in TRAIN)
    assert (images / "10002456.jpg").read_bytes() == b"jpeg-10002456.jpg"


def test_coco_parquet_route_filters_karpathy_split(tmp_path):
    table = pa.table(
        {
            "filepath": ["val2014"] * 3,
            "filename": [f"COCO_val2014_{int(s):012d}.jpg" for s in TRUTH],
            "cocoid": [int(s) for s in TRUTH],
            "sentences": [TRUTH[s] for s in TRUTH],
            "split": ["train", "restval", "test"],
        }
    )
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet")
    records = load_dataset("coco", DataSource(tmp_path, tmp_path), "train")
    assert {r.image_id: list(r.captions) for r in records.images} == {s: TRUTH[s] for s in TRAIN}


def test_wiki1m_without_a_file_offline_names_the_local_option(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MmcseError, match="--text-file"):
        load_dataset("wiki1m", DataSource(), "train")


def test_missing_required_paths_are_clear_errors(tmp_path):
    with pytest.raises(MmcseError, match="--images"):
        load_dataset("coco", DataSource(captions=tmp_path), "train")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dataset("flickr30k", DataSource(tmp_path, tmp_path / "nope.json"), "train")


# ---- caption policies ------------------------------------------------------------------------

RECORD = ImageRecord("img", Path("img.jpg"), ("short", "the longest caption", "medium one"))


def test_policy_all_and_longest():
    assert select_captions(RECORD, "all", 0) == list(enumerate(RECORD.captions))
    assert select_captions(RECORD, "longest", 0) == [(1, "the longest caption")]


def test_random_one_is_seeded_per_image_and_order_free():
    picks = {seed: select_captions(RECORD, "random-one", seed) for seed in range(20)}
    assert all(len(p) == 1 and p[0][1] == RECORD.captions[p[0][0]] for p in picks.values())
    assert picks == {seed: select_captions(RECORD, "random-one", seed) for seed in range(20)}
    assert len({p[0][0] for p in picks.values()}) > 1  # the seed matters


def test_caption_ids_do_not_depend_on_policy():
    ids = {
        policy: {caption_id(RECORD.image_id, k): c for k, c in select_captions(RECORD, policy, 3)}
        for policy in ("all", "longest", "random-one")
    }
    for policy in ("longest", "random-one"):
        assert ids[policy].items() <= ids["all"].items()


def test_unknown_policy():
    with pytest.raises(MmcseError, match="unknown caption policy"):
        select_captions(RECORD, "first", 0)


# ---- real caption files (skipped without shared/data) --------------------------------------

needs_shared = pytest.mark.skipif(not CAPTIONS.is_dir(), reason="shared/data not available")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@needs_shared
@pytest.mark.parametrize(
    ("split", "prefix", "count"), [("train", "train", 29000), ("test", "test_2016", 1000)]
)
def test_real_multi30k_flickr30k(split, prefix, count, tmp_path):
    folder = CAPTIONS / "flickr30k_multi30k_task2"
    records = load_dataset("flickr30k", DataSource(tmp_path, folder), split)
    assert len(records.images) == count
    names, third = _lines(folder / f"{prefix}_images.txt"), _lines(folder / f"{prefix}.3.en")
    for i in (0, count // 2, count - 1):  # line i of {split}.k.en = caption k of image i
        record = records.images[i]
        assert record.image_id == Path(names[i]).stem and record.captions[2] == third[i].strip()
        assert record.path == tmp_path / names[i]


@needs_shared
def test_real_flickr8k_train_split_and_id_quirk(tmp_path):
    folder = CAPTIONS / "flickr8k"
    source = DataSource(tmp_path, folder / "Flickr8k.token.txt")
    records = load_dataset("flickr8k", source, "train")
    assert len(records.images) == 6000 and records.errors == []
    assert all(len(r.captions) == 5 for r in records.images)
    first = _lines(folder / "Flickr_8k.trainImages.txt")[0]
    expected = [  # independent re-read of that image's rows, in k order
        line.split("\t")[1].strip()
        for k in range(5)
        for line in _lines(folder / "Flickr8k.token.txt")
        if line.startswith(f"{first}#{k}\t")
    ]
    assert records.images[0].image_id == Path(first).stem
    assert list(records.images[0].captions) == expected
    quirk = load_dataset("flickr30k", source, "all")  # token file only: every image
    assert "2258277193_586949ec62" in {r.image_id for r in quirk.images}  # "....jpg.1#0" rows


@needs_shared
def test_real_coco_val2017_captions_json():
    path = CAPTIONS / "coco_val2017" / "captions_val2017.json"
    records = load_dataset("coco", DataSource(COCO_MINI, path), "val")
    data = json.loads(path.read_text())
    assert len(records.images) == len(data["images"]) == 5000
    assert sum(len(r.captions) for r in records.images) == len(data["annotations"]) == 25014
    ann = min(data["annotations"], key=lambda a: a["id"])
    record = next(r for r in records.images if r.image_id == str(ann["image_id"]))
    assert record.captions[0] == ann["caption"].strip()


@needs_shared
def test_real_coco_albef_test_list(tmp_path):
    path = CAPTIONS / "coco_karpathy_test_albef" / "coco_test.json"
    records = load_dataset("coco", DataSource(tmp_path, path), "test")
    entries = json.loads(path.read_text())
    assert len(records.images) == len(entries) == 5000
    assert records.images[0].image_id == "391895"
    assert records.images[0].path == tmp_path / entries[0]["image"]


@needs_shared
@pytest.mark.skipif(not COCO_MINI.is_dir(), reason="coco_mini not available")
def test_real_coco_mini_annotation_folder_resolves_image_files():
    for split, count in (("train", 80), ("val", 79)):
        records = load_dataset("coco", DataSource(COCO_MINI, COCO_MINI / "annotations"), split)
        assert len(records.images) == count
        assert all(
            r.path.is_file() and r.path.parent.name == f"{split}2017" for r in records.images
        )
        assert all(len(r.captions) >= 5 for r in records.images)


@needs_shared
def test_real_wiki1m_sample():
    path = SHARED / "text" / "wiki1m_sample" / "wiki1m_for_simcse.head.txt"
    records = load_dataset("wiki1m", DataSource(text=path), "train")
    lines = _lines(path)
    assert len(records.sentences) + len(records.errors) == len(lines)
    assert records.sentences[0].text == "YMCA in South Australia"
    for s in records.sentences[:: len(records.sentences) // 7]:
        assert lines[int(s.id.split("-")[1])].strip() == s.text


# ---- the split a file says (refused when it contradicts --split, warned when it says nothing) --


def test_no_entry_of_the_split_in_a_marked_file_is_refused_with_its_marks(tmp_path):
    _karpathy(tmp_path / "dataset_flickr30k.json", coco=False)  # train 1, restval 1, test 1
    source = DataSource(images=tmp_path, captions=tmp_path / "dataset_flickr30k.json")
    with pytest.raises(MmcseError) as info:
        load_dataset("flickr30k", source, "val")
    message = str(info.value)
    assert "dataset_flickr30k.json" in message and "no entry is marked as split 'val'" in message
    assert "restval 1, test 1, train 1" in message
    assert len(load_dataset("flickr30k", source, "test").images) == 1


def _albef(path: Path) -> Path:
    entries = [{"image": f"val2014/{s}.jpg", "caption": TRUTH[s]} for s in TRUTH]
    path.write_text(json.dumps(entries))
    return path


def _official(path: Path) -> Path:
    images = [{"id": int(s), "file_name": f"{s}.jpg"} for s in TRUTH]
    annotations = [
        {"id": 10 * n + k, "image_id": int(s), "caption": c}
        for n, s in enumerate(TRUTH)
        for k, c in enumerate(TRUTH[s])
    ]
    path.write_text(json.dumps({"images": images, "annotations": annotations}))
    return path


@pytest.mark.parametrize(
    ("name", "make", "split"),
    [
        ("coco", lambda t: DataSource(t, _albef(t / "coco_train.json")), "val"),
        ("coco", lambda t: DataSource(t, _official(t / "captions_train2017.json")), "val"),
        ("coco", lambda t: DataSource(t, _official(t / "captions_val2017.json")), "train"),
        ("flickr8k", lambda t: _flickr8k(t)[0], "val"),  # Flickr_8k.trainImages.txt as the list
        ("flickr30k", lambda t: _token_with_list(t, "train.txt"), "test"),
    ],
)
def test_a_file_named_for_another_split_is_refused(tmp_path, name, make, split):
    source = make(tmp_path)
    if name == "flickr8k":
        source = DataSource(source.images, source.captions, tmp_path / "Flickr_8k.trainImages.txt")
    named = source.split_file or source.captions
    with pytest.raises(MmcseError) as info:
        load_dataset(name, source, split)
    assert str(info.value).startswith(f"{named}: its name says split")
    assert f"--split is {split!r}" in str(info.value)


def _token_with_list(tmp: Path, list_name: str) -> DataSource:
    (tmp / "results.token").write_text(_token_lines(list(TRUTH)))
    (tmp / list_name).write_text("".join(f"{s}\n" for s in TRAIN))
    return DataSource(tmp, tmp / "results.token", tmp / list_name)


def test_a_held_out_split_from_a_file_without_split_information_is_warned(tmp_path, library_log):
    (tmp_path / "results.token").write_text(_token_lines(list(TRUTH)))
    token = DataSource(images=tmp_path, captions=tmp_path / "results.token")
    assert len(load_dataset("flickr30k", token, "test").images) == 3
    warning = library_log()
    assert "results.token carries no split information" in warning
    assert "all 3 images" in warning and "'test'" in warning and "--split-file" in warning
    for split in ("train", "all"):  # a training set or everything: nothing to warn about
        load_dataset("flickr30k", token, split)
        assert library_log() == ""
    load_dataset("coco", DataSource(tmp_path, _albef(tmp_path / "captions.json")), "val")
    assert "captions.json carries no split information" in library_log()
    # local rows: some marked train, the rest unmarked, --split val takes the unmarked ones
    rows = [{"image": f"{s}.jpg", "caption": TRUTH[s][0], "split": "train"} for s in TRAIN]
    rows += [{"image": f"{s}.jpg", "caption": TRUTH[s][0]} for s in TEST]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_dataset("local", DataSource(tmp_path, tmp_path / "rows.jsonl"), "val")
    assert [r.image_id for r in records.images] == TEST
    assert "no entry is marked as split 'val' (marked: train 2); its 1 unmarked" in library_log()


def test_cli_val_features_from_a_train_file_are_one_line_and_nothing_is_written(
    tmp_path, monkeypatch, capsys
):
    images = [
        {"filename": f"{s}.jpg", "split": "train", "sentences": [{"raw": "c"}]} for s in TRUTH
    ]
    (tmp_path / "dataset_flickr30k.json").write_text(json.dumps({"images": images}))
    out = tmp_path / "out"
    code, stderr = run_main(
        ["extract-images", "--dataset", "flickr30k", "--split", "val", "--images", str(tmp_path),
         "--captions", str(tmp_path / "dataset_flickr30k.json"), "--teacher", "resnet50",
         "--weights", "random", "--teacher-size", "tiny", "--device", "cpu", "--workers", "0",
         "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(code, stderr, "dataset_flickr30k.json", "'val'", "train 3")
    assert not out.exists()


@needs_shared
def test_real_caption_files_refuse_another_split():
    val2017 = CAPTIONS / "coco_val2017" / "captions_val2017.json"
    with pytest.raises(MmcseError, match="its name says split 'val' but --split is 'train'"):
        load_dataset("coco", DataSource(COCO_MINI, val2017), "train")
    albef = CAPTIONS / "coco_karpathy_test_albef" / "coco_test.json"
    with pytest.raises(MmcseError, match="its name says split 'test' but --split is 'val'"):
        load_dataset("coco", DataSource(COCO_MINI, albef), "val")
    folder = CAPTIONS / "flickr8k"
    source = DataSource(COCO_MINI, folder / "Flickr8k.token.txt")
    assert len(load_dataset("flickr8k", source, "val").images) == 1000  # its dev list
