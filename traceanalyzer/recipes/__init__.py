"""Bundled vLLM launch recipes that reproduce known Ascend problems and profile them.

Python API (the CLI ``traceanalyzer recipe ...`` is a thin shell over it)::

    from traceanalyzer.recipes import list_recipes, get_recipe, render
    render("graph-capture-repeat", "out/gcr", {"rounds": "20"})

Nothing in this package imports torch, torch_npu, vllm or vllm_ascend. The hook scripts under
``templates/`` run on the Ascend host only and import those lazily.
"""

from __future__ import annotations

from traceanalyzer.recipes.model import Recipe
from traceanalyzer.recipes.params import Param, ParamError
from traceanalyzer.recipes.registry import get_recipe, recipe_names
from traceanalyzer.recipes.render import Rendered, RenderError, render

__all__ = [
    "Param",
    "ParamError",
    "Recipe",
    "RenderError",
    "Rendered",
    "get_recipe",
    "list_recipes",
    "recipe_group",
    "render",
]


def list_recipes() -> list[Recipe]:
    """All bundled recipes, sorted by name."""
    return [get_recipe(n) for n in recipe_names()]


def __getattr__(name: str):  # noqa: ANN202 - lazy: keep `import traceanalyzer.recipes` free of click
    if name == "recipe_group":
        from traceanalyzer.recipes.cli import recipe_group

        return recipe_group
    raise AttributeError(name)
