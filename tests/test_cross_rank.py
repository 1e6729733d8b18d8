"""Ranks that meet in collectives: the collective time split, iterations aligned across ranks,
tail iterations followed to their root (against the synthetic scenario's truth), and one owner
per wait."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.analyses.cross_rank import align
from traceanalyzer.derived.collectives import SPLIT, collectives_of
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine import evaluate
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.json_shape import to_json
from traceanalyzer.overview.collectives import collectives_section
from traceanalyzer.overview.model import read_overview
from traceanalyzer.report.overview_text import collective_lines
from traceanalyzer.store import RankStore, Store

RULES = load_rules(entry_points=False)
MOE = {"iterations": 12, "layers": 2, "hot_rank": -1}


def derived_store(tmp: Path, scenario: str, ranks: int, **knobs: object) -> Store:
    """``ranks`` ranks of ``scenario``, ingested and derived as a run does: the rules read them
    as a run's snapshot store (each derivation read once)."""
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.ingest import ingest
    from traceanalyzer.stages import declared, run_stages
    from traceanalyzer.synth.generate import generate

    generate(scenario, tmp / "in", ranks=ranks, **knobs)
    ingest(tmp / "in", tmp / "out")
    run_stages(tmp / "out", LocalExecutor(), declared(before_rules=True))
    return RankStore(tmp / "out", range(ranks))


def moe_store(tmp: Path, **knobs: object) -> Store:
    """Four ranks of ``moe-ep`` (``MOE`` and ``knobs``)."""
    return derived_store(tmp, "moe-ep", 4, **{**MOE, **knobs})


def _split_sums(ops: pl.DataFrame) -> None:
    traced = ops.filter(pl.col("source") == "tasks")
    assert traced.height
    total = traced.select(pl.sum_horizontal(*SPLIT)).to_series()
    assert (total == traced["end_ns"] - traced["start_ns"]).all()


def test_real_export_all_reduce_waits_for_a_rank_outside_the_profile(real_g2_store: Path) -> None:
    """The gap issue 50 starts from: communication.json puts most of the all-reduce time in its
    ops' own Idle Time; the trace's planes show it is a Notify Wait on the plane to rank 5,
    which is not profiled: the last rank to arrive."""
    store = Store.open(real_g2_store)
    ops = collectives_of(store)
    _split_sums(ops)
    first = ops.filter((pl.col("rank") == 0) & (pl.col("name") == "hcom_allReduce__586_0_1"))
    row = first.row(0, named=True)
    assert row["arrival_ns"] > 0.99 * 78_764_613  # the plane-5 wait before its first transfer
    assert row["waited_for"] == 5
    assert row["export_idle_ns"] == 73_203_703  # communication.json's Idle Time, kept beside
    section = collectives_section(store)
    assert section is not None
    assert section.export_idle is not None and section.export_idle.outside == [5]
    assert section.critical_path is not None
    assert [(r.rank, r.outside) for r in section.critical_path.roots] == [(5, True)]
    text = "\n".join(collective_lines(read_overview({"collectives": to_json(section)})))
    assert "waiting for the last rank" in text
    assert "rank 5 (not in the profile)" in text


def test_db_twin_splits_its_collectives_alike(real_g2_db_store: Path) -> None:
    """The Db export's plane tasks carry the same args: the same split, the peer named."""
    ops = collectives_of(Store.open(real_g2_db_store))
    _split_sums(ops)
    longest = ops.sort("arrival_ns", descending=True).row(0, named=True)
    assert longest["waited_for"] is not None and longest["waited_for"] > 1


def test_iterations_align_through_their_collectives_not_their_index(tmp_path: Path) -> None:
    """Rank 3's profile starts two iterations after the others': its first step is their
    third (matched through the collectives they share, shifted by as many ops)."""
    store = moe_store(
        tmp_path, comm="alltoall", tail_rank=1, tail_at="4,9", tail_cause="gc", profile_from="3:2"
    )
    found = align(collectives_of(store), steps_of(store), store.sessions())
    mine = found.iterations.filter(pl.col("rank") == 3).sort("step")
    assert mine["iteration"].head(2).to_list() == ["0:0:3", "0:0:4"]
    assert set(found.offsets) == {0, 1, 2, 3}  # each rank's clock against rank 0's


def _tail(store: Store) -> list:
    return evaluate(store, rules=RULES, select=["tail-iteration"]).findings


@pytest.mark.parametrize(
    ("cause", "expected", "what"),
    [
        ("host", "host", "python"),
        ("compile", "host", "compile"),
        ("gc", "host", "gc"),
        ("sync", "sync", "synchronisation"),
        ("device", "device", "aclnnMm_MatMulV2_MatMulV2"),
    ],
)
def test_tail_root_cause_and_cost_match_the_truth(
    tmp_path: Path, cause: str, expected: str, what: str
) -> None:
    """moe-ep: rank 2 is late by 1.5 ms in iterations 3 and 10 for each cause; the finding names
    rank 2, the cause, and costs the truth (2 x 1.5 ms) within 25%."""
    store = moe_store(tmp_path, tail_rank=2, tail_at="3,10", tail_ms=1.5, tail_cause=cause)
    (found,) = _tail(store)
    m = found.metrics
    assert (m["root_rank"], m["cause"], m["late_work"]) == (2, expected, what)
    assert found.cost.ns == pytest.approx(3e6, rel=0.25)
    assert m["tail_iterations"] == 2 and m["waiting_ranks"] == [0, 1, 3]
    assert len(m["windows"]) == 2


def test_a_tail_iteration_is_owned_once(tmp_path: Path) -> None:
    """All-to-all: rank 1's garbage collection makes the others wait in two iterations;
    tail-iteration reports it, collective-straggler leaves those instances to it."""
    store = moe_store(tmp_path, comm="alltoall", tail_rank=1, tail_at="4,9", tail_cause="gc")
    result = evaluate(store, rules=RULES, select=["tail-iteration", "collective-straggler"])
    assert [f.name for f in result.findings] == ["tail-iteration"]
    straggler = next(r for r in result.rules if r.name == "collective-straggler")
    assert any("tail-iteration owns their waits" in n.text for n in straggler.notes)


def test_a_slowdown_every_rank_shares_has_no_root(tmp_path: Path) -> None:
    """Decoy: iterations 4 and 9 run 1.6x longer on every rank (a bigger batch): slower, but
    no rank waits for another; the rule says so in a note."""
    store = moe_store(tmp_path, shared_at="4,9")
    result = evaluate(store, rules=RULES, select=["tail-iteration"])
    assert not result.findings
    (status,) = result.rules
    assert any("no rank late for the others" in n.text for n in status.notes)


def test_the_overlay_draws_the_chain_of_waits(tmp_path: Path) -> None:
    """Each waiting rank's trace gets an arrow from its wait to the root's late work drawn on
    its own clock; the root's, one from its late work to the collective it was late at."""
    from types import SimpleNamespace

    from traceanalyzer.report.annotations import overlay_events

    store = moe_store(tmp_path, comm="alltoall", tail_rank=1, tail_at="4,9", tail_cause="gc")
    (found,) = _tail(store)
    finding = found.to_dict()
    rule = next(r for r in RULES.rules if r.name == "tail-iteration")
    marks = list(rule.presentation.marks_for(finding))
    view = SimpleNamespace(marks=marks, marks_failed=None)
    report = SimpleNamespace(findings={"findings": [finding]}, view=lambda f: view)
    sessions = {m.rank: m.session for m in marks}
    for rank in range(4):
        events = overlay_events(report, where=(rank, sessions[rank]))
        arrows = [e for e in events if e.get("cat") == "chain of waits"]
        assert len(arrows) == 4  # two tails: two arrows, each an `s` and an `f`
        assert sorted(e["ph"] for e in arrows) == ["f", "f", "s", "s"]
    every = [e for e in overlay_events(report) if e.get("cat") == "chain of waits"]
    assert {e["id"] for e in every if e["id"].startswith("work:")}  # across ranks, in one file


def test_a_rank_alone_has_tails_without_waiters(tmp_path: Path) -> None:
    """One rank (inference-baseline): steps 5 and 15 late by 2 ms of garbage collection."""
    store = derived_store(
        tmp_path, "inference-baseline", 1, steps=20, layers=2, tail_at="5,15", tail_cause="gc"
    )
    (found,) = _tail(store)
    m = found.metrics
    assert (m["root_rank"], m["cause"], m["late_work"], m["waiting_ranks"]) == (0, "host", "gc", [])
    assert found.cost.ns == pytest.approx(4e6, rel=0.25)


def test_ranks_alone_slow_at_once_have_no_root(tmp_path: Path) -> None:
    """Three ranks that share no collective, each late at the same steps at the same time:
    a slowdown they all shared, no rank's own."""
    store = derived_store(
        tmp_path, "inference-baseline", 3, steps=20, layers=2, tail_at="5,15", tail_cause="gc"
    )
    result = evaluate(store, rules=RULES, select=["tail-iteration"])
    assert not result.findings
    assert any("no rank late for the others" in n.text for n in result.rules[0].notes)


def test_the_collectives_section_fails_alone(
    real_g2_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure in the collectives' section is said there; the rest of the overview stands."""
    from traceanalyzer.overview import collectives

    def broken(store: Store) -> None:
        raise ValueError("no such column")

    monkeypatch.setattr(collectives, "section", broken)
    found = collectives.collectives_section(Store.open(real_g2_store))
    assert to_json(found) == {"error": "ValueError: no such column"}
    said = collective_lines(read_overview({"collectives": to_json(found)}))
    assert said == ["not computed: ValueError: no such column"]
