"""MCSEO object extraction: span matching, masks and cut-outs, Florence-2 and SAM2 (tiny models
built from configs), the whole extraction on real COCO-mini images, boxes-file import, resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mmcse.errors import MmcseError
from pipeline.objects.cutout import box_mask, cut_out, decode_rle, encode_rle, fill_colour
from pipeline.objects.spans import match_phrases

# ---- spans ---------------------------------------------------------------------------------


def spans_of(caption: str, phrases: list[str]) -> list[str | None]:
    return [
        caption[m.start : m.end] if m.matched else None for m in match_phrases(caption, phrases)
    ]


@pytest.mark.parametrize(
    ("caption", "phrases", "expected"),
    [
        # a repeated phrase takes the next occurrence, left to right
        ("A man hands a man a cup.", ["a man", "a man", "a cup"], ["A man", "a man", "a cup"]),
        # case and stray punctuation around the phrase
        ("Two DOGS play, near a Red Car.", ["two dogs", "a red car."], ["Two DOGS", "a Red Car"]),
        # Florence-2 strips non-ASCII: "café" comes back "caf", "man’s" comes back "mans"
        ("A man’s café is open.", ["A mans caf"], ["A man’s café"]),
        # whitespace differences
        ("A  dog   on a\tsofa", ["a dog on a sofa"], ["A  dog   on a\tsofa"]),
        # never inside a longer word; absent phrases are dropped
        ("A mango on a table.", ["a man", "a table", "a chair"], [None, "a table", None]),
        # out of caption order: an earlier untaken occurrence is still found
        ("A cat and a dog.", ["a dog", "a cat"], ["a dog", "A cat"]),
    ],
)
def test_match_phrases(caption, phrases, expected):
    assert spans_of(caption, phrases) == expected


def test_unmatched_phrases_carry_a_reason():
    matches = match_phrases("A dog.", ["a dog", "a dog", "a cat", " .. "])
    assert [m.reason for m in matches] == [
        "",
        "already matched",
        "not found in caption",
        "empty phrase",
    ]


# ---- masks and cut-outs --------------------------------------------------------------------


def test_rle_round_trip_and_coco_convention():
    rng = np.random.default_rng(0)
    mask = rng.random((7, 5)) > 0.5
    rle = encode_rle(mask)
    assert np.array_equal(decode_rle(rle), mask)
    assert rle["size"] == [7, 5] and sum(rle["counts"]) == 35
    # column-major runs starting with zeros: a mask whose first pixel is set starts with 0
    corner = np.zeros((2, 2), dtype=bool)
    corner[0, 0] = True
    assert encode_rle(corner)["counts"] == [0, 1, 3]
    column = np.zeros((2, 2), dtype=bool)
    column[:, 1] = True
    assert encode_rle(column)["counts"] == [2, 2]


def test_cut_out_fills_the_background_and_keeps_the_object():
    image = np.zeros((20, 40, 3), dtype=np.uint8)
    image[:, :] = (10, 200, 30)
    mask = np.zeros((20, 40), dtype=bool)
    mask[5:15, 10:30] = True  # a 10 × 20 object
    fill = fill_colour("white", (0.5, 0.5, 0.5))
    out = cut_out(image, mask, 8, fill)
    assert out.shape == (3, 8, 8) and out.dtype == torch.uint8
    assert out[:, 4, 4].tolist() == [10, 200, 30]  # centre: object
    assert out[:, 0, 4].tolist() == [255, 255, 255]  # top: padding to a square
    assert cut_out(image, np.zeros((20, 40), dtype=bool), 8, fill) is None
    assert fill_colour("mean", (0.485, 0.456, 0.406)) == (124, 116, 104)
    with pytest.raises(ValueError, match="background"):
        fill_colour("grey", (0, 0, 0))


def test_box_mask_is_clipped_to_the_image():
    mask = box_mask(10, 10, [-5.0, 2.0, 4.0, 30.0])
    assert mask.sum() == 4 * 8 and mask[2:, :4].all()


# ---- tiny models ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def florence_dir(tmp_path_factory) -> Path:
    from support.objects import build_florence2

    return build_florence2(tmp_path_factory.mktemp("florence2"))


@pytest.fixture(scope="module")
def sam2_dir(tmp_path_factory) -> Path:
    from support.objects import build_sam2

    return build_sam2(tmp_path_factory.mktemp("sam2"))


@pytest.fixture(scope="module")
def grounder(florence_dir):
    from pipeline.objects.florence import Florence2Grounder

    return Florence2Grounder(florence_dir, "cpu", num_beams=2, max_new_tokens=12)


@pytest.fixture(scope="module")
def teacher():
    from pipeline.teachers import build_teacher

    return build_teacher("resnet50", weights="random", size="tiny")


@pytest.fixture(scope="module")
def coco_records(shared_data):
    from pipeline.datasets import DataSource, load_dataset

    root = shared_data / "images" / "coco_mini"
    if not root.is_dir():
        pytest.skip(f"{root} not found")
    records = load_dataset("coco", DataSource(images=root, captions=root / "annotations"), "train")
    records.images = sorted(records.images, key=lambda r: r.image_id)[:4]
    return records


def test_florence_parses_a_handwritten_grounding(grounder):
    text = (
        "</s><s>a man<loc_100><loc_200><loc_500><loc_900>two dogs<loc_0><loc_0><loc_99><loc_99>"
        "<loc_600><loc_600><loc_999><loc_999>the image<loc_1><loc_1><loc_2><loc_2></s><pad>"
    )
    found = grounder.parse(text, (1000, 500))
    assert [g.phrase for g in found] == ["a man", "two dogs"]  # "the image" is banned
    assert found[0].boxes == [[100.0, 100.0, 500.0, 450.0]]  # bins → pixels (y scaled by 0.5)
    assert len(found[1].boxes) == 2
    assert grounder.parse("garbage without locations", (10, 10)) == []


def test_florence_generates_and_parses_in_batches(grounder, coco_records):
    from PIL import Image

    images = [Image.open(r.path).convert("RGB") for r in coco_records.images[:2]]
    captions = ["a man", "two dogs sit on a long red sofa next to the window"]  # padding
    found = grounder.ground(images, captions)
    assert len(found) == 2
    for groundings in found:
        for g in groundings:  # random weights: whatever came out, it is well formed
            assert isinstance(g.phrase, str) and all(len(b) == 4 for b in g.boxes)
            assert np.isfinite(g.score)


def test_sam2_masks_each_box_at_the_image_size(sam2_dir):
    from pipeline.objects.sam2 import Sam2Segmenter

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (30, 50, 3), dtype=np.uint8) for _ in range(3)]
    boxes = [[[1, 1, 20, 20], [5, 5, 40, 25]], [], [[0, 0, 49, 29]]]
    out = Sam2Segmenter(sam2_dir).segment(images, boxes)
    assert [s.masks.shape for s in out] == [(2, 30, 50), (0, 30, 50), (1, 30, 50)]
    assert out[0].masks.dtype == bool and out[0].scores.shape == (2,)


# ---- whole extraction ----------------------------------------------------------------------


def options(**kw):
    from pipeline.extract import RunOptions

    return RunOptions(shard_size=2, batch_size=2, workers=0, progress=False, **kw)


def test_florence_extraction_on_coco_mini(tmp_path, coco_records, grounder, sam2_dir, teacher):
    from mmcse.cache import Corpus, FeatureSet
    from pipeline.objects.extract import ObjectSettings, extract_objects
    from pipeline.objects.sam2 import Sam2Segmenter

    results = extract_objects(
        coco_records,
        grounder,
        Sam2Segmenter(sam2_dir),
        teacher,
        "resnet50",
        tmp_path,
        settings=ObjectSettings(),
        options=options(),
    )
    corpus = Corpus.open(tmp_path / "captions")
    longest = {r.image_id: max(r.captions, key=len) for r in coco_records.images}
    assert sorted(corpus.texts) == sorted(longest.values())  # the paper's caption policy
    table = results["objects"]
    assert table.kind == "objects" and table.extra["num_captions"] == 4
    counts = table.extra["counts"]
    assert counts["captions"] == 4 and counts.get("objects", 0) == table.num_rows
    features = FeatureSet.open(tmp_path / "object-resnet50")
    assert len(features) == table.num_rows and features.dim == teacher.dim
    assert features.manifest.producer["cutout"]["background"] == "mean"


def write_boxes(path: Path, records) -> dict[str, str]:
    """Two phrases per image's longest caption: its first two words and its last word."""
    rows, captions = [], {}
    for r in records.images:
        caption = max(r.captions, key=len)
        captions[r.image_id] = caption
        words = caption.rstrip(".").split()
        rows.append(
            {
                "image_id": r.image_id,
                "caption": caption,
                "phrase": " ".join(words[:2]),
                "box": [10, 20, 110, 220],
            }
        )
        rows.append(
            {
                "image_id": r.image_id,
                "caption": caption,
                "phrase": words[-1],
                "box": [50, 60, 300, 200],
            }
        )
        rows.append(
            {"image_id": r.image_id, "caption": caption, "phrase": words[-1], "box": [0, 0, 40, 30]}
        )  # a second box for the same phrase
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return captions


@pytest.fixture
def boxes_run(tmp_path, coco_records, teacher):
    from pipeline.objects.extract import BoxesFile, ObjectSettings, extract_objects

    captions = write_boxes(tmp_path / "boxes.jsonl", coco_records)
    out = tmp_path / "out"
    results = extract_objects(
        coco_records,
        BoxesFile(tmp_path / "boxes.jsonl"),
        None,
        teacher,
        "resnet50",
        out,
        settings=ObjectSettings(masks="box", background="black"),
        options=options(),
    )
    return out, results, captions


def test_boxes_file_import_with_box_masks(boxes_run, coco_records):
    from mmcse.cache import FeatureSet
    from mmcse.methods.phrases import OBJECT_ROW, ObjectsTable, table_of

    out, results, captions = boxes_run
    assert results["objects"].num_rows == 8  # 2 objects per caption; 2 boxes → 1 object
    table = ObjectsTable.open(out / "objects")
    for row in range(len(table)):
        caption = captions[table.columns["image_id"][row]]
        start, end = (int(v) for v in table.columns["row"][row, :2])
        assert caption[start:end] == table.columns["span_text"][row]
        assert table.columns["phrase"][row].lower() == caption[start:end].lower()
    last_word = [r for r in range(len(table)) if table.columns["id"][r].endswith("/1")][0]
    box = table.columns["row"][last_word, OBJECT_ROW.index("x0") : OBJECT_ROW.index("y1") + 1]
    assert box.tolist() == [0, 0, 300, 200]  # the union of the phrase's two boxes
    mask = decode_rle(table.mask(last_word))
    assert mask[0:30, 0:40].all() and mask[60:200, 50:300].all() and not mask[250:, 350:].any()
    features = FeatureSet.open(out / "object-resnet50")
    assert np.isfinite(features.gather(list(table.columns["id"]))).all()
    assert table_of(features.path, features.manifest.extra).fingerprint == table.fingerprint


def test_reencode_with_another_teacher_reuses_the_table(boxes_run):
    from mmcse.cache import FeatureSet
    from pipeline.objects.extract import reencode_objects
    from pipeline.teachers import build_teacher

    out, _, _ = boxes_run
    clip = build_teacher("clip-vit-b32", weights="random", size="tiny")
    results = reencode_objects(
        out / "objects", clip, "clip-vit-b32", out, background="mean", options=options()
    )
    encoded = FeatureSet.open(out / "object-clip-vit-b32")
    assert results["object-clip-vit-b32"].num_rows == 8 and encoded.dim == clip.dim
    assert sorted(encoded.ids) == sorted(FeatureSet.open(out / "object-resnet50").ids)


def test_resume_rewrites_only_missing_shards(boxes_run, coco_records, teacher, tmp_path):
    from mmcse.cache import Manifest
    from pipeline.objects.extract import BoxesFile, ObjectSettings, extract_objects

    out, results, _ = boxes_run
    copy = tmp_path / "resumed"
    shutil.copytree(out, copy)
    for part in ("objects", "object-resnet50"):
        (copy / part / "manifest.json").unlink()
        (copy / part / "shard-00001.arrow").unlink()
    again = extract_objects(
        coco_records,
        BoxesFile(tmp_path / "boxes.jsonl"),
        None,
        teacher,
        "resnet50",
        copy,
        settings=ObjectSettings(masks="box", background="black"),
        options=options(),
    )
    for part in ("objects", "object-resnet50"):
        assert again[part].fingerprint == Manifest.read(out / part).fingerprint


def test_unreadable_images_go_to_errors_jsonl(tmp_path, teacher):
    from PIL import Image

    from pipeline.datasets import DataSource, load_dataset
    from pipeline.objects.extract import BoxesFile, ObjectSettings, extract_objects

    Image.new("RGB", (64, 48), (200, 10, 10)).save(tmp_path / "good.jpg")
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    rows = [
        {"image": "good.jpg", "caption": "A red square."},
        {"image": "bad.jpg", "caption": "A cat."},
    ]
    (tmp_path / "caps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    boxes = [
        {
            "image_id": "good",
            "caption": "A red square.",
            "phrase": "A red square",
            "box": [0, 0, 30, 30],
        }
    ]
    (tmp_path / "boxes.jsonl").write_text(json.dumps(boxes[0]) + "\n")
    records = load_dataset("local", DataSource(tmp_path, tmp_path / "caps.jsonl"), "train")
    results = extract_objects(
        records,
        BoxesFile(tmp_path / "boxes.jsonl"),
        None,
        teacher,
        "resnet50",
        tmp_path / "o",
        settings=ObjectSettings(masks="box"),
        options=options(),
    )
    assert results["objects"].num_rows == 1 and results["objects"].extra["num_errors"] == 1
    logged = [json.loads(x) for x in (tmp_path / "o" / "errors.jsonl").read_text().splitlines()]
    assert [(e["id"], e["stage"]) for e in logged] == [("bad", "objects")]


def test_malformed_boxes_file_is_one_clear_error(tmp_path):
    from pipeline.objects.extract import BoxesFile

    (tmp_path / "b.jsonl").write_text('{"image_id": "1", "caption": "x", "phrase": "x"}\n')
    with pytest.raises(MmcseError, match=r"b.jsonl:1: expected"):
        BoxesFile(tmp_path / "b.jsonl")


def test_bench_objects_reports_three_stages():
    from mmcse.bench.objects import bench_objects

    results = bench_objects("tiny", "cpu", images=1, batch_size=1, new_tokens=4)
    assert [r.stage.split()[0] for r in results] == ["florence2", "sam2", "object"]
    assert all(r.images_per_s > 0 for r in results)


def test_mcseo_batch_inputs_join_objects_to_a_caption_batch(boxes_run, tiny_model):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from mmcse.cache import Corpus, FeatureSet
    from mmcse.methods import build_method

    out, _, _ = boxes_run
    corpus = Corpus.open(out / "captions")
    source = SimpleNamespace(ids=np.asarray(corpus.ids, dtype=object), texts=list(corpus.texts))
    data = SimpleNamespace(
        sources={"caption": source},
        feature_sets={"object": FeatureSet.open(out / "object-resnet50")},
        tokenizer=AutoTokenizer.from_pretrained(tiny_model),
        cfg=SimpleNamespace(max_seq_length=32, dynamic_padding=True),
    )
    batch = SimpleNamespace(
        kind="caption", rows=np.arange(4), input_ids=torch.zeros(4, 3), features={}
    )
    inputs = build_method("mcseo").batch_inputs(data, batch)
    assert not batch.features  # the hook writes nothing; the trainer's gather applies it
    extras = inputs.apply_to(batch)
    assert extras["phrase_mask"].sum() == 8  # all 8 pairs fit in 32 tokens
    assert batch.features["object"].shape == (4, 2, 512)
    text_inputs = build_method("mcseo").batch_inputs(data, SimpleNamespace(kind="text"))
    assert text_inputs.extras == {} and text_inputs.features == {}


def test_train_mcseo_from_extracted_objects(boxes_run, coco_records, teacher, tiny_model, tmp_path):
    """Stage 1 (images + objects) → `mmcse train --method mcseo`: the object term is trained."""
    import json as _json

    from mmcse.training.config import TrainConfig
    from mmcse.training.loop import train
    from pipeline.extract import extract_images

    out, _, _ = boxes_run
    images = tmp_path / "images"
    extract_images(
        coco_records,
        teacher,
        "resnet50",
        images,
        caption_policy="longest",
        seed=0,
        options=options(),
    )
    cfg = TrainConfig(
        model=str(tiny_model),
        method="mcseo",
        method_args={"object_phrase_weight": 1.0},
        caption_corpus=str(out / "captions"),
        features={"image": str(images / "image-resnet50"), "object": str(out / "object-resnet50")},
        mixing="caption-only",
        batch_size=2,
        max_steps=3,
        epochs=3,
        eval_data="",
        final_eval=False,
        log_every=1,
        output_dir=str(tmp_path / "run"),
    )
    result = train(cfg)
    rows = [_json.loads(x) for x in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert all(np.isfinite(r["object_phrase_loss"]) and r["object_phrase_loss"] > 0 for r in rows)
    assert all("image_text_loss" in r for r in rows)


def test_phrase_index_slices_equal_the_per_batch_collate(boxes_run, tiny_model):
    """The trainer's once-per-corpus index gives exactly what collating each batch gives."""
    from support.phrases import build_phrase_batch
    from transformers import AutoTokenizer

    from mmcse.cache import Corpus, FeatureSet
    from mmcse.methods.phrases import PhraseIndex, table_of

    out, _, _ = boxes_run
    corpus = Corpus.open(out / "captions")
    features = FeatureSet.open(out / "object-resnet50")
    table = table_of(features.path, features.manifest.extra)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids, texts = [str(i) for i in corpus.ids], list(corpus.texts)
    index = PhraseIndex.build(ids, texts, tokenizer, 32, table, features)
    rows = np.array([3, 1])
    enc = tokenizer(
        [texts[r] for r in rows],
        max_length=32,
        truncation=True,
        padding=True,
        return_offsets_mapping=True,
        return_tensors="pt",
    )
    want = build_phrase_batch(
        [ids[r] for r in rows], [texts[r] for r in rows], enc["offset_mapping"], table, features
    )
    got = index.batch(rows)
    assert torch.equal(got.spans, want.spans) and torch.equal(got.mask, want.mask)
    assert torch.allclose(got.objects, want.objects)
