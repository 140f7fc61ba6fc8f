"""The paper catalogue: every setting of the seed papers' STS tables, registered as a recipe.

Each ``_*_recipes`` function below registers one paper's rows (:class:`~mmcse.recipes.recipe.Recipe`)
with the hyperparameters its released scripts use; sources are cited beside each value and in
``docs/fidelity.md``. Importing :mod:`mmcse.recipes` registers them all.
"""

from __future__ import annotations

from typing import Any

from mmcse.recipes.recipe import (
    HF_TRAINER_TRAIN,
    MCSE_CODE_TRAIN,
    MODELS,
    RECIPES,
    TEXT_CORPUS,
    Feature,
    Recipe,
    register,
)
from mmcse.registry import METHODS

#: MCSE Table 3 (read from 002_*.txt; 000_*.txt drops one BERT λ). λ is "–" for wiki.
MCSE_TABLE3 = {
    "bert": {
        "learning_rate": 3e-5,
        "batch_size": 64,
        "lambda": {"wiki+flickr": 0.01, "wiki+coco": 0.01, "flickr": 0.05, "coco": 0.05},
    },
    "roberta": {
        "learning_rate": 1e-5,
        "batch_size": 128,
        "lambda": {"wiki+flickr": 0.01, "wiki+coco": 0.01, "flickr": 0.01, "coco": 0.01},
    },
}
MCSE_EPOCHS = {"wiki": 3, "wiki+flickr": 3, "wiki+coco": 3, "flickr": 6, "coco": 3}
#: setting → (text corpus, caption dataset, mixing); two corpora mix as the released train_mix.py
SETTINGS = {
    "wiki": (TEXT_CORPUS, None, "text-only"),
    "wiki+flickr": (TEXT_CORPUS, "flickr30k", "mcse-train-mix"),
    "wiki+coco": (TEXT_CORPUS, "coco", "mcse-train-mix"),
    "flickr": (None, "flickr30k", "caption-only"),
    "coco": (None, "coco", "caption-only"),
}
MCSE_NOTE = "MCSE Table 3 (lr, batch, λ, epochs), App. A (τ = τ' = 0.05, eval every 125 steps)"
MCSE_SCRIPT = {
    "wiki": "run_wiki.sh (src/train.py)",
    "wiki+flickr": "run_wiki_flickr.sh (src/train_mix.py)",
    "wiki+coco": "run_wiki_coco.sh (src/train_mix.py)",
    "flickr": "run_flickr.sh (src/train.py)",
    "coco": "run_coco.sh (src/train.py)",
}


def _recipe(name: str, method: str, model: str, setting: str, policy: str | None, **kw) -> Recipe:
    text, captions, mixing = SETTINGS[setting]
    return register(
        Recipe(
            name=name,
            method=method,
            model=MODELS[model],
            text_corpus=text,
            caption_dataset=captions,
            caption_policy=policy if captions else None,
            mixing=mixing,
            **kw,
        )
    )


def _mcse_train(model: str, setting: str) -> dict[str, Any]:
    table = MCSE_TABLE3[model]
    return {
        **MCSE_CODE_TRAIN,
        "learning_rate": table["learning_rate"],
        "batch_size": table["batch_size"],
        "epochs": MCSE_EPOCHS[setting],
    }


def _mcse_recipes() -> None:
    for model in MODELS:
        for setting in SETTINGS:
            train = _mcse_train(model, setting)
            source = (
                f"MCSE Table 3 with the released uds-lsv/MCSE scripts/{MCSE_SCRIPT[setting]} loop"
            )
            simcse_note = "SimCSE on the same data (MCSE's baseline: sentences and captions)"
            _recipe(
                f"simcse/{setting}/{model}",
                "simcse",
                model,
                setting,
                "random-one",
                train=train,
                notes=(MCSE_NOTE, simcse_note),
                source=source + " (--framework simcse)",
                variant="MCSE's SimCSE baseline",
            )
            if setting == "wiki":
                continue
            lam = MCSE_TABLE3[model]["lambda"][setting]
            variants = [("", "resnet50")]
            if setting in ("flickr", "coco"):
                variants.append(("/clip-vit-b32", "clip-vit-b32"))  # Table 7, App. B.2
            for suffix, teacher in variants:
                _recipe(
                    f"mcse/{setting}/{model}{suffix}",
                    "mcse",
                    model,
                    setting,
                    "random-one",  # §4.1: "we randomly sample only one caption"
                    roles={"image": Feature("image", teacher)},
                    method_args={"image_text_weight": lam},
                    train=train,
                    notes=(MCSE_NOTE,),
                    source=source,
                    variant="the method's defaults (the released model.py, λ tuned with it)",
                )


def _mcseo_recipes() -> None:
    notes = (
        "MCSEO §4.1: α = 0.01, β = 0.005, batch 64 for every model, longest caption, ResNet-50",
        "lr and epochs are not given ('we follow MCSE'): MCSE Table 3 wiki+flickr values",
        "no MCSEO code is public: loop, optimizer and precision are MCSE's released code's",
    )
    source = "MCSEO §4.1 on MCSE's released train_mix.py loop (MCSEO: 'we follow MCSE')"
    for model in MODELS:
        train = {**_mcse_train(model, "wiki+flickr"), "batch_size": 64}
        image = Feature("image", "resnet50")
        _recipe(
            f"mcse/wiki+flickr/{model}/longest",
            "mcse",
            model,
            "wiki+flickr",
            "longest",
            roles={"image": image},
            method_args={"image_text_weight": 0.01},
            train=train,
            notes=(*notes, "MCSE reproduced by MCSEO with the longest caption (its Table 1)"),
            source=source,
            variant="MCSE as reproduced by MCSEO",
        )
        _recipe(
            f"mcseo/wiki+flickr/{model}",
            "mcseo",
            model,
            "wiki+flickr",
            "longest",
            roles={"image": image, "object": Feature("object", "resnet50")},
            method_args={"image_text_weight": 0.01, "object_phrase_weight": 0.005},
            train=train,
            notes=notes,
            source=source,
            variant="the method's defaults",
        )


def _method_has(method: str, setting: str | None = None) -> bool:
    """Whether a method is registered (and has a hyperparameter): recipes follow its names."""
    import dataclasses

    import mmcse.methods  # noqa: F401  (registers the methods)

    if method not in METHODS:
        return False
    return setting is None or setting in {f.name for f in dataclasses.fields(METHODS.get(method))}


def _kdmcse_filter_on() -> dict[str, Any]:
    """Method args that switch KDMCSE's false-negative filter on."""
    if _method_has("kdmcse", "false_negative_filter"):
        return {"false_negative_filter": True}
    # older method versions: a threshold on the normalised CLIP cosine (the scripts' score_base)
    return {"false_negative_threshold": 0.8}


def _kdmcse_recipes() -> None:
    clip = "clip-vit-l14"
    notes = (
        "KDMCSE's released scripts/run_wiki_{flickr,coco}.sh: lr 3e-5, batch 64, 3 epochs, "
        "λ = 0.01, margins 0.15, CLIP ViT-L/14, every caption of an image",
        "the release has BERT scripts only; the RoBERTa recipes use the same settings",
    )
    source = "KDMCSE's released scripts/run_wiki_{flickr,coco}.sh (src/train_mix.py)"
    filter_note = (
        "false-negative filter ON: the paper's method; the released scripts (the default "
        "recipe) do not pass --using_threshhold, so which setting gave the published numbers "
        "is not stated — both recipes carry them"
    )
    for model in MODELS:
        for setting in ("wiki+flickr", "wiki+coco"):
            common = dict(
                roles={"clip_image": Feature("image", clip), "clip_text": Feature("text", clip)},
                train={**MCSE_CODE_TRAIN, "learning_rate": 3e-5, "batch_size": 64, "epochs": 3},
            )
            _recipe(
                f"kdmcse/{setting}/{model}",
                "kdmcse",
                model,
                setting,
                "all",
                method_args={"grounding_weight": 0.01},
                notes=(*notes, "false-negative filter OFF, as in the released scripts"),
                source=source,
                variant="released scripts: false-negative filter off",
                **common,
            )
            _recipe(
                f"kdmcse/{setting}/{model}/fn-filter",
                "kdmcse",
                model,
                setting,
                "all",
                method_args={"grounding_weight": 0.01, **_kdmcse_filter_on()},
                notes=(*notes, filter_note),
                source=source + " + the paper's false-negative filter",
                variant="paper: false-negative filter on",
                published_as=f"kdmcse/{setting}/{model}",
                **common,
            )


#: DALR's scripts (run_wiki_{flickr,coco}.sh): --first_teacher SimCSE, --second_teacher DiffCSE,
#: --alpha_ 0.33 = the first teacher's weight in the mixed similarity (model_modified.py)
DALR_TEXT_TEACHERS = (("text_teacher_simcse", 0.33), ("text_teacher_diffcse", 0.67))
#: the released code: kangverse/DALR at this commit (it continues Hekang001/DALR, the paper's link)
DALR_COMMIT = "849ece9"
#: the released BERT scripts at DALR_COMMIT (unchanged since 1c7464b): setting → (script, lr,
#: batch, epochs); both pass --fp16, which only casts the text teachers' embeddings to float16
#: (model_modified.py lines 688–713); the student trains in fp32 (train_mix.py line 325:
#: a plain Accelerator())
DALR_SCRIPTS = {
    "wiki+flickr": ("scripts/run_wiki_flickr.sh", 2e-5, 128, 4),  # lines 16–18
    "wiki+coco": ("scripts/run_wiki_coco.sh", 1e-5, 128, 3),  # lines 19–21
}
#: App. B: batch 128, lr 2e-5 (BERT) / 1e-5 (RoBERTa); App. C (Table 7): 4 epochs, both settings
DALR_PAPER_LR = {"bert": 2e-5, "roberta": 1e-5}
DALR_PAPER_EPOCHS = 4


def _dalr_recipes() -> None:
    """``dalr/<setting>/<model>``: the released scripts whole (their optimisation settings, the
    CLIP ViT-L/14 features they load, ℓ_CMA on the raw 768-d feature);
    ``dalr/<setting>/<model>/clip-vit-b32``: the same with App. B's CLIP ViT-B/32 teacher, whose
    512-d feature needs ℓ_CMA's own image head; ``dalr-paper/...``: eq. 14 with App. B's
    settings and teacher. All carry DALR's published rows."""
    if _method_has("dalr"):
        for model in MODELS:
            for setting in DALR_SCRIPTS:
                _dalr_released(model, setting, "clip-vit-l14")
                _dalr_released(model, setting, "clip-vit-b32")
    if _method_has("dalr-paper"):
        for model in MODELS:
            for setting in DALR_SCRIPTS:
                _dalr_paper(model, setting)


#: DALR's text teachers per student: the released code feeds the student's token ids to the
#: teachers (``model_modified.py:670–683``, ``teachers.py:36–38``), so a RoBERTa student needs
#: teachers with RoBERTa's tokenizer. The release names only ``Model/simcse`` and
#: ``Model/DiffCSE`` (BERT scripts); for RoBERTa, **chosen**: the SimCSE and DiffCSE authors'
#: published RoBERTa-base checkpoints (docs/fidelity.md)
DALR_TEXT_TEACHER_SETS = {
    "bert": {"simcse": "simcse", "diffcse": "diffcse"},
    "roberta": {"simcse": "simcse-roberta", "diffcse": "diffcse-roberta"},
}


def _dalr_roles(image_teacher: str, model: str, every_corpus: bool = False) -> dict[str, Feature]:
    """DALR's sets; text teachers sharing ``model``'s tokenizer (:data:`DALR_TEXT_TEACHER_SETS`);
    ``every_corpus``: the text teachers' features of Wiki1M too (eq. 14 distils on every batch;
    the released code on caption batches only)."""
    teachers = DALR_TEXT_TEACHER_SETS[model]
    return {
        "image": Feature("image", image_teacher),
        "text_teacher_diffcse": Feature("text", teachers["diffcse"], every_corpus),
        "text_teacher_simcse": Feature("text", teachers["simcse"], every_corpus),
    }


DALR_ROBERTA_TEACHERS_NOTE = (
    "text teachers princeton-nlp/unsup-simcse-roberta-base + voidism/diffcse-roberta-base-sts "
    "(extract-text --teacher simcse-roberta|diffcse-roberta): the released code feeds the "
    "student's RoBERTa token ids to its teachers, so they must share RoBERTa's tokenizer; which "
    "checkpoints the authors used is not released (chosen: SimCSE's and DiffCSE's own). The "
    "BERT teachers: --set features=... naming the text-simcse / text-diffcse sets"
)
DALR_COMMON_NOTES = (
    "teachers as DALR's scripts set them: SimCSE first with α = 0.33, DiffCSE 0.67",
    "every caption of an image (DALR builds on KDMCSE's data pipeline)",
)


def _dalr_released(model: str, setting: str, image_teacher: str) -> None:
    script, lr, batch, epochs = DALR_SCRIPTS[setting]
    where = f"kangverse/DALR {script} at {DALR_COMMIT}"
    raw = image_teacher == "clip-vit-l14"
    if model == "roberta":  # the scripts are BERT's; App. B gives RoBERTa's lr, batch 128
        lr = DALR_PAPER_LR["roberta"]
    notes = [
        f"{where}: lr {DALR_SCRIPTS[setting][1]:g}, batch {batch}, {epochs} epochs, "
        "λ = 0.1 and μ = 0.2 hard-coded in src/train_mix.py (line 540), margins 0.18, "
        "CLIP ViT-L/14 features (flickr30k_ViT_L14.json / train_coco_ViT_L14.json)",
        "precision fp32: the scripts pass --fp16, but src/train_mix.py builds a plain "
        "Accelerator() (line 325) and --fp16 only casts the text teachers' embeddings to "
        "float16 (src/model_modified.py lines 688–713); mmcse reads the cached teacher "
        "features as stored",
    ]
    if model == "roberta":
        notes.append(
            f"the release has BERT scripts only: RoBERTa takes App. B's lr 1e-5 (batch 128) and "
            f"the {setting} script's {epochs} epochs"
        )
        notes.append(DALR_ROBERTA_TEACHERS_NOTE)
    if setting == "wiki+coco" and model == "bert":
        notes.append("App. B/C report lr 2e-5 and 4 epochs; the released coco script runs 1e-5, 3")
    notes.append(
        "ℓ_CMA on the raw 768-d image feature against the 768-d pooler (model_modified.py line "
        "745), ListMLE with ε = 1e-7 in its log (line 209)"
        if raw
        else "App. B's CLIP ViT-B/32 teacher (512-d): ℓ_CMA projects it through its own Linear + "
        "Tanh image head into the pooler's width (cma_image_head=true; the code cannot run "
        "a 512-d feature); everything else as the released scripts"
    )
    _recipe(
        f"dalr/{setting}/{model}" + ("" if raw else "/clip-vit-b32"),
        "dalr",
        model,
        setting,
        "all",
        roles=_dalr_roles(image_teacher, model),
        # the two switches spelt out: the released readings (and B/32's image head)
        method_args={**_dalr_args("dalr"), "cma_image_head": not raw, "rank_log_eps": 1e-7},
        train={**MCSE_CODE_TRAIN, "learning_rate": lr, "batch_size": batch, "epochs": epochs},
        notes=(
            *notes,
            "distillation on caption batches only (teachers_on='caption', the released code)",
            *DALR_COMMON_NOTES,
        ),
        source=f"{where} (src/train_mix.py + src/model_modified.py)",
        variant=(
            "the released code's composition and scripts"
            if raw
            else "released composition, App. B's CLIP ViT-B/32 through an own ℓ_CMA image head"
        ),
        published_as=f"dalr/{setting}/{model}",
    )


def _dalr_paper(model: str, setting: str) -> None:
    notes = (
        "DALR App. B: τ = 0.05, λ = 0.1, μ = 0.2, batch 128, lr 2e-5 (BERT) / 1e-5 (RoBERTa), "
        "CLIP ViT-B/32 image teacher, SimCSE + DiffCSE text teachers; App. C (Table 7): 4 "
        "epochs for both settings",
        "loop, optimizer and precision: the released src/train_mix.py's (the paper states none)",
        "distillation on every batch (eq. 14; the released code: caption batches only): each "
        "text-teacher role reads its set of the captions and of Wiki1M",
        *DALR_COMMON_NOTES,
        *((DALR_ROBERTA_TEACHERS_NOTE,) if model == "roberta" else ()),
    )
    _recipe(
        f"dalr-paper/{setting}/{model}",
        "dalr-paper",
        model,
        setting,
        "all",
        roles=_dalr_roles("clip-vit-b32", model, every_corpus=True),
        method_args=_dalr_args("dalr-paper"),
        train={
            **MCSE_CODE_TRAIN,
            "learning_rate": DALR_PAPER_LR[model],
            "batch_size": 128,
            "epochs": DALR_PAPER_EPOCHS,
        },
        notes=notes,
        source=f"DALR App. B/C on the released kangverse/DALR src/train_mix.py loop ({DALR_COMMIT})",
        variant="the paper's eq. 14 as printed",
        published_as=f"dalr/{setting}/{model}",
    )


def _dalr_args(method: str) -> dict[str, Any]:
    """λ, μ and the released teacher mix, where the method has them; caption-batch distillation
    for ``dalr`` only (the released code): ``dalr-paper`` keeps eq. 14's every-batch distillation
    (its default; the text teachers' Wiki1M sets are among its needs), the only eq.-14 term a
    Wiki1M batch has."""
    args = {
        "cross_modal_weight": 0.1,
        "intra_modal_weight": 0.2,
        "text_teachers": [list(pair) for pair in DALR_TEXT_TEACHERS],
    }
    if method == "dalr":
        args["teachers_on"] = "caption"
    return {key: value for key, value in args.items() if _method_has(method, key)}


def _nonlinguistic_recipes() -> None:
    """VisualCSE/AudioCSE: each recipe follows one source whole (the README command or Table C.1).

    The BERT README commands match Table C.1 (image lr 1e-6, audio 2e-7); for RoBERTa the
    VisualCSE README command runs image lr 1e-7 (Table C.1: 5e-7) with ω = 0.2 and prints exactly
    the Table 1 row, so ``visualcse/roberta`` follows the README command and
    ``visualcse/roberta/table-c1`` Table C.1. ω is in no table of the paper: every recipe takes
    it from the README command (0.05 / 0.2 images, 0.01 / 0.02 audio).
    """
    # name: (text batch, text lr, lr of the image/audio step, ω, source)
    readme = "the authors' README command for {m} (yiren-jian/NonLing-CSE {M}/README.md)"
    table = "VisualCSE/AudioCSE Table C.1; ω (not in the paper) from the README command"
    settings = {
        "visualcse/bert": (64, 3e-5, 1e-6, 0.05, readme + " = Table C.1"),
        "visualcse/roberta": (128, 2e-5, 1e-7, 0.2, readme),
        "visualcse/roberta/table-c1": (128, 2e-5, 5e-7, 0.2, table),
        "audiocse/bert": (64, 3e-5, 2e-7, 0.01, readme + " = Table C.1"),
        "audiocse/roberta": (128, 2e-5, 2e-7, 0.02, readme + " = Table C.1"),
    }
    notes = (
        "1 epoch (§4.1), image/audio batch 48, τ = 0.07; seed 42 as the paper's Tables 1-2",
        "objective: the released --new_supcon with SupCon (every README command, run_unsup_"
        "example.sh line 57, the training logs): cross-entropy over the cross-view cosines / τ "
        "with the class rank as target (class_rank_cross_entropy); the paper names SupCon "
        "(objective=supcon)",
        "loop, optimizer and precision: SimCSE's HF Trainer (transformers 4.5, --fp16)",
    )
    # shown by `recipes show`: the released audio path adds no position embeddings
    released_embedding = {"visualcse": {}, "audiocse": {"audio_position_embeddings": False}}
    kinds = {
        "visualcse": ("image", "image_tensor", "imagenet60"),
        "audiocse": ("audio", "audio_fbank", "librispeech50"),
    }
    for name, (batch, lr, aux_lr, weight, source) in settings.items():
        method, model = name.split("/")[:2]
        modality, kind, dataset = kinds[method]
        module = {"visualcse": "VisualCSE", "audiocse": "AudioCSE"}[method]
        _recipe(
            name,
            method,
            model,
            "wiki",
            None,
            roles={kind: Feature(kind, dataset)},
            method_args={
                f"{modality}_weight": weight,
                f"{modality}_lr": aux_lr,
                f"{modality}_objective": "class_rank_cross_entropy",  # --new_supcon
                **released_embedding[method],
            },
            train={**HF_TRAINER_TRAIN, "learning_rate": lr, "batch_size": batch, "epochs": 1},
            seeds=(42,),
            notes=notes,
            source=source.format(m=f"{MODELS[model]}", M=module),
            variant=f"ω = {weight}, {modality} lr {aux_lr:g}",
            published_as=name.removesuffix("/table-c1"),
        )


_mcse_recipes()
_mcseo_recipes()
_kdmcse_recipes()
_dalr_recipes()
_nonlinguistic_recipes()


def listing() -> str:
    """``mmcse recipes list``: every recipe, its method and the published STS avg it reproduces."""
    lines = [f"{'recipe':<34} {'method':<10} {'STS avg':<7}  published in"]
    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        published = recipe.published[0] if recipe.published else None
        avg = f"{published.mean['avg']:<7.2f}  {published.source}" if published else "-"
        lines.append(f"{name:<34} {recipe.method:<10} {avg}")
    return "\n".join(lines)


def table_listing() -> str:
    """``mmcse recipes list --tables``: each published table ``recipes run`` can train whole."""
    from mmcse.recipes.published import PAPER_TABLES

    lines = [f"{'table':<18} {'rows':>4}  published in"]
    for table in PAPER_TABLES.values():
        lines.append(f"{table.name:<18} {len(table.rows):>4}  {table.source}")
        lines += [f"{'':<24}{name}" for name in table.rows]
    return "\n".join(lines)
