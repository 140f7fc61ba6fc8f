"""The Stage-1 engine: decode policy, bad inputs, resume after SIGKILL, ranks, HDF5 import."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

import cli
from mmcse.cache import Corpus, FeatureSet
from mmcse.errors import MmcseError
from pipeline.datasets import DataSource, load_dataset
from pipeline.extract import RunOptions, ShardPlan, extract_images, extract_texts
from pipeline.hdf5_import import import_hdf5_features
from pipeline.images import BadImageError, decode_image, open_rgb
from pipeline.teachers.base import ImagePreprocess

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("MMCSE_SHARED_DATA", ROOT.parent / "shared" / "data"))
COCO_MINI = SHARED / "images" / "coco_mini"
needs_coco = pytest.mark.skipif(not COCO_MINI.is_dir(), reason="shared coco_mini not available")
TINY = ImagePreprocess(resize=36, crop=32)


class FakeTeacher:
    """Per-row features that do not depend on the batch: channel means/std of the crop, and
    a hash of each sentence. Stands in for a teacher where only the plumbing is under test."""

    name = "fake"
    dim = 6
    preprocess = TINY
    device = torch.device("cpu")

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        return reference_image_features(pixels)

    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        return torch.stack([reference_text_features(t) for t in texts])

    def producer(self) -> dict:
        return {"teacher": "fake", "weights_sha256": "none", "preprocessing": TINY.to_dict()}


def reference_image_features(pixels: torch.Tensor) -> torch.Tensor:
    x = pixels.float()
    return torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3))], dim=1)


def reference_text_features(text: str) -> torch.Tensor:
    digest = hashlib.sha256(text.encode()).digest()
    return torch.tensor([b / 255 for b in digest[: FakeTeacher.dim]])


def options(**kw) -> RunOptions:
    return RunOptions(**{"shard_size": 8, "batch_size": 3, "workers": 0, "progress": False, **kw})


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every non-hidden file under ``root`` (sets, corpus, errors.jsonl) by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``mmcse ARGS`` through the real entry point (error → one line + exit 2); no subprocess."""
    monkeypatch.setattr(sys, "argv", ["mmcse", *args])
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        cli.main()
        raise SystemExit(0)
    return info.value.code, _strip_progress(capsys.readouterr().err)


def _strip_progress(stderr: str) -> str:
    return "\n".join(line for line in stderr.splitlines() if line.startswith("error"))


# ---- bad inputs ------------------------------------------------------------------------------


def _png_with_header_size(path: Path, width: int, height: int) -> None:
    """A tiny valid PNG whose IHDR claims ``width × height`` (a decompression bomb header)."""
    Image.new("RGB", (4, 4)).save(path)
    data = bytearray(path.read_bytes())
    ihdr = data[12:29]  # type + 13 data bytes
    ihdr[4:12] = struct.pack(">II", width, height)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    path.write_bytes(bytes(data))


def make_bad_and_odd_images(folder: Path) -> dict[str, str | None]:
    """file name → expected error reason prefix (``None``: valid, must be kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (50, 40), (10, 200, 30)).save(folder / "rgb.jpg", quality=95)
    Image.new("CMYK", (40, 50), (0, 255, 0, 0)).save(folder / "cmyk.jpg")
    Image.new("RGBA", (40, 40), (200, 10, 10, 0)).save(folder / "alpha.png")
    Image.new("L", (60, 40), 77).save(folder / "gray.png")
    palette = Image.new("P", (40, 40), 1)
    palette.putpalette([0, 0, 0, 9, 99, 199] + [0] * 762)
    palette.save(folder / "palette.png", transparency=0)
    full = folder / "full.jpg"
    Image.effect_noise((64, 64), 50).convert("RGB").save(full)
    (folder / "truncated.jpg").write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "text.jpg").write_text("not an image")
    _png_with_header_size(folder / "bomb.png", 20_000, 20_000)
    return {
        "rgb.jpg": None,
        "cmyk.jpg": None,
        "alpha.png": None,
        "gray.png": None,
        "palette.png": None,
        "full.jpg": None,
        "truncated.jpg": "corrupt image",
        "empty.jpg": "empty file",
        "text.jpg": "not a readable image",
        "bomb.png": "image too large",
        "missing.jpg": "missing file",
    }


def test_decode_keeps_valid_modes_and_rejects_undecodable(tmp_path):
    for name, reason in make_bad_and_odd_images(tmp_path).items():
        if reason is None:
            pixels = decode_image(tmp_path / name, TINY)
            assert pixels.dtype == torch.uint8 and pixels.shape == (3, 32, 32), name
        else:
            with pytest.raises(BadImageError) as info:
                decode_image(tmp_path / name, TINY)
            assert info.value.reason.startswith(reason), (name, info.value.reason)


def test_decode_converts_to_rgb_by_pil_convert(tmp_path):
    make_bad_and_odd_images(tmp_path)
    gray = decode_image(tmp_path / "gray.png", TINY)
    assert (gray == 77).all()  # L → RGB copies the level to every channel
    alpha = decode_image(tmp_path / "alpha.png", TINY)
    assert alpha[:, 0, 0].tolist() == [200, 10, 10]  # alpha dropped, colour kept (open_clip way)
    palette = decode_image(tmp_path / "palette.png", TINY)
    assert palette[:, 5, 5].tolist() == [9, 99, 199]
    cmyk = decode_image(tmp_path / "cmyk.jpg", TINY).float().mean(dim=(1, 2))
    assert cmyk[0] > 200 and cmyk[1] < 60 and cmyk[2] > 200  # C=0,M=255,Y=0 → magenta


def test_resize_short_side_then_centre_crop_matches_an_explicit_computation(tmp_path):
    rows = np.arange(72, dtype=np.uint8).reshape(72, 1).repeat(144, axis=1) * 3
    Image.fromarray(np.stack([rows] * 3, axis=-1)).save(tmp_path / "ramp.png")
    pre = ImagePreprocess(resize=36, crop=36, interpolation="nearest")
    pixels = decode_image(tmp_path / "ramp.png", pre)
    # 144×72 → 72×36 by nearest (every 2nd row/col from offset 0/1), crop columns 18..53
    column = pixels[0, :, 0].tolist()
    assert pixels.shape == (3, 36, 36) and (pixels[:, :, :1] == pixels).all()
    assert column == [int(rows[2 * i + 1, 0]) for i in range(36)] or column == [
        int(rows[2 * i, 0]) for i in range(36)
    ]


def test_large_jpeg_is_drafted_down_large_png_refused(tmp_path):
    Image.new("RGB", (8000, 400), (5, 6, 7)).save(tmp_path / "wide.jpg")
    Image.new("RGB", (8000, 400), (5, 6, 7)).save(tmp_path / "wide.png")
    limit = 1_000_000  # 3.2 Mpx each; the JPEG decodes at 1/8 scale (1000×50)
    assert decode_image(tmp_path / "wide.jpg", TINY, max_pixels=limit).shape == (3, 32, 32)
    with pytest.raises(BadImageError, match="image too large: 8000x400"):
        decode_image(tmp_path / "wide.png", TINY, max_pixels=limit)


def _local_dataset(tmp_path: Path, expected: dict[str, str | None]) -> DataSource:
    rows = [{"image": name, "caption": f"caption of {name}"} for name in expected]
    lines = [json.dumps(r) for r in rows] + ["{broken json"]
    (tmp_path / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return DataSource(tmp_path / "imgs", tmp_path / "captions.jsonl")


def test_bad_inputs_are_logged_left_out_and_counted(tmp_path):
    expected = make_bad_and_odd_images(tmp_path / "imgs")
    records = load_dataset("local", _local_dataset(tmp_path, expected), "train")
    out = tmp_path / "out"
    results = extract_images(
        records, FakeTeacher(), "fake", out, caption_policy="all", seed=0, options=options()
    )
    image_set = FeatureSet.open(out / "image-fake")
    kept = sorted(Path(n).stem for n, reason in expected.items() if reason is None)
    assert sorted(image_set.ids.tolist()) == kept
    bad = {Path(n).stem: r for n, r in expected.items() if r is not None}
    logged = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    image_errors = {e["id"]: e for e in logged if e["stage"] == "image-fake"}
    assert image_errors.keys() == bad.keys()
    assert all(image_errors[i]["reason"].startswith(r) for i, r in bad.items())
    assert image_errors["empty"]["path"] == str(tmp_path / "imgs" / "empty.jpg")
    assert [(e["stage"], e["id"]) for e in logged if e["stage"] == "captions"] == [
        ("captions", f"line {len(expected) + 1}")
    ]
    assert results["image-fake"].extra["num_errors"] == len(bad)
    assert results["image-fake"].extra["errors_by_reason"]["missing file"] == 1


def test_strict_stops_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    expected = make_bad_and_odd_images(tmp_path / "imgs")
    del expected["missing.jpg"]
    (tmp_path / "captions.jsonl").write_text(
        "".join(json.dumps({"image": n, "caption": "c"}) + "\n" for n in expected)
    )
    with pytest.raises(MmcseError, match="--strict stops at the first bad input"):
        records = load_dataset(
            "local", DataSource(tmp_path / "imgs", tmp_path / "captions.jsonl"), "train"
        )
        extract_images(
            records,
            FakeTeacher(),
            "fake",
            tmp_path / "o",
            caption_policy="all",
            seed=0,
            options=options(strict=True),
        )
    code, stderr = run_main(
        ["extract-images", "--dataset", "local", "--images", str(tmp_path / "imgs"),
         "--captions", str(tmp_path / "captions.jsonl"), "--out", str(tmp_path / "cli"),
         "--strict", *_TINY_FLAGS],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 2
    assert len(stderr.splitlines()) == 1 and stderr.startswith("error: ") and "--strict" in stderr


# ---- real images, id join, CLIP-style text features -------------------------------------------


@needs_coco
def test_coco_mini_extract_and_join_by_id(tmp_path):
    """All 159 captioned coco_mini images; features joined to captions by id, checked against
    features computed image by image here."""
    for split in ("train", "val"):
        source = DataSource(COCO_MINI, COCO_MINI / "annotations")
        records = load_dataset("coco", source, split)
        out = tmp_path / split
        extract_images(
            records, FakeTeacher(), "fake", out, caption_policy="random-one", seed=1,
            options=options(shard_size=32, batch_size=16, workers=1),
        )  # fmt: skip
        corpus = Corpus.open(out / "captions")
        images = FeatureSet.open(out / "image-fake")
        assert len(images) == len(records.images) and len(corpus) == len(records.images)
        by_id = {r.image_id: r for r in records.images}
        joined = images.gather(corpus.image_ids)
        for row in range(0, len(corpus), 9):
            path = by_id[corpus.image_ids[row]].path
            expected = reference_image_features(decode_image(path, TINY)[None])[0]
            np.testing.assert_allclose(joined[row], expected.numpy(), rtol=1e-6)
            image_id, k = corpus.ids[row].split("#")
            assert corpus.texts[row] == by_id[image_id].captions[int(k)]
        texts = FeatureSet.open(out / "text-fake")
        rows = texts.gather(corpus.ids)
        for row in range(0, len(corpus), 11):
            np.testing.assert_allclose(rows[row], reference_text_features(corpus.texts[row]))


@needs_coco
def test_real_tiny_resnet_through_the_cli(tmp_path):
    result = CliRunner().invoke(
        cli.app,
        ["extract-images", "--dataset", "coco", "--split", "val", "--images", str(COCO_MINI),
         "--captions", str(COCO_MINI / "annotations"), "--teacher", "resnet50",
         "--weights", "random", "--teacher-size", "tiny", "--device", "cpu", "--workers", "1",
         "--shard-size", "32", "--batch-size", "16", "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    image_set = FeatureSet.open(tmp_path / "image-resnet50")
    assert len(image_set) == 79 and image_set.manifest.producer["weights"] == "random"
    assert not (tmp_path / "text-resnet50").exists()  # an image-only teacher
    assert np.isfinite(image_set.take(np.arange(79))).all()


def test_extract_texts_wiki_style_corpus(tmp_path):
    (tmp_path / "wiki.txt").write_text("a first line\n\nsecond\nthird sentence here\n")
    records = load_dataset("wiki1m", DataSource(text=tmp_path / "wiki.txt"), "train")
    out = tmp_path / "out"
    extract_texts(
        records, FakeTeacher(), "fake", out, caption_policy="all", seed=0, options=options()
    )
    corpus = Corpus.open(out / "sentences")
    features = FeatureSet.open(out / "text-fake").gather(["wiki1m-0000003", "wiki1m-0000000"])
    assert corpus.texts == ["a first line", "second", "third sentence here"]
    np.testing.assert_allclose(features[0], reference_text_features("third sentence here"))
    np.testing.assert_allclose(features[1], reference_text_features("a first line"))


# ---- sharding, ranks, resume -----------------------------------------------------------------


@pytest.mark.parametrize(("n", "size", "world"), [(1, 8, 1), (17, 8, 2), (100, 7, 3), (5, 10, 4)])
def test_rank_shards_cover_every_item_once(n, size, world):
    plan = ShardPlan(n, size)
    covered = [
        i for r in range(world) for k in plan.shards_for_rank(r, world) for i in plan.rows(k)
    ]
    assert sorted(covered) == list(range(n))
    for k in range(plan.num_shards):
        assert [i for b in plan.batches(k, 3) for i in b] == list(plan.rows(k))


def _synthetic_images(folder: Path, n: int) -> DataSource:
    folder.mkdir(parents=True)
    rows = []
    for i in range(n):
        Image.new("RGB", (40, 30 + i), (i * 9 % 256, 100, 200 - i)).save(folder / f"im{i:03d}.png")
        rows += [
            {"image": f"im{i:03d}.png", "caption": f"photo number {i} take {k}"} for k in (0, 1)
        ]
    (folder / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DataSource(folder, folder / "c.jsonl")


def test_ranks_write_disjoint_shards_and_the_last_finalizes(tmp_path):
    records = load_dataset("local", _synthetic_images(tmp_path / "imgs", 19), "train")
    run = dict(caption_policy="random-one", seed=0)
    extract_images(records, FakeTeacher(), "fake", tmp_path / "one", **run, options=options())
    for rank in range(3):
        results = extract_images(
            records, FakeTeacher(), "fake", tmp_path / "three", **run,
            options=options(rank=rank, world_size=3),
        )  # fmt: skip
        assert (results["image-fake"] is None) == (rank < 2)
    image_set = FeatureSet.open(tmp_path / "three" / "image-fake")
    assert sorted(image_set.ids.tolist()) == sorted(r.image_id for r in records.images)
    assert tree_bytes(tmp_path / "three") == tree_bytes(tmp_path / "one")


def test_rerun_with_other_sharding_is_refused(tmp_path):
    records = load_dataset("local", _synthetic_images(tmp_path / "imgs", 5), "train")
    run = dict(caption_policy="all", seed=0)
    extract_images(records, FakeTeacher(), "fake", tmp_path / "o", **run, options=options(rank=0, world_size=2))  # fmt: skip
    with pytest.raises(MmcseError, match="other settings"):
        extract_images(records, FakeTeacher(), "fake", tmp_path / "o", **run, options=options(shard_size=4))  # fmt: skip


# The CLI in a subprocess, with the real tiny random ResNet slowed down so a shard lands well
# before the run ends (the kill must hit a live run).
_DRIVER = """
import os, sys, time
import cli
from pipeline import teachers
build = teachers.build_teacher
def slow_build(*args, **kwargs):
    teacher = build(*args, **kwargs)
    encode = teacher.encode_images
    def slow(pixels):
        time.sleep(float(os.environ["DELAY"]))
        return encode(pixels)
    teacher.encode_images = slow
    return teacher
teachers.build_teacher = slow_build
sys.argv = ["mmcse", *sys.argv[1:]]
cli.main()
"""
_TINY_FLAGS = ["--teacher", "resnet50", "--weights", "random", "--teacher-size", "tiny",
               "--device", "cpu", "--workers", "0", "--shard-size", "4", "--batch-size", "2"]  # fmt: skip


def test_sigkill_and_rerun_is_byte_identical_to_a_clean_run(tmp_path):
    source = _synthetic_images(tmp_path / "imgs", 14)
    (tmp_path / "imgs" / "broken.png").write_bytes(b"\x89PNG broken")
    with (tmp_path / "imgs" / "c.jsonl").open("a") as f:
        f.write(json.dumps({"image": "broken.png", "caption": "a broken one"}) + "\n")
    args = ["extract-images", "--dataset", "local", "--images", str(source.images),
            "--captions", str(source.captions), *_TINY_FLAGS]  # fmt: skip
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, *args, "--out", str(killed)],
        cwd=ROOT, env={**os.environ, "DELAY": "0.3"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    first_shard = killed / "image-resnet50" / "shard-00000.arrow"
    deadline = time.monotonic() + 120
    while not first_shard.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (killed / "image-resnet50" / "manifest.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-c", _DRIVER, *args, "--out", str(killed)],
        cwd=ROOT, env={**os.environ, "DELAY": "0"}, capture_output=True, text=True,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    clean = CliRunner().invoke(cli.app, [*args, "--out", str(tmp_path / "clean")])
    assert clean.exit_code == 0, clean.output
    assert tree_bytes(killed) == tree_bytes(tmp_path / "clean")
    logged = [json.loads(line) for line in (killed / "errors.jsonl").read_text().splitlines()]
    assert [(row["stage"], row["id"]) for row in logged] == [
        ("captions-dropped", "broken#0"),  # its caption left the corpus with it
        ("image-resnet50", "broken"),
    ]


# ---- MCSE's released HDF5 features -----------------------------------------------------------


def test_import_hdf5_writes_joinable_sets(tmp_path):
    rng = np.random.default_rng(0)
    features = rng.standard_normal((7, 5)).astype(np.float32)
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["features"] = features
    (tmp_path / "c.txt").write_text("".join(f"caption {i}\n" for i in range(7)))
    import_hdf5_features(
        tmp_path / "f.h5", tmp_path / "c.txt", dataset="flickr", split="train",
        out=tmp_path / "out", shard_size=3,
    )  # fmt: skip
    corpus = Corpus.open(tmp_path / "out" / "captions")
    image_set = FeatureSet.open(tmp_path / "out" / "image-mcse-resnet50")
    joined = image_set.gather(corpus.image_ids)
    for row, text in enumerate(corpus.texts):
        line = int(text.split()[1])  # caption i belongs to HDF5 row i
        np.testing.assert_array_equal(joined[row], features[line])
    assert len(image_set.manifest.shards) == 3


def test_import_hdf5_row_mismatch_is_a_one_line_cli_error(tmp_path, monkeypatch, capsys):
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        h5["features"] = np.zeros((4, 3), np.float32)
    (tmp_path / "c.txt").write_text("one\ntwo\n")
    code, stderr = run_main(
        ["import-hdf5", "--features", str(tmp_path / "f.h5"), "--captions",
         str(tmp_path / "c.txt"), "--dataset", "flickr", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 2
    assert stderr.splitlines() == [
        f"error: {tmp_path / 'f.h5'}:features has 4 rows but {tmp_path / 'c.txt'} has 2 lines; "
        "the files must be row-aligned"
    ]


def test_decode_gpu_is_refused_saying_why(tmp_path, monkeypatch, capsys):
    """The nvJPEG route is gone: one decoder (Pillow, CPU workers); the old flag says so."""
    source = _synthetic_images(tmp_path / "imgs", 2)
    code, stderr = run_main(
        ["extract-images", "--dataset", "local", "--images", str(source.images), "--captions",
         str(source.captions), *_TINY_FLAGS, "--decode", "gpu", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 2
    (line,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert "--decode gpu is not available" in line and "Pillow" in line and "drop --decode" in line
    assert not (tmp_path / "o").exists()


def test_negative_workers_is_refused_before_the_teacher_loads(tmp_path, monkeypatch, capsys):
    from pipeline import teachers

    def no_teacher(*_args, **_kwargs):
        raise AssertionError("the teacher loaded before --workers was checked")

    monkeypatch.setattr(teachers, "build_teacher", no_teacher)
    source = _synthetic_images(tmp_path / "imgs", 2)
    code, stderr = run_main(
        ["extract-images", "--dataset", "local", "--images", str(source.images), "--captions",
         str(source.captions), *_TINY_FLAGS, "--workers", "-1", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    (line,) = stderr.splitlines()
    assert "--workers -1" in line and "0 (decode in this process)" in line
    assert not (tmp_path / "o").exists()


def test_extraction_says_where_it_wrote_and_when_a_rerun_did_nothing(tmp_path):
    source = _synthetic_images(tmp_path / "imgs", 3)
    out = tmp_path / "o"
    args = ["extract-images", "--dataset", "local", "--images", str(source.images), "--captions",
            str(source.captions), *_TINY_FLAGS, "--caption-policy", "all", "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(cli.app, args)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0].startswith(f"{out / 'image-resnet50'}: 3 rows, 0 errors")
    assert lines[1].startswith(f"{out / 'captions'}: 6 rows")
    again = CliRunner().invoke(cli.app, args)
    assert again.exit_code == 0, again.output
    lines = again.stdout.splitlines()
    assert lines[0] == f"nothing to do: every set in {out} was already complete"
    assert lines[1].startswith(f"{out / 'image-resnet50'}: already complete, nothing recomputed")


def _real_or_generated_jpegs(tmp_path: Path) -> list[Path]:
    """coco_mini's photos when present, else generated ones; plus progressive, grayscale, CMYK,
    restart-marker and MPO variants (each its own decode route)."""
    paths = sorted(COCO_MINI.rglob("*.jpg"))[:40] if COCO_MINI.is_dir() else []
    rng = np.random.default_rng(0)
    smooth = np.cumsum(rng.integers(-3, 4, (300, 400, 3)), axis=1)
    photo = Image.fromarray(np.clip(smooth + 128, 0, 255).astype(np.uint8))
    if not paths:
        for quality in (30, 75, 95):
            paths.append(tmp_path / f"gen{quality}.jpg")
            photo.save(paths[-1], quality=quality)
    variants = {
        "progressive.jpg": (photo, {"progressive": True}),
        "gray.jpg": (photo.convert("L"), {}),
        "cmyk.jpg": (photo.convert("CMYK"), {"progressive": True}),
        "restart.jpg": (photo, {"restart_marker_blocks": 3}),
        "multi.mpo": (photo, {"save_all": True, "append_images": [photo.rotate(90)]}),
    }
    for name, (image, options) in variants.items():
        image.save(tmp_path / name, "MPO" if name.endswith(".mpo") else "JPEG", **options)
        paths.append(tmp_path / name)
    return paths


def test_checked_jpeg_decode_gives_the_pixels_of_a_plain_pillow_decode(tmp_path):
    """The truncation checks decode from altered bytes: the pixels must still be exactly those
    Pillow gives for the file (draft for the same short side, then RGB), the input every
    teacher's preprocessing is tested on."""
    for path in _real_or_generated_jpegs(tmp_path):
        for short_side in (1 << 30, 224, 40):
            with Image.open(path) as plain:
                plain.draft("RGB", _draft_for(plain.size, short_side))
                expected = np.asarray(plain.convert("RGB"))
            got = np.asarray(open_rgb(path, short_side))
            assert got.shape == expected.shape and (got == expected).all(), (path, short_side)


def _draft_for(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    scale = short_side / min(size)
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


def test_too_many_workers_are_clamped_with_a_warning(tmp_path, monkeypatch, capsys):
    """``--workers 10000`` used to die in torch's DataLoader with a traceback."""
    from pipeline import workers

    monkeypatch.setattr(workers, "machine_workers", lambda: 1)
    from support.cli import run_main_output

    source = _synthetic_images(tmp_path / "imgs", 2)
    code, _, stderr = run_main_output(
        ["extract-images", "--dataset", "local", "--images", str(source.images), "--captions",
         str(source.captions), *_TINY_FLAGS, "--workers", "10000", "--out", str(tmp_path / "o")],
        monkeypatch, capsys,
    )  # fmt: skip
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --workers 10000 is more than this machine allows (1 CPUs for this process); "
        "decoding with 1 workers"
    ]
    assert (tmp_path / "o" / "captions" / "manifest.json").is_file()
