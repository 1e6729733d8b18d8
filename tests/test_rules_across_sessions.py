"""TA001 across profiler sessions: rounds 1, 45 and 100 profiled into separate directories (seed 000).

The layout is the ``capture_growth_rounds`` sample (``capture-growth --set
profiled_rounds=1,45,100``): one ``*_ascend_pt`` session per profiled round, all rank 0, and
the memcpy count of round r counting every capture of the unprofiled rounds before it. The
rule orders the sessions of a rank by time and judges them as one series; without per-event
CANN slices it falls back to ``api_statistic.csv``, one point (memcpy calls per capture) per
session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from traceanalyzer.engine import evaluate
from traceanalyzer.engine.runner import RunResult
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store
from traceanalyzer.synth import generate
from traceanalyzer.synth.samples import SAMPLES

SAMPLE = next(s for s in SAMPLES if s.name == "capture_growth_rounds")
ROUNDS = [1, 45, 100]
CAPTURES = SAMPLE.knobs["captures"]
BASE = 6  # capture-growth's base_memcpy: the count of the very first capture


def _ingest(scenario: str, root: Path, **knobs: object) -> tuple[Store, list[str]]:
    dirs = generate(scenario, root / "in", seed=0, level=SAMPLE.level, **knobs)
    result = ingest(root / "in", root / "out")
    assert not result.partial, result.to_dict()
    assert any("3 sessions, analysed in time order" in p.message for p in result.discovery.problems)
    return Store.open(root / "out"), [d.name for d in dirs]


def _ta001(store: Store, **overrides: object) -> RunResult:
    return evaluate(store, config_path=False, select=["TA001"], overrides={"TA001": overrides})


def _notes(result: RunResult) -> list[str]:
    return [n.text for status in result.rules for n in status.notes]


@pytest.fixture(scope="module")
def growth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[str]]:
    root = tmp_path_factory.mktemp("rounds")
    return _ingest(SAMPLE.scenario, root, **SAMPLE.knobs)


def test_layout_is_one_session_per_profiled_round(growth: tuple[Store, list[str]]) -> None:
    store, names = growth
    assert SAMPLE.knobs["profiled_rounds"] == ",".join(map(str, ROUNDS))
    sessions = store.sessions()
    assert sessions["rank"].to_list() == [0, 0, 0]
    assert sessions["session"].to_list() == names == sorted(names)
    starts = sessions["start_ns"].to_list()
    ends = sessions["end_ns"].to_list()
    assert all(e < s for e, s in zip(ends, starts[1:], strict=False))  # later rounds later


def test_growth_across_sessions_fires_on_rank_0(growth: tuple[Store, list[str]]) -> None:
    store, names = growth
    result = _ta001(store)
    assert [s.status for s in result.rules] == ["fired"]
    [finding] = result.findings
    assert finding.rule == "TA001" and finding.ranks == [0]
    assert finding.ranks_label.startswith("rank 0")
    assert finding.sessions == names  # all three sessions, in time order
    assert finding.location["source"] == "events"
    m = finding.metrics
    assert m["captures"] == len(ROUNDS) * CAPTURES
    assert abs(m["first_count"] - BASE) <= 1  # round 1, capture 1: nothing captured before
    assert m["last_count"] > 10 * m["first_count"]  # round 100: 396+ earlier captures
    assert m["mann_kendall_p"] < 0.01 and m["slope_per_capture"] > 0
    assert "Rank 0 (3 sessions)" in finding.message

    # The series runs through the sessions in time order, and each round's captures carry
    # the unprofiled rounds before it.
    series = finding.series
    assert series["session"] == [n for n in names for _ in range(CAPTURES)]
    assert series["start_ns"] == sorted(series["start_ns"])
    per_round = [
        series["memcpy_calls"][i * CAPTURES : (i + 1) * CAPTURES] for i in range(len(ROUNDS))
    ]
    growth_per_capture = SAMPLE.knobs["growth"]
    for r, counts in zip(ROUNDS, per_round, strict=True):
        expected = BASE + growth_per_capture * ((r - 1) * CAPTURES + (CAPTURES - 1) / 2)
        assert abs(sum(counts) / CAPTURES - expected) <= 0.15 * expected, (r, counts)
    assert max(per_round[0]) < min(per_round[1]) and max(per_round[1]) < min(per_round[2])


def test_per_session_judgement_sees_too_few_captures(growth: tuple[Store, list[str]]) -> None:
    """across_sessions=false judges each session alone: 4 captures each is below min_captures."""
    store, _ = growth
    result = _ta001(store, across_sessions=False)
    assert result.findings == []
    notes = _notes(result)
    assert len(notes) == len(ROUNDS)
    assert all(f"only {CAPTURES} captures" in n and "min_captures" in n for n in notes)


def test_api_stats_fallback_has_one_point_per_session(growth: tuple[Store, list[str]]) -> None:
    """No per-event CANN slices: only api_statistic.csv (+ sessions for their order) remain.

    The rule then has one point per session (memcpy calls / captures). Three sessions are below
    the default min_captures=5, so it cannot judge and says why ("inconclusive", not "clean");
    with min_captures=3
    and a looser alpha (three points cannot reach p < 0.01) the growth across the sessions fires.
    """
    real, names = growth
    store = Store.from_frames(
        {
            "sessions": real.table("sessions").collect(),
            "api_stats": real.table("api_stats").collect(),
        }
    )
    assert not store.has_rows("slices")

    result = _ta001(store)
    assert [s.status for s in result.rules] == ["inconclusive"]
    assert result.findings == []
    assert _notes(result) == [
        "only 3 sessions (api_statistic.csv, one point each); "
        "a trend needs at least 5 (min_captures)"
    ]
    assert result.rules[0].reason.startswith("inconclusive on rank 0: only 3 sessions")

    strict = _ta001(store, min_captures=3)
    assert strict.findings == []
    [note] = _notes(strict)
    assert note.startswith("rank 0: memcpy calls per capture do not grow over 3 sessions")

    loose = _ta001(store, min_captures=3, alpha=0.2)
    [finding] = loose.findings
    assert finding.ranks == [0] and finding.sessions == names
    assert finding.location["source"] == "api_stats"
    assert finding.series["session"] == names  # ordered by session start time
    first, mid, last = finding.series["memcpy_calls"]
    assert abs(first - BASE) <= 1 and first < mid < last and last > 10 * first
    assert "over 3 sessions" in finding.title


def test_healthy_rounds_stay_silent(tmp_path: Path) -> None:
    knobs = {k: v for k, v in SAMPLE.knobs.items() if k != "growth"}  # healthy: growth=0
    store, names = _ingest("capture-healthy", tmp_path, **knobs)
    assert len(names) == len(ROUNDS)
    result = _ta001(store)
    assert [s.status for s in result.rules] == ["clean"]
    assert result.findings == []
    [note] = _notes(result)
    assert note.startswith(
        f"rank 0: memcpy calls per capture do not grow over {len(ROUNDS) * CAPTURES} captures"
    )
