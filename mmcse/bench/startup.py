"""Training start-up by corpus size: the token cache cold (written), warm (mapped) and off.

A start-up is the set-up of a :class:`~mmcse.training.loop.Trainer`: preflight, tokenizer and
student loading, the corpus opened, its token ids and the feature joins — everything before the
first step. Per corpus size it is measured three ways:

* ``cold``: the first run on the corpus, which writes its token-cache entry (:mod:`mmcse.cache.tokens`);
* ``warm``: every later run, seed, recipe and ablation, which maps the entry;
* ``off``: ``token_cache = "off"``, the corpus tokenised in memory at every start.

Start-up should not grow with the corpus once the cache is warm: ``warm_ratio_to_smallest``
(warm start-up at this size ÷ at the smallest size) is the figure to watch, ``build_s_derived``
(cold − warm) what writing the entry cost once. Corpora are synthetic English-like sentences of
8-24 words (:func:`mmcse.bench.extract.synthetic_captions`), one per line.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from pathlib import Path

from mmcse.bench.extract import synthetic_captions
from mmcse.bench.timing import timed
from mmcse.training.config import TOKEN_CACHE_OFF, TrainConfig

MODES = ("cold", "warm", "off")


def write_sentences(path: Path, count: int, seed: int = 0) -> Path:
    path.write_text("\n".join(synthetic_captions(count, seed)) + "\n", encoding="utf-8")
    return path


def startup_seconds(model: Path, corpus: Path, token_cache: str, out: Path, seq_len: int) -> float:
    """Wall seconds to set up a SimCSE :class:`~mmcse.training.loop.Trainer` on ``corpus``."""
    from mmcse.training.loop import Trainer

    cfg = TrainConfig(
        model=str(model),
        method="simcse",
        text_corpus=str(corpus),
        max_seq_length=seq_len,
        token_cache=token_cache,
        eval_data="",
        final_eval=False,
        device="cpu",
        output_dir=str(out),
    )
    seconds = timed(lambda: Trainer(cfg).setup())
    gc.collect()  # the run's student goes before the next one loads
    return seconds


def bench_startup(
    model: Path,
    sizes: Sequence[int],
    root: Path,
    seq_len: int = 32,
    echo: Callable[[str], None] = print,
) -> dict:
    """``{"sentences_N": {"cold_s", "warm_s", "off_s", "build_s_derived",
    "warm_ratio_to_smallest"}}`` for each size, smallest first."""
    out: dict = {}
    for count in sorted(sizes):
        corpus = write_sentences(root / f"sentences-{count}.txt", count)
        cache = root / f"tokens-{count}"
        seconds = {}
        for n, mode in enumerate(MODES):
            token_cache = TOKEN_CACHE_OFF if mode == "off" else str(cache)
            seconds[mode] = startup_seconds(
                model, corpus, token_cache, root / "runs" / f"{count}-{n}", seq_len
            )
        echo(
            f"start-up, {count:,} sentences: cold {seconds['cold']:.2f} s, warm "
            f"{seconds['warm']:.2f} s, cache off {seconds['off']:.2f} s"
        )
        out[f"sentences_{count}"] = {
            **{f"{mode}_s": value for mode, value in seconds.items()},
            "build_s_derived": seconds["cold"] - seconds["warm"],
        }
    smallest = out[f"sentences_{min(sizes)}"]["warm_s"]
    for row in out.values():
        row["warm_ratio_to_smallest"] = row["warm_s"] / smallest
    return out
