"""What a training run records of where it came from: teachers' provenance and environment."""

from __future__ import annotations

import logging
import platform

import numpy as np
import torch
from support.runs import tiny_mcse_settings

from mmcse.cache import FeatureSet, write_feature_set
from mmcse.rundir import RunDir
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

RANDOM_CLIP = {
    "teacher": "clip-vit-b32",
    "weights": "random",
    "weights_source": "clip-ViT-B-32",
    "weights_sha256": "random",
    "seed": 0,
    "compute_dtype": "float32",
}


def _config(tiny_model, tiny_world, tmp_path, image: str) -> TrainConfig:
    settings = tiny_mcse_settings(
        tiny_model, tiny_world, tmp_path / "run", features={"image": image}, max_steps=2,
        eval_steps=2, device="auto",
    )  # fmt: skip
    return TrainConfig(**settings)


def _random_image_set(tiny_world, path) -> str:
    """The tiny world's image features again, said to come from a randomly initialised CLIP."""
    source = FeatureSet.open(tiny_world["image"])
    ids = list(source.ids)
    values = np.random.default_rng(1).standard_normal((len(ids), 16)).astype(np.float32)
    write_feature_set(path, ids, values, kind="image", dim=16, dtype="float32",
                      dataset="tiny", split="train", producer=RANDOM_CLIP)  # fmt: skip
    return str(path)


def test_run_info_names_each_teacher_and_warns_of_random_weights(
    tiny_model, tiny_world, tmp_path, caplog
):
    image = _random_image_set(tiny_world, tmp_path / "random-clip")
    with caplog.at_level(logging.WARNING, logger="mmcse.training.preflight"):
        result = train(_config(tiny_model, tiny_world, tmp_path, image))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("RANDOM weights" in w and "(clip-vit-b32" in w for w in warnings)
    info = RunDir(result.output_dir).best.read_info()
    teacher = info["teachers"]["feature:image"]
    assert teacher["teacher"] == "clip-vit-b32" and teacher["weights"] == "random"
    assert teacher["weights_source"] == "clip-ViT-B-32" and teacher["dtype"] == "float32"
    assert teacher["fingerprint"] == info["fingerprints"]["feature:image"]["fingerprint"]
    assert teacher["producer"]["seed"] == 0


def test_run_info_records_the_environment_and_trained_teachers_do_not_warn(
    tiny_model, tiny_world, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, logger="mmcse"):
        result = train(_config(tiny_model, tiny_world, tmp_path, tiny_world["image"]))
    assert not any("RANDOM" in r.getMessage() for r in caplog.records)
    info = RunDir(result.output_dir).best.read_info()
    assert info["teachers"]["feature:image"]["weights"] is None  # not recorded by its producer
    env = info["environment"]
    assert env["python"]["version"] == platform.python_version()
    assert env["packages"]["torch"] == torch.__version__
    assert env["device"]["name"] == "cpu" and env["numerics"]["precision"] == "fp32"
    assert (
        env["numerics"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    )
    assert set(env) >= {"mmcse", "cuda", "system"}
