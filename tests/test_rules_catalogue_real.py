"""The device catalogue rules on the real two-rank G2 Level1 export: verdicts checked by hand.

The export is a ResNet training step on two ranks (4 gradient all-reduces, one step):
- aicpu-ops: op_statistic.csv / kernel_details.csv list no AI_CPU op -> silent.
- aicore-freq-throttle: the `AI Core Freq` counter holds 1800 MHz (two samples) -> silent.
- risky-settings: every ENV_VARIABLES value is empty -> silent.
- collective-straggler: rank 1 starts the first all-reduce 5.6 ms after rank 0
  (communication.json: rank 0 Wait 5.65 ms / Synchronization 5.62 ms, rank 1 0.03 ms), once;
  the other three all-reduces differ by 7-92 µs in 2.3-22 ms ops (protocol jitter). One late
  arrival in one instance is not a straggler -> silent, with a note. A test below makes rank 1
  late at every all-reduce of that same export and the rule names it.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.engine import evaluate
from traceanalyzer.schema import TABLES
from traceanalyzer.store import Store

CATALOGUE = ("aicpu-ops", "aicore-freq-throttle", "collective-straggler", "risky-settings")


@pytest.fixture(scope="module")
def real_result(real_g2_store: Path):
    return evaluate(Store.open(real_g2_store), select=CATALOGUE, config_path=False)


def test_catalogue_rules_are_silent_on_the_real_export(real_result) -> None:
    statuses = {r.name: r for r in real_result.rules}
    assert set(statuses) == set(CATALOGUE)
    for name in CATALOGUE:
        assert statuses[name].status == "clean", (name, statuses[name].reason)
    assert real_result.findings == []


def test_the_one_late_all_reduce_is_seen_and_judged_jitter(real_result) -> None:
    notes = next(r for r in real_result.rules if r.name == "collective-straggler").notes
    assert any("no late rank" in n.text for n in notes)


def test_rank_1_late_at_every_all_reduce_is_named(real_g2_store: Path) -> None:
    """Transplant: rank 0 waits 1 ms longer in each all-reduce (communication.json)."""
    store = Store.open(real_g2_store)
    frames = {name: store.table(name).collect() for name in TABLES}
    delay = 1_000_000
    rank0 = pl.col("rank") == 0
    frames["comm_ops"] = frames["comm_ops"].with_columns(
        pl.when(rank0).then(pl.col(c) + delay).otherwise(pl.col(c)).alias(c)
        for c in ("wait_ns", "elapse_ns")
    )
    result = evaluate(Store.from_frames(frames), select=["collective-straggler"], config_path=False)
    assert [f.ranks for f in result.findings] == [[1]]
    assert "rank 1 arrives late" in result.findings[0].title
