"""Inside the graphs: each step's graph size, real batch and padding, and the decode batches that
fall out of the FULL aclgraph (graph-fallback), against the serving generator's truth."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.runner import evaluate
from traceanalyzer.ingest import ingest
from traceanalyzer.steps.tables import steps_of
from traceanalyzer.store import Store
from traceanalyzer.synth import generate
from traceanalyzer.synth.scenarios import serving

DECODE = {"iterations": 12, "layers": 2, "prefill_every": 0, "markers": "python"}
BATCHES = "8,16,40,64"


def _run(tmp: Path, **knobs: object) -> tuple[Store, pl.DataFrame, list[serving.Iteration]]:
    generate("serving", tmp / "in", ranks=1, **DECODE, **knobs)
    ingest(tmp / "in", tmp / "out", jobs=1)
    store = Store.open(tmp / "out")
    steps = steps_of(store, [0]).filter(pl.col("step_source") != "gap")
    plan = [
        it for it in serving.plan({**serving.KNOBS, **DECODE, **knobs}, 0) if it.phase != "idle"
    ]
    return store, steps, plan


@pytest.mark.parametrize(
    "knobs",
    [
        {"batches": "3,8,12,20", "capture_sizes": "1,2,4,8,16,32"},
        {"batches": "3,5,12", "spec_tokens": 1, "capture_sizes": "1,2,4,8,16,32"},
        {"batches": "3,8,12,20", "graph": "piecewise"},
    ],
    ids=["full", "full-spec", "piecewise"],
)
def test_graph_size_batch_and_padding_are_the_generators(tmp_path: Path, knobs: dict) -> None:
    _, steps, plan = _run(tmp_path, **knobs)
    settings = {**serving.KNOBS, **DECODE, **knobs}
    checked = 0
    for it, row in zip(plan, steps.iter_rows(named=True), strict=True):
        size = serving.padded(it.tokens, settings)
        assert row["batch"] == it.requests, row
        assert row["graph_size"] == size, (row, size)
        assert row["padded_tokens"] == size - it.tokens, row
        checked += 1
    assert checked == len(plan)


def _fallback(store: Store) -> dict:
    rule = load_rules(entry_points=False).rules.get("graph-fallback")
    result = evaluate(store, rules=RuleSet([rule]), config_path=False)
    return result.findings[0].metrics if result.findings else {}


def test_fallen_out_batches_and_their_cost_against_a_covered_twin(tmp_path: Path) -> None:
    """The cost is what the fell-out iterations took beyond replays at their size: the twin,
    which captured those sizes too, replays them."""
    sick, sick_steps, plan = _run(tmp_path / "sick", batches=BATCHES, capture_sizes="1,2,4,8,16,32")
    _, twin_steps, _ = _run(tmp_path / "twin", batches=BATCHES, capture_sizes="1,2,4,8,16,32,40,64")
    found = _fallback(sick)
    assert found["batch_sizes"] == [40, 64]
    fell = [i for i, it in enumerate(plan) if it.requests > 32]
    truth = sum(
        sick_steps["step_ns"][i] - twin_steps["step_ns"][i]  # type: ignore[operator]
        for i in fell
    )
    assert set(sick_steps["graph"][i] for i in fell) == {"eager"}
    assert set(twin_steps["graph"][i] for i in fell) == {"full"}
    assert found["cost_ns"] == pytest.approx(truth, rel=0.25)
