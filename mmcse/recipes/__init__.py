"""Paper settings as named recipes: the type, the catalogue, seed runs and ablations.

:mod:`~mmcse.recipes.recipe` is the :class:`Recipe` type (what a paper row needs from the cache,
its training settings, its published numbers); :mod:`~mmcse.recipes.catalogue` registers every
row of the seed papers; :mod:`~mmcse.recipes.runs` trains one over seeds and says what a run
changed from it; :mod:`~mmcse.recipes.ablate` reruns it with loss terms switched off.
"""

from mmcse.recipes import catalogue  # noqa: F401  (importing registers every recipe)
from mmcse.recipes.recipe import RECIPES, Recipe, get_recipe, register
from mmcse.recipes.runs import SeedRuns, comparison_rows, run_recipe, run_seeds

__all__ = [
    "RECIPES",
    "Recipe",
    "SeedRuns",
    "comparison_rows",
    "get_recipe",
    "register",
    "run_recipe",
    "run_seeds",
]
