"""Batched VisualCSE views against torchvision, the authors' per-image transforms.

Distributions: our host draws vs torchvision's ``get_params`` (the v1 API the authors' SupCon
pipeline calls) with two-sample tests, and for each test a deliberately wrong sampler that the
same decision rule must reject, so a test cannot pass for a wrong distribution. Pixels: a fixed
draw through the batched ops vs ``torchvision.transforms.v2.functional`` one image at a time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from support.views import augment, two_views
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as TF

from mmcse.nonling.augment import (
    HUE,
    ViewAugmentation,
    ViewParams,
    apply_params,
    draw_crops,
    draw_params,
    pack_params,
)

ALPHA = 1e-3  # one decision rule: a sample "matches" when every p-value exceeds it
DRAWS = 4000
SPEC = ViewAugmentation()
PIXEL_TOLERANCE = 1e-5  # on 0–1 pixels (a uint8 step is 3.9e-3)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def matches(p_values: dict[str, float]) -> bool:
    return min(p_values.values()) > ALPHA


# -- crop boxes --------------------------------------------------------------------------------
def torchvision_boxes(height: int, width: int, scale, ratio, seed: int = 0) -> np.ndarray:
    image = torch.empty(3, height, width)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return np.array(
            [T.RandomResizedCrop.get_params(image, list(scale), list(ratio)) for _ in range(DRAWS)]
        )


def wrong_boxes(height, width, scale, ratio, *, log_ratio=True, offset_shrink=0, whole=False):
    """RandomResizedCrop written out, with at most one deliberate mistake: aspect ratio uniform
    instead of log-uniform, a position range one short, or the whole image as the fallback."""
    rng, boxes = np.random.default_rng(1), []
    for _ in range(DRAWS):
        for _ in range(10):
            area = height * width * rng.uniform(*scale)
            if log_ratio:
                aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
            else:
                aspect = rng.uniform(*ratio)
            w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = rng.integers(0, max(height - h + 1 - offset_shrink, 1))
                left = rng.integers(0, max(width - w + 1 - offset_shrink, 1))
                boxes.append((top, left, h, w))
                break
        else:
            h, w = height, width
            if not whole and width / height > ratio[1]:  # the shapes here are wide, not tall
                w = round(height * ratio[1])
            boxes.append(((height - h) // 2, (width - w) // 2, h, w))
    return np.array(boxes)


def box_p_values(ours: np.ndarray, reference: np.ndarray, height: int, width: int) -> dict:
    """KS p-values of area fraction, log aspect ratio and the box centre's relative position."""

    def describe(boxes):
        top, left, h, w = boxes.T.astype(float)
        return {
            "area": h * w / (height * width),
            "log_ratio": np.log(w / h),
            "centre_y": (top + h / 2) / height,
            "centre_x": (left + w / 2) / width,
        }

    a, b = describe(ours), describe(reference)
    return {k: stats.ks_2samp(a[k], b[k]).pvalue for k in a}


SHAPES = [(256, 256), (40, 48), (40, 200)]  # training size; small (rounding); wide (fallback)


@pytest.mark.parametrize("height,width", SHAPES)
def test_crop_boxes_follow_random_resized_crop(height, width):
    reference = torchvision_boxes(height, width, SPEC.scale, SPEC.ratio)
    ours = draw_crops(np.random.default_rng(3), DRAWS, height, width, SPEC.scale, SPEC.ratio)
    assert matches(box_p_values(ours, reference, height, width))
    assert ((ours[:, :2] >= 0) & (ours[:, :2] + ours[:, 2:] <= [height, width])).all()
    wrong_scale = draw_crops(np.random.default_rng(3), DRAWS, height, width, (0.08, 1), SPEC.ratio)
    assert not matches(box_p_values(wrong_scale, reference, height, width))


@pytest.mark.parametrize(
    "height,width,mistake",
    [
        (256, 256, {"log_ratio": False}),
        (40, 48, {"log_ratio": False}),
        (40, 48, {"offset_shrink": 1}),
        (40, 200, {"offset_shrink": 1}),
        (40, 200, {"whole": True}),
    ],
)
def test_crop_test_rejects_wrong_samplers(height, width, mistake):
    reference = torchvision_boxes(height, width, SPEC.scale, SPEC.ratio)
    right = wrong_boxes(height, width, SPEC.scale, SPEC.ratio, whole=False)
    assert matches(box_p_values(right, reference, height, width))  # the control itself is fair
    wrong = wrong_boxes(height, width, SPEC.scale, SPEC.ratio, **mistake)
    assert not matches(box_p_values(wrong, reference, height, width))


# -- flip, jitter, grayscale -------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec", [SPEC, ViewAugmentation(flip_p=0.3, jitter_p=0.6, grayscale_p=0.1)]
)
def test_rates_are_the_probabilities(spec):
    n = 20000
    params = draw_params(n, 64, 64, seed=11, spec=spec)
    rates = [
        (params.flip, spec.flip_p),
        (params.jitter, spec.jitter_p),
        (params.grayscale, spec.grayscale_p),
    ]
    for drawn, p in rates:
        sigma = math.sqrt(p * (1 - p) / n)  # 4σ ≤ 0.014: a wrong or inverted p fails
        assert abs(drawn.mean() - p) < 4 * sigma
    independent = params.flip & params.grayscale
    assert abs(independent.mean() - spec.flip_p * spec.grayscale_p) < 0.01


def torchvision_jitter(strengths, seed=0):
    jitter = T.ColorJitter(*strengths)
    ranges = (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draws = [T.ColorJitter.get_params(*ranges) for _ in range(DRAWS)]
    orders = np.array([d[0].tolist() for d in draws])
    return np.array([d[1:] for d in draws], dtype=float), orders


def factor_p_values(ours: np.ndarray, reference: np.ndarray) -> dict:
    names = ("brightness", "contrast", "saturation", "hue")
    return {n: stats.ks_2samp(ours[:, i], reference[:, i]).pvalue for i, n in enumerate(names)}


def order_p_value(ours: np.ndarray, reference: np.ndarray) -> float:
    """χ² test of the 24 permutations' counts, ours vs torchvision's ``fn_idx``."""
    perms = list(itertools.permutations(range(4)))
    counts = [Counter(map(tuple, o)) for o in (ours, reference)]
    table = [[c[p] for p in perms] for c in counts]
    return stats.chi2_contingency(table).pvalue


def test_jitter_ranges_are_color_jitters():
    jitter = T.ColorJitter(*SPEC.jitter)
    expected = [jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue]
    assert SPEC.jitter_ranges() == [tuple(r) for r in expected]
    assert ViewAugmentation(jitter=(0, 0.4, 0.4, 0)).jitter_ranges()[::3] == [None, None]


def test_jitter_factors_and_order_follow_color_jitter():
    reference, reference_orders = torchvision_jitter(SPEC.jitter)
    params = draw_params(DRAWS, 64, 64, seed=5)
    assert matches(factor_p_values(params.factors, reference))
    assert (np.sort(params.order, axis=1) == np.arange(4)).all()
    assert order_p_value(params.order, reference_orders) > ALPHA
    for wrong in ((0.2, 0.4, 0.4, 0.1), (0.4, 0.4, 0.4, 0.05), (0.4, 0.6, 0.4, 0.1)):
        wrong_params = draw_params(DRAWS, 64, 64, seed=5, spec=ViewAugmentation(jitter=wrong))
        assert not matches(factor_p_values(wrong_params.factors, reference))
    rng = np.random.default_rng(0)
    cyclic = np.array([np.roll(np.arange(4), k) for k in rng.integers(0, 4, DRAWS)])
    assert order_p_value(cyclic, reference_orders) < ALPHA  # only 4 of the 24 orders
    swapped = params.order.copy()
    first_two = swapped[:, 0] > swapped[:, 1]
    swapped[first_two, :2] = swapped[first_two, 1::-1]  # first two ops always ascending
    assert order_p_value(swapped, reference_orders) < ALPHA


# -- pixels of a fixed draw --------------------------------------------------------------------
JITTER_OPS = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)


def torchvision_views(images: torch.Tensor, params: ViewParams, spec: ViewAugmentation):
    """The per-image pipeline with the same parameters, from torchvision's functional ops."""
    ranges, views = spec.jitter_ranges(), []
    for k, image in enumerate(images.float().div(255.0)):
        top, left, h, w = (int(v) for v in params.boxes[k])
        x = TF.resized_crop(image, top, left, h, w, [spec.size, spec.size], antialias=True)
        if params.flip[k]:
            x = TF.hflip(x)
        if params.jitter[k]:
            for op in params.order[k]:
                if ranges[op] is not None:  # ColorJitter skips an op of strength 0
                    x = JITTER_OPS[op](x, float(np.float32(params.factors[k, op])))
        if params.grayscale[k]:
            x = TF.rgb_to_grayscale(x, num_output_channels=3)
        views.append(x)
    return torch.stack(views)


def sample_images(count: int, height: int = 48, width: int = 56) -> torch.Tensor:
    """Noise, with grey, saturated and flat patches (HSV's special cases)."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(
        0, 256, (count, 3, height, width), dtype=torch.uint8, generator=generator
    )
    images[:, :, :8, :8] = 128  # grey: saturation 0
    images[:, 0, 8:16, :8], images[:, 1:, 8:16, :8] = 255, 0  # pure red
    images[:, :, 16:24, :8] = torch.tensor([10, 200, 200], dtype=torch.uint8).view(3, 1, 1)
    return images


def fixed_params(height: int, width: int) -> ViewParams:
    """Every jitter order (hue at each position), with boxes that up- and down-sample, the
    whole image, a 1-pixel-thin and an off-centre crop; flip and grayscale on and off."""
    orders = np.array(list(itertools.permutations(range(4))))
    count = len(orders) + 4
    boxes = [(0, 0, height, width), (5, 7, 20, 30), (1, 2, height - 3, width - 2), (10, 3, 1, 40)]
    rng = np.random.default_rng(0)
    return ViewParams(
        boxes=np.array([boxes[k % len(boxes)] for k in range(count)]),
        flip=np.arange(count) % 2 == 0,
        jitter=np.arange(count) < len(orders),
        factors=np.column_stack([rng.uniform(0.6, 1.4, (count, 3)), rng.uniform(-0.1, 0.1, count)]),
        order=np.concatenate([orders, np.tile(np.arange(4), (4, 1))]),
        grayscale=np.arange(count) % 5 == 0,
    )


def batched_views(images, params, spec, device):
    packed = torch.from_numpy(pack_params(params, spec)).to(device)
    pixels = images.to(device).float().div(255.0)
    views = apply_params(pixels, packed, spec.size).cpu()
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (spec.mean, spec.std))
    return views * std + mean  # back to 0–1 pixels


@pytest.mark.parametrize("device", DEVICES)
def test_fixed_draw_pixels_match_torchvision(device):
    spec = ViewAugmentation(size=32)
    images = sample_images(28)
    params = fixed_params(48, 56)
    expected = torchvision_views(images, params, spec)
    ours = batched_views(images, params, spec, device)
    assert ours.shape == expected.shape == (28, 3, 32, 32)
    assert (ours - expected).abs().max().item() < PIXEL_TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_random_draws_and_switched_off_ops_match_torchvision(device):
    images = sample_images(16)
    for spec in (ViewAugmentation(size=40), ViewAugmentation(size=24, jitter=(0.0, 0.4, 0.3, 0.0))):
        params = draw_params(16, 48, 56, seed=9, spec=spec)
        expected = torchvision_views(images, params, spec)
        ours = batched_views(images, params, spec, device)
        assert (ours - expected).abs().max().item() < PIXEL_TOLERANCE


def test_mistakes_exceed_the_pixel_tolerance():
    """The tolerance sees a skipped hue step or a resize without antialiasing."""
    spec = ViewAugmentation(size=32)
    images = sample_images(28)
    params = fixed_params(48, 56)
    ours = batched_views(images, params, spec, "cpu")
    no_hue = dataclasses.replace(params, factors=params.factors * [1, 1, 1, 0])
    assert (ours - torchvision_views(images, no_hue, spec)).abs().max() > 100 * PIXEL_TOLERANCE
    k = 24  # whole image, 48 × 56 → 32 × 32, flipped, no jitter, no grayscale
    assert params.flip[k] and not params.jitter[k] and not params.grayscale[k]
    aliased = TF.hflip(TF.resize(images[k].float() / 255, [32, 32], antialias=False))
    assert (ours[k] - aliased).abs().max() > 100 * PIXEL_TOLERANCE


# -- the batch as a whole ----------------------------------------------------------------------
def leaf_op_count(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    return sum(
        1
        for e in events
        if e.name.startswith("aten::")
        and not any(c.name.startswith("aten::") for c in e.cpu_children)
    )


def test_operator_count_does_not_grow_with_the_batch():
    spec = ViewAugmentation(size=16)
    small, large = sample_images(2, 24, 24), sample_images(32, 24, 24)
    assert leaf_op_count(lambda: augment(small, 0, spec)) == leaf_op_count(
        lambda: augment(large, 0, spec)
    )


def test_views_are_reproducible_and_leave_global_rngs_alone():
    images, spec = sample_images(6), ViewAugmentation(size=24)
    torch_state, numpy_state = torch.random.get_rng_state(), np.random.get_state()
    views = augment(images, seed=4, spec=spec)
    assert torch.equal(torch_state, torch.random.get_rng_state())
    assert np.array_equal(numpy_state[1], np.random.get_state()[1])
    assert views.shape == (6, 3, 24, 24) and views.dtype == torch.float32
    assert torch.equal(views, augment(images, seed=4, spec=spec))
    assert not torch.equal(views, augment(images, seed=5, spec=spec))
    first, second = two_views(images, seed=4, spec=spec)
    assert torch.equal(torch.cat([first, second]), augment(torch.cat([images, images]), 4, spec))


def test_autocast_does_not_reach_the_resampling():
    images, spec = sample_images(4), ViewAugmentation(size=24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = augment(images, seed=2, spec=spec)
    assert under_autocast.dtype == torch.float32
    assert torch.equal(under_autocast, augment(images, seed=2, spec=spec))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_views_need_no_host_sync():
    images, spec = sample_images(8), ViewAugmentation(size=24)
    on_device = images.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        views = augment(on_device, seed=3, spec=spec)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert views.device == on_device.device
    assert (views.cpu() - augment(images, seed=3, spec=spec)).abs().max() < 1e-4


def test_hue_position_is_uniform():
    params = draw_params(DRAWS, 32, 32, seed=8)
    hue_at = (params.order == HUE).argmax(axis=1)
    assert stats.chisquare(np.bincount(hue_at, minlength=4)).pvalue > ALPHA
