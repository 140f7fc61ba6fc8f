"""VisualCSE/AudioCSE components: fbank, SupCon/SimCLR, augmentation, patch embeddings, Stage-1
writer and the alternating non-linguistic step on a tiny BERT (all CPU, all small)."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from support.views import augment, spec_augment, two_views
from support.worlds import SR, make_image_folder, write_sine_wav

from mmcse.cache import FeatureSet, write_feature_set
from mmcse.errors import MmcseError
from mmcse.losses.base import LossInputs
from mmcse.losses.heads import MLPHead
from mmcse.methods import build_method
from mmcse.model import SentenceEncoder
from mmcse.nonling.augment import ViewAugmentation
from mmcse.nonling.patch_embed import AudioPatchEmbedding, ImagePatchEmbedding
from mmcse.nonling.task import NonLinguisticTask, class_of, encode_tokens
from mmcse.registry import LOSSES
from mmcse.tiny import build_tiny_bert
from mmcse.training.updates import auxiliary_update
from pipeline import nonling_cache as nc
from pipeline.fbank import FbankConfig, kaldi_fbank, pad_or_cut, read_wav, ssast_fbank


# -- fbank against an independent numpy implementation of Kaldi's definition --------------------
def numpy_kaldi_fbank(x: np.ndarray, sr: int, bins: int, window: str) -> np.ndarray:
    """Written from Kaldi's compute-fbank-feats description with explicit loops (float64)."""
    length, shift = int(sr * 0.025), int(sr * 0.010)
    n_fft = 1
    while n_fft < length:
        n_fft *= 2
    n = np.arange(length)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * n / (length - 1))
    win = hann**0.85 if window == "povey" else hann

    def mel(f):
        return 1127.0 * np.log(1.0 + f / 700.0)

    low, high = mel(20.0), mel(sr / 2)
    step = (high - low) / (bins + 1)
    filters = np.zeros((bins, n_fft // 2 + 1))
    for b in range(bins):
        left, center, right = low + b * step, low + (b + 1) * step, low + (b + 2) * step
        for k in range(n_fft // 2):  # Kaldi gives the Nyquist bin no weight
            m = mel(k * sr / n_fft)
            if left < m <= center:
                filters[b, k] = (m - left) / (center - left)
            elif center < m < right:
                filters[b, k] = (right - m) / (right - center)
    frames = 1 + (len(x) - length) // shift
    out = np.zeros((frames, bins))
    for t in range(frames):
        frame = x[t * shift : t * shift + length].astype(np.float64)
        frame = frame - frame.mean()
        emphasised = np.empty(length)
        emphasised[0] = frame[0] - 0.97 * frame[0]
        for i in range(1, length):
            emphasised[i] = frame[i] - 0.97 * frame[i - 1]
        buffer = np.zeros(n_fft)
        buffer[:length] = emphasised * win
        power = np.abs(np.fft.rfft(buffer)) ** 2
        out[t] = np.log(np.maximum(filters @ power, np.finfo(np.float32).eps))
    return out


@pytest.mark.parametrize("window", ["hanning", "povey"])
def test_fbank_matches_numpy_kaldi(window):
    rng = np.random.default_rng(0)
    t = np.arange(int(0.3 * SR)) / SR
    x = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    ours = kaldi_fbank(torch.from_numpy(x), SR, FbankConfig(num_mel_bins=40, window=window))
    reference = numpy_kaldi_fbank(x, SR, 40, window)
    assert ours.shape == (1 + (x.size - 400) // 160, 40) == reference.shape
    np.testing.assert_allclose(ours.numpy(), reference, rtol=1e-4, atol=5e-4)


def test_ssast_fbank_pads_and_cuts():
    x = torch.sin(torch.arange(SR) / SR * 2 * math.pi * 300)  # 1 s → 98 frames
    short = ssast_fbank(x, SR, FbankConfig(target_frames=120))
    assert short.shape == (120, 128) and torch.all(short[98:] == 0) and torch.all(short[97] != 0)
    assert pad_or_cut(short, 50).shape == (50, 128)
    assert torch.equal(ssast_fbank(x, SR), ssast_fbank(x, SR))  # dither 0: deterministic


def test_read_wav_scales_int16(tmp_path):
    write_sine_wav(tmp_path / "a.wav", 200)
    waveform, rate = read_wav(tmp_path / "a.wav")
    assert rate == SR and waveform.dtype == torch.float32
    assert 0.49 < waveform.abs().max().item() <= 0.5
    with pytest.raises(MmcseError):
        read_wav(tmp_path / "missing.wav")


# -- SupCon / SimCLR against explicit loops ----------------------------------------------------
def loop_supcon(f1, f2, labels, tau):
    z = torch.nn.functional.normalize(torch.cat([f1, f2]).double(), dim=1).tolist()
    lab = list(labels) * 2
    total = 0.0
    for a in range(len(z)):

        def sim(i, j):
            return sum(p * q for p, q in zip(z[i], z[j], strict=True)) / tau

        denominator = sum(math.exp(sim(a, k)) for k in range(len(z)) if k != a)
        positives = [p for p in range(len(z)) if p != a and lab[p] == lab[a]]
        total += -sum(math.log(math.exp(sim(a, p)) / denominator) for p in positives) / len(
            positives
        )
    return total / len(z)


def loop_simclr(f1, f2, tau):
    a = torch.nn.functional.normalize(f1.double(), dim=1).tolist()
    b = torch.nn.functional.normalize(f2.double(), dim=1).tolist()
    total = 0.0
    for i in range(len(a)):
        sims = [sum(p * q for p, q in zip(a[i], b[j], strict=True)) / tau for j in range(len(b))]
        total += -math.log(math.exp(sims[i]) / sum(math.exp(s) for s in sims))
    return total / len(a)


def test_supcon_matches_loop():
    torch.manual_seed(0)
    f1, f2 = torch.randn(6, 5), torch.randn(6, 5)
    labels = torch.tensor([0, 1, 0, 2, 1, 0])
    ours = LOSSES.get("supcon").compute_loss_from_embeddings(f1, f2, labels, 0.07)
    assert ours.item() == pytest.approx(loop_supcon(f1, f2, labels.tolist(), 0.07), rel=1e-5)
    unlabelled = LOSSES.get("supcon").compute_loss_from_embeddings(f1, f2, None, 0.5)
    assert unlabelled.item() == pytest.approx(loop_supcon(f1, f2, range(6), 0.5), rel=1e-5)


def test_simclr_matches_loop():
    torch.manual_seed(1)
    f1, f2 = torch.randn(5, 4), torch.randn(5, 4)
    ours = LOSSES.get("simclr").compute_loss_from_embeddings(f1, f2, 0.07)
    assert ours.item() == pytest.approx(loop_simclr(f1, f2, 0.07), rel=1e-5)


@pytest.mark.parametrize("name", ["supcon", "simclr"])
def test_loss_modules_return_their_terms_and_gradients(name):
    loss, head = LOSSES.get(name)(), MLPHead(8, 8, "bert")
    view1, view2 = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    inputs = LossInputs(view1, view2, extras={"labels": torch.tensor([0, 0, 1, 2])})
    terms = loss(inputs, {"student": head})
    assert set(terms) == set(loss.terms) and torch.isfinite(terms[f"{name}_loss"])
    terms[f"{name}_loss"].backward()
    assert view1.grad is not None and head[0].weight.grad is not None


# -- augmentation and patch embeddings ---------------------------------------------------------
def test_augment_shapes_dtype_and_seed():
    images = torch.randint(0, 256, (3, 3, 40, 48), dtype=torch.uint8)
    spec = ViewAugmentation(size=32)
    views = augment(images, seed=7, spec=spec)
    assert views.shape == (3, 3, 32, 32) and views.dtype == torch.float32
    assert torch.equal(views, augment(images, seed=7, spec=spec))
    assert not torch.equal(views, augment(images, seed=8, spec=spec))
    first, second = two_views(images, seed=7, spec=spec)
    assert first.shape == second.shape == (3, 3, 32, 32) and not torch.equal(first, second)
    state = torch.random.get_rng_state()
    augment(images, seed=9, spec=spec)
    assert torch.equal(state, torch.random.get_rng_state())  # global RNG untouched
    with pytest.raises(ValueError):
        augment(images.float(), seed=0)


def test_patch_embedding_shapes():
    image = ImagePatchEmbedding(hidden_size=8)
    assert image(torch.randn(2, 3, 224, 224)).shape == (2, 197, 8)  # 14×14 patches + [CLS]
    audio = AudioPatchEmbedding(hidden_size=8)
    assert audio(torch.randn(2, 1024, 128)).shape == (2, 211, 8)  # the paper's 1 × 211 × h
    assert AudioPatchEmbedding(8, patch_size=16)(torch.randn(1, 1024, 128)).shape == (1, 513, 8)
    with pytest.raises(MmcseError):
        image(torch.randn(1, 3, 64, 64))


def test_image_patch_embedding_loads_a_local_vit(tmp_path):
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=32,
        patch_size=16,
    )
    vit = ViTModel(config, add_pooling_layer=False)
    vit.save_pretrained(tmp_path / "vit")
    module = ImagePatchEmbedding.create(16, image_size=32, init=str(tmp_path / "vit"))
    assert torch.equal(module.position_embeddings, vit.embeddings.position_embeddings)
    assert torch.equal(module.projection.weight, vit.embeddings.patch_embeddings.projection.weight)
    pixels = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(module(pixels), vit.embeddings(pixels), atol=1e-6)
    with pytest.raises(MmcseError, match="hidden size"):
        ImagePatchEmbedding.create(8, image_size=32, init=str(tmp_path / "vit"))
    assert ImagePatchEmbedding.create(8, image_size=32).num_patches == 4  # auto: no ViT of width 8


# -- Stage 1 writer ----------------------------------------------------------------------------


def test_image_writer_folder_and_subset(tmp_path):
    folder = make_image_folder(tmp_path / "imgs")
    manifest = nc.write_image_tensors(
        nc.class_folder(folder, nc.IMAGE_SUFFIXES),
        tmp_path / "set",
        dataset="toy",
        size=32,
        shard_rows=5,
        workers=0,
    )
    fs = FeatureSet.open(tmp_path / "set")
    assert manifest.kind == "image_tensor" and fs.shape == (3, 32, 32) and fs.dtype == np.uint8
    assert len(fs) == 12 and len(manifest.shards) == 3
    assert manifest.extra["classes"] == ["cat", "dog", "owl"]
    assert sorted({class_of(i) for i in fs.ids}) == ["cat", "dog", "owl"]
    row = fs.gather(["dog/img2"])[0]
    from PIL import Image

    expected = nc.resize_center_crop(Image.open(folder / "dog" / "img2.png"), 32)
    assert np.array_equal(row, expected)
    subset = nc.class_folder(folder, nc.IMAGE_SUFFIXES, max_classes=2, per_class=3, seed=1)
    assert len(subset) == 6 and len({class_of(e.id) for e in subset}) == 2
    assert subset == nc.class_folder(folder, nc.IMAGE_SUFFIXES, max_classes=2, per_class=3, seed=1)


def test_image_writer_cifar_pickles(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"plane", b"car"]}, f)
    data = np.arange(4 * 3072, dtype=np.int64).astype(np.uint8).reshape(4, 3072)
    with open(root / "data_batch_1", "wb") as f:
        pickle.dump({b"data": data, b"labels": [0, 1, 1, 0]}, f)
    examples = nc.cifar_batches(root)
    assert [e.id for e in examples][:2] == ["plane/data_batch_1-00000", "car/data_batch_1-00001"]
    assert np.array_equal(examples[1].source[..., 0], data[1, :1024].reshape(32, 32))
    manifest = nc.write_image_tensors(
        examples, tmp_path / "set", dataset="cifar10", size=32, workers=0
    )
    assert manifest.num_rows == 4 and manifest.extra["classes"] == ["car", "plane"]
    np.testing.assert_array_equal(
        FeatureSet.open(tmp_path / "set").take([1])[0, 1], data[1, 1024:2048].reshape(32, 32)
    )


# -- the alternating step ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("bert"))


class Cfg:  # the fields auxiliary_task and auxiliary_update read from a TrainConfig
    def __init__(self, features, adam_eps=1e-8, adam_eps_style="transformers"):
        self.features, self.seed, self.precision = features, 3, "auto"
        self.adam_eps, self.adam_eps_style = adam_eps, adam_eps_style
        self.weight_decay_style, self.zero_grad = "transformers", "none"


def changed(before: dict, module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def record_of(result) -> dict[str, float]:
    """A task step's logged values by name: its terms (device, stacked) and its host values."""
    (names, values), host = result
    return {**dict(zip(names, values.tolist(), strict=True)), **host}


def test_visualcse_step_updates_encoder(tmp_path, tiny_bert):
    folder = make_image_folder(tmp_path / "imgs")
    nc.write_image_tensors(
        nc.class_folder(folder, nc.IMAGE_SUFFIXES),
        tmp_path / "set",
        dataset="toy",
        size=40,
        workers=0,
    )
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert))
    method = build_method("visualcse", image_batch_size=4, image_size=32, image_lr=1e-3)
    cfg = Cfg({"image_tensor": str(tmp_path / "set")})
    task = method.auxiliary_task(encoder, cfg, "cpu")
    update = auxiliary_update(task, cfg, "cpu")
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    heads_before = {k: v.clone() for k, v in task.state_dict().items()}
    records = [record_of(update.step()) for _ in range(4)]  # 12 images, batch 4: a new epoch
    assert all(math.isfinite(v) for r in records for v in r.values())
    assert set(records[0]) == {"image_class_rank_ce_loss", "image_lr"}  # --new_supcon
    assert changed(before, encoder) and changed(heads_before, task.heads)
    assert not any(k.startswith("backbone.embeddings.word") for k in task.state_dict())
    assert task.fingerprint == {"image_tensor": FeatureSet.open(tmp_path / "set").fingerprint}
    assert len(task._batch_rows(0)) == 4 and not np.array_equal(
        task._batch_rows(0), task._batch_rows(1)
    )
    # a step's views (made from host-drawn parameters, in both steps) are augment's of its images
    images = torch.from_numpy(task.examples.take(task._batch_rows(2)))
    views, _ = task.batch(2)
    reference = augment(torch.cat([images, images]), task._view_seed(2), task.views)
    assert views.shape == (8, 3, 32, 32) and torch.equal(views, reference)


def test_audiocse_step_on_sine_waves(tmp_path, tiny_bert):
    for speaker, freq in (("s1", 220.0), ("s2", 880.0)):
        for i in range(3):
            write_sine_wav(tmp_path / "wavs" / speaker / f"u{i}.wav", freq * (1 + 0.1 * i))
    cfg = FbankConfig(num_mel_bins=32, target_frames=48)
    examples = nc.class_folder(tmp_path / "wavs", nc.AUDIO_SUFFIXES)
    manifest = nc.write_audio_fbanks(
        examples, tmp_path / "set", dataset="sines", cfg=cfg, workers=0
    )
    assert manifest.kind == "audio_fbank" and manifest.shape == [48, 32]
    assert manifest.dtype == "float16" and manifest.extra["classes"] == ["s1", "s2"]
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert))
    method = build_method("audiocse", audio_batch_size=4, audio_patch_size=16, audio_lr=1e-3)
    task = method.auxiliary_task(encoder, Cfg({"audio_fbank": str(tmp_path / "set")}), "cpu")
    update = auxiliary_update(task, Cfg({}), "cpu")
    before = {k: v.clone() for k, v in encoder.state_dict().items()}
    record = record_of(update.step())
    assert set(record) == {"audio_class_rank_ce_loss", "audio_lr"} and math.isfinite(
        record["audio_class_rank_ce_loss"]
    )
    assert changed(before, encoder)
    assert set(update.state_dict()) == {"steps_taken", "optimizer", "scaler"}
    # the released SpecAugment: each clip masked once, the same masked clip in both views
    rows = task._batch_rows(1)
    first, second = task.batch(1)[0].chunk(2)
    raw = torch.from_numpy(task.examples.take(rows)).float()
    assert torch.equal(first, second) and ((first == 0) & (raw != 0)).any()
    assert torch.equal(first, spec_augment(raw, task._view_seed(1), task.masks))
    unmasked = build_method(
        "audiocse", audio_batch_size=4, audio_patch_size=16, audio_freq_mask=0, audio_time_mask=0
    )
    plain = unmasked.auxiliary_task(encoder, Cfg({"audio_fbank": str(tmp_path / "set")}), "cpu")
    assert torch.equal(plain.batch(1)[0], torch.cat([raw, raw]))


def test_method_hooks_and_errors(tmp_path, tiny_bert):
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert))
    assert build_method("visualcse", image_weight=0).auxiliary_task(encoder, Cfg({}), "cpu") is None
    with pytest.raises(MmcseError, match="--feature image_tensor=DIR"):
        build_method("visualcse").auxiliary_task(encoder, Cfg({}), "cpu")
    assert "image class_rank_cross_entropy" in build_method("visualcse").describe()
    assert "image supcon" in build_method("visualcse", image_objective="supcon").describe()
    with pytest.raises(ValueError):
        build_method("audiocse", audio_objective="triplet")
    ids = [f"x/{i}" for i in range(4)]
    unlabelled = np.zeros((4, 3, 16, 16), dtype=np.uint8)
    write_feature_set(
        tmp_path / "u",
        ids,
        unlabelled,
        kind="image_tensor",
        dim=768,
        shape=[3, 16, 16],
        dtype="uint8",
        dataset="u",
        split="train",
        producer={"teacher": "test"},
    )
    for objective in ("class_rank_cross_entropy", "supcon"):  # both read class labels
        method = build_method(
            "visualcse", image_batch_size=2, image_size=16, image_objective=objective
        )
        with pytest.raises(MmcseError, match="simclr"):
            NonLinguisticTask(encoder, method, tmp_path / "u", "cpu")
    simclr = build_method("visualcse", image_batch_size=2, image_size=16, image_objective="simclr")
    task = NonLinguisticTask(encoder, simclr, tmp_path / "u", "cpu")
    assert task.labels is None
    mlp = task.heads["mlp"][0]  # the authors' image_mlp, BERT-initialised (built in cl_init)
    assert torch.count_nonzero(mlp.bias) == 0 and mlp.weight.std().item() < 0.03
    with pytest.raises(MmcseError, match="audio_fbank"):
        NonLinguisticTask(encoder, build_method("audiocse"), tmp_path / "u", "cpu")
    with pytest.raises(MmcseError, match="fewer than one batch"):
        NonLinguisticTask(
            encoder, build_method("visualcse", image_objective="simclr"), tmp_path / "u", "cpu"
        )


def test_cli_extract_image_tensors(tmp_path):
    from typer.testing import CliRunner

    import cli

    folder = make_image_folder(tmp_path / "imgs", per_class=2)
    args = ["extract-image-tensors", str(folder), str(tmp_path / "set"), "--size", "24"]
    result = CliRunner().invoke(cli.app, [*args, "--workers", "0"])
    assert result.exit_code == 0, result.output
    assert "6 images, 3 classes" in result.output
    assert FeatureSet.open(tmp_path / "set").shape == (3, 24, 24)


def test_auxiliary_step_updates_equal_transformers_adamw(tmp_path, tiny_bert):
    """The released image optimizer is transformers.AdamW with the run's ε (trainers.py:516–522):
    the first three updates of every parameter equal that update written out (tests/test_optim),
    fed the step's own (clipped) gradients."""
    from test_optim import TransformersAdamW

    folder = make_image_folder(tmp_path / "imgs")
    examples = nc.class_folder(folder, nc.IMAGE_SUFFIXES)
    nc.write_image_tensors(examples, tmp_path / "set", dataset="toy", size=40, workers=0)
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert))
    method = build_method("visualcse", image_batch_size=4, image_size=32, image_lr=1e-3)
    cfg = Cfg({"image_tensor": str(tmp_path / "set")}, adam_eps=1e-4)  # ε visible at this scale
    task = method.auxiliary_task(encoder, cfg, "cpu")
    update = auxiliary_update(task, cfg, "cpu")
    params = [*encoder.parameters(), *task.parameters()]
    reference = TransformersAdamW(lr=1e-3, eps=1e-4)
    expected: list[torch.Tensor] = []

    def hand_written(optimizer, args, kwargs):  # the gradients the step is about to apply
        expected[:] = [reference.update(i, p, p.grad) for i, p in enumerate(params)]

    update.core.optimizer.register_step_pre_hook(hand_written)
    for _ in range(3):
        update.step()
        for param, want in zip(params, expected, strict=True):
            torch.testing.assert_close(param.detach().double(), want, rtol=1e-5, atol=1e-7)


def sine_fbank_set(tmp_path) -> Path:
    for speaker, freq in (("s1", 220.0), ("s2", 880.0)):
        for i in range(3):
            write_sine_wav(tmp_path / "wavs" / speaker / f"u{i}.wav", freq * (1 + 0.1 * i))
    examples = nc.class_folder(tmp_path / "wavs", nc.AUDIO_SUFFIXES)
    cfg = FbankConfig(num_mel_bins=32, target_frames=48)
    nc.write_audio_fbanks(examples, tmp_path / "set", dataset="sines", cfg=cfg, workers=0)
    return tmp_path / "set"


def released_audio_cls(backbone, heads, clips: torch.Tensor) -> torch.Tensor:
    """AudioCSE/src/models.py:393–403 in order: unsqueeze, transpose(2, 3), timm's patch_embed
    (conv, flatten(2), transpose(1, 2)), cls_token in front, pos_drop (dropout 0: identity), then
    ``bert.encoder`` and [CLS] — no position embeddings anywhere."""
    conv = heads["patch_embed"].projection
    x = clips.unsqueeze(1).transpose(2, 3)
    x = torch.nn.functional.conv2d(x, conv.weight, conv.bias, stride=conv.stride)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat((heads["patch_embed"].cls_token.expand(x.shape[0], -1, -1), x), dim=1)
    return backbone.encoder(x).last_hidden_state[:, 0]


def test_audio_encoder_follows_the_released_layer_order(tmp_path, tiny_bert):
    examples = sine_fbank_set(tmp_path)
    encoder = SentenceEncoder.from_pretrained(str(tiny_bert)).eval()
    outputs = {}
    for positions in (False, True):
        method = build_method(
            "audiocse", audio_batch_size=4, audio_patch_size=16,
            audio_position_embeddings=positions,
        )  # fmt: skip
        task = method.auxiliary_task(encoder, Cfg({"audio_fbank": str(examples)}), "cpu")
        clips = torch.from_numpy(task.examples.take(np.arange(4))).float()
        with torch.no_grad():
            ours = encode_tokens(encoder.backbone, task.heads["patch_embed"](clips))
            outputs[positions] = (ours, released_audio_cls(encoder.backbone, task.heads, clips))
        has_positions = any("position_embeddings" in k for k in task.state_dict())
        assert has_positions == positions
    torch.testing.assert_close(*outputs[False], rtol=1e-5, atol=1e-6)  # the default = released
    assert not torch.allclose(*outputs[True], atol=1e-3)  # the switch adds positions


def released_top_speakers(path: Path, k: int, suffix: str = ".wav") -> list[str]:
    """AudioCSE/data_preparation/prep_librispeech.py:walk (counts per speaker, the file name's
    part before its first '-', in os.walk order; ``sorted(…, key=count, reverse=True)``) and
    AudioCSE/src/trainers.py:481 (``top_k[i][0] for i in range(top_classes)``), as written there."""
    import os
    import re

    mid_number: dict[str, int] = {}
    for _root, _dirs, files in os.walk(path):
        for file in files:
            if file.endswith(suffix):
                c_name = re.findall(r"(.*?)-.*", file)[0]
                mid_number[c_name] = mid_number.get(c_name, 0) + 1
    ranked = sorted(mid_number.items(), key=lambda x: x[1], reverse=True)
    return [ranked[i][0] for i in range(k)]


def test_audio_classes_are_the_released_top_speakers(tmp_path, caplog):
    # LibriSpeech's layout: SPEAKER/CHAPTER/SPEAKER-CHAPTER-UTT; counts with ties across the cut
    counts = {"19": 5, "26": 2, "103": 7, "1034": 3, "87": 3, "911": 3, "200": 1, "4": 6}
    for speaker, n in counts.items():
        for u in range(n):
            chapter = 100 + u % 2
            wav = tmp_path / "ls" / speaker / str(chapter) / f"{speaker}-{chapter}-{u:04d}.wav"
            wav.parent.mkdir(parents=True, exist_ok=True)
            wav.write_bytes(b"")
    for k in (1, 3, 4, 5, 6):  # 4 and 5 cut through the three speakers with 3 utterances
        want = released_top_speakers(tmp_path / "ls", k)
        assert nc.most_files_classes(tmp_path / "ls", nc.AUDIO_SUFFIXES, k) == want
        picked = nc.class_folder(tmp_path / "ls", nc.AUDIO_SUFFIXES, max_classes=k, by="most")
        assert sorted({class_of(e.id) for e in picked}) == sorted(want)
        assert len(picked) == sum(counts[s] for s in want)  # every utterance of each speaker
    assert "straddle the top-4 cut" in caplog.text
    drawn = nc.class_folder(tmp_path / "ls", nc.AUDIO_SUFFIXES, max_classes=3, seed=0)
    assert len({class_of(e.id) for e in drawn}) == 3  # the switch: a seeded random draw
    with pytest.raises(MmcseError, match="class pick"):
        nc.class_folder(tmp_path / "ls", nc.AUDIO_SUFFIXES, max_classes=3, by="first")


def released_speaker_numbering(path: Path, k: int, suffix: str = ".wav") -> list[str]:
    """The speaker of each label 0, 1, … in the released AudioCSE run, as written there:
    prep_librispeech.py's walk appends each new speaker to ``mid`` as it first meets one of their
    files (lines 35–36) and writes ``csv.display_name = mid`` (56, 65); trainers.py (489–494) keeps
    the top-``k`` speakers and numbers them 0, 1, … in ``display_name``'s order."""
    import os
    import re

    mid: list[str] = []
    for _root, _dirs, files in os.walk(path):
        for file in files:
            if file.endswith(suffix):
                c_name = re.findall(r"(.*?)-.*", file)[0]
                if c_name not in mid:
                    mid.append(c_name)
    top_dk = released_top_speakers(path, k, suffix)
    return [name for name in mid if name in top_dk]


def test_audio_speakers_are_numbered_as_the_released_run(tmp_path, monkeypatch):
    """extract-audio numbers speakers by first appearance in os.walk (the release), not by name:
    the class-rank loss is not invariant to the numbering (next test). The file system lists
    folders in reverse name order here, so the two numberings differ."""
    import os

    real_walk = os.walk

    def reverse_listing_walk(top, *args, **kwargs):
        for folder, dirs, files in real_walk(top, *args, **kwargs):
            dirs.sort(reverse=True)  # in place: the walk descends in this order
            yield folder, dirs, files

    monkeypatch.setattr(os, "walk", reverse_listing_walk)
    counts = {"19": 5, "26": 2, "103": 7, "1034": 3, "87": 4, "911": 3, "200": 1, "4": 6}
    for speaker, n in counts.items():
        for u in range(n):
            wav = tmp_path / "ls" / speaker / "100" / f"{speaker}-100-{u:04d}.wav"
            wav.parent.mkdir(parents=True, exist_ok=True)
            wav.write_bytes(b"")
    root = tmp_path / "ls"
    for k in (3, 5, 8):
        picked = nc.class_folder(root, nc.AUDIO_SUFFIXES, max_classes=k, by="most")
        walk = nc.numbered_classes(root, nc.AUDIO_SUFFIXES, picked, "walk")
        assert walk == released_speaker_numbering(root, k)
        assert nc.numbered_classes(root, nc.AUDIO_SUFFIXES, picked, "sorted") == sorted(walk)
        assert walk != sorted(walk)
    from pipeline.jobs import AudioJob

    assert AudioJob.__dataclass_fields__["class_numbering"].default == "walk"
    with pytest.raises(MmcseError, match="numbering"):
        nc.numbered_classes(root, nc.AUDIO_SUFFIXES, picked, "name")


def test_the_class_rank_loss_depends_on_how_classes_are_numbered():
    """Renumbering the classes (a permutation of the label values) moves the class-rank targets
    — a column index — and so the loss: the numbering must be the release's."""
    from mmcse.losses.class_rank_cross_entropy import class_rank_targets

    labels = torch.tensor([7, 2, 7, 5, 2, 9])
    renumbered = torch.tensor([{7: 0, 2: 3, 5: 1, 9: 2}[int(y)] for y in labels])
    assert class_rank_targets(labels).tolist() == [2, 0, 2, 1, 0, 3]
    assert class_rank_targets(renumbered).tolist() == [0, 3, 0, 1, 3, 2]
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 6, generator=gen)
    loss = torch.nn.functional.cross_entropy
    assert loss(scores, class_rank_targets(labels)) != loss(scores, class_rank_targets(renumbered))


RELEASED_LIST_SHA256 = "dca31e7bfb42686d76b1f4c86dd77b6bc015bab792059dcaacba8ede5c3f760d"


def test_shipped_visualcse_list_is_the_released_file_and_selects_its_images(tmp_path):
    """``--list visualcse`` = yiren-jian/NonLing-CSE VisualCSE/sampled-Imagenet.txt byte for byte
    (its sha256 read off the released file). On an ImageNet-shaped tree with other images too, a
    list in the released format (a slice of the shipped one) caches exactly the images of the
    released ``sampled-Imagenet`` folder (ImageFolder: class = the line's parent folder)."""
    import gzip
    import hashlib

    raw = gzip.decompress(nc.RELEASED_LISTS["visualcse"].read_bytes())
    assert hashlib.sha256(raw).hexdigest() == RELEASED_LIST_SHA256
    lines = raw.decode().splitlines()
    assert nc.list_text("visualcse").splitlines() == lines
    assert len(set(lines)) == 30_000 and len({line.split("/")[-2] for line in lines}) == 60
    fixture = lines[:3] + lines[500:502] + lines[-2:]  # three classes
    (tmp_path / "list.txt").write_text("\n".join(fixture) + "\n")
    released = {tuple(line.split("/")[-2:]) for line in fixture}
    root = tmp_path / "imagenet-train"
    for wnid, name in [*released, ("n99999999", "n99999999_1.JPEG")]:
        (root / wnid).mkdir(parents=True, exist_ok=True)
        (root / wnid / name).touch()
        (root / wnid / f"{wnid}_999999.JPEG").touch()  # not listed
    ids = [e.id for e in nc.listed_files(root, tmp_path / "list.txt")]
    assert sorted(ids) == sorted(f"{wnid}/{Path(name).stem}" for wnid, name in released)
    with pytest.raises(MmcseError, match="shipped lists: visualcse"):
        nc.listed_files(root, tmp_path / "no-such-list.txt")
