"""The rule-unit API: a rule registers its figure, key figures and marks next to its body."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl
import pytest

from traceanalyzer.engine.rule import RuleDefinitionError
from traceanalyzer.kit import (
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Mark,
    Param,
    Params,
    RuleContext,
    rule,
)
from traceanalyzer.kit.testing import StoreBuilder


def _rule():  # noqa: ANN202 - a Rule
    @rule(
        id="TX900",
        name="slow-thing",
        severity="warning",
        summary="Things take too long.",
        params={"min_us": Param(10.0, "Report slower than this (µs).")},
    )
    def slow_thing(ctx: RuleContext) -> Iterator[Finding]:
        """## What it detects
        x
        ## Why it matters
        x
        ## How to fix
        x
        ## Example
        x
        ## References
        x
        """
        yield ctx.finding(
            rank=0,
            title="slow",
            message="slow",
            location={"thing": "x"},
            evidence=[
                Evidence(rank=0, session="s0", name="a", start_ns=5, dur_ns=2),
                Evidence(rank=0, session="s0", name="b"),
            ],
        )

    return slow_thing


def test_rule_without_presentation_has_defaults() -> None:
    r = _rule()
    assert r.presentation.figure is None and r.presentation.key_figures == ()
    finding = {"evidence": [{"rank": 0, "session": "s0", "name": "a", "start_ns": 5, "dur_ns": 2,
                             "stream": 7, "detail": "d"}, {"rank": 0, "name": "b"}]}  # fmt: skip
    (mark,) = r.presentation.marks_for(finding)
    assert mark == Mark(0, "s0", "stream 7: a", 5, 2, args={"stream": 7, "detail": "d"})
    store = StoreBuilder().store()
    ctx = RuleContext(rule=r, store=store, params=Params({"min_us": 10.0}))
    assert r.key_figure_frame(ctx).columns == ["rank"]


def test_decorators_register_and_return_the_function() -> None:
    r = _rule()

    @r.figure(caption="Slow things per rank.")
    def figure(fig: FigureContext):  # noqa: ANN202
        f, (ax,) = fig.new(4, 2)
        ax.plot([0, 1], [fig.params.min_us, 1])
        return f

    @r.key_figures(
        KeyFigure("slow_things", "slow things", better="lower", unit="count"),
        KeyFigure("worst_ns", "worst thing", better="lower", unit="ns"),
    )
    def key_figures(ctx: RuleContext) -> pl.DataFrame:
        return pl.DataFrame({"rank": [0, 1], "slow_things": [3, 0], "extra": [1, 1]})

    @r.marks
    def marks(finding):  # noqa: ANN001, ANN202
        yield Mark(0, "s0", "m", 1, None, track="own")

    assert callable(figure) and callable(key_figures) and callable(marks)
    assert r.presentation.caption == "Slow things per rank."
    ctx = RuleContext(rule=r, store=StoreBuilder().store(), params=Params({"min_us": 10.0}))
    frame = r.key_figure_frame(ctx)
    assert frame.columns == ["rank", "slow_things", "worst_ns"]  # extra dropped, missing null
    assert frame["worst_ns"].null_count() == 2 and frame["slow_things"].dtype == pl.Float64
    assert [m.track for m in r.presentation.marks_for({})] == ["own"]
    fig = r.presentation.figure(FigureContext({}, Params({"min_us": 10.0})))
    assert len(fig.axes) == 1


def test_key_figures_may_be_returned_as_rows() -> None:
    """A list of row dicts (empty too) gets the declared schema, in rank order."""
    r = _rule()
    rows: list[dict] = [{"rank": 1, "worst_ns": 7, "extra": 1}, {"rank": 0, "worst_ns": None}]

    @r.key_figures(KeyFigure("worst_ns", "worst thing", better="lower", unit="ns"))
    def key_figures(ctx: RuleContext) -> list[dict]:
        return rows

    ctx = RuleContext(rule=r, store=StoreBuilder().store(), params=Params({"min_us": 10.0}))
    frame = r.key_figure_frame(ctx)
    assert frame.to_dicts() == [{"rank": 0, "worst_ns": None}, {"rank": 1, "worst_ns": 7.0}]
    rows = []
    assert r.key_figure_frame(ctx).schema == {"rank": pl.Int32, "worst_ns": pl.Float64}


def test_key_figures_must_be_declared_once_each() -> None:
    r = _rule()
    with pytest.raises(RuleDefinitionError):
        r.key_figures(KeyFigure("a", "a"), KeyFigure("a", "b"))
    with pytest.raises(ValueError):
        KeyFigure("rank", "rank")
    with pytest.raises(ValueError):
        KeyFigure("a", "a", better="smaller")  # type: ignore[arg-type]


def test_a_metric_prints_in_the_unit_its_rule_declared_never_by_its_name() -> None:
    """The one conversion of units (``report.fmt.metric``) takes the rule's declaration: a
    metric named like a duration is a plain number until declared one, a helper's units come
    with it, and a cost's are the engine's (n/a where the rule could not tell it)."""
    from traceanalyzer.kit import NS, TRACE_NS, recurring_calls
    from traceanalyzer.report import fmt

    @rule(
        id="TX901",
        name="declared",
        severity="info",
        summary="Declares its units.",
        units={"wait": NS, "freq": "MHz", "at": TRACE_NS},
        uses=[recurring_calls],
    )
    def declared(ctx: RuleContext) -> Iterator[Finding]:
        """## What it detects\nx\n## Why it matters\nx\n## How to fix\nx\n## Example\nx
        ## References\nx"""
        yield from ()

    shown = declared.presentation
    values = {"wait": 2.52e9, "wait_ns": 2_520_000_000, "freq": 1800, "steady_share": 0.25,
              "cost_ns": 5e9, "cost_share": None, "at": 1736408885527946217}  # fmt: skip
    assert {k: fmt.metric(v, shown.unit(k)) for k, v in values.items()} == {
        "wait": "2.52 s",
        "wait_ns": "2,520,000,000",
        "freq": "1,800 MHz",
        "steady_share": "25.0%",
        "cost_ns": "5 s",
        "cost_share": "n/a",
        "at": "1736408885527946.217 µs",
    }


def test_a_cost_given_as_metrics_is_refused_with_the_way_to_give_it() -> None:
    r = _rule()
    ctx = RuleContext(rule=r, store=StoreBuilder().store(), params=Params({"min_us": 10.0}))
    with pytest.raises(RuleDefinitionError, match=r"cost=Cost\(ns, share\)"):
        ctx.finding(rank=0, title="t", message="m", location={}, metrics={"cost_ns": 5})
