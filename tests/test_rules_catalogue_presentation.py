"""The built-in rules' figures and the device catalogue's key figures, on their fire fixtures."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from traceanalyzer.authoring.ruletest import fixtures_for
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.params import Params
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.rule import RuleContext
from traceanalyzer.engine.runner import evaluate
from traceanalyzer.kit import Chart, FigureContext

RULES = {r.name: r for r in load_rules(entry_points=False).rules}
WITH_FIGURE = ("aicpu-ops", "aicore-freq-throttle", "collective-straggler")
WITH_KEY_FIGURES = (*WITH_FIGURE, "risky-settings")


def _fired(name: str):  # noqa: ANN202 - (rule, store, grouped findings)
    rule = RULES[name]
    fix = next(f for f in fixtures_for(rule) if f.expect == "fire" and not f.params)
    store = fix.build()
    result = evaluate(store, rules=RuleSet([rule]), config_path=False)
    assert result.findings, name
    return rule, store, result.findings


@pytest.mark.parametrize("name", WITH_FIGURE)
def test_figure_draws_the_finding(name: str) -> None:
    rule, store, findings = _fired(name)
    params = Params({k: p.default for k, p in rule.params.items()})
    figure = rule.presentation.figure(FigureContext(findings[0].to_dict(), params, store))
    assert figure is not None and figure.axes


@pytest.mark.parametrize("name", WITH_KEY_FIGURES)
def test_key_figures_per_rank(name: str) -> None:
    rule, store, findings = _fired(name)
    params = Params({k: p.default for k, p in rule.params.items()})
    frame = rule.key_figure_frame(RuleContext(rule=rule, store=store, params=params))
    declared = [k.name for k in rule.presentation.key_figures]
    assert frame.columns == ["rank", *declared]
    fired = set(findings[0].ranks)
    rows = frame.filter(frame["rank"].is_in(sorted(fired)))
    assert rows.height == len(fired)
    assert rows.select(declared).null_count().sum_horizontal().item() == 0


DRAWN = sorted(name for name, r in RULES.items() if r.presentation.figure is not None)


@pytest.mark.parametrize("name", DRAWN)
def test_every_built_in_figure_is_an_svg_chart(name: str) -> None:
    """Built-in figures are SVG charts (no matplotlib), and well-formed."""
    rule, store, findings = _fired(name)
    params = Params({k: p.default for k, p in rule.params.items()})
    figure = rule.presentation.figure(FigureContext(findings[0].to_dict(), params, store))
    assert isinstance(figure, Chart)
    root = ET.fromstring(figure.to_svg())
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("width") == "100%"
