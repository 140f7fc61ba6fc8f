"""Where a ``--model`` argument points: a local path that does not exist is refused at once,
naming it (never 30 s of hub retries); a bare hub id goes to the hub, and an offline or
unreachable hub is one line after at most one short probe. The same rule for eval, export and
train."""

from __future__ import annotations

import socket

import pytest
from support.cli import assert_one_error, run_main

from mmcse.errors import MmcseError
from mmcse.hub import local_or_hub_id, missing_path_message
from mmcse.model import SentenceEncoder

HUB_ID = "mmcse-test-org/no-such-model"


@pytest.fixture
def no_network(monkeypatch):
    """Every connection attempt is recorded and fails; no model may load."""
    calls = []

    def unreachable(address, timeout=None, *args, **kwargs):
        calls.append(address)
        raise OSError(-2, "Name or service not known")

    def no_load(*args, **kwargs):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(SentenceEncoder, "from_pretrained", classmethod(no_load))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    return calls


@pytest.mark.parametrize(
    "text", ["./runs/mcse-flikr", "../x", "~/no-such-run", "/no/such/run", "a/b/c", "run/", "x y"]
)
def test_a_path_like_name_that_does_not_exist_is_refused(text):
    with pytest.raises(MmcseError, match="no such folder"):
        local_or_hub_id(text)


def test_a_name_whose_first_folder_exists_is_a_path_and_a_bare_id_is_a_hub_id(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert local_or_hub_id("bert-base-uncased") == "bert-base-uncased"
    assert local_or_hub_id("runs/mcse-flikr") == "runs/mcse-flikr"  # no runs/ here: a hub id
    (tmp_path / "runs").mkdir()
    assert missing_path_message("runs/mcse-flikr") == (
        "runs/mcse-flikr: no such folder (a local path, not a hub id); runs has no 'mcse-flikr'"
    )
    assert missing_path_message("princeton-nlp/unsup-simcse-bert-base-uncased") is None


@pytest.mark.parametrize("command", ["eval", "export", "train"])
def test_a_typo_in_a_local_run_path_is_one_line_without_the_hub(
    command, tmp_path, monkeypatch, capsys, no_network, tiny_world
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    typo = "./runs/mcse-flikr"
    args = {
        "eval": ["eval", "--model", typo],
        "export": ["export", typo, str(tmp_path / "out")],
        "train": ["train", "--model", typo, "--text-corpus", tiny_world["text"],
                  "--output-dir", str(tmp_path / "run")],
    }[command]  # fmt: skip
    code, stderr = run_main(args, monkeypatch, capsys)
    assert_one_error(code, stderr, typo, "no such folder")
    assert no_network == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing written


def test_eval_of_a_hub_id_offline_is_one_line_without_a_connection(monkeypatch, capsys, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, stderr = run_main(["eval", "--model", HUB_ID], monkeypatch, capsys)
    assert_one_error(code, stderr, HUB_ID, "HF_HUB_OFFLINE", "--model DIR")
    assert no_network == []


def test_eval_of_a_hub_id_with_no_network_is_one_probe_and_one_line(
    monkeypatch, capsys, no_network
):
    code, stderr = run_main(["eval", "--model", HUB_ID], monkeypatch, capsys)
    assert_one_error(code, stderr, HUB_ID, "cannot be reached")
    assert len(no_network) == 1  # one short probe, not the hub client's retries


def test_a_sentencepiece_only_tokenizer_loads_or_names_the_package(tmp_path):
    """A DeBERTa-v3-style folder with ``spm.model`` and no ``tokenizer.json`` (built offline with
    protobuf): converted where ``sentencepiece`` is installed, else one line naming it (not
    transformers' fallback asking for tiktoken)."""
    import importlib.util

    from transformers.utils import sentencepiece_model_pb2_new as spm

    from mmcse.hub import load_tokenizer

    model = spm.ModelProto()
    model.trainer_spec.model_type, model.trainer_spec.unk_id = 1, 1  # Unigram
    for piece, kind in [("[PAD]", 3), ("[UNK]", 2), ("[CLS]", 3), ("[SEP]", 3), ("▁a", 1),
                        ("▁man", 1), ("a", 1), ("m", 1), ("n", 1)]:  # fmt: skip
        entry = model.pieces.add()
        entry.piece, entry.score, entry.type = piece, -1.0, kind
    (tmp_path / "spm.model").write_bytes(model.SerializeToString())
    (tmp_path / "config.json").write_text('{"model_type": "deberta-v2"}')
    (tmp_path / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "DebertaV2Tokenizer", "vocab_file": "spm.model"}'
    )
    if importlib.util.find_spec("sentencepiece") is not None:
        assert load_tokenizer(str(tmp_path))("a man")["input_ids"]
        return
    with pytest.raises(MmcseError, match="pip install sentencepiece"):
        load_tokenizer(str(tmp_path))
