"""Finding records: fingerprints, grouping across ranks, rendering, JSON cleanliness."""

from __future__ import annotations

import json
import math

from traceanalyzer.engine.findings import (
    Evidence,
    Finding,
    compress_ranks,
    fingerprint,
    group_findings,
)


def make(rank, *, score=1.0, severity="warning", location=None, title=None, start_ns=0):
    return Finding(
        rule="TA002",
        name="store-transfer-stall",
        severity=severity,
        ranks=[rank],
        sessions=[f"host_{rank}_{start_ns}_ascend_pt"],
        title=title or f"stall on rank {rank}",
        message="m",
        fix="f",
        metrics={"lost_ns": score, "ratio": math.inf},
        evidence=[
            Evidence(
                rank=rank, session="s", name="Notify Wait", stream=39, start_ns=start_ns, dur_ns=5
            )
        ],
        location=location or {"transfer": "batch_get_into_multi_buffers"},
        score=score,
    )


def test_fingerprint_is_stable_and_ignores_times_and_sessions():
    a, b = make(0, start_ns=1), make(0, start_ns=999_999)
    assert (
        a.fingerprint
        == b.fingerprint
        == fingerprint("TA002", {"transfer": "batch_get_into_multi_buffers"})
    )
    assert len(a.fingerprint) == 16
    assert (
        make(0, location={"transfer": "batch_put_from_multi_buffers"}).fingerprint != a.fingerprint
    )
    assert fingerprint("TA002", {"a": 1, "b": 2}) == fingerprint("TA002", {"b": 2, "a": 1})


def test_fingerprint_pinned_value():
    # pinned: changing the hashing would orphan every stored triage decision and baseline diff
    assert fingerprint("TA001", {"x": 1}) == "7231adf72ed75d69"


def test_grouping_lists_ranks_and_keeps_occurrences():
    findings = [make(9, score=3), make(2, score=10), make(5, score=1)]
    (group,) = group_findings(findings, total_ranks=64)
    assert group.ranks == [2, 5, 9]
    assert group.ranks_label == "ranks 2, 5, 9 (3/64)"
    assert group.headline.startswith("store-transfer-stall on ranks 2, 5, 9 (3/64): ")
    assert group.title == "stall on rank 2"  # representative = highest score
    assert [o.ranks for o in group.occurrences] == [[2], [5], [9]]
    assert len(group.evidence) == 3 and group.evidence[0].rank == 2


def test_grouping_severity_wins_over_score_and_locations_stay_apart():
    findings = [
        make(0, score=100),
        make(1, score=1, severity="error"),
        make(2, location={"transfer": "x"}),
    ]
    groups = group_findings(findings, total_ranks=3)
    assert [g.ranks for g in groups] == [[0, 1], [2]]
    assert groups[0].severity == "error" and groups[0].title == "stall on rank 1"


def test_compress_ranks():
    assert compress_ranks([0, 1, 2, 3, 9, 11, 12]) == "0-3, 9, 11, 12"
    assert compress_ranks([5]) == "5"
    assert compress_ranks([]) == ""


def test_single_rank_label_and_text():
    (g,) = group_findings([make(3)], total_ranks=1)
    assert g.ranks_label == "rank 3"
    text = g.text()
    assert text.startswith("TA002 store-transfer-stall [warning] rank 3\nstall on rank 3\n")
    assert text.rstrip().endswith("Fix: f")


def test_to_dict_is_strict_json():
    (g,) = group_findings([make(0)], total_ranks=1)
    doc = g.to_dict()
    json.dumps(doc, allow_nan=False)  # inf/nan must become null
    assert doc["metrics"]["ratio"] is None
    assert doc["evidence"][0] == {
        "rank": 0,
        "session": "s",
        "name": "Notify Wait",
        "process": None,
        "thread": None,
        "stream": 39,
        "start_ns": 0,
        "dur_ns": 5,
        "detail": None,
    }
