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


@pytest.mark.parametrize("graph", ["full_and_piecewise", "piecewise", "eager"])
def test_each_decoder_kernel_gets_its_layer(tmp_path: Path, graph: str) -> None:
    """The generator writes each layer's nine kernels in order: the cut at the attention (the
    layer's fourth) gives every one of them its layer, eager or replayed alike; the sampler
    after the layers is in none, and the slow layer is named in the overview."""
    generate(
        "serving", tmp_path / "in", ranks=1, iterations=8, layers=4, graph=graph,
        slow_layer=2, markers="python",
    )  # fmt: skip
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.pipeline import analyse

    analyse(tmp_path / "in", tmp_path / "out", executor=LocalExecutor())
    store = Store.open(tmp_path / "out")
    layered = store.table("kernel_layers").collect().sort("start_ns")
    per_layer = len(serving.ops.DECODE_LAYER)
    checked = 0
    for (_, _), part in layered.group_by("session", "step", maintain_order=True):
        decoder = part.filter(pl.col("module") != "sampling")
        truth = [i // per_layer for i in range(decoder.height)]
        assert decoder["layer"].to_list() == truth, decoder.select("name", "layer")
        checked += decoder.height
        assert (
            part.filter(pl.col("module") == "sampling")["layer"].null_count()
            == part.filter(pl.col("module") == "sampling").height
        )
    assert checked >= 8 * 4 * per_layer
    import json

    rows = json.loads((tmp_path / "out" / "findings.json").read_text())["summary"]["overview"][
        "phases"
    ]["rows"]
    decode = next(r for r in rows if r["phase"] == "decode")
    assert [s["layer"] for s in decode["layers"]["slow_layers"]] == [2]
