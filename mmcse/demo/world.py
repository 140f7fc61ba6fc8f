"""The offline demo's world: drawn scenes whose captions really describe them.

A scene is one or two coloured shapes (size, colour, shape; a spatial relation between two).
Captions and corpus sentences say the same things with sampled synonyms ("crimson disc" for "red
circle"), so text alone sees many surface forms while the drawn image is the same: exactly the
signal visual grounding adds. Scored scene pairs (gold = shared scene meaning) give a dev split for
model selection and three named test tasks; they are synthetic, not SentEval's STS tasks.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from mmcse.evaluation.sts import DEV_NAME_FILE

COLORS = {
    "red": ((220, 30, 30), ["red", "crimson", "scarlet"]),
    "green": ((30, 170, 60), ["green", "emerald", "grassy"]),
    "blue": ((30, 60, 220), ["blue", "navy", "azure"]),
    "yellow": ((235, 210, 30), ["yellow", "golden", "lemon"]),
    "purple": ((140, 40, 170), ["purple", "violet", "lilac"]),
}
SHAPES = {
    "circle": ["circle", "disc", "round shape"],
    "square": ["square", "box", "block"],
    "triangle": ["triangle", "wedge", "pyramid"],
}
SIZES = {"small": ["small", "tiny", "little"], "big": ["big", "large", "huge"]}
RELATIONS = {
    "left": ["to the left of", "left of", "on the left side of"],
    "above": ["above", "over", "on top of"],
}
OPENERS = ["", "a picture of ", "there is ", "we see ", "an image showing "]


@dataclass(frozen=True)
class Thing:
    size: str
    color: str
    shape: str


@dataclass(frozen=True)
class Scene:
    things: tuple[Thing, ...]
    relation: str | None = None

    def attributes(self) -> list[str]:
        attrs = [f"{i}:{a}" for i, t in enumerate(self.things) for a in (t.size, t.color, t.shape)]
        return attrs + ([f"rel:{self.relation}"] if self.relation else [])


def random_thing(rng: random.Random) -> Thing:
    return Thing(rng.choice(list(SIZES)), rng.choice(list(COLORS)), rng.choice(list(SHAPES)))


def random_scene(rng: random.Random, objects: int | None = None) -> Scene:
    """One or two shapes (``objects=None``: one with probability 0.4)."""
    if objects == 1 or (objects is None and rng.random() < 0.4):
        return Scene((random_thing(rng),))
    return Scene((random_thing(rng), random_thing(rng)), rng.choice(list(RELATIONS)))


def describe(scene: Scene, rng: random.Random) -> str:
    """One caption of ``scene`` with sampled synonyms."""

    def phrase(t: Thing) -> str:
        words = [
            rng.choice(SIZES[t.size]),
            rng.choice(COLORS[t.color][1]),
            rng.choice(SHAPES[t.shape]),
        ]
        return "a " + " ".join(words)

    text = phrase(scene.things[0])
    if scene.relation:
        text += f" {rng.choice(RELATIONS[scene.relation])} {phrase(scene.things[1])}"
    return rng.choice(OPENERS) + text


def draw(scene: Scene, path: Path, size: int = 96) -> None:
    """Render ``scene`` as a JPEG: shapes at positions the relation implies."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (235, 235, 235))
    pen = ImageDraw.Draw(img)
    centres = [(size // 2, size // 2)]
    if scene.relation == "left":
        centres = [(size // 4, size // 2), (3 * size // 4, size // 2)]
    elif scene.relation == "above":
        centres = [(size // 2, size // 4), (size // 2, 3 * size // 4)]
    for thing, (cx, cy) in zip(scene.things, centres, strict=False):
        r = size // 5 if thing.size == "big" else size // 10
        box = (cx - r, cy - r, cx + r, cy + r)
        fill = COLORS[thing.color][0]
        if thing.shape == "circle":
            pen.ellipse(box, fill=fill)
        elif thing.shape == "square":
            pen.rectangle(box, fill=fill)
        else:
            pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    img.save(path, quality=92)


def similarity(a: Scene, b: Scene) -> float:
    """Gold relatedness on SentEval's 0–5 scale: Jaccard overlap of scene attributes × 5."""
    sa, sb = set(a.attributes()), set(b.attributes())
    return round(5.0 * len(sa & sb) / len(sa | sb), 2)


def perturb(scene: Scene, rng: random.Random) -> Scene:
    """A related scene: change 0–3 attributes, so gold scores spread over the scale."""
    things = list(scene.things)
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(things))
        field = rng.choice(["size", "color", "shape"])
        choices = {"size": SIZES, "color": COLORS, "shape": SHAPES}[field]
        values = {**things[i].__dict__, field: rng.choice(list(choices))}
        things[i] = Thing(**values)
    return Scene(tuple(things), scene.relation)


def write_images(out: Path, n_images: int, rng: random.Random) -> Path:
    """``n_images`` drawings + ``captions.jsonl`` (two captions each) for the ``local`` loader."""
    img_dir = out / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n_images):
        scene = random_scene(rng)
        name = f"scene{i:05d}.jpg"
        draw(scene, img_dir / name)
        lines += [json.dumps({"image": name, "caption": describe(scene, rng)}) for _ in range(2)]
    captions = out / "captions.jsonl"
    captions.write_text("\n".join(lines) + "\n")
    return captions


def write_text_corpus(path: Path, n: int, rng: random.Random) -> Path:
    path.write_text("\n".join(describe(random_scene(rng), rng) for _ in range(n)) + "\n")
    return path


def sts_pairs(n: int, rng: random.Random, **kw) -> list[tuple[str, str, float]]:
    """``n`` scored pairs: a scene and a perturbed copy (80%) or an unrelated scene (20%)."""
    out = []
    for _ in range(n):
        a = random_scene(rng, **kw)
        b = perturb(a, rng) if rng.random() < 0.8 else random_scene(rng, **kw)
        out.append((describe(a, rng), describe(b, rng), similarity(a, b)))
    return out


def reworded_pairs(n: int, rng: random.Random) -> list[tuple[str, str, float]]:
    """Half the pairs describe one scene in other words (gold 5), half two unrelated scenes."""
    out = []
    for _ in range(n):
        a = random_scene(rng)
        b = a if rng.random() < 0.5 else random_scene(rng)
        out.append((describe(a, rng), describe(b, rng), similarity(a, b)))
    return out


#: the demo's test tasks, named for what they hold (none of them is a SentEval task)
DEMO_TASKS = {
    "one-shape scenes": lambda n, rng: sts_pairs(n, rng, objects=1),
    "two-shape scenes": lambda n, rng: sts_pairs(n, rng, objects=2),
    "reworded or unrelated": reworded_pairs,
}


#: what the demo's dev split is (logs, the plan, the demo's table)
DEV_NAME = "dev (held-out scene pairs)"


def write_tasks(root: Path, rng: random.Random, pairs_per_task: int = 200) -> Path:
    """The scored scene pairs: a dev split for model selection and the named test tasks.

    The trainer selects checkpoints on ``senteval/downstream/STS/STSBenchmark/sts-dev.csv`` (its
    dev hook reads that layout); here the file holds held-out *scene pairs*, not STS-B. The test
    tasks are ``tasks/<name>.tsv`` (sentence, sentence, gold 0-5).
    """
    stsb = root / "senteval" / "downstream" / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True, exist_ok=True)
    rows = [
        f"demo\tscenes\t2026\t{i:04d}\t{g}\t{a}\t{b}\n"
        for i, (a, b, g) in enumerate(sts_pairs(2 * pairs_per_task, rng))
    ]
    (stsb / "sts-dev.csv").write_text("".join(rows))
    (root / "senteval" / DEV_NAME_FILE).write_text(DEV_NAME + "\n")  # so logs do not say STS-B
    tasks = root / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    for name, make in DEMO_TASKS.items():
        pairs = make(pairs_per_task, rng)
        (tasks / f"{name}.tsv").write_text("".join(f"{a}\t{b}\t{g}\n" for a, b, g in pairs))
    return root


def generate(out: Path, n_images: int = 600, n_text: int = 4000, seed: int = 0) -> dict[str, Path]:
    """Write the whole demo world under ``out``; returns its paths."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    captions = write_images(out / "flat", n_images, rng)
    text = write_text_corpus(out / "text.txt", n_text, rng)
    write_tasks(out, rng)
    return {
        "images": out / "flat" / "images",
        "captions": captions,
        "text": text,
        "senteval": out / "senteval",
        "tasks": out / "tasks",
    }
