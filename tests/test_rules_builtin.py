"""The built-in rules: fixtures pass (what `traceanalyzer rules test` runs in CI), and they load
cleanly with complete docs."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from traceanalyzer.authoring.cli import rules_group
from traceanalyzer.authoring.ruletest import fixtures_for, run_fixture
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.rule import DOC_HEADINGS

LOADED = load_rules(entry_points=False)
CASES = [(rule, fix) for rule in LOADED.rules for fix in fixtures_for(rule)]


def test_builtin_rules_load_without_errors():
    assert LOADED.errors == []
    assert {r.name for r in LOADED.rules} >= {"capture-memcpy-growth", "store-transfer-stall"}


@pytest.mark.parametrize("rule", list(LOADED.rules), ids=lambda r: r.name)
def test_rule_is_documented_and_covered(rule):
    assert all(rule.sections.get(h) for h in DOC_HEADINGS)
    kinds = [f.expect for f in fixtures_for(rule)]
    assert kinds.count("fire") >= 2 and kinds.count("silent") >= 2
    assert all(p.help for p in rule.params.values())


@pytest.mark.parametrize(("rule", "fix"), CASES, ids=[f"{r.name}::{f.name}" for r, f in CASES])
def test_fixture(rule, fix):
    result = run_fixture(rule, fix)
    assert result.passed, "\n".join(result.problems)


def test_rules_test_command_passes_for_builtins():
    result = CliRunner().invoke(rules_group, ["test"])
    assert result.exit_code == 0, result.output
    assert "0 failed" in result.output
