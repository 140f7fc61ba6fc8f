"""Shared fixtures: tiny models built from configs and small cached worlds (no network)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from support.worlds import WORDS, sentences  # noqa: F401  (fixtures below use them)

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("MMCSE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip cleanly on a machine without a CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def session_project_cache(tmp_path_factory):
    """:func:`project_cache` for session-scoped fixtures (runs trained once for many tests)."""
    import mmcse.cache.tokens

    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("project-cache")
        patch.setattr(mmcse.cache.tokens, "FALLBACK_ROOT", root)
        yield root


@pytest.fixture(autouse=True)
def project_cache(tmp_path, monkeypatch) -> Path:
    """The project's cache root (``cache/`` under the working directory), where derived files of
    a user's own data go (:mod:`mmcse.cache.tokens`), moved into each test's own folder so no
    test writes into the checkout or shares a warm entry with another."""
    import mmcse.cache.tokens

    root = tmp_path / "project-cache"
    monkeypatch.setattr(mmcse.cache.tokens, "FALLBACK_ROOT", root)
    return root


@pytest.fixture
def library_log(caplog):
    """``library_log()``: the messages the library logged (``mmcse.*``, ``pipeline.*``, INFO and
    up) since the last call, one per line; the ``mmcse`` command shows them on stderr."""
    for name in ("mmcse", "pipeline"):
        caplog.set_level(logging.INFO, logger=name)

    def read() -> str:
        text = "\n".join(record.getMessage() for record in caplog.records)
        caplog.clear()
        return text

    return read


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from mmcse.tiny import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), texts=WORDS)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> dict[str, str]:
    """A text corpus (.txt), a caption corpus table and an image feature set keyed by image id."""
    from mmcse.cache import write_corpus, write_feature_set

    root = tmp_path_factory.mktemp("world")
    text = root / "wiki.txt"
    text.write_text("\n".join(sentences(96, seed=1)) + "\n")
    captions = sentences(64, seed=2)
    image_ids = [f"img{i // 2}" for i in range(len(captions))]  # two captions per image
    write_corpus(
        root / "captions",
        [f"{im}#{i % 2}" for i, im in enumerate(image_ids)],
        captions,
        image_ids=image_ids,
        dataset="tiny",
        split="train",
    )
    rng = np.random.default_rng(0)
    uniq = sorted(set(image_ids))
    write_feature_set(
        root / "image-feats",
        uniq,
        rng.standard_normal((len(uniq), 16)).astype(np.float16),
        kind="image",
        dim=16,
        dtype="float16",
        dataset="tiny",
        split="train",
        producer={"teacher": "random"},
    )
    return {
        "text": str(text),
        "captions": str(root / "captions"),
        "image": str(root / "image-feats"),
    }


@pytest.fixture
def hub_ids_resolve(monkeypatch):
    """A hub id passes the student check as if the hub answered (there is no network here): for
    dry runs of recipes whose own students are hub ids. Nothing is downloaded or loaded."""
    from mmcse.training import preflight

    monkeypatch.setattr(preflight, "check_hub_id", lambda name, flag="--model": None)


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading the student fails the test: a refusal must come before any model work."""
    from mmcse.model import SentenceEncoder

    def fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was refused")

    monkeypatch.setattr(SentenceEncoder, "from_pretrained", classmethod(fail))
