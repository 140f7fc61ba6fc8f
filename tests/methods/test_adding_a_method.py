"""README "Adding a method", followed to the letter: a throwaway loss and method written as the
README says train one step through :func:`mmcse.training.loop.train`, and a module that
registers nothing or that its package's ``__init__`` does not import fails here (else the
method would come back "unknown method" at the command line while every registry test passed).
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import pkgutil
import sys
import textwrap
from pathlib import Path

import pytest

import mmcse.losses
import mmcse.methods
from mmcse.registry import LOSSES, METHODS, Registry
from mmcse.training.config import TrainConfig
from mmcse.training.loop import train

#: modules that hold shared code, not a registered loss or method
HELPERS = {"mmcse.losses": {"base", "heads"}, "mmcse.methods": {"base", "phrases"}}
REGISTRIES = {"mmcse.losses": LOSSES, "mmcse.methods": METHODS}


def imported_by_init(package) -> set[str]:
    """The submodules ``package/__init__.py`` imports (what ``import package`` registers)."""
    name = package.__name__
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == name:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(name + "."):
            found.add(node.module[len(name) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            prefix = name + "."
            found.update(
                a.name[len(prefix) :].split(".")[0] for a in node.names if a.name.startswith(prefix)
            )
    return found


def registration_gaps(package, registry: Registry, helpers: set[str]) -> list[str]:
    """Every module of ``package`` (helpers aside) that registers nothing in ``registry``, or
    that ``package/__init__.py`` does not import."""
    modules = {
        info.name: importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if info.name not in helpers
    }
    registered_in = {registry.get(n).__module__ for n in registry.names()}
    imported = imported_by_init(package)
    gaps = []
    for name, module in modules.items():
        if module.__name__ not in registered_in:
            gaps.append(f"{module.__name__} registers no {registry.kind}")
        elif name not in imported:
            gaps.append(f"{module.__name__} is not imported by {package.__name__}/__init__.py")
    return gaps


@pytest.mark.parametrize("package", [mmcse.losses, mmcse.methods], ids=lambda p: p.__name__)
def test_every_loss_and_method_module_registers_and_is_imported(package):
    name = package.__name__
    assert registration_gaps(package, REGISTRIES[name], HELPERS[name]) == []


@pytest.fixture
def clean_registries():
    """Whatever a test registers is gone afterwards."""
    saved = {reg: dict(reg._entries) for reg in (LOSSES, METHODS)}
    modules = set(sys.modules)
    yield
    for reg, entries in saved.items():
        reg._entries.clear()
        reg._entries.update(entries)
    for name in set(sys.modules) - modules:
        del sys.modules[name]


LOSS_FILE = '''
    """Cosine agreement of two dropout views (a throwaway loss for the README's recipe)."""

    import torch.nn.functional as F
    from torch import Tensor

    from mmcse.losses.base import Heads, Loss, LossInputs, project_views
    from mmcse.registry import register_loss


    @register_loss("throwaway_agreement")
    class ThrowawayAgreementLoss(Loss):
        """ℓ = scale · (1 − mean_i cos(h_i, h_i⁺)), ``h = MLP([CLS])`` of each view.

        Inputs: ``view1``, ``view2`` ``[B, H]``. Returns ``{"agreement_loss": scalar}``.
        """

        terms = ("agreement_loss",)
        slots = {"student": "mlp"}

        def __init__(self, scale: float = 1.0) -> None:
            super().__init__()
            self.scale = scale

        @staticmethod
        def compute_loss_from_embeddings(h1: Tensor, h2: Tensor, scale: float = 1.0) -> Tensor:
            return scale * (1 - F.cosine_similarity(h1, h2, dim=-1).mean())

        def forward(self, inputs: LossInputs, heads: Heads) -> dict[str, Tensor]:
            h1, h2 = project_views(heads["student"], inputs.view1, inputs.view2)
            return {"agreement_loss": self.compute_loss_from_embeddings(h1, h2, self.scale)}
'''

METHOD_FILE = '''
    """SimCSE plus a cosine-agreement term (a throwaway method for the README's recipe)."""

    from dataclasses import dataclass
    from typing import ClassVar

    from mmcse.losses.heads import HIDDEN, Head
    from mmcse.methods.base import Term
    from mmcse.methods.simcse import SimCSE
    from mmcse.registry import register_method


    @register_method("throwaway")
    @dataclass
    class Throwaway(SimCSE):
        """ℓ = ℓ^S + λ·ℓ_agree on every batch."""

        name: ClassVar[str] = "throwaway"
        agreement_weight: float = 0.5
        agreement_scale: float = 1.0

        def terms(self) -> list[Term]:
            heads = {"student": Head(HIDDEN, 16)}
            options = {"scale": self.agreement_scale}
            agree = Term(
                "agreement", "throwaway_agreement", self.agreement_weight, "all", options, heads
            )
            return [*super().terms(), agree]
'''


def write_module(package, name: str, source: str, folder: Path, monkeypatch) -> None:
    """``<package>/<name>.py`` (README steps 1 and 2), in a folder added to the package's path so
    the source tree is left alone."""
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])


def test_a_method_added_as_the_readme_says_trains_one_step(
    clean_registries, monkeypatch, tmp_path, tiny_model, tiny_world
):
    write_module(mmcse.losses, "throwaway_agreement", LOSS_FILE, tmp_path / "losses", monkeypatch)
    write_module(mmcse.methods, "throwaway", METHOD_FILE, tmp_path / "methods", monkeypatch)
    # steps 1 and 2 without the import line in __init__.py: the registration test says so
    for package in (mmcse.losses, mmcse.methods):
        name = package.__name__
        gaps = registration_gaps(package, REGISTRIES[name], HELPERS[name])
        assert len(gaps) == 1 and "is not imported by" in gaps[0]
    # ... and with it (the import is what registers), the method trains through the public entry
    cfg = TrainConfig(
        model=str(tiny_model),
        method="throwaway",
        text_corpus=tiny_world["text"],
        batch_size=8,
        max_steps=1,
        eval_data="",
        final_eval=False,
        log_every=1,
        device="cpu",
        output_dir=str(tmp_path / "run"),
    )
    result = train(cfg)
    [record] = [
        json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert record["step"] == 1
    assert math.isfinite(record["agreement_loss"]) and math.isfinite(record["simcse_loss"])
    assert record["loss"] == pytest.approx(record["simcse_loss"] + 0.5 * record["agreement_loss"])


def test_a_loss_module_that_registers_nothing_is_caught(clean_registries, monkeypatch, tmp_path):
    source = LOSS_FILE.replace('    @register_loss("throwaway_agreement")\n', "")
    write_module(mmcse.losses, "forgotten", source, tmp_path / "losses", monkeypatch)
    gaps = registration_gaps(mmcse.losses, LOSSES, HELPERS["mmcse.losses"])
    assert gaps == ["mmcse.losses.forgotten registers no loss"]
