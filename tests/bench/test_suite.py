"""``mmcse bench all``: structure of its JSON/Markdown, the counted FLOPs, the timing helper.

No timing thresholds: every assertion holds on any machine, however loaded.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mmcse.bench import flops, timing
from mmcse.bench import suite as bench_suite
from mmcse.errors import MmcseError

SENTEVAL_MINI = Path(__file__).parents[1] / "fixtures" / "senteval_mini"


# ---- counted FLOPs -------------------------------------------------------------------------


def test_train_step_flops_match_a_hand_count_for_the_tiny_config():
    # tiny: h=32, 2 layers, FFN 64; batch 8, length 16, two dropout views
    shape = flops.EncoderShape.of(
        {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64}
    )
    # per layer: Q, K, V, O = 4 * 32 * 32 = 4096 weights; FFN = 2 * 32 * 64 = 4096 weights
    assert shape.matmul_params == 2 * (4096 + 4096) == 16384
    tokens = 2 * 8 * 16  # 256 tokens through the encoder per step
    # forward: 2 FLOPs per weight per token, + QK^T and A.V: 2 * (2 * 16 * 32) per token per layer
    forward = 2 * 16384 * tokens + 2 * (4 * 16 * 32) * tokens
    assert forward == 8_388_608 + 1_048_576
    # backward = 2 x forward, so a training step is 3 x forward
    assert flops.train_step_flops(shape, batch=8, seq_len=16) == 3 * forward == 28_311_552


def test_bert_base_step_flops_are_the_6nd_rule_plus_attention():
    shape = flops.EncoderShape(hidden=768, layers=12, ffn=3072)
    assert shape.matmul_params == 84_934_656  # BERT-base without embeddings and pooler
    tokens = 2 * 64 * 32
    expected = 6 * 84_934_656 * tokens + 12 * 12 * 768 * 32 * tokens
    assert flops.train_step_flops(shape, 64, 32) == expected


def test_mfu_needs_a_peak_and_cpu_has_none_unless_declared():
    assert flops.peak_flops("cpu")[0] is None
    assert "n/a on CPU" in flops.peak_flops("cpu")[1]
    peak, source = flops.peak_flops("cpu", declared_tflops=2.0)
    assert peak == 2e12 and "declared" in source
    assert flops.mfu(10**12, 1.0, None) is None
    assert flops.mfu(10**12, 0.5, 4e12) == pytest.approx(0.5)


def test_peak_table_matches_specific_names_before_general_ones():
    names = [key for key, _ in flops.PEAK_BF16_FLOPS]
    assert names.index("H100 PCIe") < names.index("H100")
    assert names.index("A100") < names.index("A10")
    assert names.index("L40S") < names.index("L4")


# ---- timing helper -------------------------------------------------------------------------


def test_repeat_drops_warmup_and_reports_the_median():
    calls = []
    result = timing.repeat(lambda: calls.append(1), "cpu", warmup=2, repeats=3)
    assert len(calls) == 5 and len(result.samples) == 3
    assert result.seconds == sorted(result.samples)[1]
    with pytest.raises(MmcseError):
        timing.repeat(lambda: None, repeats=0)


def test_steady_rate_leaves_out_the_first_batch():
    def batches():
        time.sleep(0.05)  # start-up, excluded
        yield 100
        for _ in range(2):
            time.sleep(0.01)
            yield 10

    rate = timing.steady_rate(batches())
    assert rate < 20 / 0.019  # 20 items counted over at least two 10 ms sleeps
    with pytest.raises(MmcseError):
        timing.steady_rate(iter([]))


def test_timed_result_returns_the_value():
    value, seconds = timing.timed_result(lambda: 42)
    assert value == 42 and seconds >= 0
    assert timing.peak_memory_bytes("cpu") is None


# ---- the suite -----------------------------------------------------------------------------


def test_suite_options_reject_bad_values_in_one_line():
    with pytest.raises(MmcseError, match="--size"):
        bench_suite.SuiteOptions(size="huge")
    with pytest.raises(MmcseError, match="unknown section"):
        bench_suite.SuiteOptions(sections=("train", "warp"))
    if not torch.cuda.is_available():
        with pytest.raises(MmcseError, match="no CUDA"):
            bench_suite.SuiteOptions(device="cuda")


def test_train_choices_are_checked_and_default_to_the_device_s_step():
    assert bench_suite.SuiteOptions().capture == ("off",)
    with pytest.raises(MmcseError, match="'compiled'"):
        bench_suite.SuiteOptions(capture=("off", "compiled"))
    with pytest.raises(MmcseError, match="'imdb'"):
        bench_suite.SuiteOptions(lengths="imdb")


@pytest.mark.slow
def test_bench_all_tiny_writes_json_and_markdown(tmp_path):
    from cli import app

    out = tmp_path / "bench" / "results-cpu.json"
    args = ["bench", "all", "--size", "tiny", "--device", "cpu", "--out", str(out)]
    args += ["--method", "simcse", "--method", "mcse", "--eval-data", str(SENTEVAL_MINI)]
    args += ["--lengths", "full", "--packing", "off,on"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(bench_suite.SECTIONS) <= set(data)
    meta = data["meta"]
    assert meta["device"] == "cpu" and meta["size"] == "tiny" and meta["torch"]
    assert set(meta["section_seconds"]) == set(bench_suite.SECTIONS)

    for teacher in bench_suite.IMAGE_TEACHERS:
        rates = data["extract"][teacher]["images_per_s"]
        assert set(rates) == {"decode", "teacher", "end-to-end"}
        assert all(r > 0 for r in rates.values())
    assert data["extract"]["clip-vit-l14"]["text_sentences_per_s"] > 0
    assert data["text"]["simcse"]["sentences_per_s"] > 0
    assert len(data["objects"]["stages"]) == 3
    assert data["objects"]["combined_images_per_s_serial_sum"] > 0

    train = data["train"]
    assert train["peak_flops"] is None and "n/a" in train["peak_source"]
    for batch in (8, 16):
        assert list(train[f"batch_{batch}"]) == ["off", "off+packed"]
        for side, methods in train[f"batch_{batch}"].items():
            assert list(methods) == ["simcse", "mcse"]
            assert methods["simcse"]["ratio"] == 1.0
            for r in methods.values():
                assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["mfu"] is None
                assert 0 <= r["data_wait_share"] < 1 and r["peak_memory_bytes"] is None
                assert r["ops_per_step"] > 0 and r["step"] == "off"
                assert r["ops_outside_graphs"] == r["ops_per_step"]  # eager: no graph
                low, high = r["ratio_range"]
                assert low <= r["ratio"] <= high
            # MCSE adds a term to SimCSE's: strictly more operators per step (deterministic)
            assert methods["mcse"]["ops_per_step"] > methods["simcse"]["ops_per_step"], side
        for r in train[f"batch_{batch}"]["off"].values():
            assert r["mean_width"] == 16  # --lengths full: the captions fill max length exactly
            assert r["flops_per_step"] == flops.train_step_flops(
                flops.EncoderShape(32, 2, 64), batch, 16
            )

    assert data["dev_eval"]["seconds"] > 0 and data["dev_eval"]["seconds_unprepared"] > 0
    assert data["dev_eval"]["forwards"] > 0 and data["dev_eval"]["computed_tokens"] > 0
    assert 0 < data["dev_eval"]["share_every_125_steps_derived"] < 1
    assert data["sts_eval"]["seconds"] > 0 and data["sts_eval"]["sentences_encoded"] > 0

    versus = data["versus_st"]  # skipped where sentence-transformers' Trainer is not installed
    assert "skipped" in versus or min(versus["mmcse_steps_per_s"], versus["st_steps_per_s"]) > 0

    markdown = out.with_suffix(".md").read_text()
    for heading in ("## Image extraction", "## Objects", "### batch 8, off+packed step",
                    "## STS-B dev evaluation", "## STS 7-task evaluation",
                    "## SimCSE training: mmcse vs"):  # fmt: skip
        assert heading in markdown
    assert "| mcse |" in markdown and "n/a" in markdown
    assert math.isfinite(data["train"]["batch_8"]["off+packed"]["mcse"]["ratio"])
