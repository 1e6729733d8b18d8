"""Every row of the serving conformance table (``synth/conformance.py``, read from the vllm-ascend,
op-plugin and msprof sources) through the product: the ``serving`` scenario writes the row's
attention kernels, the run ingests them, and the steps derive the row's phase.

The classifier (``derived/phases.py``) is not written from the table: this holds the two readings of
the sources to agree. A row no profile here exercises fails the coverage test.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.derived.tables import steps_of
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store
from traceanalyzer.synth import conformance, generate
from traceanalyzer.synth.scenarios import serving

BASE = {"iterations": 8, "layers": 2, "markers": "python", "prefill_every": 4}
NO_CHUNKS = {"chunked": False, "prefill_every": 2}
# per row: the profiles that run it, each (graph mode, knobs), and the batch kinds of the
# plan's iterations that run the row (serving.batch_kind)
RUNS: dict[str, list[tuple[str, dict, tuple[str, ...]]]] = {
    "v0.11-prefill-no-cache": [("eager", {"style": "v0.11", **NO_CHUNKS}, ("prefill_no_cache",))],
    "v0.11-decode": [
        ("eager", {"style": "v0.11"}, ("decode",)),
        ("full_and_piecewise", {"style": "v0.11"}, ("decode",)),
    ],
    "v0.11-chunked-mixed": [("piecewise", {"style": "v0.11"}, ("mixed",))],
    "fia-prefill-no-cache": [
        ("eager", {**NO_CHUNKS, "prompts": 3, "heads": heads}, ("prefill_no_cache",))
        for heads in conformance.HEADS
    ]
    + [("piecewise", {**NO_CHUNKS, "heads": "gqa"}, ("prefill_no_cache",))],
    "fia-prefill-chunk": [
        ("piecewise", {**NO_CHUNKS, "prefix_hit": True, "heads": "gqa"}, ("prefill_chunk",))
    ],
    "fia-mixed": [("eager", {"heads": "gqa"}, ("mixed",)), ("piecewise", {}, ("mixed",))],
    "fia-decode": [("eager", {"heads": "mqa"}, ("decode",)), ("piecewise", {}, ("decode",))],
    "fia-decode-full": [("full_and_piecewise", {"heads": "gqa"}, ("decode",))],
    "fia-spec": [("piecewise", {"spec_tokens": 2, "heads": "gqa"}, ("spec_decode",))],
    "fia-spec-one-request": [
        ("piecewise", {"spec_tokens": 1, "batch": 1, "heads": "gqa"}, ("spec_decode",)),
        ("eager", {"spec_tokens": 1, "batch": 1, **NO_CHUNKS}, ("spec_decode",)),
        ("eager", {"spec_tokens": 1, "batch": 1, "markers": "scopes"}, ("spec_decode",)),
    ],
    "fia-spec-full": [("full_and_piecewise", {"spec_tokens": 1}, ("spec_decode",))],
    "mla-prefill": [("eager", {"style": "mla", **NO_CHUNKS}, ("prefill_no_cache",))],
    "mla-decode": [
        ("piecewise", {"style": "mla"}, ("decode",)),
        ("full_and_piecewise", {"style": "mla"}, ("decode",)),
    ],
    "mla-spec": [("piecewise", {"style": "mla", "spec_tokens": 1}, ("spec_decode",))],
    "sfa-decode": [("piecewise", {"style": "sfa"}, ("decode",))],
    "sfa-prefill-chunk": [("eager", {"style": "sfa", **NO_CHUNKS}, ("prefill_no_cache",))],
}
ROWS = [(key, i) for key, runs in RUNS.items() for i in range(len(runs))]


def test_every_row_of_the_table_is_run() -> None:
    assert set(RUNS) == set(conformance.BY_KEY), "a conformance row without a profile here"


@cache
def _derived(graph: str, knobs: tuple) -> tuple[pl.DataFrame, tuple[serving.Iteration, ...]]:
    """The steps (idle gaps left out) of a one-rank serving profile, and its plan."""
    import tempfile

    settings = {**BASE, **dict(knobs), "graph": graph}
    root = Path(tempfile.mkdtemp(prefix="conformance-"))
    generate("serving", root / "in", ranks=1, **settings)
    ingest(root / "in", root / "out", jobs=1)
    steps = steps_of(Store.open(root / "out"), [0]).filter(pl.col("step_source") != "gap")
    plan = serving.plan({**serving.KNOBS, **settings}, 0)
    return steps, tuple(it for it in plan if it.phase != "idle")


@pytest.mark.parametrize(("key", "run"), ROWS, ids=[f"{k}-{i}" for k, i in ROWS])
def test_each_row_derives_its_phase(key: str, run: int) -> None:
    case = conformance.BY_KEY[key]
    graph, knobs, kinds = RUNS[key][run]
    steps, plan = _derived(graph, tuple(sorted(knobs.items())))
    assert steps.height == len(plan), steps.select("start_ns", "phase", "phase_reason")
    style = knobs.get("style", "v0.13")
    rows = [
        (i, row)
        for i, (it, row) in enumerate(zip(plan, steps.iter_rows(named=True), strict=True))
        if serving.batch_kind(it) in kinds and conformance.case_for(style, serving.batch_kind(it))
    ]
    assert rows, f"the profile runs no {kinds} iteration"
    wrong = [
        (i, row["phase"], row["phase_reason"]) for i, row in rows if row["phase"] != case.phase
    ]
    assert not wrong, f"{case.key} ({graph}): expected {case.phase}: {wrong}"


def test_the_docs_hold_the_table() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text("utf-8")
    for line in conformance.markdown():
        assert line in page, "regenerate: python -m traceanalyzer.synth.conformance"
