"""``traceanalyzer recipe ...``: list, show, render and doctor the bundled vLLM launch recipes."""

from __future__ import annotations

import json
import sys

import click

from traceanalyzer.exitcodes import EXIT_OK, EXIT_USAGE, UsageFailure
from traceanalyzer.recipes.doctor import diagnose
from traceanalyzer.recipes.params import ParamError, parse_assignments
from traceanalyzer.recipes.registry import RECIPES, get_recipe, recipe_names
from traceanalyzer.recipes.render import RenderError, render
from traceanalyzer.recipes.versions import detect

__all__ = ["recipe_group"]


def _recipe_or_fail(name: str):  # noqa: ANN202
    try:
        return get_recipe(name)
    except KeyError as exc:
        raise click.UsageError(str(exc.args[0])) from None


@click.group("recipe")
def recipe_group() -> None:
    """Bundled vLLM launch recipes that reproduce known Ascend problems and profile them."""


@recipe_group.command("list")
def list_cmd() -> None:
    """List the recipes."""
    width = max(len(n) for n in RECIPES)
    for name in recipe_names():
        click.echo(f"{name.ljust(width)}  {RECIPES[name].summary}")


@recipe_group.command("show")
@click.argument("name")
def show_cmd(name: str) -> None:
    """What NAME reproduces, its parameters, and what to expect."""
    recipe = _recipe_or_fail(name)
    click.echo(f"{recipe.name}: {recipe.summary}\n")
    click.echo(click.wrap_text(recipe.reproduces, 96, preserve_paragraphs=True) + "\n")
    click.echo("Expect:")
    click.echo(click.wrap_text(recipe.expect, 96, "  ", "  ") + "\n")
    click.echo("Parameters (--set name=value):")
    for p in recipe.params:
        default = p.format_value(p.default)
        click.echo(f"  {p.name} ({p.type_label}; default {default!r})")
        click.echo(f"      {p.help}")
    click.echo("\nHook variants (picked by `traceanalyzer recipe doctor`):")
    for v in recipe.variants:
        rng = f">= {v.min_version}" + (f", < {v.max_version}" if v.max_version else "")
        click.echo(f"  {v.name}: vllm-ascend {rng}; {v.summary}")
    tested = ", ".join(f"{ver} ({var})" for ver, var in recipe.supported.items())
    click.echo(f"Checked against released vllm-ascend: {tested}")


@recipe_group.command("render")
@click.argument("name")
@click.option(
    "--out", "out", required=True, type=click.Path(file_okay=False), help="folder to write"
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a parameter (repeatable)",
)
@click.option(
    "--force",
    is_flag=True,
    help="replace a rendered recipe in --out (a folder holding anything else is refused)",
)
def render_cmd(name: str, out: str, assignments: tuple[str, ...], force: bool) -> None:
    """Write NAME as a self-contained folder with run.sh, scripts and configs."""
    _recipe_or_fail(name)
    try:
        rendered = render(name, out, parse_assignments(assignments), force=force)
    except ParamError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from None
    except RenderError as exc:
        raise UsageFailure(str(exc)) from None
    click.echo(f"rendered {name} into {rendered.out}")
    for rel in rendered.files:
        click.echo(f"  {rel}")
    click.echo(f"run it on the Ascend host: {rendered.out}/run.sh")


@recipe_group.command("doctor")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option(
    "--variant-only", is_flag=True, help="print only the chosen hook variant (for run.sh)"
)
def doctor_cmd(name: str | None, as_json: bool, variant_only: bool) -> None:
    """Detect vllm / vllm-ascend / torch_npu / CANN (without importing them) and pick hook variants."""
    recipes = [_recipe_or_fail(name)] if name else [RECIPES[n] for n in recipe_names()]
    if variant_only and len(recipes) != 1:
        raise click.UsageError("--variant-only needs a recipe NAME")
    env = detect()
    verdicts = [diagnose(r, env) for r in recipes]
    failed = any(not v.ok for v in verdicts)
    if variant_only:
        v = verdicts[0]
        if v.ok:
            click.echo(v.variant)
        else:
            for problem in v.problems:
                click.echo(f"{v.recipe}: {problem}", err=True)
        sys.exit(EXIT_USAGE if failed else EXIT_OK)
    if as_json:
        payload = {
            "versions": env.versions,
            "cann_source": env.cann_source,
            "recipes": [v.as_dict() for v in verdicts],
        }
        click.echo(json.dumps(payload, indent=2))
        sys.exit(EXIT_USAGE if failed else EXIT_OK)
    for key, value in env.versions.items():
        extra = f"  ({env.cann_source})" if key == "cann" and env.cann_source else ""
        click.echo(f"{key:12} {value or 'not found'}{extra}")
    click.echo("")
    for v in verdicts:
        state = f"OK, hook variant {v.variant}" if v.ok else "REFUSED"
        click.echo(f"{v.recipe}: {state}")
        for problem in v.problems:
            click.echo(f"  - {problem}")
        for note in v.notes:
            click.echo(f"  note: {note}")
    sys.exit(EXIT_USAGE if failed else EXIT_OK)
