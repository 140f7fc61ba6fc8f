"""mmcse.precision: one autocast / loss-scaling / precision-name policy, and training, the
VisualCSE/AudioCSE auxiliary step and evaluation all follow it (a GPU is simulated: autocast is
recorded, not entered, and bf16 support is what the case says)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from mmcse import precision
from mmcse.evaluation.encode import eval_autocast
from mmcse.nonling.task import NonLinguisticTask
from mmcse.training.config import TrainConfig

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture
def autocasts(monkeypatch):
    """The dtype of every autocast entered (None: no autocast), with a GPU's bf16 support set."""
    seen = []

    def record(device_type, dtype=None, enabled=True, **_):
        seen.append(dtype if enabled else None)
        return nullcontext()

    monkeypatch.setattr(torch, "autocast", record)
    return seen


def training_dtype(device, name, seen):
    with precision.autocast_context(device, name)():  # what the trainer's step enters
        pass
    return seen.pop() if seen else None


def auxiliary_dtype(device, name, seen):
    task = NonLinguisticTask.__new__(NonLinguisticTask)  # only the step's precision settings
    task.device, task.precision = device, name
    with task.autocast():
        pass
    return seen.pop() if seen else None


def evaluation_dtype(device, seen):
    with eval_autocast(device):
        pass
    return seen.pop() if seen else None


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-gpu", "no-bf16-gpu"])
@pytest.mark.parametrize("device", [CUDA, CPU], ids=["cuda", "cpu"])
@pytest.mark.parametrize("name", ["auto", "bf16", "fp16", "fp32"])
def test_training_the_auxiliary_step_and_evaluation_follow_one_policy(
    name, device, bf16, autocasts, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    want = precision.autocast_dtype(device, name)
    assert training_dtype(device, name, autocasts) == want
    assert auxiliary_dtype(device, name, autocasts) == want
    with precision.evaluating_in(name):  # --eval-precision / mmcse eval --precision
        assert evaluation_dtype(device, autocasts) == want
    recorded = {None: "fp32", torch.bfloat16: "bf16 autocast"}.get(
        want, "fp16 autocast + GradScaler"
    )
    assert precision.precision_name(device, name) == recorded


@pytest.mark.parametrize(
    "device, name, bf16, want",
    [
        (CUDA, "fp16", True, torch.float16),  # released --fp16: autocast(float16) + GradScaler
        (CUDA, "auto", True, torch.bfloat16),
        (CUDA, "auto", False, None),  # no bf16 on this GPU: fp32, not an emulated bf16
        (CUDA, "bf16", False, None),
        (CUDA, "fp32", True, None),
        (CPU, "fp16", True, None),
        (CPU, "auto", True, None),
    ],
)
def test_the_policy(device, name, bf16, want):
    assert precision.autocast_dtype(device, name, bf16) == want


@pytest.mark.parametrize("device", [CUDA, CPU], ids=["cuda", "cpu"])
@pytest.mark.parametrize("name", ["auto", "bf16", "fp16", "fp32"])
def test_only_fp16_on_a_gpu_scales_the_loss(name, device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    seen = []
    monkeypatch.setattr(torch.amp, "GradScaler", lambda *_, enabled: seen.append(enabled))
    precision.grad_scaler_for(device, name)
    assert seen == [device.type == "cuda" and name == "fp16"]


def test_the_settings_offer_exactly_the_policy_s_names():
    for name in precision.PRECISIONS:
        assert TrainConfig(precision=name).precision == name


@pytest.mark.parametrize("device", [CUDA, CPU], ids=["cuda", "cpu"])
def test_evaluation_is_fp32_by_default_on_every_device(device, autocasts, monkeypatch):
    """The released trainers evaluated (dev: the checkpoint choice; test: the numbers) with no
    autocast; so do mmcse eval and a run's dev/test scoring unless asked, even on a bf16 GPU."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert evaluation_dtype(device, autocasts) is None
    assert precision.precision_name(device) == "fp32"
    assert TrainConfig().eval_precision == "fp32"
    with precision.evaluating_in("auto"):
        assert precision.precision_name(device) == ("bf16 autocast" if device == CUDA else "fp32")
    assert precision.evaluation_precision() == "fp32"  # restored on leaving


def test_mmcse_eval_and_a_run_evaluate_under_their_precision_setting(monkeypatch, tmp_path):
    from mmcse.evaluation import evaluate as evaluate_mod
    from mmcse.evaluation.request import EvalRequest
    from mmcse.training import loop

    seen = []

    class Scored(Exception):  # stops the evaluation once the STS suite is entered
        pass

    def spy_sts(*_, **__):
        seen.append(precision.evaluation_precision())
        raise Scored

    monkeypatch.setattr(evaluate_mod, "evaluate_sts", spy_sts)
    monkeypatch.setattr(evaluate_mod, "unfinished_warning", lambda *_: None)
    monkeypatch.setattr(evaluate_mod, "resolve_model_source", lambda m: m)
    for asked in ("fp32", "auto"):
        request = EvalRequest(model=str(tmp_path), tasks="sts", precision=asked)
        with pytest.raises(Scored):
            list(evaluate_mod.evaluate_model(request))
    assert seen == ["fp32", "auto"]
    assert EvalRequest(model="m").precision == "fp32"

    class FakeTrainer:
        def __init__(self, cfg, resume):
            self.record = type("R", (), {"out": tmp_path})()

        def setup(self):
            return self

        def fit(self):
            return precision.evaluation_precision()

    monkeypatch.setattr(loop, "Trainer", FakeTrainer)
    assert loop.train(TrainConfig(eval_precision="bf16")) == "bf16"


# ---- TF32: what a run sets on CUDA, checked on the CPU through the adapter's stand-in ------------


@pytest.mark.parametrize("tf32", [True, False])
def test_a_run_sets_tf32_matmuls_and_convolutions_on_cuda_only(tf32):
    from mmcse.training.fastpath import set_matmul_precision

    applied = []
    cfg = TrainConfig(tf32=tf32)
    want = {"matmul": tf32, "cudnn": tf32}
    assert set_matmul_precision(cfg, CUDA, applied.append) == want
    assert applied == [want]
    assert set_matmul_precision(cfg, CPU, applied.append) is None and len(applied) == 1


@pytest.mark.parametrize("tf32", [True, False])
def test_the_tf32_switches_leave_torch_and_the_run_record_able_to_read_them(tf32):
    """The adapter's switches are process-wide flags, so the CPU sets them as a CUDA run does:
    afterwards inductor's ``torch.get_float32_matmul_precision`` and the environment record still
    read them (torch's per-backend ``fp32_precision`` made both raise)."""
    from mmcse.environment import numerics
    from mmcse.training.fastpath import set_matmul_precision

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        set_matmul_precision(TrainConfig(tf32=tf32), CUDA)  # the real adapter
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
        record = numerics("fp32")
        assert record["tf32_matmul"] is tf32 and record["tf32_cudnn"] is tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_the_recorded_precision_names_tf32_where_it_is_set():
    assert (
        precision.precision_name(CUDA, "fp32", tf32=True) == "fp32 (TF32 matmuls and convolutions)"
    )
    assert precision.precision_name(CUDA, "fp32", tf32=False) == "fp32"
    assert precision.precision_name(CPU, "fp32", tf32=True) == "fp32"  # no TF32 on a CPU
    assert precision.precision_name(CUDA, "fp16", tf32=True) == (
        "fp16 autocast + GradScaler + TF32 matmuls"
    )


def test_recipes_train_fp32_in_tf32_as_the_released_torch_and_plain_train_does_not():
    from mmcse.recipes import RECIPES
    from mmcse.recipes.recipe import RecipeRunSpec

    assert TrainConfig().tf32 is False  # mmcse train: bf16 autocast on CUDA by default
    recipes = [RECIPES.get(name) for name in RECIPES.names()]
    assert recipes
    for recipe in recipes:
        cfg = recipe.config("cache", seed=0, output_dir="o")
        assert cfg.tf32 is True, recipe.name
        assert "TF32" in recipe.describe(), recipe.name  # `mmcse recipes show` says it
        off = recipe.config(
            RecipeRunSpec("cache", overrides={"tf32": False}), seed=0, output_dir="o"
        )
        assert off.tf32 is False  # --set tf32=false: full fp32 matmuls
    mcse = RECIPES.get("mcse/wiki+flickr/bert").describe()
    assert "precision   fp32 (fp32, TF32 matmuls and cuDNN convolutions on CUDA" in mcse
