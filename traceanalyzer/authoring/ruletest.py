"""Rule fixtures: small stores on which a rule must fire, stay silent, say it cannot decide, or
decline to evaluate.

Fixtures live beside the rule, in ``fixtures/<rule file name>.py`` (or in the rule file itself)::

    @fixture(expect="fire", ranks=[0], contains="grow from")
    def fire_linear_growth() -> Store: ...

    @fixture(expect="silent", params={"min_ratio": 5.0})   # per-fixture parameter overrides
    def silent_when_threshold_is_high() -> Store: ...

    @fixture(expect="not_evaluated", reason="no transfer spans")
    def not_evaluated_without_spans() -> Store: ...

    @fixture(expect="inconclusive", reason="a trend needs at least")   # ran, could not decide
    def inconclusive_with_few_captures() -> Store: ...

A "silent" fixture passes only if the rule *ran* and found nothing: a rule that was not
evaluated proves nothing about silence. The text of the findings of every "fire" fixture is
pinned in ``fixtures/snapshots/<rule name>/<fixture>.txt`` (a missing snapshot is written and
reported as new; ``--update-snapshots`` rewrites changed ones), so a change in wording or numbers
shows up in review, the way ruff's snapshot tests do.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from traceanalyzer.engine.loader import FIXTURES_DIR, import_file
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import Rule
from traceanalyzer.engine.runner import KEY_FIGURES_FAILED, RunResult, evaluate
from traceanalyzer.interrupts import contained
from traceanalyzer.store import Store

Expectation = Literal["fire", "silent", "inconclusive", "not_evaluated"]
SNAPSHOTS_DIR = "snapshots"


@dataclass(frozen=True)
class Fixture:
    """One case: how to build the store, what the rule must do on it, with which parameters."""

    name: str
    build: Callable[[], Store]
    expect: Expectation
    params: Mapping[str, Any] = field(default_factory=dict)
    ranks: tuple[int, ...] | None = None  # the ranks the grouped finding must name
    contains: tuple[str, ...] = ()  # substrings the finding text (or reason) must contain
    # the first finding's metrics: name -> (expected value, relative tolerance)
    metrics: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    cost: tuple[float, float] | None = None  # the first finding's cost (ns), and its tolerance
    snapshot: bool = True
    doc: str = ""


def fixture(
    *,
    expect: Expectation,
    params: Mapping[str, Any] | None = None,
    ranks: Sequence[int] | None = None,
    contains: str | Sequence[str] = (),
    reason: str | None = None,
    metrics: Mapping[str, tuple[float, float]] | None = None,
    cost: tuple[float, float] | None = None,
    snapshot: bool = True,
) -> Callable[[Callable[[], Store]], Fixture]:
    """Declare a fixture function (it returns a :class:`Store`). ``metrics``: what the first
    finding's metrics must be, each ``name: (value, relative tolerance)``; ``cost``: its cost
    in ns, the same way (within 20% of the truth the fixture was built with: ``(24e6, 0.2)``)."""
    if expect not in ("fire", "silent", "inconclusive", "not_evaluated"):
        raise ValueError(
            f"expect must be fire, silent, inconclusive or not_evaluated, not {expect!r}"
        )
    needles = (contains,) if isinstance(contains, str) else tuple(contains)
    if reason:
        needles += (reason,)

    def decorate(build: Callable[[], Store]) -> Fixture:
        return Fixture(
            name=build.__name__,
            build=build,
            expect=expect,
            params=dict(params or {}),
            ranks=tuple(ranks) if ranks is not None else None,
            contains=needles,
            metrics=dict(metrics or {}),
            cost=cost,
            snapshot=snapshot and expect == "fire",
            doc=(build.__doc__ or "").strip().splitlines()[0] if build.__doc__ else "",
        )

    return decorate


def fixture_file(rule: Rule) -> Path | None:
    if rule.source is None:
        return None
    return rule.source.parent / FIXTURES_DIR / rule.source.name


def fixtures_for(rule: Rule) -> list[Fixture]:
    """Fixtures defined in the rule's own module, then in ``fixtures/<rule file>``."""
    found: list[Fixture] = []
    module = sys.modules.get(getattr(rule.body, "__module__", ""), None)
    if module is not None and getattr(module, "__file__", None) == str(rule.source):
        found += [v for v in vars(module).values() if isinstance(v, Fixture)]
    path = fixture_file(rule)
    if path is not None and path.is_file():
        found += [
            v
            for v in vars(import_file(path, "traceanalyzer_fixtures")).values()
            if isinstance(v, Fixture)
        ]
    return found


def snapshot_path(rule: Rule, fix: Fixture) -> Path | None:
    if rule.source is None:
        return None
    return rule.source.parent / FIXTURES_DIR / SNAPSHOTS_DIR / rule.name / f"{fix.name}.txt"


def findings_text(result: RunResult) -> str:
    return "\n---\n".join(f.text() for f in result.findings)


@dataclass
class FixtureResult:
    rule: Rule
    fixture: Fixture
    passed: bool
    problems: list[str] = field(default_factory=list)
    snapshot: Literal["none", "match", "new", "updated"] = "none"

    @property
    def label(self) -> str:
        return f"{self.rule.name}::{self.fixture.name}"


def run_fixture(rule: Rule, fix: Fixture, *, update_snapshots: bool = False) -> FixtureResult:
    """Evaluate ``rule`` alone on the fixture's store and check the expectation."""
    outcome = FixtureResult(rule, fix, passed=True)
    problems = outcome.problems
    try:
        store = fix.build()
        result = evaluate(
            store, rules=RuleSet([rule]), overrides={rule.id: dict(fix.params)}, config_path=False
        )
    except BaseException as exc:  # a broken fixture or a bad parameter override
        if not contained(exc):
            raise
        outcome.passed = False
        problems.append(f"fixture raised {type(exc).__name__}: {exc}")
        return outcome
    status = result.rules[0]
    text = findings_text(result)
    if status.status == "error":
        problems.append(f"rule raised {status.error}\n{status.traceback or ''}")
    elif fix.expect == "fire":
        if not result.findings:
            why = f": {status.reason}" if status.reason else ""
            problems.append(f"expected a finding, rule was {status.status}{why}")
        else:
            first = result.findings[0]
            if fix.ranks is not None and first.ranks != list(fix.ranks):
                problems.append(f"expected ranks {list(fix.ranks)}, got {first.ranks}")
            problems += _metric_problems(first.metrics, fix.metrics)
            if fix.cost is not None:
                ns = first.cost.ns if first.cost else None
                problems += _metric_problems({"cost": ns}, {"cost": fix.cost})
    elif fix.expect == "silent":
        if status.status != "clean":
            detail = f"{len(result.findings)} finding(s)" if result.findings else status.reason
            problems.append(f"expected silence, rule was {status.status} ({detail})")
            if text:
                problems.append(text)
    elif status.status != fix.expect:
        problems.append(f"expected {fix.expect}, rule was {status.status}")
    # an escalation the rule does not declare would be missing from `rules list` and the docs
    problems += sorted({u for f in result.findings if (u := rule.undeclared(f.severity))})
    # key figures run on every fixture too: a crash there would only be a note in a real run
    problems += [n.text for n in status.notes if n.text.startswith(KEY_FIGURES_FAILED)]
    haystack = text if fix.expect == "fire" else (status.reason or "")
    problems += [f"text lacks {needle!r}" for needle in fix.contains if needle not in haystack]
    if not problems and fix.snapshot:
        _check_snapshot(outcome, text, update_snapshots)
    outcome.passed = not problems
    return outcome


def _metric_problems(
    got: Mapping[str, Any], expected: Mapping[str, tuple[float, float]]
) -> list[str]:
    """Each expected metric missing, or off its value by more than its relative tolerance."""
    problems = []
    for name, (value, tolerance) in expected.items():
        seen = got.get(name)
        if not isinstance(seen, int | float):
            problems.append(f"metric {name!r} missing (got {seen!r})")
        elif abs(seen - value) > tolerance * abs(value):
            problems.append(f"metric {name!r} is {seen:g}, not within {tolerance:.0%} of {value:g}")
    return problems


def _check_snapshot(outcome: FixtureResult, text: str, update: bool) -> None:
    path = snapshot_path(outcome.rule, outcome.fixture)
    if path is None:
        return
    old = path.read_text("utf-8") if path.exists() else None
    if old == text:
        outcome.snapshot = "match"
    elif old is None or update:  # a new snapshot is written, a changed one when asked
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, "utf-8")
        outcome.snapshot = "new" if old is None else "updated"
    else:
        diff = difflib.unified_diff(
            old.splitlines(), text.splitlines(), "snapshot", "now", lineterm=""
        )
        outcome.problems.append(
            f"finding text differs from {path} (accept with --update-snapshots):\n"
            + "\n".join(diff)
        )


def run_rule_fixtures(
    rules: RuleSet, *, update_snapshots: bool = False
) -> tuple[list[FixtureResult], list[str]]:
    """Run every fixture of every rule. Also returns coverage problems (fewer than two fire or
    two silent fixtures), which fail ``rules test`` like a failing fixture does."""
    results: list[FixtureResult] = []
    coverage: list[str] = []
    for rule in rules:
        try:
            fixtures = fixtures_for(rule)
        except BaseException as exc:  # a fixture file that fails to import, SystemExit too
            if not contained(exc):
                raise
            coverage.append(
                f"{rule.name}: fixtures could not be loaded ({type(exc).__name__}: {exc})"
            )
            continue
        for kind in ("fire", "silent"):
            count = sum(f.expect == kind for f in fixtures)
            if count < 2:
                coverage.append(f"{rule.name}: {count} {kind} fixture(s), need at least 2")
        results += [run_fixture(rule, f, update_snapshots=update_snapshots) for f in fixtures]
    return results, coverage
