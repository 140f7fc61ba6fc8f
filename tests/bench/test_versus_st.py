"""``mmcse bench all --sections versus_st``: mmcse's SimCSE step vs sentence-transformers' Trainer.

One tiny CPU run of the section (a few steps each side) serves every structural test; no timing
thresholds: rates are only required to be positive and consistent with what was timed.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from mmcse.bench import suite as bench_suite
from mmcse.bench import versus_st
from mmcse.cache import Corpus
from mmcse.errors import BadValueError

TINY = bench_suite.SUITE_SIZES["tiny"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The section's JSON and Markdown, and what the sentence-transformers side was given next to
    what the mmcse side's world holds (read while the section's world still exists)."""
    if versus_st.unavailable():
        pytest.skip(versus_st.unavailable())
    seen: dict = {}
    bench, dataset, model = (
        versus_st.bench_versus_st,
        versus_st.pair_dataset,
        versus_st.st_model,
    )

    def bench_spy(world, *args):
        seen["corpus_texts"] = Corpus.open(world.captions).texts
        seen["world_model"] = world.model
        return bench(world, *args)

    def dataset_spy(texts):
        seen["dataset"] = dataset(texts)
        return seen["dataset"]

    def model_spy(model_dir, seq_len, device):
        seen["st_model_dir"], seen["st_seq_len"] = model_dir, seq_len
        return model(model_dir, seq_len, device)

    out = tmp_path_factory.mktemp("versus") / "results.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(versus_st, "bench_versus_st", bench_spy)
        patch.setattr(versus_st, "pair_dataset", dataset_spy)
        patch.setattr(versus_st, "st_model", model_spy)
        options = bench_suite.SuiteOptions(size="tiny", sections=("versus_st",))
        bench_suite.run_suite(options, out)
    return json.loads(out.read_text()), out.with_suffix(".md").read_text(), seen


def test_both_sides_report_positive_rates_and_the_ratio_is_their_quotient(measured):
    data, _, _ = measured
    section = data["versus_st"]
    mmcse, st = section["mmcse"], section["sentence_transformers"]
    assert section["mmcse_steps_per_s"] == mmcse["steps_per_s"] > 0
    assert section["st_steps_per_s"] == st["steps_per_s"] > 0
    assert section["ratio_mmcse_over_st_derived"] == mmcse["steps_per_s"] / st["steps_per_s"]
    for side in (mmcse, st):  # the tiny size's steps, each rate = timed steps / timed seconds
        assert (side["steps"], side["warmup"]) == (TINY.steps, TINY.warmup)
        assert side["steps_per_s"] == pytest.approx(side["steps"] / side["seconds"])
    assert mmcse["first_step_s"] > 0  # the first warm-up step, timed apart (the compile)
    assert (section["batch"], section["seq_len"]) == (TINY.batches[0], TINY.seq_len)
    assert section["student"] == "tiny" and section["precision"] == "fp32"
    assert section["capture"] == "off"  # the CPU default --capture off: the eager step
    assert set(section["versions"]) == {"sentence_transformers", "transformers", "torch"}
    assert set(section["settings"]) == {"same", "mmcse", "sentence_transformers", "timing"}
    assert "versus_st" in data["meta"]["section_seconds"]


def test_sentence_transformers_trains_on_the_same_texts_and_student(measured):
    _, _, seen = measured
    texts = seen["corpus_texts"]
    assert len(texts) == TINY.batches[0] * (TINY.warmup + TINY.steps + 1)
    assert seen["dataset"].column_names == ["anchor", "positive"]
    assert list(seen["dataset"]["anchor"]) == texts  # (s, s) pairs of the mmcse corpus
    assert list(seen["dataset"]["positive"]) == texts
    assert seen["st_model_dir"] == seen["world_model"]
    assert seen["st_seq_len"] == TINY.seq_len


def test_both_sides_pad_to_the_same_width_and_st_runs_two_forwards(measured):
    data, _, _ = measured
    section = data["versus_st"]
    # the bench captions have exactly seq_len tokens: both sides' encoders see that width
    assert section["mmcse"]["mean_width"] == section["sentence_transformers"]["mean_width"]
    assert section["mmcse"]["mean_width"] == TINY.seq_len
    st = section["sentence_transformers"]
    assert st["encoder_forwards_per_step"] == 2  # anchor and positive columns apart
    assert st["bf16"] is False and st["rows"] == TINY.batches[0] * (TINY.warmup + TINY.steps + 1)


def test_markdown_shows_both_rates_and_names_the_ratio_derived(measured):
    data, markdown, _ = measured
    section = data["versus_st"]
    assert "## SimCSE training: mmcse vs sentence-transformers' Trainer" in markdown
    assert f"| mmcse | {section['mmcse_steps_per_s']:,.2f} |" in markdown
    assert f"| sentence-transformers | {section['st_steps_per_s']:,.2f} |" in markdown
    ratio = section["ratio_mmcse_over_st_derived"]
    assert f"mmcse ÷ sentence-transformers (derived): {ratio:.2f}x" in markdown


@pytest.mark.parametrize(
    ("module", "reason"),
    [("sentence_transformers", versus_st.ST_MISSING), ("accelerate", versus_st.TRAINER_MISSING)],
)
def test_the_section_skips_cleanly_without_the_trainer(module, reason, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # its import now raises ImportError
    out = tmp_path / "results.json"
    options = bench_suite.SuiteOptions(size="tiny", sections=("versus_st",))
    bench_suite.run_suite(options, out)
    assert json.loads(out.read_text())["versus_st"] == {"skipped": reason}
    assert f"skipped: {reason}" in out.with_suffix(".md").read_text()


def test_the_section_is_listed_and_rejects_too_few_steps(tmp_path):
    assert "versus_st" in bench_suite.SECTIONS
    assert "``versus_st``" in bench_suite.__doc__
    with pytest.raises(BadValueError, match="steps"):
        versus_st.bench_versus_st(None, 8, 16, "cpu", steps=2, warmup=0, capture="off")


def test_a_captured_step_warms_up_three_steps_and_the_trainer_as_many(monkeypatch, tmp_path):
    """Compile, CUDA graph record, first replay: none of them timed, on either side."""
    cfg = SimpleNamespace(
        caption_corpus="corpus", model=str(tmp_path / "student"), batch_size=8,
        max_seq_length=16, dropout=0.1, learning_rate=5e-5, adam_eps=1e-6, grad_clip=1.0,
        attn_implementation="sdpa",
    )  # fmt: skip
    warmups = {}

    def fake_mmcse(world, batch, seq_len, device, steps, warmup, capture):
        warmups["mmcse"] = warmup
        run = versus_st.MmcseRun(cfg, "bf16 autocast", "whole", True, 30.0)
        return versus_st.SideRate(10.0, steps / 10.0, steps, warmup, 16.0), run

    def fake_st(model_dir, texts, batch, seq_len, device, steps, warmup, precision, lr):
        warmups["st"] = warmup
        assert (model_dir, precision, lr) == (tmp_path / "student", "bf16 autocast", 5e-5)
        info = {"encoder_forwards_per_step": 2.0, "optimizer": "adamw", "max_grad_norm": 1.0}
        return versus_st.SideRate(4.0, steps / 4.0, steps, warmup, 16.0), {
            **info, "attention": "sdpa"
        }  # fmt: skip

    monkeypatch.setattr(versus_st, "mmcse_rate", fake_mmcse)
    monkeypatch.setattr(versus_st, "st_rate", fake_st)
    monkeypatch.setattr(versus_st, "corpus_texts", lambda corpus: ["w1 w2"] * 8)
    report = versus_st.bench_versus_st(None, 8, 16, "cuda", steps=5, warmup=1, capture="on")
    assert warmups == {"mmcse": 3, "st": 3}
    assert report["ratio_mmcse_over_st_derived"] == 2.5 and report["capture"] == "whole"
    assert report["mmcse"]["first_step_s"] == 30.0
    versus_st.bench_versus_st(None, 8, 16, "cpu", steps=5, warmup=1, capture="off")
    assert warmups == {"mmcse": 1, "st": 1}  # eager: the size's own warm-up
