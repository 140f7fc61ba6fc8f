"""Training-loop fidelity (issue 8): the released batch schedule, partial batches, AdamW ε,
HF's warm-up, precision, and what the recipes record about the code they reproduce."""

from __future__ import annotations

import math
from contextlib import nullcontext
from functools import partial
from operator import itemgetter

import numpy as np
import pytest
import torch
from support.corpora import InMemoryCorpus
from support.optim import set_transformers_eps
from torch.optim.lr_scheduler import LambdaLR

from mmcse.errors import MmcseError
from mmcse.precision import autocast_for, grad_scaler_for
from mmcse.recipes import RECIPES, get_recipe
from mmcse.recipes.recipe import RecipeRunSpec
from mmcse.training.adamw import AdamWSettings, FlatAdamW, FlatParameters, adamw_groups
from mmcse.training.batch_order import CAPTION, TEXT, train_mix_counts
from mmcse.training.config import TrainConfig
from mmcse.training.data import Source, TrainData
from mmcse.training.lr import linear_factor
from mmcse.training.update import EagerUpdate, Forward

# ---- a TrainData over fake corpora of given sizes (the schedule only needs their lengths) ----


def fake_data(n_text: int | None, n_caption: int | None, **cfg) -> TrainData:
    data = object.__new__(TrainData)
    data.cfg = TrainConfig(**cfg)
    data.sources = {}
    for kind, n in ((TEXT, n_text), (CAPTION, n_caption)):
        if n is not None:
            ids = np.arange(n).astype(str)
            data.sources[kind] = Source(kind, InMemoryCorpus(ids, [], fingerprint="fp"))
    return data


def released_train_mix_kinds(n_text: int, n_caption: int, batch: int) -> list[str]:
    """The released loop, written out: len(DataLoader) = ⌈N/B⌉ (drop_last=False), epoch steps
    ``len(text) + len(pair)``, a pair batch when ``step % (len(text) // len(pair)) == 0``."""
    text_len, pair_len = math.ceil(n_text / batch), math.ceil(n_caption / batch)
    paired_sample_step = text_len // pair_len
    return [
        CAPTION if step % paired_sample_step == 0 else TEXT for step in range(text_len + pair_len)
    ]


# (text sentences, captions): Wiki1M with Flickr30k / COCO-2014 train, one or all captions
PAPER_SIZES = {
    "flickr-one": (1_000_000, 29_000),
    "coco-one": (1_000_000, 82_783),
    "flickr-all": (1_000_000, 145_000),
    "coco-all": (1_000_000, 413_915),
}


@pytest.mark.parametrize("setting", sorted(PAPER_SIZES))
def test_train_mix_counts_match_the_released_loop_at_paper_sizes(setting):
    n_text, n_caption = PAPER_SIZES[setting]
    data = fake_data(n_text, n_caption, mixing="mcse-train-mix")
    counts = data.batches_per_epoch(64)
    released = released_train_mix_kinds(n_text, n_caption, 64)
    assert counts == {TEXT: released.count(TEXT), CAPTION: released.count(CAPTION)}
    # interleave uses each corpus once: ⌈N/B⌉ batches (last partial kept)
    inter = fake_data(n_text, n_caption, mixing="interleave").batches_per_epoch(64)
    assert inter == {TEXT: math.ceil(n_text / 64), CAPTION: math.ceil(n_caption / 64)}
    # captions revisited, text skipped: the released schedule has more caption batches
    assert counts[CAPTION] > inter[CAPTION] and counts[TEXT] < inter[TEXT]


def test_flickr_one_caption_numbers_written_out():
    # ⌈1e6/64⌉ = 15625, ⌈29000/64⌉ = 454, every 15625 // 454 = 34 steps, 16079 steps per epoch
    counts = train_mix_counts(15625, 454)
    assert counts == {CAPTION: 473, TEXT: 16079 - 473}  # ⌈16079 / 34⌉ = 473


def test_train_mix_schedule_rows_revisit_captions_and_continue_across_epochs():
    n_text, n_caption, batch = 1000, 130, 16  # 63 text batches (last 8), 9 caption (last 2)
    data = fake_data(n_text, n_caption, mixing="mcse-train-mix", seed=3)
    epoch0, epoch1 = data.batch_order(0, batch), data.batch_order(1, batch)
    kinds = [k for k, _ in epoch0]
    assert kinds == released_train_mix_kinds(n_text, n_caption, batch)  # s % 7 == 0 → caption
    assert len(epoch0) == sum(data.batches_per_epoch(batch).values()) == 63 + 9
    captions = [rows for k, rows in epoch0 if k == CAPTION]
    assert len(captions) == 11  # ⌈72/7⌉: one pass of 9 and 2 batches of the next
    first_pass = np.concatenate(captions[:9])
    assert [len(r) for r in captions[:9]] == [16] * 8 + [2]  # the partial batch is kept
    assert sorted(first_pass) == list(range(n_caption))
    assert not np.array_equal(captions[9], captions[0])  # a fresh shuffle for pass 2
    # text: 61 of 63 batches in epoch 0; epoch 1 resumes with the pass's last two batches
    text0 = [rows for k, rows in epoch0 if k == TEXT]
    text1 = [rows for k, rows in epoch1 if k == TEXT]
    assert len(text0) == 61
    seen = np.concatenate(text0 + text1[:2])
    assert sorted(seen) == list(range(n_text)) and len(text1[1]) == 8
    # every rank computes the same schedule
    again = data.batch_order(1, batch)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(epoch1, again, strict=True))


@pytest.mark.parametrize("mixing", ["interleave", "proportional-random", "mcse-train-mix"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_per_epoch_is_the_schedule_length(mixing, drop_last):
    data = fake_data(500, 70, mixing=mixing, drop_last=drop_last)
    sizes = set()
    for epoch in range(3):
        schedule = data.batch_order(epoch, 16)
        counts = data.batches_per_epoch(16)
        assert len(schedule) == sum(counts.values())
        assert sum(k == CAPTION for k, _ in schedule) == counts[CAPTION]
        sizes |= {len(rows) for _, rows in schedule}
    assert sizes == ({16} if drop_last else {16, 500 % 16, 70 % 16})


def test_interleave_uses_every_row_once_with_the_partial_batch_kept():
    data = fake_data(500, 70, mixing="interleave")
    schedule = data.batch_order(0, 16)
    for kind, n in ((TEXT, 500), (CAPTION, 70)):
        rows = np.concatenate([r for k, r in schedule if k == kind])
        assert sorted(rows) == list(range(n))
    dropped = fake_data(500, 70, mixing="interleave", drop_last=True)
    assert dropped.batches_per_epoch(16) == {TEXT: 500 // 16, CAPTION: 70 // 16}


def test_a_one_row_remainder_is_dropped_and_single_corpora_keep_partials():
    # 1 leftover row cannot form in-batch negatives: not a batch
    assert fake_data(161, None, mixing="text-only").batches_per_epoch(16) == {TEXT: 10}
    assert fake_data(None, 35, mixing="caption-only").batches_per_epoch(16) == {CAPTION: 3}
    # a corpus smaller than a batch is one partial batch now, not an error
    assert fake_data(None, 5, mixing="caption-only").batches_per_epoch(16) == {CAPTION: 1}
    with pytest.raises(MmcseError, match="fewer than one global batch"):
        fake_data(None, 5, mixing="caption-only", drop_last=True).batches_per_epoch(16)


def test_train_mix_refuses_more_caption_than_text_batches():
    data = fake_data(100, 300, mixing="mcse-train-mix")
    with pytest.raises(MmcseError, match="divides by"):
        data.batches_per_epoch(16)


# ---- optimizer, schedule, precision ----------------------------------------------------------


def hf_linear_with_warmup(step: int, warmup: int, total: int) -> float:
    """transformers' get_linear_schedule_with_warmup lr_lambda, written out."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


@pytest.mark.parametrize(("warmup", "total"), [(0, 7), (3, 10), (10, 10)])
def test_linear_schedule_is_hf_get_linear_schedule_with_warmup(warmup, total):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = LambdaLR(optimizer, partial(linear_factor, warmup=warmup, total=total))
    applied = []
    for _ in range(total):
        applied.append(optimizer.param_groups[0]["lr"])  # the lr the next step uses
        optimizer.step()
        scheduler.step()
    assert applied == pytest.approx(
        [2.0 * hf_linear_with_warmup(s, warmup, total) for s in range(total)]
    )
    if warmup:
        assert applied[0] == 0.0  # HF: the first step runs at lr 0
    transformers = pytest.importorskip("transformers")
    hf_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    hf = transformers.get_linear_schedule_with_warmup(hf_opt, warmup, total)
    hf_applied = []
    for _ in range(total):
        hf_applied.append(hf_opt.param_groups[0]["lr"])
        hf_opt.step()
        hf.step()
    assert applied == pytest.approx(hf_applied)


def transformers_adamw_steps(param, grads, lr, eps, betas=(0.9, 0.999)):
    """transformers.AdamW (correct_bias=True, no weight decay), written out from its step()."""
    p, m, v = param.clone(), torch.zeros_like(param), torch.zeros_like(param)
    for t, g in enumerate(grads, start=1):
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        step_size = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
        p = p - step_size * m / (v.sqrt() + eps)
    return p


def adamw_run(update: str, style: str, start, grads, lr: float, eps: float):
    """The parameter after ``grads`` through one of the AdamW implementations mmcse steps."""
    param = torch.nn.Parameter(start.clone())
    settings = AdamWSettings(lr=lr, weight_decay=0.0, eps=eps, eps_style=style, max_grad_norm=0)
    if update == "torch + set_transformers_eps":  # mmcse.optim's helper on a torch AdamW
        optimizer = torch.optim.AdamW([param], lr=lr, eps=eps, weight_decay=0.0)
        for g in grads:
            param.grad = g.clone()
            if style == "transformers":
                set_transformers_eps(optimizer, eps)
            optimizer.step()
    elif update == "eager":  # EagerUpdate, text and auxiliary (host-side step counts)
        forward = Forward(lambda g: {"loss": (param * g).sum()}, itemgetter("loss"), nullcontext)
        eager = EagerUpdate([[param]], settings, lambda step: 1.0, forward)
        for g in grads:
            eager.step("text", (g,))  # the gradient is g
    else:  # the captured update's arithmetic, on the flat buffer's device tensors
        flat = FlatParameters([[param]])
        adamw = FlatAdamW(flat, [param], settings)
        segments = adamw.segments({id(param)}, {id(param): "p"})
        for g in grads:
            adamw.step_([g], segments, torch.tensor(lr, dtype=torch.float64))
    return param.detach()


@pytest.mark.parametrize("style", ["transformers", "torch"])
@pytest.mark.parametrize("update", ["torch + set_transformers_eps", "eager", "captured"])
def test_adamw_eps_placement_matches_transformers_adamw(style, update):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(50, generator=gen, dtype=torch.float64)
    grads = [1e-4 * torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(6)]
    lr, eps = 1e-2, 1e-4  # gradients near ε, so where ε is added matters
    got = adamw_run(update, style, start, grads, lr, eps)
    expected = transformers_adamw_steps(start, grads, lr, eps)
    # the captured update counts steps in fp32 on the device: its bias corrections round there
    rtol = 1e-6 if update == "captured" else 1e-10
    if style == "transformers":
        torch.testing.assert_close(got, expected, rtol=rtol, atol=1e-12)
    else:  # torch's own placement differs measurably here
        assert (got - expected).abs().max() > 1e-5


def test_adamw_groups_cover_every_parameter_once():
    student = torch.nn.Module()
    student.encoder = torch.nn.Linear(3, 3)
    student.heads = torch.nn.ModuleDict(
        {"a": torch.nn.Linear(3, 2), "b": torch.nn.Identity(), "c": torch.nn.Linear(2, 2)}
    )
    student.losses = torch.nn.ModuleDict({"t": torch.nn.Identity()})
    groups = adamw_groups([student.encoder, *student.heads.values()])
    assert len(groups) == 3  # encoder, a, c (b and the loss have no parameters)
    grouped = [id(p) for g in groups for p in g]
    assert sorted(grouped) == sorted(id(p) for p in student.parameters())


def test_adam_eps_reaches_the_optimizer(tiny_model, tiny_world, tmp_path, monkeypatch):
    from mmcse.training import loop as train_mod

    seen = {}
    real = torch.optim.AdamW.__init__

    def spy(self, params, **kw):  # torch's AdamW, as the eager update's optimizer builds it
        seen.update(kw)
        real(self, params, **kw)

    monkeypatch.setattr(torch.optim.AdamW, "__init__", spy)
    cfg = TrainConfig(
        model=str(tiny_model),
        text_corpus=tiny_world["text"],
        mixing="text-only",
        batch_size=8,
        max_steps=1,
        eval_data="",
        final_eval=False,
        output_dir=str(tmp_path / "run"),
        adam_eps=1e-7,
    )
    train_mod.train(cfg)
    assert seen["eps"] == 1e-7
    assert TrainConfig().adam_eps == 1e-6  # transformers.AdamW's default, MCSE/KDMCSE/DALR
    with pytest.raises(MmcseError, match="adam-eps"):
        TrainConfig(adam_eps=0.0)


def test_precision_choices_on_cpu_are_plain_fp32():
    cpu = torch.device("cpu")
    for precision in ("auto", "bf16", "fp16", "fp32"):
        with autocast_for(cpu, precision):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert not grad_scaler_for(cpu, precision).is_enabled()
    with pytest.raises(MmcseError, match="--precision"):
        TrainConfig(precision="fp8")


# ---- recipes record the code they reproduce --------------------------------------------------


def recipe_config(name: str) -> TrainConfig:
    recipe = get_recipe(name)
    return recipe.config("cache", seed=recipe.seeds[0], output_dir="o")


@pytest.mark.parametrize("name", RECIPES.names())
def test_every_recipe_names_its_source_and_precision(name):
    recipe, cfg = get_recipe(name), recipe_config(name)
    assert recipe.source and recipe.variant
    if recipe.method in ("visualcse", "audiocse"):
        assert (cfg.precision, cfg.adam_eps) == ("fp16", 1e-8)  # SimCSE's HF Trainer, --fp16
    else:
        assert (cfg.precision, cfg.adam_eps) == ("fp32", 1e-6)  # MCSE's train(_mix).py
    assert not cfg.drop_last and cfg.warmup_steps == 0 and cfg.weight_decay == 0.0
    if recipe.text_corpus and recipe.caption_dataset:
        assert cfg.mixing == "mcse-train-mix"
    text = recipe.describe("cache")
    for word in ("mixing", "precision", "eps", "weight decay", "warm-up", "partial batch",
                 "source", "variant", "max length"):  # fmt: skip
        assert word in text, word


def test_interleave_stays_a_switch_of_the_recipes():
    spec = RecipeRunSpec("c", overrides={"mixing": "interleave", "precision": "bf16"})
    cfg = get_recipe("mcse/wiki+coco/bert").config(spec, seed=0, output_dir="o")
    assert cfg.mixing == "interleave" and cfg.precision == "bf16"


def test_kdmcse_reproduction_keeps_the_filter_off_and_a_recipe_turns_it_on():
    off = get_recipe("kdmcse/wiki+flickr/bert")
    on = get_recipe("kdmcse/wiki+flickr/bert/fn-filter")
    filter_keys = {"false_negative_filter", "false_negative_threshold"}
    assert not filter_keys & set(off.method_args)
    assert on.method_args.get("false_negative_filter") is True or (
        on.method_args.get("false_negative_threshold") is not None
    )
    assert "off" in off.variant and "on" in on.variant
    assert on.published == off.published


def test_visualcse_roberta_recipes_follow_one_source_each():
    readme = get_recipe("visualcse/roberta")
    table = get_recipe("visualcse/roberta/table-c1")
    released = {
        "image_weight": 0.2,
        "image_lr": 1e-7,
        "image_objective": "class_rank_cross_entropy",
    }
    assert readme.method_args == released and "README" in readme.source
    assert table.method_args["image_lr"] == 5e-7 and "Table C.1" in table.source
    assert table.published == readme.published
    # AudioCSE's README command runs Table C.1's 2e-7 for RoBERTa too
    assert get_recipe("audiocse/roberta").method_args["audio_lr"] == 2e-7


def test_dalr_recipes_name_their_variant_and_the_released_teacher_mix():
    recipe = get_recipe("dalr/wiki+flickr/bert")
    assert recipe.method == "dalr" and "released" in recipe.variant
    teachers = recipe.method_args.get("text_teachers")
    if teachers is not None:  # SimCSE first with α = 0.33 (DALR's scripts)
        assert [tuple(t) for t in teachers] == [
            ("text_teacher_simcse", 0.33),
            ("text_teacher_diffcse", 0.67),
        ]
    for name in RECIPES.names():
        if name.startswith("dalr-paper/"):
            assert "eq. 14" in get_recipe(name).variant


def test_the_plan_under_a_launcher_is_the_one_the_joined_processes_train(monkeypatch):
    """One rule for the global batch and the partial batch: preflight (before the processes
    join, ``WORLD_SIZE`` from torchrun) plans what the run takes once they have joined — the
    batch is ``batch_size × world``, and the last partial batch is dropped under DDP."""
    from mmcse.training.plan import plan_run

    data = fake_data(500, 70, mixing="interleave", batch_size=8)
    monkeypatch.setenv("WORLD_SIZE", "2")
    before_join = plan_run(data)
    assert before_join == plan_run(data, world_size=2)
    assert before_join.global_batch == 16
    assert before_join.batches_per_epoch == {TEXT: 500 // 16, CAPTION: 70 // 16}  # no partial
    assert len(data.batch_order(0, 16)) == before_join.steps_per_epoch
    monkeypatch.delenv("WORLD_SIZE")
    alone = plan_run(data)
    assert alone.global_batch == 8 and alone.batches_per_epoch == {TEXT: 63, CAPTION: 9}
