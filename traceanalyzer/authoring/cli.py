"""``traceanalyzer rules ...``: list, explain, scaffold and test rules.

The main CLI registers :data:`rules_group`; ``traceanalyzer run`` calls
:func:`~traceanalyzer.engine.runner.evaluate` and
:func:`~traceanalyzer.engine.runner.write_findings_json` (re-exported here).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceanalyzer.authoring.docs import explain_rule
from traceanalyzer.authoring.ruletest import run_rule_fixtures
from traceanalyzer.authoring.scaffold import USER_ID_START, declared_ids, scaffold_rule
from traceanalyzer.engine.config import (
    DEFAULT_RULES_DIR,
    ConfigError,
    configured_rule_dirs,
    default_rule_dirs,
    load_run_rules,
)
from traceanalyzer.engine.loader import (
    FIXTURES_DIR,
    LoadedRules,
    RulesNotLoaded,
    builtin_rules_dir,
)
from traceanalyzer.engine.registry import RuleSet, UnknownRuleError
from traceanalyzer.engine.rule import RULE_ID, RULE_NAME, Rule
from traceanalyzer.engine.runner import RunResult, evaluate, write_findings_json
from traceanalyzer.exitcodes import UsageFailure

__all__ = ["RunResult", "evaluate", "rules_group", "write_findings_json"]

# A rule's name becomes its file's (a folder entry holds 255 bytes) and is shown in every
# report's finding lines.
MAX_RULE_NAME = 64

rules_dir_option = click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Extra rule folder (repeatable; default: ./{DEFAULT_RULES_DIR} when it exists).",
)


def _load(rule_dirs: tuple[Path, ...], *, strict: bool = True) -> LoadedRules:
    """The rules: built-in, ``--rules`` folders (default ./traceanalyzer-rules), the config
    file's ``rule_dirs``, rule packs. A file that does not load is a usage error (exit 2) when
    ``strict``, else a warning."""
    rule_dirs, _ = default_rule_dirs(rule_dirs)
    try:
        loaded = load_run_rules(rule_dirs)
    except ConfigError as exc:
        raise UsageFailure(str(exc)) from None
    if loaded.errors and strict:
        raise UsageFailure(str(RulesNotLoaded(loaded.errors)))
    for error in loaded.errors:
        click.echo(f"warning: {error.source}: {error.error}", err=True)
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
    severities = max((len(r.severities) for r in loaded.rules), default=7)
    for rule in loaded.rules:
        click.echo(
            f"{rule.id}  {rule.name:<{width}}  {rule.severities:<{severities}}  {rule.summary}"
        )
        if rule.escalates_to:
            click.echo(f"{'':<{len(rule.id) + width + 4}}{rule.escalates_to} {rule.escalation}")


@rules_group.command("explain")
@click.argument("name")
@rules_dir_option
def explain(name: str, rule_dirs: tuple[Path, ...]) -> None:
    """Print a rule's documentation and parameters (NAME is an id or a name)."""
    loaded = _load(rule_dirs)
    try:
        rule = loaded.rules.get(name)
    except UnknownRuleError as exc:
        raise UsageFailure(str(exc)) from None
    click.echo(explain_rule(rule))


@rules_group.command("new")
@click.argument("name")
@click.option(
    "--rules",
    "rule_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Folder to write the rule into (default: ./{DEFAULT_RULES_DIR}); repeated, the "
    "rule goes into the first and the others are read so that its id and name are new.",
)
@click.option("--dir", "folder", hidden=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--id", "rule_id", default=None, help="Rule id (default: next free TA1xx).")
def new(name: str, rule_dirs: tuple[Path, ...], folder: Path | None, rule_id: str | None) -> None:
    """Scaffold rule NAME (kebab-case): detection, figure, key figures, marks, fixtures.

    NAME and the id must be new: no built-in rule, --rules folder, rule_dirs of the config
    file or installed rule pack may have them. The id is the first TA1xx that none uses.
    """
    if not RULE_NAME.match(name):
        raise click.BadParameter("use kebab-case, e.g. slow-host-launch", param_hint="NAME")
    if len(name) > MAX_RULE_NAME:
        raise click.BadParameter(
            f"{len(name)} characters: use at most {MAX_RULE_NAME}", param_hint="NAME"
        )
    if rule_id is not None:
        _check_id(rule_id)
    rule_dirs = (folder, *rule_dirs) if folder else rule_dirs  # --dir: what --rules was
    target = rule_dirs[0] if rule_dirs else DEFAULT_RULES_DIR
    builtin = builtin_rules_dir()
    if builtin is not None and target.resolve().is_relative_to(builtin.resolve()):
        raise UsageFailure(
            f"{target} is traceanalyzer's own folder of built-in rules; write yours into a "
            f"folder of your own: --rules DIR (default ./{DEFAULT_RULES_DIR})"
        )
    folders = [*rule_dirs[1:], *([target] if target.is_dir() else [])]
    loaded = _load(tuple(folders), strict=False)
    if name in loaded.rules:
        raise UsageFailure(
            f"a rule named {name!r} already exists: {_described(loaded.rules.get(name))}; "
            "choose another name"
        )
    taken = {r.id for r in loaded.rules} | declared_ids([*folders, *configured_rule_dirs(None)])
    if rule_id is not None and rule_id in taken:
        holder = _described(loaded.rules.get(rule_id)) if rule_id in loaded.rules else "a rule file"
        raise UsageFailure(
            f"--id {rule_id} is already used by {holder}; choose another id, or leave --id out"
        )
    try:
        rule_file, fixture_file = scaffold_rule(name, target, rule_id=rule_id, taken_ids=taken)
    except FileExistsError as exc:
        raise UsageFailure(f"{exc}; choose another name") from None
    except OSError as exc:
        raise UsageFailure(f"cannot write the rule into {target}: {exc}") from None
    click.echo(f"created {rule_file}")
    click.echo(f"created {fixture_file}")
    default = target.resolve() == DEFAULT_RULES_DIR.resolve()
    if default:
        click.echo(
            f"({target}/ is the default folder for your rules; --rules DIR writes elsewhere)"
        )
    click.echo(
        f"next: edit both, then `traceanalyzer rules test {name}"
        f"{'' if default else f' --rules {target}'}`"
    )
    click.echo(
        f'`run` picks it up with --rules {target} (or rule_dirs = ["{target}"] in '
        "traceanalyzer.toml)"
    )


def _check_id(rule_id: str) -> None:
    if not RULE_ID.match(rule_id):
        raise click.BadParameter("use 2-4 capitals and 3-4 digits, e.g. TA123", param_hint="--id")
    if rule_id.startswith("TA") and int(rule_id[2:]) < USER_ID_START:
        raise click.BadParameter(
            f"ids below TA{USER_ID_START} are reserved for built-in rules", param_hint="--id"
        )


def _described(rule: Rule) -> str:
    """``the built-in rule TA003 (rules/slow_rank.py)``, for a refusal."""
    builtin = builtin_rules_dir()
    where = rule.source or "an installed rule pack"
    kind = (
        "the built-in rule" if builtin and rule.source and rule.source.parent == builtin else "rule"
    )
    return f"{kind} {rule.id} ({where})"


@rules_group.command("test")
@click.argument("name", required=False)
@rules_dir_option
@click.option("--update-snapshots", is_flag=True, help="Accept changed finding text.")
@click.option("-v", "--verbose", is_flag=True, help="Show every fixture, not only failures.")
@click.option(
    "--all",
    "every_rule",
    is_flag=True,
    help="With --rules: test the built-in rules and rule packs too, not only the folder's.",
)
def test(
    name: str | None,
    rule_dirs: tuple[Path, ...],
    update_snapshots: bool,
    verbose: bool,
    every_rule: bool,
) -> None:
    """Run every rule (or NAME) against its fixtures; exit 1 on any failure. With a rule
    folder (--rules, or ./traceanalyzer-rules), only that folder's rules unless --all."""
    rule_dirs, _ = default_rule_dirs(rule_dirs)
    loaded = _load(rule_dirs)
    try:
        rules = loaded.rules.select([name] if name else None)
    except UnknownRuleError as exc:
        raise UsageFailure(str(exc)) from None
    if rule_dirs and not name and not every_rule:  # the author's rules, not 130 built-in fixtures
        folders = [d.resolve() for d in rule_dirs]
        rules = RuleSet(
            r
            for r in rules
            if r.source and any(r.source.resolve().is_relative_to(d) for d in folders)
        )
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
    summary = f"{len(results) - len(failed)} passed, {len(failed)} failed ({len(rules)} rule(s))"
    bad = failed or coverage
    click.secho(summary, fg="red" if bad else "green", bold=True)
    sys.exit(1 if bad else 0)
