"""The papers' published STS numbers, as data, each row with the table it was copied from.

Rows are kept as the papers print them (``"71.4±0.9 81.8±1.3 ..."``: STS12-16, STS-B, SICK-R,
Avg.; significance marks dropped), so a row can be checked against the paper text by eye. Every
number is Spearman × 100 in SentEval's "all" setting. ``seeds`` is how many runs a row averages
(1: a single run; ``None``: the paper does not say).

Text-extraction notes (papers in ``../shared/papers``):

* MCSE Tables 1, 3 and 7 are read from ``002_*.txt``; ``000_*.txt`` garbles Table 3's BERT λ row
  (one value missing) and the coco MCSE-CLIP-BERT Avg. cell of Table 7 (``\\begin{array}...``).
  Both extractions agree on every other number used here. Table 2 (avg only) repeats Table 7's
  averages for the same runs, so the full Table 7 rows are used.
* MCSE Table 5 (wiki+flickr+coco, avg only) has no recipe: the trainer reads one caption corpus.
* DALR (``001_*.txt``) Table 1 quotes KDMCSE (Nguyen et al., 2024; marked ‡) — those are the
  KDMCSE numbers used, cited to DALR's table. Its Tables 3 and 8 (ablations) give STS avg ± std
  only.
* MCSEO (``003_*.txt``) Table 1 does not say how many seeds its own rows average.
* VisualCSE/AudioCSE (``004_*.txt``) Tables 1-2 are single runs with seed 42; Table 3 gives
  5-seed avg ± std and a ``p`` column whose pairing to rows is not stated in the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mmcse.evaluation.report import COLUMN_TITLES

#: SentEval task names in the papers' column order, then the average
TASKS: tuple[str, ...] = tuple(COLUMN_TITLES)
COLUMNS: tuple[str, ...] = (*TASKS, "avg")

MCSE_PAPER = "MCSE (Zhang et al., NAACL 2022)"
DALR_PAPER = "DALR (He et al., 2025)"
MCSEO_PAPER = "MCSEO (Zhao et al., 2025)"
NONLING_PAPER = "VisualCSE/AudioCSE (Jian et al., NeurIPS 2022)"


@dataclass(frozen=True)
class Published:
    """One published result row: per-column means (and standard deviations where printed)."""

    label: str
    source: str
    mean: dict[str, float]
    std: dict[str, float] = field(default_factory=dict)
    seeds: int | None = None

    def to_dict(self) -> dict:
        return {
            "label": self.label,
            "source": self.source,
            "mean": self.mean,
            "std": self.std,
            "seeds": self.seeds,
        }


def parse_row(text: str, columns: tuple[str, ...] = COLUMNS) -> tuple[dict, dict]:
    """``"71.4±0.9 81.8 ..."`` → (means, stds) keyed by ``columns``; stds only where printed."""
    cells = text.split()
    if len(cells) != len(columns):
        raise ValueError(f"row {text!r} has {len(cells)} cells, expected {len(columns)}")
    mean, std = {}, {}
    for column, cell in zip(columns, cells, strict=True):
        value, _, spread = cell.partition("±")
        mean[column] = float(value)
        if spread:
            std[column] = float(spread)
    return mean, std


def row(label: str, source: str, text: str, seeds: int | None) -> Published:
    mean, std = parse_row(text)
    return Published(label, source, mean, std, seeds)


def avg_only(label: str, source: str, text: str, seeds: int | None) -> Published:
    mean, std = parse_row(text, ("avg",))
    return Published(label, source, mean, std, seeds)


def _rows(sources: dict[str, str], table: str) -> dict[str, tuple[str, str, str]]:
    """A table's lines ``source | recipe name | label | row as printed`` → recipe name:
    (label, source, row); ``source`` is a key of ``sources`` (the table the row is copied from)."""
    rows = {}
    for line in table.strip().splitlines():
        source, name, label, printed = (cell.strip() for cell in line.split("|"))
        rows[name] = (label, sources[source], printed)
    return rows


# ---- MCSE (seeds 000/002): Table 1 (wiki, wiki+flickr, wiki+coco) and Table 7 (flickr, coco) ---

_T1 = f"{MCSE_PAPER}, Table 1"
_T7 = f"{MCSE_PAPER}, Table 7 (Avg. also in Table 2)"
_GAO = f"SimCSE (Gao et al., 2021), single seed, 1 epoch; quoted in {MCSE_PAPER}, Table 1"

_MCSE_ROWS = _rows(
    {"T1": _T1, "T7": _T7},
    """
T1 | simcse/wiki/bert                 | SimCSE-BERT         | 67.8±1.6 80.0±2.1 72.5±1.7 80.1±0.8 77.6±0.8 76.5±0.8 70.1±0.9 74.9±1.1
T1 | simcse/wiki/roberta              | SimCSE-RoBERTa      | 68.7±1.0 82.0±0.5 74.0±1.0 82.1±0.4 81.1±0.4 80.6±0.3 69.2±0.2 76.8±0.5
T1 | simcse/wiki+flickr/bert          | SimCSE-BERT         | 69.9±1.7 79.8±1.5 72.9±0.9 81.9±0.8 77.8±0.9 76.6±1.1 68.4±0.8 75.3±0.9
T1 | mcse/wiki+flickr/bert            | MCSE-BERT           | 71.4±0.9 81.8±1.3 74.8±0.9 83.6±0.9 77.5±0.8 79.5±0.5 72.6±1.4 77.3±0.5
T1 | simcse/wiki+flickr/roberta       | SimCSE-RoBERTa      | 69.5±0.9 81.6±0.5 74.1±0.6 82.4±0.3 80.9±0.5 79.9±0.3 67.3±0.5 76.5±0.4
T1 | mcse/wiki+flickr/roberta         | MCSE-RoBERTa        | 71.7±0.2 82.7±0.4 75.9±0.3 84.0±0.4 81.3±0.3 82.3±0.5 70.3±1.3 78.3±0.1
T1 | simcse/wiki+coco/bert            | SimCSE-BERT         | 69.1±1.0 80.4±0.9 72.7±0.7 81.1±0.3 78.2±0.9 73.9±0.6 66.6±1.2 74.6±0.2
T1 | mcse/wiki+coco/bert              | MCSE-BERT           | 71.2±1.3 79.7±0.9 73.8±0.9 83.0±0.4 77.8±0.9 78.5±0.4 72.1±1.4 76.6±0.5
T1 | simcse/wiki+coco/roberta         | SimCSE-RoBERTa      | 66.4±0.9 80.7±0.7 72.7±1.1 81.3±0.9 80.2±0.8 76.8±0.6 65.7±0.7 74.8±0.5
T1 | mcse/wiki+coco/roberta           | MCSE-RoBERTa        | 70.2±1.7 82.0±0.7 75.5±1.2 83.0±0.6 81.5±0.7 80.8±1.0 69.9±0.6 77.6±0.8
T7 | simcse/flickr/bert               | SimCSE-BERT         | 62.1±0.5 73.8±0.9 64.2±0.6 74.2±0.8 74.8±0.6 67.1±1.1 65.4±1.1 68.8±0.7
T7 | mcse/flickr/bert                 | MCSE-ResNet-BERT    | 63.6±0.7 74.0±0.9 65.5±1.1 75.5±0.2 71.6±0.4 74.0±0.4 69.8±0.3 70.6±0.5
T7 | mcse/flickr/bert/clip-vit-b32    | MCSE-CLIP-BERT      | 63.1±0.7 73.9±1.0 65.8±0.9 76.0±0.7 70.7±0.3 74.9±0.5 70.7±0.3 70.7±0.2
T7 | simcse/flickr/roberta            | SimCSE-RoBERTa      | 66.6±0.5 78.3±0.5 69.7±0.6 77.7±0.5 76.3±0.5 75.8±0.3 66.2±0.4 72.9±0.3
T7 | mcse/flickr/roberta              | MCSE-ResNet-RoBERTa | 67.6±0.5 78.8±0.4 70.1±0.3 78.5±0.2 75.4±0.5 77.4±0.3 68.6±0.3 73.8±0.2
T7 | mcse/flickr/roberta/clip-vit-b32 | MCSE-CLIP-RoBERTa   | 67.0±0.5 78.6±0.4 69.8±0.5 78.7±0.8 74.9±0.5 77.4±0.4 69.5±0.5 73.7±0.2
T7 | simcse/coco/bert                 | SimCSE-BERT         | 59.3±0.9 73.0±1.2 62.7±0.6 74.7±0.7 74.4±0.4 65.3±0.7 65.4±0.5 67.8±0.4
T7 | mcse/coco/bert                   | MCSE-ResNet-BERT    | 64.9±0.5 74.8±0.9 68.1±0.6 76.8±0.6 72.7±0.8 74.5±0.4 69.7±0.4 71.6±0.2
T7 | mcse/coco/bert/clip-vit-b32      | MCSE-CLIP-BERT      | 64.8±0.6 74.1±0.6 68.0±0.2 76.2±0.5 71.6±0.4 74.5±0.3 70.3±0.6 71.4±0.1
T7 | simcse/coco/roberta              | SimCSE-RoBERTa      | 64.7±0.6 79.2±0.4 70.2±0.4 79.0±0.6 78.2±0.5 73.8±0.5 64.6±0.3 72.8±0.3
T7 | mcse/coco/roberta                | MCSE-ResNet-RoBERTa | 67.0±0.8 79.4±0.4 70.9±0.4 80.0±0.4 77.8±0.5 76.9±0.4 67.9±0.7 74.3±0.3
T7 | mcse/coco/roberta/clip-vit-b32   | MCSE-CLIP-RoBERTa   | 66.0±1.0 79.0±0.7 70.6±0.6 80.0±0.8 77.6±0.5 76.5±0.4 68.4±0.8 74.0±0.2
""",
)

# ---- DALR (seed 001): Table 1, its own rows and the KDMCSE rows it quotes (‡) ------------------

_D1 = f"{DALR_PAPER}, Table 1"
_KD = f"KDMCSE (Nguyen et al., 2024), quoted in {DALR_PAPER}, Table 1 (‡)"

_DALR_ROWS = _rows(
    {"KD": _KD, "D1": _D1},
    """
KD | kdmcse/wiki+flickr/bert    | KDMCSE-BERT    | 74.4±1.4 83.1±0.9 76.3±1.1 83.7±0.8 78.8±0.9 81.3±0.9 73.0±0.9 78.6±0.8
D1 | dalr/wiki+flickr/bert      | DALR-BERT      | 73.9±0.8 84.0±0.7 76.5±0.5 84.3±0.9 80.6±1.1 81.8±0.2 75.3±0.4 79.5±0.7
KD | kdmcse/wiki+flickr/roberta | KDMCSE-RoBERTa | 73.6±0.7 83.8±0.6 77.4±0.4 84.0±0.3 81.5±0.7 82.3±0.6 71.2±0.4 79.1±0.3
D1 | dalr/wiki+flickr/roberta   | DALR-RoBERTa   | 73.6±0.4 84.4±0.2 77.2±0.6 84.9±0.7 82.0±0.4 82.6±0.2 74.6±0.7 79.9±0.5
KD | kdmcse/wiki+coco/bert      | KDMCSE-BERT    | 73.2±1.2 80.5±1.0 75.4±0.9 83.2±0.3 79.7±0.8 79.7±0.7 73.7±1.4 77.9±1.2
D1 | dalr/wiki+coco/bert        | DALR-BERT      | 73.4±1.0 82.6±1.2 75.6±0.8 83.5±0.6 80.8±0.7 80.5±0.5 74.1±0.9 78.6±0.9
KD | kdmcse/wiki+coco/roberta   | KDMCSE-RoBERTa | 72.8±1.5 81.7±0.9 76.1±1.1 83.4±1.0 81.5±0.6 80.7±0.8 69.9±0.6 78.0±0.7
D1 | dalr/wiki+coco/roberta     | DALR-RoBERTa   | 73.1±0.3 83.2±0.7 76.5±0.9 83.9±1.0 82.2±0.4 81.2±1.1 72.0±0.7 78.9±0.8
""",
)

# ---- MCSEO (seed 003): Table 1 — MCSEO and MCSE reproduced with the longest caption -----------

_O1 = f"{MCSEO_PAPER}, Table 1"

_MCSEO_ROWS = _rows(
    {"O1": _O1},
    """
O1 | mcse/wiki+flickr/bert/longest    | MCSE-BERT (reproduced)    | 72.3 81.3 74.5 83.7 78.7 80.2 72.0 77.5
O1 | mcseo/wiki+flickr/bert           | MCSEO-BERT                | 70.8 82.6 75.9 84.9 79.6 80.8 73.4 78.3
O1 | mcse/wiki+flickr/roberta/longest | MCSE-RoBERTa (reproduced) | 73.8 82.2 75.1 83.0 78.7 83.0 71.5 78.2
O1 | mcseo/wiki+flickr/roberta        | MCSEO-RoBERTa             | 74.1 82.8 76.7 83.6 80.3 83.3 72.0 79.0
""",
)

# ---- VisualCSE / AudioCSE (seed 004): Tables 1-2 (seed 42), Table 3 (5 seeds, avg only) ------

_V1, _A2 = f"{NONLING_PAPER}, Table 1", f"{NONLING_PAPER}, Table 2"
_V3 = f"{NONLING_PAPER}, Table 3"

_NONLING_ROWS = _rows(
    {"V1": _V1, "A2": _A2},
    """
V1 | visualcse/bert    | VisualCSE-BERT-base    | 71.16 83.29 75.13 81.59 80.05 80.03 71.23 77.50
V1 | visualcse/roberta | VisualCSE-RoBERTa-base | 70.41 83.51 74.87 82.79 81.67 81.89 69.95 77.87
A2 | audiocse/bert     | AudioCSE-BERT-base     | 71.65 84.27 76.69 83.22 78.69 79.94 70.49 77.85
A2 | audiocse/roberta  | AudioCSE-RoBERTa-base  | 68.44 83.96 75.77 82.38 82.07 81.63 70.56 77.83
""",
)
#: SimCSE in the VisualCSE/AudioCSE setting (1 epoch), the rows their tables compare against
_NONLING_SIMCSE = {
    "bert": row("SimCSE-BERT-base", _V1, "68.40 82.41 74.38 80.91 78.56 76.85 72.23 76.25", 1),
    "roberta": row(
        "SimCSE-RoBERTa-base", _V1, "70.16 81.77 73.24 81.36 80.65 80.22 68.56 76.57", 1
    ),
}
_NONLING_REPEATED = {
    "visualcse/bert": avg_only("VisualCSE-BERT-base", _V3, "76.96±0.38", 5),
    "visualcse/roberta": avg_only("VisualCSE-RoBERTa-base", _V3, "77.74±0.25", 5),
}
_NONLING_SIMCSE_REPEATED = {
    "bert": avg_only("SimCSE-BERT-base", _V3, "75.74±0.90", 5),
    "roberta": avg_only("SimCSE-RoBERTa-base", _V3, "76.36±0.18", 5),
}


def _build_published() -> dict[str, tuple[Published, ...]]:
    seeds_of = {_T1: 5, _T7: 5, _KD: 5, _D1: 5, _O1: None, _V1: 1, _A2: 1}
    out: dict[str, tuple[Published, ...]] = {}
    for table in (_MCSE_ROWS, _DALR_ROWS, _MCSEO_ROWS, _NONLING_ROWS):
        for name, (label, source, text) in table.items():
            out[name] = (row(label, source, text, seeds_of[source]),)
    gao = {
        "simcse/wiki/bert": "68.4 82.4 74.4 80.9 78.6 76.9 72.2 76.3",
        "simcse/wiki/roberta": "70.2 81.8 73.2 81.4 80.7 80.2 68.6 76.6",
    }
    for name, text in gao.items():
        label = out[name][0].label + "◊"
        out[name] += (row(label, _GAO, text, 1),)
    for name, repeated in _NONLING_REPEATED.items():
        out[name] += (repeated,)
    return out


#: recipe name → its published rows (the first is what ``recipes run`` reports deltas against)
PUBLISHED: dict[str, tuple[Published, ...]] = _build_published()


# ---- ablations: recipe name → ``--drop`` spec → published rows of that reduced method ---------

_DALR_T3, _DALR_T8 = f"{DALR_PAPER}, Table 3", f"{DALR_PAPER}, Table 8 (App. E.1)"
#: DALR's ablation rows in the paper's order, as ``--drop`` specs of the ``dalr`` method. In the
#: released composition the image–text term sits inside the λ bracket (``image_text_in_cross_modal``),
#: so "w/o L_CML" — which keeps ℓ_Info — drops the bracket's own terms, not ``cross_modal`` (whose
#: weight λ would zero the image–text term too).
_DALR_ABLATION_SPECS = (
    ("image_text", "w/o L_Info"),
    ("consistency+cma", "w/o L_CML"),
    ("consistency", "w/o L_consistency"),
    ("cma", "w/o L_CMA"),
    ("intra_modal", "w/o L_IML"),
    ("rank", "w/o L_rank"),
    ("ima", "w/o L_IMA"),
    ("intra_modal+consistency+cma", "w/o L_IML & L_CML"),
)
_DALR_ABLATION_AVGS = {
    # full method first, then the rows above (STS Avg. ± std over 5 runs)
    ("dalr/wiki+flickr/bert", _DALR_T3): (
        "79.49±0.7 78.24±0.9 78.16±0.8 79.15±0.7 78.61±0.3 78.82±0.4 79.06±0.6 78.91±0.8 77.17±0.7"
    ),
    ("dalr/wiki+coco/bert", _DALR_T8): (
        "78.64±0.9 77.20±1.0 77.48±0.6 78.19±0.4 77.85±0.5 77.89±0.8 78.31±1.1 78.07±0.9 76.75±0.6"
    ),
}


def _build_ablations() -> dict[str, dict[str, tuple[Published, ...]]]:
    out: dict[str, dict[str, tuple[Published, ...]]] = {}
    for (recipe, source), text in _DALR_ABLATION_AVGS.items():
        full, *rows = text.split()
        specs = (("", "DALR"), *_DALR_ABLATION_SPECS)
        out[recipe] = {
            spec: (avg_only(label, source, cell, 5),)
            for (spec, label), cell in zip(specs, (full, *rows), strict=True)
        }
    # MCSE without ℓ^M is the SimCSE row of the same table and setting
    for name in _MCSE_ROWS:
        method, setting, model, *variant = name.split("/")
        if method == "mcse" and not variant:
            out.setdefault(name, {})["image_text"] = PUBLISHED[f"simcse/{setting}/{model}"]
    # MCSEO without the object–phrase term is its "MCSE (reproduced)" row
    for model in ("bert", "roberta"):
        mcseo = f"mcseo/wiki+flickr/{model}"
        out.setdefault(mcseo, {})["object_phrase"] = PUBLISHED[f"mcse/wiki+flickr/{model}/longest"]
        simcse = (_NONLING_SIMCSE[model],)
        out.setdefault(f"visualcse/{model}", {})["image"] = simcse + (
            _NONLING_SIMCSE_REPEATED[model],
        )
        out.setdefault(f"audiocse/{model}", {})["audio"] = (
            Published(simcse[0].label, _A2, simcse[0].mean, simcse[0].std, 1),
        )
    return out


#: recipe → drop spec (``""`` = the full method) → published rows; shown by ``mmcse ablate``
PUBLISHED_ABLATIONS: dict[str, dict[str, tuple[Published, ...]]] = _build_ablations()


# ---- the papers' tables: which recipes make up each, in the paper's order ---------------------


@dataclass(frozen=True)
class PaperTable:
    """A published table as ``mmcse recipes run TABLE`` trains it: its recipes in the paper's
    row order, and which row each is tested against (the paper's significance pairs: MCSE
    against SimCSE of the same setting and student, DALR against KDMCSE, MCSEO against MCSE)."""

    name: str
    source: str
    rows: tuple[str, ...]
    against: dict[str, str] = field(default_factory=dict)


def _rows_of(rows: dict[str, tuple[str, str, str]], source: str) -> tuple[str, ...]:
    return tuple(name for name, (_, where, _) in rows.items() if where == source)


def _pairs(rows: tuple[str, ...], method: str, baseline: str, suffix: str = "") -> dict:
    """``method/<setting>/<model>[/variant]`` → ``baseline/<setting>/<model><suffix>``, where that
    row is in the table."""
    out = {}
    for name in rows:
        head, _, tail = name.partition("/")
        setting_model = "/".join(tail.split("/")[:2])
        other = f"{baseline}/{setting_model}{suffix}"
        if head == method and other in rows:
            out[name] = other
    return out


def _dalr_table1() -> tuple[str, ...]:
    rows = ["simcse/wiki/bert", "simcse/wiki/roberta"]
    for setting in ("wiki+flickr", "wiki+coco"):
        for model in ("bert", "roberta"):
            rows += [f"{m}/{setting}/{model}" for m in ("simcse", "mcse", "kdmcse", "dalr")]
    return tuple(rows)


def _build_tables() -> dict[str, PaperTable]:
    mcse1, mcse7 = _rows_of(_MCSE_ROWS, _T1), _rows_of(_MCSE_ROWS, _T7)
    dalr1, mcseo1 = _dalr_table1(), tuple(_MCSEO_ROWS)
    tables = [
        PaperTable("mcse:table1", _T1, mcse1, _pairs(mcse1, "mcse", "simcse")),
        PaperTable("mcse:table7", _T7, mcse7, _pairs(mcse7, "mcse", "simcse")),
        PaperTable("dalr:table1", _D1, dalr1, _pairs(dalr1, "dalr", "kdmcse")),
        PaperTable("mcseo:table1", _O1, mcseo1, _pairs(mcseo1, "mcseo", "mcse", "/longest")),
        PaperTable("visualcse:table1", _V1, _rows_of(_NONLING_ROWS, _V1)),
        PaperTable("audiocse:table2", _A2, _rows_of(_NONLING_ROWS, _A2)),
    ]
    return {table.name: table for table in tables}


#: table name (``paper:tableN``) → its recipes in the paper's order; ``mmcse recipes list
#: --tables`` lists them, ``mmcse recipes run TABLE`` trains them
PAPER_TABLES: dict[str, PaperTable] = _build_tables()
