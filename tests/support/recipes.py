"""One recipe's seeds run and recorded, as ``mmcse recipes run`` does for each row of its table
(:mod:`mmcse.recipes.table_run`, through :mod:`mmcse.recipes.runner`): the tests' shortcut."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mmcse.recipes.recipe import Recipe, RecipeRunSpec
from mmcse.recipes.runs import RecipeOutcome, record_recipe, run_seeds


def run_recipe(
    recipe: Recipe,
    spec: RecipeRunSpec,
    output_dir: str | Path,
    on_run: Callable[[str, int, str], None] | None = None,
) -> RecipeOutcome:
    """Run the seeds (:func:`~mmcse.recipes.runs.run_seeds`: finished ones skipped, stopped ones
    resumed) and write the recipe record into ``output_dir``
    (:func:`~mmcse.recipes.runs.record_recipe`)."""
    spec = spec.for_recipe(recipe)
    runs = run_seeds(recipe, spec, output_dir, on_run=on_run)
    return record_recipe(recipe, spec, output_dir, runs)
