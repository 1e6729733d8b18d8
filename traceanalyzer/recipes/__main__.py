"""``python -m traceanalyzer.recipes doctor NAME --variant-only`` (used by rendered run.sh)."""

from traceanalyzer.recipes.cli import recipe_group

if __name__ == "__main__":
    recipe_group(prog_name="python -m traceanalyzer.recipes")
