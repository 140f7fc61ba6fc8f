"""Stage-1 teachers: every registered teacher builds offline, and each one's features match an
independent computation (torchvision's own graph, transformers' own CLIP/BERT forwards)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmcse.errors import MmcseError
from mmcse.tiny import SIZES as TINY_SIZES
from pipeline.teachers import TEACHERS, ImageTeacher, TextTeacher, build_teacher

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["a dog", "the man sits in the park with a red ball", "a small cat runs"]
LONG_SENTENCE = " ".join(f"w{i}" for i in range(60))  # over the 32-token limit


def random_pixels(teacher, n: int = 2, seed: int = 0) -> torch.Tensor:
    crop = teacher.preprocess.crop
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, crop, crop), dtype=torch.uint8, generator=generator)


def normalise(pixels: torch.Tensor, preprocess) -> torch.Tensor:
    from torchvision.transforms.functional import normalize

    return normalize(pixels.float() / 255.0, list(preprocess.mean), list(preprocess.std))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", TEACHERS.names())
def test_every_teacher_builds_random_and_outputs_its_dim(name):
    teacher = build_teacher(name, weights="random", size="tiny")
    if hasattr(teacher, "encode_images"):
        assert isinstance(teacher, ImageTeacher)
        features = teacher.encode_images(random_pixels(teacher, 3))
        assert features.shape == (3, teacher.dim) and features.dtype == torch.float32
        assert torch.isfinite(features).all()
    if hasattr(teacher, "encode_texts"):
        assert isinstance(teacher, TextTeacher)
        features = teacher.encode_texts(SENTENCES)
        assert features.shape == (3, teacher.dim) and features.dtype == torch.float32
    producer = teacher.producer()
    assert producer["teacher"] == name and producer["weights_sha256"] == "random"
    assert producer["seed"] == 0 and producer["dim"] == teacher.dim
    json.dumps(producer)  # goes into manifest.json


def test_resnet50_is_torchvision_avgpool_features_at_real_size():
    from torchvision.models import resnet50
    from torchvision.models.feature_extraction import create_feature_extractor

    teacher = build_teacher("resnet50", weights="random", seed=3)
    assert teacher.dim == 2048
    assert (teacher.preprocess.resize, teacher.preprocess.crop) == (256, 224)
    reference = resnet50(weights=None).eval()
    missing, _ = reference.load_state_dict(teacher.modules.state_dict(), strict=False)
    assert sorted(missing) == ["fc.bias", "fc.weight"]  # everything but the classifier
    extractor = create_feature_extractor(reference, {"avgpool": "pooled"})
    pixels = random_pixels(teacher)
    with torch.no_grad():
        expected = extractor(normalise(pixels, teacher.preprocess))["pooled"].flatten(1)
    torch.testing.assert_close(teacher.encode_images(pixels), expected, rtol=1e-4, atol=1e-5)


def test_random_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = build_teacher("resnet50", weights="random", size="tiny", seed=1)
    assert torch.rand(1) == expected_next
    b = build_teacher("resnet50", weights="random", size="tiny", seed=1)
    c = build_teacher("resnet50", weights="random", size="tiny", seed=2)
    pixels = random_pixels(a)
    assert torch.equal(a.encode_images(pixels), b.encode_images(pixels))
    assert not torch.allclose(a.encode_images(pixels), c.encode_images(pixels))


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_resnet_weights_path_reproduces_outputs_and_records_sha256(tmp_path, suffix):
    from safetensors.torch import save_file

    original = build_teacher("resnet50", weights="random", size="tiny", seed=5)
    state = {k: v.contiguous() for k, v in original.modules.state_dict().items()}
    path = tmp_path / f"resnet{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    loaded = build_teacher("resnet50", weights=str(path), size="tiny")
    pixels = random_pixels(original)
    assert torch.equal(loaded.encode_images(pixels), original.encode_images(pixels))
    producer = loaded.producer()
    assert producer["weights"] == "path" and producer["weights_sha256"] == file_sha256(path)
    assert "seed" not in producer


def test_weights_that_do_not_fit_or_do_not_exist_are_clear_errors(tmp_path):
    tiny = build_teacher("resnet50", weights="random", size="tiny")
    path = tmp_path / "tiny.pth"
    torch.save(tiny.modules.state_dict(), path)
    with pytest.raises(MmcseError, match="do not fit"):
        build_teacher("resnet50", weights=str(path))
    with pytest.raises(MmcseError, match="no such file"):
        build_teacher("simcse", weights=str(tmp_path / "missing"))
    with pytest.raises(MmcseError, match="backend"):
        build_teacher("resnet50", weights="random", size="tiny", backend="open_clip")
    with pytest.raises(KeyError, match="known"):
        build_teacher("resnet-50", weights="random")


def test_encode_images_rejects_float_or_wrong_size_pixels():
    teacher = build_teacher("resnet50", weights="random", size="tiny")
    with pytest.raises(ValueError, match="uint8"):
        teacher.encode_images(random_pixels(teacher).float())
    with pytest.raises(ValueError, match="uint8"):
        teacher.encode_images(torch.zeros(1, 3, 8, 8, dtype=torch.uint8))


def test_bf16_autocast_keeps_float32_output_close_to_fp32():
    fp32 = build_teacher("resnet50", weights="random", size="tiny", dtype="float32")
    bf16 = build_teacher("resnet50", weights="random", size="tiny", dtype="bf16")
    pixels = random_pixels(fp32)
    low = bf16.encode_images(pixels)
    assert low.dtype == torch.float32 and bf16.producer()["compute_dtype"] == "bfloat16"
    cosine = torch.nn.functional.cosine_similarity(low, fp32.encode_images(pixels))
    assert (cosine > 0.99).all()


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    from mmcse.tiny import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("bert"), texts=[*SENTENCES, LONG_SENTENCE])


def test_text_teacher_is_last_layer_cls_of_each_sentence_alone(bert_dir):
    """Sorted batching, padding and unsorting must not change any sentence's embedding."""
    from transformers import AutoTokenizer, BertModel

    texts = [*SENTENCES, LONG_SENTENCE]
    teacher = build_teacher("simcse", weights=str(bert_dir), batch_size=2)
    features = teacher.encode_texts(texts)
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    model = BertModel.from_pretrained(bert_dir).eval()
    for row, text in enumerate(texts):
        encoded = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")
        with torch.no_grad():
            expected = model(**encoded).last_hidden_state[0, 0]
        torch.testing.assert_close(features[row], expected, rtol=1e-4, atol=1e-5)
    producer = teacher.producer()
    assert producer["pooling"] == "cls_before_pooler" and producer["max_length"] == 32
    assert producer["weights_sha256"] == file_sha256(bert_dir / "model.safetensors")


def test_text_teacher_pooling_is_configurable(bert_dir):
    from transformers import AutoTokenizer, BertModel

    teacher = build_teacher("diffcse", weights=str(bert_dir), pooling="avg")
    encoded = AutoTokenizer.from_pretrained(bert_dir)(SENTENCES[1], return_tensors="pt")
    with torch.no_grad():
        expected = BertModel.from_pretrained(bert_dir)(**encoded).last_hidden_state[0].mean(0)
    torch.testing.assert_close(teacher.encode_texts([SENTENCES[1]])[0], expected)
    with pytest.raises(MmcseError, match="pooling"):
        build_teacher("diffcse", weights=str(bert_dir), pooling="median")


def tiny_clip_file(tmp_path: Path, seed: int = 7):
    from safetensors.torch import save_file
    from transformers import CLIPModel

    from pipeline.teachers.clip import hf_clip_config

    torch.manual_seed(seed)
    model = CLIPModel(hf_clip_config("tiny")).eval()
    path = tmp_path / "clip.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


def features_of(output) -> torch.Tensor:
    """transformers 5 returns a pooled output object from ``get_*_features``; 4.x a tensor."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


def test_clip_image_and_text_embeddings_match_transformers_clip_model(tmp_path, bert_dir):
    from transformers import AutoTokenizer

    model, path = tiny_clip_file(tmp_path)
    teacher = build_teacher("clip-vit-b32", weights=str(path), size="tiny", tokenizer=bert_dir)
    assert teacher.dim == TINY_SIZES["tiny"]["hidden_size"]  # as wide as the tiny student
    assert teacher.preprocess.interpolation == "bicubic"
    pixels = random_pixels(teacher)
    with torch.no_grad():
        expected = features_of(model.get_image_features(normalise(pixels, teacher.preprocess)))
    torch.testing.assert_close(teacher.encode_images(pixels), expected, rtol=1e-4, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    features = teacher.encode_texts(SENTENCES)
    for row, text in enumerate(SENTENCES):
        with torch.no_grad():
            expected = features_of(model.get_text_features(**tokenizer(text, return_tensors="pt")))
        torch.testing.assert_close(features[row], expected[0], rtol=1e-4, atol=1e-5)
    assert teacher.producer()["weights_sha256"] == file_sha256(path)


def test_clip_weights_file_without_tokenizer_refuses_captions_clearly(tmp_path):
    _, path = tiny_clip_file(tmp_path)
    teacher = build_teacher("clip-vit-b32", weights=str(path), size="tiny")
    teacher.encode_images(random_pixels(teacher))  # images need no tokenizer
    with pytest.raises(MmcseError, match="tokenizer=DIR"):
        teacher.encode_texts(SENTENCES)


def test_open_clip_backend_weights_path_reproduces_outputs(tmp_path):
    original = build_teacher("clip-vit-l14", weights="random", size="tiny", backend="open_clip")
    path = tmp_path / "open_clip.pth"
    torch.save(original.modules.model.state_dict(), path)
    loaded = build_teacher("clip-vit-l14", weights=str(path), size="tiny", backend="open_clip")
    pixels = random_pixels(original)
    assert torch.equal(loaded.encode_images(pixels), original.encode_images(pixels))
    assert torch.equal(loaded.encode_texts(SENTENCES), original.encode_texts(SENTENCES))
    assert loaded.producer()["backend"] == "open_clip"


def test_clip_text_teacher_is_text_only():
    teacher = build_teacher("clip-text", weights="random", size="tiny")
    assert not hasattr(teacher, "encode_images") and isinstance(teacher, TextTeacher)


OFFLINE_SCRIPT = """
from mmcse.errors import MmcseError
from pipeline.teachers import build_teacher
for name, kw in [("simcse", {}), ("resnet50", {}), ("clip-vit-b32", {"backend": "open_clip"})]:
    try:
        build_teacher(name, **kw)
    except MmcseError as exc:
        print(exc)
"""


def test_default_weights_offline_fail_fast_with_a_clear_error(tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a hang fails this test instead of stalling the suite
        cwd=ROOT,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and len(lines) == 3, done.stderr[-2000:]
    assert all("--weights PATH" in line for line in lines)
    assert "princeton-nlp/unsup-simcse-bert-base-uncased" in lines[0]
    assert "resnet50-0676ba61.pth" in lines[1]  # torchvision's IMAGENET1K_V1 file
    assert "vit_base_patch32_clip_224.openai" in lines[2]


def test_bench_extract_reports_all_rates():
    from mmcse.bench.extract import run_extract_bench

    rates = run_extract_bench("clip-vit-b32", images=4, batch_size=2, num_workers=0, size="tiny")
    assert set(rates) == {"decode", "teacher", "end-to-end", "text"}
    assert all(rate > 0 for rate in rates.values())


def test_bench_extract_cli_rejects_missing_cuda_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    done = subprocess.run(
        [sys.executable, "-c", "import cli; cli.main()", "bench", "all", "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stderr.strip().startswith("error: --device cuda")


def test_extract_help_names_every_registered_teacher_of_its_kind():
    """The names are written in pipeline.jobs (its --help must not load torch): held to the
    registry and the kinds in pipeline.teachers' table."""
    import dataclasses
    import re

    import pipeline.teachers as teachers
    from pipeline import jobs

    table = re.findall(r"^``([a-z0-9-]+)``\s+(image|text|both)\s", teachers.__doc__, re.M)
    assert sorted(name for name, _ in table) == sorted(TEACHERS.names())
    image = {name for name, kind in table if kind != "text"}
    text = {name for name, kind in table if kind != "image"}
    assert set(re.findall(r"[a-z0-9-]+", jobs.IMAGE_TEACHERS.split("(")[0])) == image
    assert set(jobs.TEXT_TEACHERS.split(", ")) == text
    helps = {f.name: f.metadata["help"] for f in dataclasses.fields(jobs.ImagesJob)}
    assert jobs.IMAGE_TEACHERS in helps["teacher"]
