"""Paper settings as named recipes: the type, the catalogue, seed runs and ablations.

:mod:`~mmcse.recipes.recipe` is the :class:`Recipe` type (what a paper row needs from the cache,
its training settings, its published numbers); :mod:`~mmcse.recipes.catalogue` registers every
row of the seed papers; :mod:`~mmcse.recipes.runs` trains one over seeds (finished seeds
skipped, stopped ones resumed) and says what a run changed from it; :mod:`~mmcse.recipes.runner`
plans and runs rows × seeds, for :mod:`~mmcse.recipes.table_run` (several recipes, or a paper's
table, into one table) and :mod:`~mmcse.recipes.ablate` (one recipe with loss terms switched off).

The names below load on first use (PEP 562), the registry's with the catalogue registered: the
command line imports :class:`~mmcse.recipes.recipe.RecipeRunSpec` for its flags, and building
the catalogue loads the methods (torch), which ``--help`` and an early error must not wait for.
"""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "RECIPES": "recipe",
    "get_recipe": "recipe",
    "Recipe": "recipe",
    "register": "recipe",
    "SeedRuns": "runs",
    "comparison_rows": "runs",
    "run_seeds": "runs",
}
#: names whose use needs every recipe registered
_REGISTRY = ("RECIPES", "get_recipe")

__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _REGISTRY:
        importlib.import_module(f"{__name__}.catalogue")  # importing registers every recipe
    value = getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    globals()[name] = value
    return value
