"""``traceanalyzer rules ...``: list, explain, scaffold and test rules.

The main CLI registers :data:`rules_group`; ``traceanalyzer run`` calls
:func:`~traceanalyzer.engine.runner.evaluate` and
:func:`~traceanalyzer.engine.runner.write_findings_json` (re-exported here).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from traceanalyzer.engine.config import ConfigError, configured_rule_dirs, load_run_rules
from traceanalyzer.engine.docs import explain_rule
from traceanalyzer.engine.loader import FIXTURES_DIR, LoadedRules
from traceanalyzer.engine.registry import UnknownRuleError
from traceanalyzer.engine.ruletest import run_rule_fixtures
from traceanalyzer.engine.runner import RunResult, evaluate, write_findings_json
from traceanalyzer.engine.scaffold import declared_ids, scaffold_rule

__all__ = ["RunResult", "evaluate", "rules_group", "write_findings_json"]

rules_dir_option = click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Extra rule folder (repeatable).",
)


def _load(rule_dirs: tuple[Path, ...]) -> LoadedRules:
    """The rules: built-in, ``--rules`` folders, the config file's ``rule_dirs``, rule packs."""
    try:
        loaded = load_run_rules(rule_dirs)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for error in loaded.errors:
        click.secho(f"error loading {error.source}: {error.error}", fg="red", err=True)
    return loaded


@click.group("rules")
def rules_group() -> None:
    """List, explain, scaffold and test rules."""


@rules_group.command("list")
@rules_dir_option
def list_rules(rule_dirs: tuple[Path, ...]) -> None:
    """Every loaded rule: id, name, severity and summary."""
    loaded = _load(rule_dirs)
    width = max((len(r.name) for r in loaded.rules), default=4)
    for rule in loaded.rules:
        click.echo(f"{rule.id}  {rule.name:<{width}}  {rule.severity:<7}  {rule.summary}")


@rules_group.command("explain")
@click.argument("name")
@rules_dir_option
def explain(name: str, rule_dirs: tuple[Path, ...]) -> None:
    """Print a rule's documentation and parameters (NAME is an id or a name)."""
    loaded = _load(rule_dirs)
    try:
        rule = loaded.rules.get(name)
    except UnknownRuleError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(explain_rule(rule))


@rules_group.command("new")
@click.argument("name")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("rules"),
    show_default=True,
    help="Folder to create the rule in.",
)
@click.option("--id", "rule_id", default=None, help="Rule id (default: next free TA1xx).")
@rules_dir_option
def new(name: str, folder: Path, rule_id: str | None, rule_dirs: tuple[Path, ...]) -> None:
    """Scaffold rule NAME (kebab-case): detection, figure, key figures, marks, fixtures.

    The id is the first TA1xx that no loaded rule uses (built-in, --rules folders, the config
    file's rule_dirs, installed rule packs, and the rule files of --dir).
    """
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name):
        raise click.BadParameter("use kebab-case, e.g. slow-host-launch", param_hint="NAME")
    folders = [*rule_dirs, *([folder] if folder.is_dir() else [])]
    loaded = _load(tuple(folders))
    taken = {r.id for r in loaded.rules} | declared_ids([*folders, *configured_rule_dirs(None)])
    if rule_id is not None and rule_id in taken:
        raise click.BadParameter(f"{rule_id} is already used by a loaded rule", param_hint="--id")
    try:
        rule_file, fixture_file = scaffold_rule(name, folder, rule_id=rule_id, taken_ids=taken)
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"created {rule_file}")
    click.echo(f"created {fixture_file}")
    click.echo(f"next: edit both, then `traceanalyzer rules test {name} --rules {folder}`")


@rules_group.command("test")
@click.argument("name", required=False)
@rules_dir_option
@click.option("--update-snapshots", is_flag=True, help="Accept changed finding text.")
@click.option("-v", "--verbose", is_flag=True, help="Show every fixture, not only failures.")
def test(
    name: str | None, rule_dirs: tuple[Path, ...], update_snapshots: bool, verbose: bool
) -> None:
    """Run every rule (or NAME) against its fixtures; exit 1 on any failure."""
    loaded = _load(rule_dirs)
    try:
        rules = loaded.rules.select([name] if name else None)
    except UnknownRuleError as exc:
        raise click.ClickException(str(exc)) from None
    results, coverage = run_rule_fixtures(rules, update_snapshots=update_snapshots)
    failed = [r for r in results if not r.passed]
    for result in results:
        if result.passed and not verbose:
            continue
        mark = click.style("PASS", fg="green") if result.passed else click.style("FAIL", fg="red")
        note = f" [{result.fixture.expect}]"
        if result.snapshot in ("new", "updated"):
            note += f" (snapshot {result.snapshot})"
        click.echo(f"{mark} {result.label}{note}")
        for problem in result.problems:
            click.echo("    " + problem.replace("\n", "\n    "))
    new_snaps = [r for r in results if r.snapshot in ("new", "updated")]
    for result in new_snaps if not verbose else ():
        click.echo(f"snapshot {result.snapshot}: {result.label} (review it in {FIXTURES_DIR}/)")
    for problem in coverage:
        click.secho(f"COVERAGE {problem}", fg="red")
    load_failed = bool(loaded.errors)
    summary = f"{len(results) - len(failed)} passed, {len(failed)} failed"
    summary += f" ({len(rules)} rule(s))"
    bad = failed or coverage or load_failed
    click.secho(summary, fg="red" if bad else "green", bold=True)
    sys.exit(1 if bad else 0)
