"""One answer whichever way you look: the real Text and Db exports of one workload (two sessions
of the same job, `../shared/real_traces/g2_level1` and `g2_db_level1`) tell one story.

Not the same numbers (they are different runs), but the same picture: every overview component
within 2 points of the step, the same top kernels and host APIs, the same rule statuses and
findings, and a `diff` between them that finds nothing new, resolved or changed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.schema import TABLES
from traceanalyzer.step_components import COMPONENT_NAMES
from traceanalyzer.store import Store

POINTS = 0.02  # per component, as a share of the step


@pytest.fixture(scope="module")
def runs(real_g2: Path, real_g2_db: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("parity")
    outs = {}
    for name, path in (("text", real_g2), ("db", real_g2_db)):
        out = root / name
        result = CliRunner().invoke(main, ["run", str(path), "--out", str(out), "-q", "-j", "1"])
        assert result.exit_code == 0, result.output
        outs[name] = out
    return outs


def _doc(out: Path) -> dict:
    return json.loads((out / "findings.json").read_text("utf-8"))


def test_the_overviews_agree_within_two_points_per_component(runs) -> None:
    text, db = (_doc(runs[k])["summary"]["overview"] for k in ("text", "db"))
    for t, d in zip(text["ranks"], db["ranks"], strict=True):
        assert t["rank"] == d["rank"]
        for key in COMPONENT_NAMES:
            assert abs(t[key] / t["step_ns"] - d[key] / d["step_ns"]) <= POINTS, (t["rank"], key)
    # the same parts in the same order; their rounded shares may differ by a point
    assert re.sub(r"\d+%", "N%", text["headline"]) == re.sub(r"\d+%", "N%", db["headline"])
    for overview in (text, db):  # each agrees with the export's own step record
        assert overview["source"]["agrees"] is True
    assert db["source"]["reference"] == "analysis.db StepTraceTime"
    assert text["source"]["reference"] == "step_trace_time.csv"


def test_the_top_kernels_are_kernels_and_the_same(runs) -> None:
    tops = {k: _doc(runs[k])["summary"]["overview"]["top_kernels"] for k in runs}
    names = {k: [row["name"] for row in tops[k][:5]] for k in tops}
    # two runs: the same leaders in the same order, the next two may trade places
    assert names["text"][:3] == names["db"][:3] and set(names["text"]) == set(names["db"])
    task_types = {"AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV", "AI_CPU", "KERNEL_AICORE"}
    assert not task_types & set(names["db"])
    for k in runs:
        cluster = _doc(runs[k])["summary"]["overview"]["cluster"]
        assert {c["top_kernel"] for c in cluster} == {names["text"][0]}


def test_the_rules_say_the_same(runs) -> None:
    def verdicts(out: Path) -> tuple[list, list]:
        doc = _doc(out)
        rules = sorted((r["name"], r["status"]) for r in doc["rules"])
        found = sorted((f["rule"], tuple(f.get("ranks") or ())) for f in doc["findings"])
        return rules, found

    assert verdicts(runs["text"]) == verdicts(runs["db"])


def test_every_table_the_text_export_fills_the_db_fills_or_says_why(runs) -> None:
    text, db = Store.open(runs["text"]), Store.open(runs["db"])
    ingest = json.loads((runs["db"] / "ingest.json").read_text("utf-8"))
    said = " ".join(n for s in ingest["sessions"] for n in s["not_collected"])
    for name in TABLES:
        if text.table(name).collect().height and not db.table(name).collect().height:
            assert name in said, f"{name}: filled from Text, empty from Db, and nothing says why"


def test_diff_between_the_twins_finds_no_change(runs, tmp_path: Path) -> None:
    out = tmp_path / "diff"
    result = CliRunner().invoke(
        main, ["diff", str(runs["text"]), str(runs["db"]), "--out", str(out), "--fail-on-new"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "diff.json").read_text("utf-8"))
    assert {k: v for k, v in doc["summary"].items() if k != "unchanged"} == {
        k: 0 for k in doc["summary"] if k != "unchanged"
    }
    overview = {row["key"]: row for row in doc["overview"]}
    step = (overview["step_ns"]["base"], overview["step_ns"]["target"])
    for key in COMPONENT_NAMES:
        base, target = overview[key]["base"] / step[0], overview[key]["target"] / step[1]
        assert abs(base - target) <= POINTS, key
