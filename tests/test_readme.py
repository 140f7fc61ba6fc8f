"""Every command line of the README's bash blocks runs, in the README's order, on a tiny world.

The README is read, not copied: each ``mmcse ...`` line (continuation lines joined, comments
dropped, ``&&`` chains split) is looked up in :data:`TINY`, the reviewed table of what changes to
run it here, and run in-process through ``cli.main`` in a scratch project folder, so later
commands read what earlier ones wrote (extract → cache ls → train → eval → compare → plot →
recipes → ablate → export → bench). A README command the table does not know fails the test:
adding or changing a documented command means deciding here how it is tested. The set-up
block's other commands are CI's (``.ci/run``) and the demo's own test's; both are checked to agree.
Every ``mmcse`` line is also parsed exactly as written (typer's parser, nothing run), so a flag
renamed under a value the run replaces (``--device cuda``) or under the demo still fails here.

What changes, and why, is all in the tables below: the README's placeholders become generated
files (:data:`PLACEHOLDERS`); hub ids become tiny models built from configs (no network in
tests); teachers run with random tiny weights; epochs, seeds and benchmark sizes shrink; CUDA
becomes CPU. Checks are on documented behaviour (exit 0, the files and tables the README
promises), not on exact output text.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import typer
from support.cli import run_main_output
from support.worlds import sentences, write_downstream

import cli
from mmcse.recipes.layout import AblationDir, SeedsDir
from mmcse.rundir import ALIGN_UNIFORM_PLOT, RunDir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI_SCRIPT = ROOT / ".ci" / "run"
SENTEVAL_MINI = ROOT / "tests" / "fixtures" / "senteval_mini"

#: README placeholder -> the generated input standing in for it ({name} = a path of the world)
PLACEHOLDERS = {
    "IMG_DIR": "{flickr_images}",  # the Flickr30k image folder
    "dataset_flickr30k.json": "{flickr_json}",  # Karpathy's split file
    "IMG_ROOT": "{coco_images}",  # the COCO image root (train2017/, val2017/)
    "annotations/": "{coco_annotations}",  # COCO's captions_train2017.json folder
    "dataset_coco.json": "{coco_json}",  # Karpathy's COCO split file (the test split)
    "wiki1m_for_simcse.txt": "{wiki1m}",  # SimCSE's Wiki1M sentences
    "bert-base-uncased": "{student}",  # a hub id: tests have no network; a tiny BERT instead
    "MY_STUDENT": "{student}",
}

#: what the README's Stage-2 commands write, relative to the project folder (layout: mmcse.rundir)
MCSE_RUN, SIMCSE_RUN = RunDir("runs/mcse-flickr-s0"), RunDir("runs/simcse-s0")
SIMCSE_SEED1 = RunDir("runs/simcse-s1")
RECIPE_RUNS = SeedsDir("runs/mcse/wiki+flickr/bert")  # `recipes run`'s default --output-dir
ABLATION = AblationDir("runs/ablate/dalr/wiki+coco/bert")
TABLE_RUNS = Path("runs/table")  # `recipes run NAME NAME --output-dir runs/table`

#: Stage-1 teachers: random weights in tiny shapes (the real ones are hub downloads)
TINY_TEACHER = ("--weights", "random", "--teacher-size", "tiny")
NO_DECODE_WORKERS = ("--workers", "0")  # in-process: no DataLoader worker processes


@dataclass(frozen=True)
class Tiny:
    """How one README command runs here, and what the README says it produces."""

    set: tuple[tuple[str, str], ...] = ()  # (flag, value): a flag of the command, new value
    add: tuple[str, ...] = ()  # flags appended
    files: tuple[str | Path, ...] = ()  # must exist afterwards (relative to the project folder)
    shows: tuple[str, ...] = ()  # stdout must contain each
    absent: tuple[str | Path, ...] = ()  # must not exist afterwards (a dry run writes nothing)


#: every ``mmcse`` command line of the README (as it reads there) -> how it runs on the tiny world
TINY: dict[str, Tiny] = {
    # ---- Stage 1 ----
    "mmcse extract-images --dataset flickr30k --images IMG_DIR --captions dataset_flickr30k.json "
    "--teacher resnet50": Tiny(
        add=TINY_TEACHER + NO_DECODE_WORKERS,
        files=("cache/flickr30k/train/captions", "cache/flickr30k/train/image-resnet50"),
    ),
    "mmcse extract-images --dataset coco --images IMG_ROOT --captions annotations/ "
    "--teacher clip-vit-l14 --caption-policy all --out cache/coco/train-all": Tiny(
        add=TINY_TEACHER + NO_DECODE_WORKERS,
        files=(
            "cache/coco/train-all/captions",
            "cache/coco/train-all/image-clip-vit-l14",
            "cache/coco/train-all/text-clip-vit-l14",
        ),
    ),  # fmt: skip
    "mmcse extract-text --corpus cache/coco/train-all/captions --teacher simcse": Tiny(
        add=TINY_TEACHER, files=("cache/coco/train-all/text-simcse",)
    ),
    "mmcse extract-text --corpus cache/coco/train-all/captions --teacher diffcse": Tiny(
        add=TINY_TEACHER, files=("cache/coco/train-all/text-diffcse",)
    ),
    "mmcse extract-images --dataset coco --split test --images IMG_ROOT --captions "
    "dataset_coco.json --teacher resnet50 --caption-policy all --out cache/coco/test-all": Tiny(
        add=TINY_TEACHER + NO_DECODE_WORKERS,
        files=("cache/coco/test-all/captions", "cache/coco/test-all/image-resnet50"),
    ),
    "mmcse extract-text --corpus wiki1m --text-file wiki1m_for_simcse.txt --teacher none": Tiny(
        files=("cache/wiki1m/train/sentences",)
    ),
    "mmcse extract-objects --dataset flickr30k --images IMG_DIR --captions dataset_flickr30k.json "
    "--out cache/flickr30k/train-longest": Tiny(
        # Florence-2-large and SAM2.1-L are hub downloads: tiny random builds of both; a random
        # grounder's text is noise, so a short generation budget and one beam suffice
        add=TINY_TEACHER
        + (
            "--florence",
            "{florence2}",
            "--sam2",
            "{sam2}",
            "--num-beams",
            "1",
            "--max-new-tokens",
            "8",
        ),
        files=(
            "cache/flickr30k/train-longest/captions",
            "cache/flickr30k/train-longest/objects",
            "cache/flickr30k/train-longest/object-resnet50",
        ),
    ),  # fmt: skip
    "mmcse cache ls": Tiny(
        shows=(
            "cache/wiki1m/train/sentences",
            "cache/flickr30k/train/image-resnet50",
            "cache/coco/test-all/captions",
            "cache/flickr30k/train-longest/objects",
        ),
    ),  # fmt: skip
    # ---- Stage 2 ----
    "mmcse train --method mcse --model bert-base-uncased --text-corpus "
    "cache/wiki1m/train/sentences --caption-corpus cache/flickr30k/train/captions --feature "
    "image=cache/flickr30k/train/image-resnet50 --epochs 3 --seed 0 --output-dir runs/mcse-flickr-s0": Tiny(
        add=("--max-steps", "2"),
        files=(
            MCSE_RUN.config,
            MCSE_RUN.metrics,
            MCSE_RUN.plan,
            MCSE_RUN.best.heads,
            MCSE_RUN.best.run_info,
            MCSE_RUN.last.path,
        ),
    ),  # fmt: skip
    "mmcse train --method simcse --model bert-base-uncased --text-corpus "
    "cache/wiki1m/train/sentences --epochs 3 --seed 0 --output-dir runs/simcse-s0": Tiny(
        add=("--max-steps", "2"),
        files=(SIMCSE_RUN.metrics, SIMCSE_RUN.best.run_info),
    ),
    "mmcse train --method simcse --model bert-base-uncased --text-corpus "
    "cache/wiki1m/train/sentences --epochs 3 --seed 1 --output-dir runs/simcse-s1": Tiny(
        add=("--max-steps", "2"), files=(SIMCSE_SEED1.best.run_info,)
    ),
    "mmcse eval --model runs/mcse-flickr-s0": Tiny(shows=("STS12", "STS-B", "SICK-R")),
    "mmcse eval --model runs/mcse-flickr-s0 --tasks sts,transfer": Tiny(
        # the papers' protocol (10-fold, Adam) is ten times slower; fasttest is the same code path
        add=("--transfer-mode", "fasttest"),
        files=(MCSE_RUN.transfer,),
        shows=("STS12", "MR", "MRPC"),
    ),
    "mmcse eval --model runs/mcse-flickr-s0 --tasks retrieval --images-features "
    "cache/coco/test-all/image-resnet50 --captions cache/coco/test-all/captions": Tiny(
        files=(MCSE_RUN.retrieval,), shows=("R@1",)
    ),
    "mmcse compare runs/simcse-s0 runs/simcse-s1 runs/mcse-flickr-s0 --format md": Tiny(
        shows=("simcse-s{0,1} (n=2)", "mcse-flickr-s0", "STS12", "---", "What separates the rows")
    ),
    "mmcse plot runs/simcse-s0 runs/mcse-flickr-s0 --align-uniform": Tiny(
        files=(
            SIMCSE_RUN.training_curves,
            MCSE_RUN.training_curves,
            MCSE_RUN.path.parent / ALIGN_UNIFORM_PLOT,
        ),  # beside both runs
    ),  # fmt: skip
    "mmcse recipes list": Tiny(shows=("mcse/wiki+flickr/bert", "dalr/wiki+coco/bert")),
    "mmcse recipes run mcse/wiki+flickr/bert --seeds 0,1,2,3,4": Tiny(
        set=(("--seeds", "0"),),
        add=("--model", "{student}", "--max-steps", "2"),
        files=(RECIPE_RUNS.seed(0).best.run_info, RECIPE_RUNS.results),
        shows=("published",),
    ),
    "mmcse recipes list --tables": Tiny(shows=("mcse:table1", "dalr:table1", "simcse/wiki/bert")),
    "mmcse recipes run mcse:table1 --output-dir runs/table1 --dry-run": Tiny(
        # the tiny cache has no coco/train set: the plan lists its commands and trains nothing;
        # the dry run checks the students load (offline here: the tiny one stands in)
        add=("--model", "{student}"),
        shows=("10 recipe(s) x seeds 0,1,2,3,4 = 50 run(s)", "run first:", "disk: about"),
        absent=("runs/table1",),
    ),
    "mmcse recipes run simcse/wiki+flickr/bert mcse/wiki+flickr/bert --output-dir runs/table": Tiny(
        add=("--seeds", "0", "--model", "{student}", "--max-steps", "2"),
        files=(
            TABLE_RUNS / "simcse/wiki+flickr/bert/seed0/best",
            TABLE_RUNS / "tables/simcse_wiki+flickr_bert__mcse_wiki+flickr_bert.md",
            TABLE_RUNS / "tables/simcse_wiki+flickr_bert__mcse_wiki+flickr_bert.tex",
        ),
        shows=("published: MCSE-BERT", "p (Welch, Avg.)"),
    ),  # fmt: skip
    "mmcse ablate --recipe dalr/wiki+coco/bert --drop cma,rank": Tiny(
        add=("--seeds", "0", "--model", "{student}", "--max-steps", "2"),
        files=(ABLATION.table, ABLATION.record),
        shows=("w/o cma", "w/o rank"),
    ),  # fmt: skip
    "mmcse recipes run mcse/wiki+flickr/bert --model MY_STUDENT --dry-run": Tiny(
        shows=("seed 4",), absent=(RECIPE_RUNS.seed(4).path,)
    ),
    "mmcse export runs/mcse-flickr-s0 out/mcse-flickr-st": Tiny(
        files=(
            "out/mcse-flickr-st/modules.json",
            "out/mcse-flickr-st/1_Pooling/config.json",
            "out/mcse-flickr-st/README.md",
        ),
    ),  # fmt: skip
    "mmcse bench all --device cuda --out docs/benchmarks/results-cuda.json": Tiny(
        # no GPU in CI; every section still runs (tiny shapes on CPU), the train section for one
        # method (every method's step ratio: tests/bench/)
        set=(("--device", "cpu"),),
        add=("--method", "simcse"),
        files=("docs/benchmarks/results-cuda.json", "docs/benchmarks/results-cuda.md"),
    ),
    "mmcse bench all --sections train --capture forward,whole --packing off,on": Tiny(
        # compiling takes minutes on a CPU: the eager step, padded and packed, SimCSE and MCSE
        # (every method and option: tests/bench/)
        set=(("--capture", "off"),),
        add=("--method", "simcse", "--method", "mcse", "--out", "bench-out/train.json"),
        files=("bench-out/train.json", "bench-out/train.md"),
    ),
}

#: the set-up block's `mmcse demo`: run by its own test with these flags added (place and size)
DEMO = "mmcse demo"
DEMO_TEST = (ROOT / "tests" / "recipes" / "test_runs.py", "test_demo_end_to_end_short")
DEMO_ADDED = ("--out", "{tmp}", "--steps", "4", "--device", "cpu")

#: the set-up block's other commands: what CI runs (.ci/run), checked against it
CI_COMMANDS = (
    'pip install torch==2.14.1 torchvision==0.29.1 -e ".[plot]"',
    'pip install torch==2.14.1 torchvision==0.29.1 -e ".[dev]"',
    "ruff check .",
    "ruff format --check .",
    "python -m pytest --cov --cov-report=json",
    "python .ci/coverage_report.py",
)


# ---- reading the README --------------------------------------------------------------------


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell script: continuation lines joined, comments dropped, ``&&``,
    ``||`` and ``;`` chains split; each as its words."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", "||", ";"):
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def readme_commands() -> list[list[str]]:
    """Every command of the README's bash blocks, in order."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    assert blocks, "no ```bash blocks in README.md"
    return [command for block in blocks for command in shell_commands(block)]


def key(command: list[str]) -> str:
    return shlex.join(command)


def entry_of(command: list[str]) -> Tiny:
    return {key(shlex.split(k)): v for k, v in TINY.items()}[key(command)]


def test_every_readme_command_is_in_the_tables():
    commands = [key(c) for c in readme_commands()]
    known = {key(shlex.split(k)) for k in (*TINY, DEMO, *CI_COMMANDS)}
    unknown = [c for c in commands if c not in known]
    assert not unknown, (
        "README commands this test does not know; add each to TINY in tests/test_readme.py "
        "(what changes to run it on the tiny world, what it must produce):\n" + "\n".join(unknown)
    )
    stale = sorted(known - set(commands))
    assert not stale, "table entries no README command matches any more:\n" + "\n".join(stale)
    assert len(commands) == len(set(commands)), "a README command repeats"


# ---- the set-up block: CI and the demo's own test -------------------------------------------


def test_every_environment_variable_and_dataset_loader_is_documented():
    """What a new user needs before the first command: the MMCSE_* variables the code reads and
    where each registered dataset comes from."""
    from pipeline.datasets import DATASETS

    code = [*(ROOT / "mmcse").rglob("*.py"), *(ROOT / "pipeline").rglob("*.py")]
    variables = {v for f in code for v in re.findall(r"\bMMCSE_[A-Z_]+", f.read_text())}
    text = README.read_text(encoding="utf-8")
    assert variables and all(f"`{v}`" in text for v in variables)
    where = text.split("**Where the data comes from.**")[1].split("\n\n")[1]
    for name in DATASETS.names():
        if name != "local":  # your own files
            assert {"wiki1m": "Wiki1M", "coco": "COCO"}.get(name, name.capitalize()) in where


def test_setup_commands_are_what_ci_runs():
    ci = [c for c in shell_commands(CI_SCRIPT.read_text(encoding="utf-8")) if c[:1] != ["exit"]]
    ci_pip = next(c for c in ci if c[:2] == ["pip", "install"])
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for command in map(shlex.split, CI_COMMANDS):
        if command[:2] == ["pip", "install"]:
            # the README installs the same pinned torch as CI, and extras that exist
            assert [w for w in command if "==" in w] == [w for w in ci_pip if "==" in w]
            extra = re.fullmatch(r"\.\[(\w+)\]", command[-1])
            assert extra and extra.group(1) in extras, command
            assert command[-2] == "-e" == ci_pip[-2]
        else:
            assert command in ci, f"{shlex.join(command)} is not in {CI_SCRIPT}"
    assert shlex.split(CI_COMMANDS[1]) == [w for w in ci_pip if w != "-q"]


def test_the_readme_demo_is_the_tested_demo():
    """The demo's end-to-end test runs the README's ``mmcse demo`` with only place and size
    flags added, so the two cannot drift apart unnoticed."""
    path, name = DEMO_TEST
    tree = ast.parse(path.read_text(encoding="utf-8"))
    test = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    calls = [
        n for n in ast.walk(test)
        if isinstance(n, ast.Call) and any(getattr(a, "value", None) == "demo" for a in n.args)
    ]  # fmt: skip
    assert len(calls) == 1, f"{name} should run `mmcse demo` once"
    words = [a.value for a in calls[0].args if isinstance(a, ast.Constant)]
    readme = shlex.split(DEMO)[1:]
    assert words == readme + [w for w in DEMO_ADDED if not w.startswith("{")]
    assert any(w == "--out" for w in words), "the demo test must write into its tmp folder"


# ---- the tiny world ------------------------------------------------------------------------


def write_images(folder: Path, names: list[str], seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / name)


def karpathy_entry(split: str, captions: list[str], **fields) -> dict:
    return {"split": split, "sentences": [{"raw": c} for c in captions], **fields}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model) -> dict[str, str]:
    """Generated stand-ins for every README placeholder, tiny Florence-2/SAM2, and a shared
    data folder (SentEval: the STS fixture + generated transfer tasks; a Wiki1M sample). One
    per module: the README's commands build on each other in it, as they would for a user."""
    from support.objects import build_florence2, build_sam2

    tmp_path = tmp_path_factory.mktemp("readme")
    inputs = tmp_path / "inputs"
    captions = iter(sentences(200, seed=3))
    flickr = [f"{1000 + i}.jpg" for i in range(8)]  # 6 train, 1 val, 1 test
    write_images(inputs / "flickr30k-images", flickr, seed=0)
    splits = ["train"] * 6 + ["val", "test"]
    entries = [karpathy_entry(split, [next(captions) for _ in range(5)], filename=name)
               for name, split in zip(flickr, splits, strict=True)]  # fmt: skip
    (inputs / "dataset_flickr30k.json").write_text(json.dumps({"images": entries}))

    train_ids, test_ids = range(100, 106), range(500, 506)
    write_images(inputs / "coco" / "train2017", [f"{i:012d}.jpg" for i in train_ids], seed=1)
    write_images(inputs / "coco" / "val2017", [f"{i:012d}.jpg" for i in test_ids], seed=2)
    annotations = [{"id": n, "image_id": i, "caption": next(captions)}
                   for n, i in enumerate(i for i in train_ids for _ in range(5))]  # fmt: skip
    images = [{"id": i, "file_name": f"{i:012d}.jpg"} for i in train_ids]
    (inputs / "annotations").mkdir()
    (inputs / "annotations" / "captions_train2017.json").write_text(
        json.dumps({"images": images, "annotations": annotations})
    )
    coco_test = [karpathy_entry("test", [next(captions) for _ in range(5)], cocoid=i,
                                filepath="val2014", filename=f"COCO_val2014_{i:012d}.jpg")
                 for i in test_ids]  # fmt: skip
    (inputs / "dataset_coco.json").write_text(json.dumps({"images": coco_test}))
    (inputs / "wiki1m_for_simcse.txt").write_text("\n".join(sentences(96, seed=1)) + "\n")

    shared = tmp_path / "shared"
    shutil.copytree(SENTEVAL_MINI / "downstream", shared / "senteval" / "downstream")
    write_downstream(shared / "senteval")
    (shared / "text" / "wiki1m_sample").mkdir(parents=True)
    shutil.copy(inputs / "wiki1m_for_simcse.txt", shared / "text" / "wiki1m_sample")
    return {
        "flickr_images": str(inputs / "flickr30k-images"),
        "flickr_json": str(inputs / "dataset_flickr30k.json"),
        "coco_images": str(inputs / "coco"),
        "coco_annotations": str(inputs / "annotations"),
        "coco_json": str(inputs / "dataset_coco.json"),
        "wiki1m": str(inputs / "wiki1m_for_simcse.txt"),
        "student": str(tiny_model),
        "florence2": str(build_florence2(tmp_path / "florence2")),
        "sam2": str(build_sam2(tmp_path / "sam2")),
        "shared": str(shared),
        "project": str(tmp_path / "project"),
    }


def tiny_command(command: list[str], world: dict[str, str]) -> list[str]:
    """The README command as it runs here: placeholders, then ``set``, then ``add``."""
    entry = entry_of(command)
    words = [PLACEHOLDERS.get(w, w).format(**world) for w in command[1:]]
    for flag, value in entry.set:
        assert flag in words, f"{key(command)}: the table sets {flag}, which it does not have"
        words[words.index(flag) + 1] = value
    added = [w.format(**world) for w in entry.add]
    overlap = {w for w in added if w.startswith("--")} & set(words)
    assert not overlap, f"{key(command)}: the table adds {overlap}, which it already has"
    return words + added


# ---- the whole README, in order -----------------------------------------------------------

#: the README's ``mmcse`` commands, in order; the demo has its own test (above)
RUN_IN_ORDER = [c for c in readme_commands() if c[0] == "mmcse" and key(c) != DEMO]


@pytest.mark.parametrize(
    "command", PARSED := [c for c in readme_commands() if c[0] == "mmcse"],
    ids=[key(c)[6:60] for c in PARSED],
)  # fmt: skip
def test_readme_command_parses_as_written(command):
    """The flags and values as the README shows them, parsed by the CLI's own parser before any
    substitution: also where the run below changes a value (``--device cuda``, ``--seeds``)
    and for ``mmcse demo`` — a renamed or removed flag, or a refused value, fails here."""
    path, params = parse_cli(command[1:])
    flags = [w for w in command if w.startswith("--")]
    assert len(path.split()) > 1 and len(params) >= len(flags), (path, params)


def parse_cli(words: list[str]) -> tuple[str, dict]:
    """``(command path, parameters)`` of ``mmcse WORDS`` as typer/click parse them; nothing runs.
    A flag the command lacks is a usage error, raised here."""
    command, args, context, path = typer.main.get_command(cli.app), list(words), None, ["mmcse"]
    while hasattr(command, "resolve_command"):  # a group: its options, then the subcommand
        context = command.make_context(" ".join(path), args, parent=context)
        name, command, args = command.resolve_command(
            context, [*context._protected_args, *context.args]
        )
        path.append(name)
    return " ".join(path), command.make_context(" ".join(path), args, parent=context).params


#: README commands that failed in this session; later ones read what earlier ones wrote
FAILED: list[str] = []


@pytest.mark.parametrize("command", RUN_IN_ORDER, ids=[key(c)[6:60] for c in RUN_IN_ORDER])
def test_readme_command_runs_on_the_tiny_world(command, world, monkeypatch, capsys):
    """Each README command in the README's order, in one project folder, so later commands
    read what earlier ones wrote (selecting one with ``-k`` runs it without its inputs)."""
    if key(command) not in {key(shlex.split(k)) for k in TINY}:
        pytest.fail(
            f"{key(command)} is not in TINY (see test_every_readme_command_is_in_the_tables)"
        )
    if FAILED:
        pytest.skip(f"an earlier README command failed: {FAILED[0]}")
    FAILED.append(key(command))  # until it passes
    project = Path(world["project"])
    project.mkdir(exist_ok=True)
    monkeypatch.chdir(project)  # the README's relative cache/, runs/, out/, bench/
    monkeypatch.setenv("MMCSE_SHARED_DATA", world["shared"])  # where SentEval is looked for
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id left unsubstituted fails fast
    monkeypatch.setenv("XDG_CACHE_HOME", str(project.parent / "xdg"))  # base-model cache
    entry, args = entry_of(command), tiny_command(command, world)
    code, out, err = run_main_output(args, monkeypatch, capsys)
    where = f"README: {key(command)}\nran: mmcse {shlex.join(args)}"
    assert code == 0, f"{where}\nexit {code}; stderr:\n{err[-4000:]}"
    assert "Traceback" not in err, f"{where}\n{err[-4000:]}"
    missing = [str(f) for f in entry.files if not (project / f).exists()]
    assert not missing, f"{where}\ndid not write {missing}"
    unseen = [s for s in entry.shows if s not in out]
    assert not unseen, f"{where}\nstdout lacks {unseen}:\n{out[-4000:]}"
    written = [str(f) for f in entry.absent if (project / f).exists()]
    assert not written, f"{where}\nwrote {written}"
    FAILED.remove(key(command))


# ---- on the shared data, where it lies ------------------------------------------------------

#: a README command that reads the shared data by default (``shared/data`` beside the project),
#: with what this test gives it: the CPU, and the one section that reads it quickest
ON_SHARED_DATA = {
    "mmcse bench all --device cuda --out docs/benchmarks/results-cuda.json": (
        ("--device", "cpu", "--sections", "dev_eval", "--out", "out.json")
    ),
}


def test_readme_commands_find_the_shared_data_beside_the_project(tmp_path, monkeypatch, capsys):
    """No ``MMCSE_SHARED_DATA``, run from another folder: the default is ``../shared/data``
    beside the project (not ``./shared``): the bench's dev evaluation finds SentEval there."""
    shared = ROOT.parent / "shared" / "data"
    if not (shared / "senteval" / "downstream" / "STS" / "STSBenchmark").is_dir():
        pytest.skip(f"no shared data at {shared}")
    monkeypatch.delenv("MMCSE_SHARED_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    for line, added in ON_SHARED_DATA.items():
        assert shlex.split(line) in readme_commands(), f"{line} is no README command any more"
        args = [*shlex.split(line)[1:], *added]
        code, out, err = run_main_output(args, monkeypatch, capsys)
        assert code == 0, err[-3000:]
        section = json.loads((tmp_path / "out.json").read_text())["dev_eval"]
        assert "skipped" not in section and section["forwards"] > 0
