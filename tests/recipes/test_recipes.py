"""Recipes, published numbers, seed aggregation and ablations (tiny CPU runs, no network)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from support.recipes import run_recipe
from support.worlds import TINY_METHOD_ARGS, write_tiny_cache

from mmcse.errors import MmcseError
from mmcse.methods import build_method
from mmcse.recipes import RECIPES, Recipe, get_recipe
from mmcse.recipes import ablate as ablate_mod
from mmcse.recipes import runs as recipes_mod
from mmcse.recipes.published import COLUMNS, PUBLISHED, PUBLISHED_ABLATIONS, TASKS
from mmcse.recipes.recipe import UNPAIRED_SOURCES, RecipeRunSpec
from mmcse.recipes.summary import delta, summarize
from mmcse.registry import METHODS
from mmcse.reports.compare import markdown_table
from mmcse.reports.recipes import ablation_markdown, recipe_tables, write_ablation

FIXTURE_SENTEVAL = Path(__file__).parents[1] / "fixtures" / "senteval_mini"


def roles_read(recipe: Recipe) -> set[str]:
    method = build_method(recipe.method, **recipe.method_args)
    roles = {*method.caption_roles, *method.text_roles}
    return roles | {getattr(method, "nonlinguistic", None)} - {None}


# ---- every recipe is valid -------------------------------------------------------------------


@pytest.mark.parametrize("name", RECIPES.names())
def test_recipe_is_valid(name):
    from pipeline.datasets.base import CAPTION_POLICIES
    from pipeline.teachers import TEACHERS

    recipe = get_recipe(name)
    assert recipe.method in METHODS and name.split("/")[0] == recipe.method
    assert set(recipe.roles) == roles_read(recipe)
    for feature in recipe.roles.values():
        assert feature.teacher in TEACHERS or feature.teacher in UNPAIRED_SOURCES
    assert (recipe.caption_policy in CAPTION_POLICIES) == bool(recipe.caption_dataset)
    cfg = recipe.config("cache", seed=recipe.seeds[0], output_dir="runs/x")
    assert cfg.max_seq_length == 32 and cfg.eval_steps == 125
    assert cfg.pooler == "cls_before_pooler" and cfg.model in ("bert-base-uncased", "roberta-base")
    assert recipe.published, f"{name} carries no published numbers"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_numbers_are_plausible(name):
    assert name in RECIPES
    for row in PUBLISHED[name]:
        assert row.source and "Table" in row.source
        assert all(0 < v < 100 for v in row.mean.values())
        assert all(0 <= s < 5 for s in row.std.values()) and set(row.std) <= set(row.mean)
        if all(task in row.mean for task in TASKS):
            mean_of_tasks = sum(row.mean[t] for t in TASKS) / len(TASKS)
            assert abs(mean_of_tasks - row.mean["avg"]) <= 0.06, (row.label, mean_of_tasks)


def test_published_spot_checks_against_the_papers():
    mcse = PUBLISHED["mcse/wiki+flickr/bert"][0]
    assert mcse.mean["STS12"] == 71.4 and mcse.std["SICKRelatedness"] == 1.4
    assert mcse.mean["avg"] == 77.3 and mcse.seeds == 5
    kd = PUBLISHED["kdmcse/wiki+coco/roberta"][0]
    assert "DALR" in kd.source and kd.mean["SICKRelatedness"] == 69.9 and kd.std["avg"] == 0.7
    visual = PUBLISHED["visualcse/bert"]
    assert visual[0].mean["STSBenchmark"] == 80.03 and visual[1].mean == {"avg": 76.96}
    assert PUBLISHED["simcse/wiki/bert"][1].mean["avg"] == 76.3  # Gao et al., single seed


# kangverse/DALR at 849ece9: scripts/run_wiki_flickr.sh LR=2e-5 BATCH=128 EPS=4,
# scripts/run_wiki_coco.sh LR=1e-5 BATCH=128 EPS=3 (BERT); App. B: RoBERTa lr 1e-5, batch 128
DALR_RELEASED = {
    ("wiki+flickr", "bert"): (2e-5, 128, 4),
    ("wiki+coco", "bert"): (1e-5, 128, 3),
    ("wiki+flickr", "roberta"): (1e-5, 128, 4),
    ("wiki+coco", "roberta"): (1e-5, 128, 3),
}


@pytest.mark.parametrize(("setting", "model"), sorted(DALR_RELEASED))
def test_dalr_recipes_follow_the_released_scripts_and_the_paper(setting, model):
    lr, batch, epochs = DALR_RELEASED[(setting, model)]
    released = get_recipe(f"dalr/{setting}/{model}")
    cfg = released.config("cache", seed=0, output_dir="o")
    assert (cfg.learning_rate, cfg.batch_size, cfg.epochs) == (lr, batch, epochs)
    assert cfg.precision == "fp32"  # --fp16 casts only the teachers (model_modified.py 688-713)
    assert released.roles["image"].teacher == "clip-vit-l14"  # flickr30k_ViT_L14.json
    method = build_method("dalr", **released.method_args)
    assert method.cma_image_head is False and method.rank_log_eps == 1e-7
    b32 = get_recipe(f"dalr/{setting}/{model}/clip-vit-b32")
    assert b32.roles["image"].teacher == "clip-vit-b32" and b32.method_args["cma_image_head"]
    assert b32.train == released.train and b32.published == released.published
    paper = get_recipe(f"dalr-paper/{setting}/{model}")
    cfg = paper.config("cache", seed=0, output_dir="o")
    paper_lr = {"bert": 2e-5, "roberta": 1e-5}[model]  # App. B; 4 epochs: App. C, Table 7
    assert (cfg.learning_rate, cfg.batch_size, cfg.epochs) == (paper_lr, 128, 4)
    assert paper.roles["image"].teacher == "clip-vit-b32"  # App. B
    method = build_method("dalr-paper", **paper.method_args)
    assert method.cma_image_head and method.rank_log_eps == 0.0
    # eq. 14 distils on every batch (its text-teacher sets cover Wiki1M); the code on captions
    assert method.teachers_on == "all" and paper.roles["text_teacher_simcse"].every_corpus
    assert build_method("dalr", **released.method_args).teachers_on == "caption"
    assert not released.roles["text_teacher_simcse"].every_corpus


@pytest.mark.parametrize("name", ["visualcse/bert", "visualcse/roberta", "audiocse/bert"])
def test_nonlinguistic_recipes_run_the_released_objective(name):
    recipe = get_recipe(name)
    method = build_method(recipe.method, **recipe.method_args)
    assert method.nonlinguistic_settings().objective == "class_rank_cross_entropy"


@pytest.mark.parametrize("name", sorted(PUBLISHED_ABLATIONS))
def test_published_ablations_name_real_terms(name):
    recipe = get_recipe(name)
    method = build_method(recipe.method, **recipe.method_args)
    for spec in PUBLISHED_ABLATIONS[name]:
        for term in filter(None, spec.split("+")):
            assert ablate_mod.resolve_term(method, term).endswith("_weight")


# ---- cache check and config ------------------------------------------------------------------


def test_missing_cache_lists_the_commands(tmp_path):
    recipe = get_recipe("kdmcse/wiki+flickr/bert")
    with pytest.raises(MmcseError) as info:
        recipe.check_cache(tmp_path)
    first, *commands = str(info.value).splitlines()
    assert "kdmcse/wiki+flickr/bert" in first and "missing" in first
    assert commands == [
        f"  mmcse extract-text --corpus wiki1m --text-file WIKI1M_TXT --teacher none "
        f"--out {tmp_path}/wiki1m/train",
        "  mmcse extract-images --dataset flickr30k --split train --images IMAGES_DIR "
        "--captions CAPTIONS --teacher clip-vit-l14 --caption-policy all "
        f"--out {tmp_path}/flickr30k/train-all",
    ]
    # an overridden corpus is not required from the cache
    with pytest.raises(MmcseError) as info:
        recipe.check_cache(tmp_path, {"text_corpus"})
    assert "wiki1m" not in str(info.value)


def test_wrong_caption_policy_is_refused(tmp_path):
    recipe = get_recipe("simcse/flickr/bert")
    write_tiny_cache(recipe, tmp_path)
    from mmcse.cache import write_corpus

    path = recipe.caption_dir(tmp_path) / "captions"
    for f in path.iterdir():
        f.unlink()
    write_corpus(path, ["a#0"], ["a dog"], ["a"], dataset="flickr30k", split="train",
                 extra={"caption_policy": "longest"})  # fmt: skip
    with pytest.raises(MmcseError, match="policy 'longest'.*needs 'random-one'"):
        recipe.check_cache(tmp_path)


def test_overrides_merge_method_args_and_refuse_unknown_settings():
    recipe = get_recipe("mcse/flickr/bert")
    cfg = recipe.config(
        RecipeRunSpec("c", overrides={"method_args": {"proj_dim": 8}, "epochs": 1}),
        seed=1,
        output_dir="o",
    )
    assert cfg.method_args == {"image_text_weight": 0.05, "proj_dim": 8} and cfg.epochs == 1
    assert cfg.features == {"image": "c/flickr30k/train/image-resnet50"} and cfg.seed == 1
    with pytest.raises(MmcseError, match="unknown training setting"):
        recipe.config(RecipeRunSpec("c", overrides={"nope": 1}), seed=1, output_dir="o")


# ---- seeds aggregation and the comparison table ---------------------------------------------


def fake_result(rng: np.random.Generator, shift: float = 0.0) -> dict:
    scores = {t: float(rng.uniform(74, 76)) + shift for t in TASKS}
    return {**scores, "avg": float(np.mean(list(scores.values())))}


def test_summary_mean_and_std_match_statistics_module():
    rng = np.random.default_rng(0)
    results = [fake_result(rng) for _ in range(5)]
    row = summarize("x", results)
    for column in COLUMNS:
        values = [r[column] for r in results]
        assert row.mean[column] == pytest.approx(statistics.fmean(values))
        assert row.std[column] == pytest.approx(statistics.stdev(values))
    assert summarize("one", results[:1]).std == {}


def test_comparison_table_has_published_run_and_delta_rows():
    recipe = get_recipe("mcse/wiki+flickr/bert")
    results = [fake_result(np.random.default_rng(s)) for s in range(3)]
    runs = recipes_mod.SeedRuns("r", Path("o"), (0, 1, 2), results)
    rows = recipes_mod.comparison_rows(recipe, runs)
    assert [r.label for r in rows] == [
        "published: MCSE-BERT",
        "this run (3 of 3 seeds)",
        "Δ vs published",
    ]
    assert rows[2].mean["avg"] == pytest.approx(rows[1].mean["avg"] - 77.3)
    table = markdown_table(rows, extra_columns=("source",))
    assert table.count("\n") == 4 and "77.30 ± 0.50" in table and " ± " in table.splitlines()[3]
    assert delta("d", rows[1], rows[0]).signed


# ---- ablations with faked training: the statistics alone -------------------------------------


def test_ablation_statistics_with_fake_training(monkeypatch, tmp_path):
    recipe = get_recipe("dalr/wiki+flickr/bert")
    seen = []

    def fake_train(cfg):
        seen.append((cfg.output_dir, dict(cfg.method_args)))
        rng = np.random.default_rng(cfg.seed)
        dropped = sum(cfg.method_args.get(f, 1) == 0 for f in ("image_text_weight", "rank_weight"))
        return fake_result(rng, shift=-1.5 * dropped)

    monkeypatch.setattr(recipes_mod, "train_one", fake_train)
    monkeypatch.setattr(Recipe, "check_cache", lambda self, root, overridden=(): None)
    result = ablate_mod.ablate(
        recipe,
        ablate_mod.parse_drops("image_text,rank+cma"),
        RecipeRunSpec(cache_root=tmp_path, seeds=(0, 1, 2)),
        output_dir=tmp_path / "abl",
    )
    assert [r.terms for r in result.rows] == [(), ("image_text",), ("rank", "cma")]
    assert result.rows[2].fields == ("rank_weight", "cma_weight")
    zeroed = [args for out, args in seen if out.endswith("wo-rank+cma/seed1")][0]
    assert zeroed["rank_weight"] == 0 and zeroed["cma_weight"] == 0
    assert zeroed["cross_modal_weight"] == 0.1  # the recipe's own settings stay
    full = [fake_result(np.random.default_rng(s))["avg"] for s in (0, 1, 2)]
    wo = [fake_result(np.random.default_rng(s), -1.5)["avg"] for s in (0, 1, 2)]
    expected = stats.ttest_ind(wo, full, equal_var=False).pvalue
    assert result.rows[1].p_value == pytest.approx(expected)
    assert expected < 0.05
    table = ablation_markdown(result)
    assert "| w/o image_text |" in table and "| w/o rank & cma |" in table
    assert "78.24 ± 0.90 (DALR (He et al., 2025), Table 3)" in table  # the paper's w/o L_Info
    md, js = write_ablation(result, tmp_path / "t.md")
    record = json.loads(js.read_text())
    assert record["rows"][1]["p_value"] == pytest.approx(expected) and md.read_text() == table


def test_welch_needs_two_runs_per_side():
    assert ablate_mod.welch_p([1.0], [1.0, 2.0]) is None
    assert ablate_mod.welch_p([1.0, 1.0], [1.0, 1.0]) is None  # no variance: undefined


def test_unknown_term_lists_the_weight_fields():
    method = build_method("mcse")
    with pytest.raises(MmcseError, match="simcse_weight, image_text_weight"):
        ablate_mod.resolve_term(method, "grounding")
    assert ablate_mod.resolve_term(method, "image_text_weight") == "image_text_weight"
    with pytest.raises(MmcseError):
        ablate_mod.parse_drops("a,,b")


# ---- tiny caches in the Stage-1 layout and real runs ------------------------------------------


def recipe_shapes() -> list[str]:
    """One recipe per distinct (method, roles, data setting)."""
    shapes: dict[tuple, str] = {}
    for name in RECIPES.names():
        r = get_recipe(name)
        kinds = tuple(sorted((role, f.kind) for role, f in r.roles.items()))
        shapes.setdefault((r.method, kinds, r.mixing), name)
    return sorted(shapes.values())


def tiny_overrides(recipe: Recipe, **kw) -> dict:
    return {
        "batch_size": 8,
        "epochs": 1,
        "eval_data": "",
        "final_eval": False,
        "log_every": 1,
        "device": "cpu",
        "method_args": TINY_METHOD_ARGS.get(recipe.method, {}),
        **kw,
    }


@pytest.mark.parametrize("name", recipe_shapes())
def test_every_recipe_shape_trains_from_a_tiny_cache(name, tiny_model, tmp_path):
    recipe = get_recipe(name)
    write_tiny_cache(recipe, tmp_path / "cache")

    def run():
        return run_recipe(
            recipe,
            RecipeRunSpec(
                cache_root=tmp_path / "cache",
                seeds=(0,),
                model=str(tiny_model),
                max_steps=2,
                overrides=tiny_overrides(recipe),
            ),
            output_dir=tmp_path / "run",
        )

    outcome = run()
    table = recipe_tables(outcome)
    metrics = (tmp_path / "run" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 2 and all(math.isfinite(json.loads(m)["loss"]) for m in metrics)
    kinds = {json.loads(m)["kind"] for m in metrics}
    expected = {"text-only": {"text"}, "caption-only": {"caption"}}.get(recipe.mixing)
    assert expected is None or kinds == expected
    report = json.loads((tmp_path / "run" / "results.json").read_text())
    assert report["recipe"]["name"] == name and report["runs"]["per_seed"] == {"0": None}
    assert "published" in table


@pytest.mark.parametrize("name", RECIPES.names())
def test_every_recipe_has_a_loss_term_for_every_batch_kind_it_trains_on(name):
    """A recipe with a text corpus trains on text batches: some active term must apply to them.
    The dalr-paper recipes once distilled on caption batches only, leaving eq. 14's Wiki1M
    batches without a term (the tiny shape test's two steps, both caption batches, missed it)."""
    recipe = get_recipe(name)
    terms = build_method(recipe.method, **recipe.method_args).active_terms()
    kinds = {"text-only": ["text"], "caption-only": ["caption"]}.get(recipe.mixing)
    if kinds is None:
        kinds = ["caption", *(["text"] if recipe.text_corpus else [])]
    for kind in kinds:
        assert any(term.applies_to(kind) for term in terms), kind


def test_dalr_paper_distils_on_wiki1m_batches_from_both_corpora_sets(tiny_model, tmp_path):
    """Eq. 14's every-batch distillation: each text-teacher role reads its caption set and its
    Wiki1M set (``DIR1,DIR2``); a run long enough to take text batches trains on them."""
    recipe = get_recipe("dalr-paper/wiki+coco/bert")
    needs = [n for n in recipe.needs(tmp_path / "cache") if n.key == "features.text_teacher_simcse"]
    assert [n.corpus for n in needs] == ["caption", "text"]
    assert needs[1].path == tmp_path / "cache" / "wiki1m" / "train" / "text-simcse"
    assert (
        "extract-text --corpus" in needs[1].command and "wiki1m/train/sentences" in needs[1].command
    )
    write_tiny_cache(recipe, tmp_path / "cache")
    config = recipe.config(tmp_path / "cache", seed=0, output_dir=tmp_path / "run")
    assert config.features["text_teacher_simcse"] == ",".join(str(n.path) for n in needs)
    run_recipe(
        recipe,
        RecipeRunSpec(
            cache_root=tmp_path / "cache",
            seeds=(0,),
            model=str(tiny_model),
            max_steps=6,
            overrides=tiny_overrides(recipe, mixing="interleave"),
        ),
        output_dir=tmp_path / "run",
    )  # fmt: skip  (the tiny corpora's train-mix ratio would take caption batches only)
    metrics = [json.loads(m) for m in (tmp_path / "run" / "seed0" / "metrics.jsonl").open()]
    text = [m for m in metrics if m.get("kind") == "text"]
    assert text and all(math.isfinite(m["loss"]) and m["rank_loss"] > 0 for m in text)


def test_tiny_end_to_end_ablation_with_sts_eval(tiny_model, tmp_path):
    recipe = get_recipe("mcse/wiki+flickr/bert")
    write_tiny_cache(recipe, tmp_path / "cache")
    overrides = tiny_overrides(
        recipe, eval_data=str(FIXTURE_SENTEVAL), final_eval=True, eval_steps=2
    )
    result = ablate_mod.ablate(
        recipe,
        [("image_text",)],
        RecipeRunSpec(
            cache_root=tmp_path / "cache",
            seeds=(0, 1),
            model=str(tiny_model),
            max_steps=2,
            overrides=overrides,
        ),
        output_dir=tmp_path / "abl",
    )
    full, wo = result.rows
    assert len(full.avgs) == 2 and len(wo.avgs) == 2
    expected = stats.ttest_ind(wo.avgs, full.avgs, equal_var=False).pvalue
    assert wo.p_value == pytest.approx(expected) or (math.isnan(expected) and wo.p_value is None)
    assert (tmp_path / "abl" / "wo-image_text" / "seed1" / "best").is_dir()
    md, _ = write_ablation(result, tmp_path / "table.md")
    lines = md.read_text().splitlines()
    assert any(line.startswith("| full |") for line in lines)
    assert any(line.startswith("| w/o image_text |") for line in lines)
    assert "75.30 ± 0.90 (MCSE (Zhang et al., NAACL 2022), Table 1)" in md.read_text()


# ---- DALR's text teachers share the student's tokenizer (issue 22, item 4) ---------------------


def released_teacher_pooler(path: str) -> str:
    """DALR ``src/train_mix.py:386–389``: the pooler each teacher is built with, from its path."""
    return "cls_before_pooler" if ("simcse" in path or "DiffCSE" in path) else "avg"


#: the scripts' teacher paths (``run_wiki_flickr.sh:14–15``, ``run_wiki_coco.sh``) per role
RELEASED_TEACHER_PATHS = {
    "text_teacher_simcse": "Model/simcse",
    "text_teacher_diffcse": "Model/DiffCSE",
}


@pytest.mark.parametrize("name", [n for n in RECIPES.names() if n.startswith("dalr")])
def test_dalr_teachers_read_the_students_token_ids(name):
    """The released code feeds the student's token ids to both teachers (model_modified.py:
    670–683), so each teacher's checkpoint must be of the student's family (its tokenizer), the
    SimCSE / DiffCSE of its role, pooled as train_mix.py pools it."""
    from pipeline.teachers.text import BERT_TEACHERS

    recipe = get_recipe(name)
    family = {"bert-base-uncased": "bert-base-uncased", "roberta-base": "roberta-base"}
    for role, path in RELEASED_TEACHER_PATHS.items():
        hub_id, pooling = BERT_TEACHERS[recipe.roles[role].teacher]
        assert hub_id.endswith((f"{family[recipe.model]}", f"{family[recipe.model]}-sts"))
        assert path.lower().removeprefix("model/") in hub_id
        assert pooling == released_teacher_pooler(path)


def test_recipes_list_has_a_header_over_its_columns():
    from mmcse.recipes.catalogue import RECIPES, listing

    header, *rows = listing().splitlines()
    assert header.split() == ["recipe", "method", "STS", "avg", "published", "in"]
    assert len(rows) == len(RECIPES.names())
    method, avg = header.index("method"), header.index("STS avg")  # the columns line up
    name = RECIPES.names()[0]
    assert rows[0][method:avg].strip() == RECIPES.get(name).method
    assert float(rows[0][avg : avg + 7]) == RECIPES.get(name).published[0].mean["avg"]
