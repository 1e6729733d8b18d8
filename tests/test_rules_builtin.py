"""The built-in rules: fixtures pass (what `traceanalyzer rules test` runs in CI), and they load
cleanly with complete docs."""

from __future__ import annotations

import pytest

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


# `traceanalyzer rules test` over the built-ins runs in .ci/run, after this suite: the
# fixtures above are the same ones, one test each.


# Rules that judge the served workload's steps: on a profile of start-up alone they could not
# judge, and must say so (inconclusive or not evaluated), never "clean".
STEP_JUDGES = ("slow-rank", "host-launch-bound", "sync-in-step", "alloc-churn", "online-compile")


@pytest.mark.parametrize(
    "scenario, knobs",
    [
        ("inference-baseline", {"steps": 1}),  # ProfilerStep#1 alone: warm-up (warmup_steps)
        ("serving", {"iterations": 0, "warmup": 6}),  # graph captures, then nothing served
    ],
    ids=["profiler-step-1-only", "serving-start-up-only"],
)
def test_a_warm_up_only_profile_is_never_clean(scenario, knobs, tmp_path):
    from traceanalyzer.engine.shards import evaluate_store
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.ingest import ingest
    from traceanalyzer.synth import generate

    generate(scenario, tmp_path / "in", ranks=4, **knobs)
    ingest(tmp_path / "in", tmp_path / "out", jobs=1)
    result = evaluate_store(tmp_path / "out", LocalExecutor(), config_path=False)
    status = {r.name: r for r in result.rules}
    for name in STEP_JUDGES:
        assert status[name].status in ("inconclusive", "not_evaluated"), (
            name,
            status[name].status,
            [n.text for n in status[name].notes],
        )
    assert not result.findings, [f.headline for f in result.findings]
