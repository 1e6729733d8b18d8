"""``traceanalyzer synth``: write synthetic torch_npu exports (a thin shell over :func:`generate`)."""

from __future__ import annotations

from pathlib import Path

import click

from traceanalyzer.hints import did_you_mean
from traceanalyzer.synth.generate import generate
from traceanalyzer.synth.profiles import GENERATIONS
from traceanalyzer.synth.scenarios import SCENARIOS


def _scenario_help() -> str:
    # "\b" keeps click from re-wrapping the list into one paragraph.
    return "\b\nScenarios:\n" + "\n".join(f"  {name}: {sc.help}" for name, sc in SCENARIOS.items())


def _parse_sets(values: tuple[str, ...]) -> dict[str, str]:
    knobs: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--set expects knob=value, got {item!r}")
        knobs[key.strip().replace("-", "_")] = value.strip()
    return knobs


@click.command("synth", epilog=_scenario_help())
@click.argument("scenario")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output root.",
)
@click.option(
    "--ranks",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rank directories to write.",
)
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same bytes.")
@click.option(
    "--generation", default="g2", show_default=True, type=click.Choice(sorted(GENERATIONS))
)
@click.option(
    "--level",
    default=1,
    show_default=True,
    type=click.IntRange(0, 2),
    help="Profiler level 0, 1 or 2.",
)
@click.option(
    "--target-mb",
    type=float,
    default=None,
    help="Pad with decode steps until trace_view.json ~ M MB.",
)
@click.option(
    "--profile-style",
    type=click.Choice(["events", "session"]),
    default=None,
    help="store-*: 'session' = the profiler wraps one transfer call (no span event, as in the Mooncake KV-pool TTFT report).",
)
@click.option(
    "--export",
    default="text",
    show_default=True,
    type=click.Choice(["text", "db", "both"]),
    help="torch_npu export type: text (trace_view.json, CSVs), db (ascend_pytorch_profiler_{rank}.db, analysis.db) or both.",
)
@click.option(
    "--set", "sets", multiple=True, metavar="KNOB=VALUE", help="Scenario knob; repeatable."
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace the rank directories synth wrote in --out before (other files stay; a rank "
    "directory synth did not write is refused).",
)
def synth_command(
    scenario: str,
    out: Path,
    ranks: int,
    seed: int,
    generation: str,
    level: int,
    target_mb: float | None,
    profile_style: str | None,
    export: str,
    sets: tuple[str, ...],
    force: bool,
) -> None:
    """Write SCENARIO as complete *_ascend_pt rank directories under --out.

    An --out that holds rank directories already is refused (the next run would read one mixed
    collection); --force replaces those synth wrote. Nothing else in --out is touched."""
    if scenario not in SCENARIOS:
        raise click.UsageError(
            f"unknown scenario {scenario!r}"
            + (
                did_you_mean(scenario, SCENARIOS)
                or f"; choose from: {', '.join(sorted(SCENARIOS))}"
            )
        )
    knobs = _parse_sets(sets)
    if profile_style is not None:
        knobs["profile_style"] = profile_style
    try:
        dirs = generate(
            scenario,
            out,
            ranks=ranks,
            seed=seed,
            generation=generation,
            level=level,
            target_mb=target_mb,
            export=export,
            force=force,
            **knobs,
        )
    except (KeyError, ValueError) as exc:
        raise click.UsageError(str(exc.args[0] if exc.args else exc)) from None
    for d in dirs:
        click.echo(str(d))


__all__ = ["synth_command"]
