"""The device catalogue on synthetic exports (through real files): each pathology scenario fires
its rule with the right ranks, its healthy twin or decoy stays silent, and the two field rules
stay silent on all of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceanalyzer.engine import evaluate
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store
from traceanalyzer.synth.generate import generate

FIELD_RULES = ("capture-memcpy-growth", "store-transfer-stall")
CASES = [
    # (id, scenario, ranks, generate kwargs, knobs, rule, ranks expected to fire or None, text)
    ("aicpu", "aicpu-fallback", 2, {}, {}, "aicpu-ops", [0, 1], "NonZero"),
    ("aicpu-tiny", "aicpu-fallback", 2, {}, {"aicpu_us": 2.0}, "aicpu-ops", None, ""),
    ("aicpu-level0", "aicpu-fallback", 1, {"level": 0}, {}, "aicpu-ops", [0], "NonZero"),
    ("throttle", "aicore-throttle", 2, {}, {}, "aicore-freq-throttle", [0, 1], "lowest 1300"),
    (
        "power-saving",
        "aicore-throttle",
        2,
        {},
        {"throttle_mhz": 0, "idle_mhz": 800},
        "aicore-freq-throttle",
        None,
        "",
    ),
    (
        "straggler",
        "late-rank-decode",
        2,
        {},
        {},
        "collective-straggler",
        [1],
        "computes",
    ),
    (
        "straggler-host-g3",
        "late-rank-decode",
        4,
        {"generation": "g3", "level": 2},
        {"late_rank": 2, "cause": "host"},
        "collective-straggler",
        [2],
        "host-bound",
    ),
    (
        "balanced",
        "late-rank-decode",
        4,
        {},
        {"late_rank": -1, "wait_all_us": 300.0},
        "collective-straggler",
        None,
        "",
    ),
    ("risky", "debug-settings", 2, {}, {}, "risky-settings", [0, 1], "ASCEND_LAUNCH_BLOCKING=1"),
    (
        "settings-ok",
        "debug-settings",
        2,
        {},
        {"launch_blocking": "0", "log_level": "3"},
        "risky-settings",
        None,
        "",
    ),
]


@pytest.mark.parametrize(
    ("scenario", "ranks", "gen", "knobs", "rule", "expected", "text"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_scenario(
    tmp_path: Path,
    scenario: str,
    ranks: int,
    gen: dict,
    knobs: dict,
    rule: str,
    expected: list[int] | None,
    text: str,
) -> None:
    generate(scenario, tmp_path / "traces", ranks=ranks, **gen, **knobs)
    ingest(tmp_path / "traces", tmp_path / "out", jobs=1)
    result = evaluate(Store.open(tmp_path / "out"), config_path=False)
    by_rule: dict[str, list] = {}
    for f in result.findings:
        by_rule.setdefault(f.name, []).append(f)
    assert not set(by_rule) & set(FIELD_RULES), [
        f.title for n in FIELD_RULES for f in by_rule.get(n, [])
    ]
    if expected is None:
        status = next(r for r in result.rules if r.name == rule)
        assert status.status == "clean", (status.status, status.reason)
    else:
        assert rule in by_rule, [r.to_dict() for r in result.rules if r.name == rule]
        assert all(f.ranks == expected for f in by_rule[rule])
        assert any(text in f.title + f.message for f in by_rule[rule])
