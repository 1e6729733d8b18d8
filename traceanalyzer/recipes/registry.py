"""All bundled recipes, by name."""

from __future__ import annotations

from traceanalyzer.hints import did_you_mean
from traceanalyzer.recipes.model import Recipe

__all__ = ["RECIPES", "get_recipe", "recipe_names"]


def _load() -> dict[str, Recipe]:
    from traceanalyzer.recipes import graph_capture_repeat, mooncake_store_transfer, serving_window

    recipes = (graph_capture_repeat.RECIPE, mooncake_store_transfer.RECIPE, serving_window.RECIPE)
    return {r.name: r for r in recipes}


RECIPES: dict[str, Recipe] = _load()


def recipe_names() -> list[str]:
    return sorted(RECIPES)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``KeyError`` with the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        hint = did_you_mean(name, recipe_names()) or f"; known: {', '.join(recipe_names())}"
        raise KeyError(f"no recipe {name!r}{hint}") from None
