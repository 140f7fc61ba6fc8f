"""Fault injection against Stage 1: bad images, text and caption files, path escapes, reruns
with other settings, killed runs, empty results and OS errors. Each is either logged and left
out (``errors.jsonl``) or one ``error:`` line naming the file (exit 2); ``--strict`` stops on
all of them; the output of an extraction always trains as is (corpus ids ⊆ feature ids)."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support.cli import assert_one_error, run_main

import cli
from mmcse.cache import Corpus, FeatureSet
from mmcse.errors import CacheError, MmcseError
from mmcse.files import HOST
from pipeline.datasets import DataSource, load_dataset
from pipeline.extract import RunOptions, extract_images, extract_texts
from pipeline.images import BadImageError, open_rgb
from pipeline.teachers.base import ImagePreprocess

TINY = ImagePreprocess(resize=36, crop=32)
ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MMCSE_SHARED_DATA", ROOT.parent / "shared" / "data"))
COCO_MINI = SHARED / "images" / "coco_mini"


class MeanTeacher:
    """Image features = channel means of the crop; text features = character statistics.
    ``nan_for`` makes the features of images with that mean red value NaN (a broken teacher)."""

    name, dim, preprocess, device = "mean", 3, TINY, torch.device("cpu")

    def __init__(self, nan_red: int | None = None) -> None:
        self.nan_red = nan_red

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        features = pixels.float().mean(dim=(2, 3))
        if self.nan_red is not None:
            features[(features[:, 0] - self.nan_red).abs() < 2] = float("nan")
        return features

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        return torch.tensor([[len(t), t.count(" "), ord(t[0])] for t in texts], dtype=torch.float)

    def producer(self) -> dict:
        return {"teacher": "mean", "weights_sha256": "none"}


def options(**kw) -> RunOptions:
    return RunOptions(**{"shard_size": 4, "batch_size": 2, "workers": 0, "progress": False, **kw})


def images_folder(root: Path, count: int = 4) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", (40, 30), (20 * i, 100, 50)).save(root / f"im{i}.jpg", quality=95)
    return root


def captions_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def local_records(tmp_path: Path, extra_rows: list[dict] = (), count: int = 4):
    images = images_folder(tmp_path / "imgs", count)
    rows = [{"image": f"im{i}.jpg", "caption": f"caption number {i}"} for i in range(count)]
    captions = captions_file(tmp_path / "c.jsonl", rows + list(extra_rows))
    return load_dataset("local", DataSource(images, captions), "train")


def errors_jsonl(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


# ---- images ----------------------------------------------------------------------------------


def _jpeg_bytes(size=(64, 64), quality=30) -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (*size[::-1], 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=quality
    )
    return buffer.getvalue()


def _with_header_size(data: bytes, width: int, height: int) -> bytes:
    data = bytearray(data)
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 7] = height.to_bytes(2, "big")
    data[sof + 7 : sof + 9] = width.to_bytes(2, "big")
    return bytes(data)


def test_huge_jpeg_header_is_refused_without_decoding(tmp_path, monkeypatch):
    path = tmp_path / "bomb.jpg"
    path.write_bytes(_with_header_size(_jpeg_bytes(), 60000, 60000))
    monkeypatch.setattr(Image.Image, "load", lambda self: pytest.fail("decoded"))
    with pytest.raises(BadImageError, match="60000x60000 in the header"):
        open_rgb(path, 36)


def test_jpeg_whose_data_cannot_fill_its_header_is_truncated(tmp_path):
    """libjpeg pads such a file with grey ("premature end") and PIL says nothing."""
    path = tmp_path / "forged.jpg"
    path.write_bytes(_with_header_size(_jpeg_bytes(), 2000, 2000))
    with pytest.raises(BadImageError, match="truncated JPEG"):
        open_rgb(path, 36)


def test_cut_jpeg_without_end_marker_is_truncated(tmp_path):
    data = _jpeg_bytes((200, 200), quality=90)
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[:-2])  # only the EOI marker missing
    with pytest.raises(BadImageError, match="truncated"):
        open_rgb(path, 36)


def _photo_jpeg(progressive: bool = False) -> bytes:
    """A real photo as JPEG bytes: a coco_mini file when present, else a generated one."""
    photos = sorted(COCO_MINI.rglob("*.jpg")) if COCO_MINI.is_dir() else []
    if photos and not progressive:
        return photos[0].read_bytes()
    if photos:
        image = Image.open(photos[0])
    else:
        steps = np.random.default_rng(0).integers(-4, 5, (240, 320, 3))
        image = Image.fromarray(np.clip(np.cumsum(steps, axis=1) + 128, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, progressive=progressive)
    return buffer.getvalue()


def _cut_then_ended(data: bytes, keep: float) -> bytes:
    """The first ``keep`` of a JPEG and an end-of-image marker: libjpeg pads the missing scan
    data with grey and only warns ("premature end of data segment"), which Pillow drops."""
    cut = data[: int(len(data) * keep)]
    return cut.rstrip(b"\xff") + b"\xff\xd9"


@pytest.mark.parametrize("progressive", [False, True])
@pytest.mark.parametrize("keep", [0.3, 0.7, 0.97])
def test_cut_jpeg_with_an_end_marker_is_truncated(tmp_path, progressive, keep):
    path = tmp_path / "cut.jpg"
    path.write_bytes(_cut_then_ended(_photo_jpeg(progressive), keep))
    with Image.open(path) as plain:  # what the check is for: Pillow decodes it, grey and all
        plain.load()
    # a progressive file drafted to 1/8 decodes its DC only: a cut that loses only finer
    # detail leaves those pixels as the complete file's (see pipeline.images.load_jpeg)
    for short_side in (224, 1 << 30) if progressive else (36, 224, 1 << 30):
        with pytest.raises(BadImageError, match="truncated JPEG"):
            open_rgb(path, short_side)


def test_progressive_jpeg_missing_its_last_scans_is_truncated(tmp_path):
    data = _photo_jpeg(progressive=True)
    scans = [i for i in range(len(data) - 1) if data[i : i + 2] == b"\xff\xda"]
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: scans[len(scans) // 2]] + b"\xff\xd9")  # whole scans gone
    with pytest.raises(BadImageError, match="its last scans are missing"):
        open_rgb(path, 36)


def test_cut_jpeg_is_logged_and_left_out_or_stops_strict(tmp_path, monkeypatch, capsys):
    """Through extract-images: logged in errors.jsonl and left out with its captions, as every
    bad image; with --strict one error line naming the file, and no set written."""
    images = images_folder(tmp_path / "imgs", 2)
    (images / "cut.jpg").write_bytes(_cut_then_ended(_photo_jpeg(), 0.5))
    names = ["im0.jpg", "im1.jpg", "cut.jpg"]
    captions = captions_file(tmp_path / "c.jsonl", [{"image": n, "caption": n} for n in names])
    args = ["extract-images", "--dataset", "local", "--images", str(images), "--captions",
            str(captions), "--teacher", "resnet50", "--weights", "random", "--teacher-size",
            "tiny", "--device", "cpu", "--workers", "0", "--caption-policy", "all"]  # fmt: skip
    out = tmp_path / "o"
    code, _ = run_main([*args, "--out", str(out)], monkeypatch, capsys)
    assert code == 0
    assert sorted(FeatureSet.open(out / "image-resnet50").ids) == ["im0", "im1"]
    assert sorted(set(Corpus.open(out / "captions").image_ids)) == ["im0", "im1"]
    (row,) = [r for r in errors_jsonl(out) if r["stage"] == "image-resnet50"]
    assert row["id"] == "cut" and row["path"] == str(images / "cut.jpg")
    assert row["reason"] == "corrupt image: truncated JPEG (premature end of data)"
    strict = tmp_path / "strict"
    code, stderr = run_main([*args, "--strict", "--out", str(strict)], monkeypatch, capsys)
    assert_one_error(code, stderr, str(images / "cut.jpg"), "truncated JPEG", "--strict")
    assert not list(strict.rglob("manifest.json")) and not list(strict.rglob("*.tmp-*"))


def test_decoder_warnings_are_errors(tmp_path, monkeypatch):
    import warnings

    from pipeline import images

    real = images._load_rgb

    def warn_then_load(*args):
        warnings.warn("Corrupt JPEG data: 12 extraneous bytes", UserWarning, stacklevel=1)
        return real(*args)

    monkeypatch.setattr(images, "_load_rgb", warn_then_load)
    Image.new("RGB", (40, 30)).save(tmp_path / "a.jpg")
    with pytest.raises(BadImageError, match="decoder warning: Corrupt JPEG data"):
        open_rgb(tmp_path / "a.jpg", 36)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Image.fromarray(np.full((8, 8), 32896, np.uint16)), 128),  # I;16 (16-bit PNG)
        (lambda: Image.fromarray(np.full((8, 8), 257 * 200, np.int32)), 200),  # I
        (lambda: Image.fromarray(np.full((8, 8), 0.5, np.float32)), 128),  # F in [0, 1]
        (lambda: Image.new("LA", (8, 8), (90, 0)), 90),
        (lambda: Image.new("RGBA", (8, 8), (90, 90, 90, 0)), 90),
        (lambda: Image.new("L", (8, 8), 90).convert("P"), 90),
        (lambda: Image.new("CMYK", (8, 8), (0, 0, 0, 165)), 90),
    ],
)
def test_every_mode_becomes_the_right_rgb(tmp_path, make, expected):
    image = make()
    path = tmp_path / ("m.tiff" if image.mode in ("I", "F", "CMYK") else "m.png")
    image.save(path)
    rgb = np.asarray(open_rgb(path, 8))
    assert rgb.shape == (8, 8, 3)
    np.testing.assert_allclose(rgb.mean(), expected, atol=1)


def test_sixteen_bit_png_is_not_saturated(tmp_path):
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "g16.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    rgb = np.asarray(open_rgb(tmp_path / "g16.png", 64)).astype(float)
    np.testing.assert_allclose(rgb[..., 0], ramp / 257, atol=0.51)


# ---- paths, text, caption files --------------------------------------------------------------


def test_image_paths_escaping_the_root_are_logged_with_their_caption_line(
    tmp_path, monkeypatch, capsys
):
    """``--dataset local``: a caption row naming ``../x`` or an absolute path outside --images
    is left out and logged under the caption file and line; the file is never opened."""
    from pipeline import images as decoder

    for name in ("secret.jpg", "other.jpg"):
        Image.new("RGB", (8, 8)).save(tmp_path / name)
    images = images_folder(tmp_path / "imgs", 3)
    (images / "sub").mkdir()
    rows = [{"image": f"im{i}.jpg", "caption": f"caption {i}"} for i in range(2)]
    rows += [
        {"image": "../secret.jpg", "caption": "up"},
        {"image": str(tmp_path / "other.jpg"), "caption": "absolute"},
        {"image": "sub/../im2.jpg", "caption": "stays inside"},
    ]
    captions = captions_file(tmp_path / "c.jsonl", rows)
    opened = []
    real = decoder._load_rgb
    monkeypatch.setattr(
        decoder, "_load_rgb", lambda path, *a: opened.append(path) or real(path, *a)
    )
    out = tmp_path / "o"
    code, _ = run_main(
        ["extract-images", "--dataset", "local", "--images", str(images), "--captions",
         str(captions), "--teacher", "resnet50", "--weights", "random", "--teacher-size", "tiny",
         "--device", "cpu", "--workers", "0", "--caption-policy", "all", "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0
    assert sorted(FeatureSet.open(out / "image-resnet50").ids) == ["im0", "im1", "im2"]
    assert {Path(p).name for p in opened} == {"im0.jpg", "im1.jpg", "im2.jpg"}
    logged = [(r["stage"], r["id"], r["path"], r["reason"]) for r in errors_jsonl(out)]
    assert logged == [
        ("captions", "line 3", str(captions), f"image path outside --images: '../secret.jpg' leaves {images}"),
        ("captions", "line 4", str(captions), f"image path outside --images: '{tmp_path / 'other.jpg'}' leaves {images}"),
    ]  # fmt: skip


def test_strict_stops_on_an_escaping_path(tmp_path, monkeypatch, capsys):
    images = images_folder(tmp_path / "imgs", 2)
    rows = [{"image": "im0.jpg", "caption": "ok"}, {"image": "../x.jpg", "caption": "c"}]
    captions = captions_file(tmp_path / "c.jsonl", rows)
    code, stderr = run_main(
        ["extract-images", "--dataset", "local", "--images", str(images), "--captions",
         str(captions), "--teacher", "resnet50", "--weights", "random", "--teacher-size", "tiny",
         "--device", "cpu", "--workers", "0", "--strict", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(
        code, stderr, f"{captions}: image path outside --images: '../x.jpg'", "(id line 2)",
        "--strict",
    )  # fmt: skip
    assert not (tmp_path / "o" / "image-resnet50" / "manifest.json").exists()


def test_invalid_utf8_line_is_logged_with_its_line_number(tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_bytes(b"first sentence\nbad \xff\xfe byte\nthird one\n")
    records = load_dataset("wiki1m", DataSource(text=text), "train")
    assert [s.text for s in records.sentences] == ["first sentence", "third one"]
    assert [s.id for s in records.sentences] == ["wiki1m-0000000", "wiki1m-0000002"]
    (error,) = records.errors
    assert error.path == str(text) and error.reason.startswith("line 2: undecodable: invalid UTF-8")


def test_strict_stops_on_a_bad_text_line(tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_bytes(b"ok\n\xc3\x28\n")
    records = load_dataset("wiki1m", DataSource(text=text), "train")
    with pytest.raises(MmcseError, match=r"wiki.txt: line 2: undecodable: invalid UTF-8.*--strict"):
        extract_texts(
            records, MeanTeacher(), "mean", tmp_path / "o", caption_policy="all", seed=0,
            options=options(strict=True),
        )  # fmt: skip


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_text_with_a_byte_order_mark_is_decoded(tmp_path, encoding):
    text = tmp_path / "wiki.txt"
    text.write_bytes("héllo wörld\nzweite Zeile\n".encode(encoding))
    records = load_dataset("wiki1m", DataSource(text=text), "train")
    assert [s.text for s in records.sentences] == ["héllo wörld", "zweite Zeile"]
    assert records.errors == []


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32", "utf-8-sig", "utf-8"])
def test_text_corpus_reaches_the_cache_without_replacement_characters(
    tmp_path, monkeypatch, capsys, encoding
):
    text = tmp_path / "wiki.txt"
    bom = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}.get(encoding, b"")
    text.write_bytes(bom + "héllo wörld\r\n\nzweite Zeile — 東京\n".encode(encoding))
    out = tmp_path / "o"
    code, _ = run_main(
        ["extract-text", "--corpus", "wiki1m", "--text-file", str(text), "--teacher", "none",
         "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0
    corpus = Corpus.open(out / "sentences")
    assert corpus.texts == ["héllo wörld", "zweite Zeile — 東京"]
    assert [str(i) for i in corpus.ids] == ["wiki1m-0000000", "wiki1m-0000002"]
    assert [(r["id"], r["reason"]) for r in errors_jsonl(out)] == [
        ("wiki1m-0000001", "line 2: blank")
    ]


def test_utf16_text_with_an_invalid_unit_is_refused_naming_the_line(tmp_path, monkeypatch, capsys):
    text = tmp_path / "wiki.txt"
    lone_surrogate = b"\x00\xd8"  # a high surrogate with no low one after it
    text.write_bytes(b"\xff\xfe" + "ok\nbad ".encode("utf-16-le") + lone_surrogate + b"\n\x00")
    out = tmp_path / "o"
    code, stderr = run_main(
        ["extract-text", "--corpus", "wiki1m", "--text-file", str(text), "--teacher", "none",
         "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(code, stderr, f"{text}:2: not valid utf-16 text")
    assert not out.exists()


def test_utf8_bom_text_logs_a_bad_line_like_plain_utf8(tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_bytes(b"\xef\xbb\xbffirst\nbad \xff byte\nthird\n")
    records = load_dataset("wiki1m", DataSource(text=text), "train")
    assert [s.text for s in records.sentences] == ["first", "third"]
    (error,) = records.errors
    assert error.reason.startswith("line 2: undecodable: invalid UTF-8")


def test_a_utf8_line_with_a_nul_byte_is_skipped_and_named_not_called_utf16(tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_bytes(b"first sentence here\nbad \x00 byte\nthird sentence here\n")
    records = load_dataset("wiki1m", DataSource(text=text), "train")
    assert [s.text for s in records.sentences] == ["first sentence here", "third sentence here"]
    (error,) = records.errors
    assert (
        error.reason
        == "line 2: undecodable: a NUL byte at byte 4 of the line (UTF-8 text holds none)"
    )


def test_utf16_without_a_byte_order_mark_is_refused(tmp_path):
    text = tmp_path / "wiki.txt"
    text.write_bytes("hello\nworld\n".encode("utf-16-le"))
    with pytest.raises(MmcseError, match=r"wiki.txt: holds NUL bytes.*UTF-16/32"):
        load_dataset("wiki1m", DataSource(text=text), "train")


def _coco_file(path: Path, annotations, images=None) -> Path:
    images = images if images is not None else [{"id": 1, "file_name": "im0.jpg"}]
    path.write_text(json.dumps({"annotations": annotations, "images": images}))
    return path


def test_null_caption_names_the_file_and_the_entry(tmp_path):
    images = images_folder(tmp_path / "imgs", 1)
    path = _coco_file(
        tmp_path / "captions_train2017.json",
        [{"id": 1, "image_id": 1, "caption": "a dog"}, {"id": 2, "image_id": 1, "caption": None}],
    )
    records = load_dataset("coco", DataSource(images, path), "train")
    assert [r.captions for r in records.images] == [("a dog",)]
    (error,) = records.errors
    assert (error.id, error.path) == ("annotations[1]", str(path))
    assert "caption is None" in error.reason


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"annotations": []}, "needs an 'images' list"),
        ([{"image": "x.jpg"}], r"no coco records found.* the first: \[0\]: unreadable caption"),
    ],
)
def test_caption_file_errors_name_the_file(tmp_path, payload, fragment):
    images = images_folder(tmp_path / "imgs", 1)
    path = tmp_path / "captions.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(MmcseError, match=fragment) as info:
        load_dataset("coco", DataSource(images, path), "train")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("name", "payload", "entry"),
    [
        (
            "captions_train2017.json",
            {"annotations": [None], "images": [{"id": 1}]},
            "annotations[0]",
        ),
        ("captions_train2017.json", {"annotations": [], "images": [None]}, "images[0]"),
        ("albef.json", [None], "[0]"),  # the ALBEF/BLIP list format
        ("dataset_coco.json", {"images": [None]}, "images[0]"),  # Karpathy
    ],
)
def test_a_file_of_null_entries_names_the_file_and_the_entry(
    tmp_path, monkeypatch, capsys, name, payload, entry
):
    """Every entry unreadable: the error says which file and which entry, not only that no
    records were found."""
    images = images_folder(tmp_path / "imgs", 1)
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    out = tmp_path / "o"
    code, stderr = run_main(
        ["extract-text", "--corpus", "coco", "--images", str(images), "--captions", str(path),
         "--teacher", "none", "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(code, stderr, str(path), "no coco records", f"the first: {entry}: ", "null")
    assert not out.exists()


def test_bad_image_entry_id_names_file_and_entry(tmp_path):
    images = images_folder(tmp_path / "imgs", 1)
    path = _coco_file(
        tmp_path / "captions_train2017.json",
        [{"id": 1, "image_id": 1, "caption": "a dog"}],
        [{"id": 1, "file_name": "im0.jpg"}, {"id": "seven", "file_name": "im1.jpg"}],
    )
    records = load_dataset("coco", DataSource(images, path), "train")
    (error,) = records.errors
    assert (error.id, error.path) == ("images[1]", str(path)) and "seven" in error.reason


def test_unexpected_loader_failure_names_the_file(tmp_path, monkeypatch):
    from pipeline.datasets import base

    monkeypatch.setitem(base.DATASETS._entries, "local", lambda source, split: {}["images"])
    with pytest.raises(MmcseError, match=r"c.jsonl: cannot read it as local data \(KeyError"):
        load_dataset("local", DataSource(tmp_path, tmp_path / "c.jsonl"), "train")


# ---- the output of one extraction trains as is -----------------------------------------------


def test_captions_of_left_out_images_leave_the_corpus_too(tmp_path):
    records = local_records(tmp_path, [{"image": "gone.jpg", "caption": "of a missing image"}])
    (tmp_path / "imgs" / "im3.jpg").write_bytes(b"not an image")
    out = tmp_path / "o"
    extract_images(
        records, MeanTeacher(), "mean", out, caption_policy="all", seed=0, options=options()
    )
    corpus, images = Corpus.open(out / "captions"), FeatureSet.open(out / "image-mean")
    assert sorted(images.ids) == ["im0", "im1", "im2"]
    assert sorted(set(corpus.image_ids)) == ["im0", "im1", "im2"]
    images.gather(corpus.image_ids)  # joins: no missing ids
    assert sorted(FeatureSet.open(out / "text-mean").ids) == sorted(corpus.ids)
    dropped = {(r["stage"], r["id"]) for r in errors_jsonl(out) if r["stage"] == "captions-dropped"}
    assert dropped == {("captions-dropped", "gone#0"), ("captions-dropped", "im3#0")}
    assert corpus.manifest.extra["num_dropped_captions"] == 2


def test_nan_features_are_logged_per_row_not_written(tmp_path):
    records = local_records(tmp_path)
    out = tmp_path / "o"
    extract_images(  # im2 has red 40: the teacher returns NaN for it
        records, MeanTeacher(nan_red=40), "mean", out, caption_policy="all", seed=0,
        options=options(),
    )  # fmt: skip
    assert sorted(FeatureSet.open(out / "image-mean").ids) == ["im0", "im1", "im3"]
    (row,) = [r for r in errors_jsonl(out) if r["stage"] == "image-mean"]
    assert row["id"] == "im2" and row["reason"].startswith("non-finite features")
    with pytest.raises(MmcseError, match="non-finite features.*--strict"):
        extract_images(
            records, MeanTeacher(nan_red=40), "mean", tmp_path / "strict", caption_policy="all",
            seed=0, options=options(strict=True),
        )  # fmt: skip


def test_float16_overflow_is_a_non_finite_row(tmp_path):
    class Loud(MeanTeacher):
        def encode_images(self, pixels):
            features = super().encode_images(pixels)
            features[features[:, 0] > 30] *= 1e4  # im2, im3: 1e6 > float16's 65504
            return features

    records = local_records(tmp_path)
    out = tmp_path / "o"
    extract_images(
        records, Loud(), "loud", out, caption_policy="all", seed=0, options=options(dtype="float16")
    )
    assert sorted(FeatureSet.open(out / "image-loud").ids) == ["im0", "im1"]
    logged = [r for r in errors_jsonl(out) if r["stage"] == "image-loud"]
    assert [r["id"] for r in logged] == ["im2", "im3"]
    assert all("overflow in float16" in r["reason"] for r in logged)


# ---- reruns, kills, empty results, OS errors --------------------------------------------------


def test_rerun_with_other_settings_is_refused(tmp_path):
    records = local_records(tmp_path)
    out = tmp_path / "o"
    run = dict(caption_policy="all", seed=0)
    extract_images(records, MeanTeacher(), "mean", out, **run, options=options())
    extract_images(records, MeanTeacher(), "mean", out, **run, options=options())  # same: reused
    with pytest.raises(
        CacheError, match=r"other settings \(dtype: 'float32' in the set, 'float16'"
    ):
        extract_images(records, MeanTeacher(), "mean", out, **run, options=options(dtype="float16"))

    class Other(MeanTeacher):
        def producer(self):
            return {"teacher": "mean", "weights_sha256": "other"}

    with pytest.raises(CacheError, match=r"producer.weights_sha256.*mmcse cache rm"):
        extract_images(records, Other(), "mean", out, **run, options=options())


def test_killed_corpus_write_leaves_temp_files_that_the_next_run_cleans(tmp_path):
    records = local_records(tmp_path)
    out = tmp_path / "o"
    litter = out / "captions" / f".shard-00000.arrow.tmp-{HOST}-{2**22 + 7}-dead"
    litter.parent.mkdir(parents=True)
    litter.write_bytes(b"half a shard")
    extract_images(
        records, MeanTeacher(), "mean", out, caption_policy="all", seed=0, options=options()
    )
    assert not litter.exists()
    assert not list(out.rglob("*.tmp-*"))


# The CLI in a child process that SIGKILLs itself right after the first manifest is written:
# the image set is complete, its writer state (.pending.json) and errors.jsonl not yet cleaned.
_KILLED_AFTER_MANIFEST = """
import os, signal, sys
import cli
from mmcse.cache.manifest import Manifest
write = Manifest.write
def write_then_die(self, directory):
    write(self, directory)
    os.kill(os.getpid(), signal.SIGKILL)
Manifest.write = write_then_die
sys.argv = ["mmcse", *sys.argv[1:]]
cli.main()
"""


def test_kill_right_after_the_manifest_then_rerun_leaves_what_a_clean_run_does(
    tmp_path, monkeypatch, capsys
):
    import signal
    import subprocess

    images = images_folder(tmp_path / "imgs", 3)
    (images / "im2.jpg").write_bytes(b"not an image")  # one logged error
    captions = captions_file(
        tmp_path / "c.jsonl", [{"image": f"im{i}.jpg", "caption": f"c {i}"} for i in range(3)]
    )
    args = ["extract-images", "--dataset", "local", "--images", str(images), "--captions",
            str(captions), "--teacher", "resnet50", "--weights", "random", "--teacher-size",
            "tiny", "--device", "cpu", "--workers", "0"]  # fmt: skip
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_MANIFEST, *args, "--out", str(killed)],
        cwd=Path(cli.__file__).parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    image_set = killed / "image-resnet50"
    assert (image_set / "manifest.json").exists() and (image_set / ".pending.json").exists()
    for out in (killed, clean):
        code, stderr = run_main([*args, "--out", str(out)], monkeypatch, capsys)
        assert code == 0, stderr

    def files(root: Path) -> dict[str, bytes | None]:
        """Every file by relative path; the content too except the stat-based verified state."""
        return {
            str(p.relative_to(root)): None if p.name == ".verified.json" else p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }

    assert files(killed) == files(clean)
    assert not list(killed.rglob(".pending.json")) and not list(killed.rglob("*.tmp-*"))
    assert [r["id"] for r in errors_jsonl(killed) if r["stage"] == "image-resnet50"] == ["im2"]


def test_wrong_images_folder_is_an_error_not_an_empty_set(tmp_path, monkeypatch, capsys):
    images_folder(tmp_path / "imgs", 2)
    captions = captions_file(
        tmp_path / "c.jsonl", [{"image": f"im{i}.jpg", "caption": "c"} for i in range(2)]
    )
    (tmp_path / "empty").mkdir()
    out = tmp_path / "o"
    code, stderr = run_main(
        ["extract-images", "--dataset", "local", "--images", str(tmp_path / "empty"),
         "--captions", str(captions), "--teacher", "resnet50", "--weights", "random",
         "--teacher-size", "tiny", "--device", "cpu", "--workers", "0", "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(code, stderr, str(out / "image-resnet50"), "2 missing file", "--images")
    assert not list(out.rglob("manifest.json"))


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_os_errors_during_extraction_are_one_line(tmp_path, monkeypatch, capsys, error):
    images = images_folder(tmp_path / "imgs", 2)
    captions = captions_file(
        tmp_path / "c.jsonl", [{"image": f"im{i}.jpg", "caption": "c"} for i in range(2)]
    )
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self.name == "o":
            raise OSError(error, os.strerror(error), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    code, stderr = run_main(
        ["extract-text", "--corpus", "local", "--images", str(images), "--captions",
         str(captions), "--teacher", "simcse", "--weights", "random", "--teacher-size", "tiny",
         "--device", "cpu", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    reason = "the disk is full" if error == errno.ENOSPC else "read-only"
    assert_one_error(code, stderr, str(tmp_path / "o"), reason)


def test_image_list_paths_cannot_leave_the_root(tmp_path):
    from pipeline.nonling_cache import listed_files

    root = images_folder(tmp_path / "root" / "cat", 1).parent
    listing = tmp_path / "list.txt"
    listing.write_text("x/cat/im0.jpg\n../outside.jpg\n")
    with pytest.raises(MmcseError, match=r"list.txt: 1 paths leave .*'../outside.jpg'"):
        listed_files(root, listing)


def test_row_aligned_captions_with_a_bad_line_are_refused(tmp_path):
    import h5py

    from pipeline.hdf5_import import import_hdf5_features

    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle["features"] = np.zeros((2, 3), np.float32)
    (tmp_path / "c.txt").write_bytes(b"one\n\xff two\n")
    with pytest.raises(MmcseError, match=r"c.txt:2: invalid UTF-8"):
        import_hdf5_features(
            tmp_path / "f.h5", tmp_path / "c.txt", dataset="d", split="train", out=tmp_path / "o"
        )


def test_visualcse_image_cache_skips_a_truncated_image(tmp_path, monkeypatch, capsys):
    """extract-image-tensors decodes through the same checked decoder (it skips and reports
    unreadable files, its own policy) instead of caching libjpeg's grey padding."""
    images_folder(tmp_path / "tree" / "cat", 2)
    images_folder(tmp_path / "tree" / "dog", 1)
    (tmp_path / "tree" / "dog" / "cut.jpg").write_bytes(_jpeg_bytes((200, 200), 90)[:-2])
    (tmp_path / "tree" / "dog" / "ended.jpg").write_bytes(_cut_then_ended(_photo_jpeg(), 0.5))
    out = tmp_path / "o"
    monkeypatch.setattr(sys, "argv", ["mmcse", "extract-image-tensors", str(tmp_path / "tree"),
                                      str(out), "--size", "16", "--workers", "0"])  # fmt: skip
    with pytest.raises(SystemExit) as info:
        cli.main()
        raise SystemExit(0)
    assert info.value.code == 0
    assert sorted(FeatureSet.open(out).ids) == ["cat/im0", "cat/im1", "dog/im0"]
    output = capsys.readouterr()
    shown = output.out + output.err
    assert "skipped 2 unreadable images" in shown and "truncated JPEG" in shown


@pytest.mark.parametrize(
    ("env", "flags", "fragments"),
    [
        ({"RANK": "abc"}, [], ["RANK='abc'", "must be an integer"]),
        ({"WORLD_SIZE": "two"}, [], ["WORLD_SIZE='two'", "must be an integer"]),
        ({"WORLD_SIZE": "0"}, [], ["WORLD_SIZE='0'", "≥ 1"]),
        ({"RANK": "2", "WORLD_SIZE": "2"}, [], ["RANK=2 is not below WORLD_SIZE=2"]),
        ({"WORLD_SIZE": "2"}, ["--rank", "5"], ["--rank=5 is not below WORLD_SIZE=2"]),
        ({}, ["--rank", "1", "--world-size", "1"], ["--rank=1 is not below --world-size=1"]),
        ({}, ["--world-size", "0"], ["--world-size must be at least 1, got 0"]),
    ],
)
def test_malformed_rank_names_the_variable_and_its_value(
    tmp_path, monkeypatch, capsys, env, flags, fragments
):
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    text = tmp_path / "wiki.txt"
    text.write_text("one sentence\n")
    out = tmp_path / "o"
    code, stderr = run_main(
        ["extract-text", "--corpus", "wiki1m", "--text-file", str(text), "--teacher", "none",
         "--out", str(out), *flags],
        monkeypatch, capsys,
    )  # fmt: skip
    assert_one_error(code, stderr, *fragments)
    assert not out.exists()


def test_the_console_summary_counts_what_errors_jsonl_holds(tmp_path, monkeypatch, capsys):
    """Image extraction used to print "N rows, 0 errors" for captions while captions were
    dropped with their images: the summary says the drop, and its last line counts every row
    of errors.jsonl by stage and reason (loader rows included)."""
    from support.cli import run_main_output

    images = images_folder(tmp_path / "imgs", 2)
    (images / "bad.jpg").write_bytes(b"not an image")
    rows = [{"image": n, "caption": f"of {n}"} for n in ("im0.jpg", "im1.jpg", "bad.jpg")]
    captions = captions_file(tmp_path / "c.jsonl", [*rows, {"image": "im0.jpg", "caption": " "}])
    out = tmp_path / "o"
    code, stdout, _ = run_main_output(
        ["extract-images", "--dataset", "local", "--images", str(images), "--captions",
         str(captions), "--teacher", "resnet50", "--weights", "random", "--teacher-size", "tiny",
         "--device", "cpu", "--workers", "0", "--caption-policy", "all", "--out", str(out)],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0
    logged = errors_jsonl(out)
    assert len(logged) == 3  # the bad image, its caption, the blank caption row
    lines = stdout.splitlines()
    assert f"{out / 'captions'}: 2 rows, 1 captions dropped with their images" in lines[1]
    assert lines[-1] == (
        f"left out: 3 in all, every one in {out / 'errors.jsonl'}: 1 captions (blank), "
        "1 captions-dropped (image left out (see its own row)), 1 image-resnet50 (not a readable image)"
    )


# ---- decode workers: one owner for every job that decodes in workers ---------------------------


def _labelled_images(root: Path) -> Path:
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 40), (60 * i, 90, 30)).save(root / label / f"{i}.png")
    return root


@pytest.mark.parametrize("command", ["extract-image-tensors", "extract-audio"])
def test_negative_workers_are_one_line(command, tmp_path, monkeypatch, capsys):
    """``--workers -1`` died in torch's DataLoader with a traceback."""
    source = _labelled_images(tmp_path / "src")
    code, stderr = run_main([command, str(source), str(tmp_path / "out"), "--workers", "-1"],
                            monkeypatch, capsys)  # fmt: skip
    assert_one_error(code, stderr, "--workers -1", "0 (decode in this process)")
    assert not (tmp_path / "out").exists()


def test_image_tensor_workers_are_clamped_as_extract_images_are(tmp_path, monkeypatch, capsys):
    from pipeline import workers

    monkeypatch.setattr(workers, "machine_workers", lambda: 1)
    source = _labelled_images(tmp_path / "src")
    args = ["extract-image-tensors", str(source), str(tmp_path / "out"), "--size", "32",
            "--workers", "10000"]  # fmt: skip
    code, stderr = run_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    assert [line for line in stderr if line.startswith("warning:")] == [
        "warning: --workers 10000 is more than this machine allows (1 CPUs for this process); "
        "decoding with 1 workers"
    ]
    assert FeatureSet.open(tmp_path / "out").manifest.num_rows == 4
