"""Runner: preconditions, error isolation, parameters, config files, sharding, findings.json."""

from __future__ import annotations

import json

import polars as pl
import pytest

from traceanalyzer.engine import (
    AnyOf,
    NotEvaluated,
    Param,
    Requirement,
    RuleContext,
    evaluate,
    rule,
    sql_rule,
    write_findings_json,
)
from traceanalyzer.engine.config import ConfigError
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.kit.testing import us
from traceanalyzer.kit.testing.store_builder import StoreBuilder

DOC = """
## What it detects
Long calls.
## Why it matters
Time.
## How to fix
Shorter calls.
## Example
none
## References
none
"""


def long_calls_rule(rule_id="TA901", name="long-calls", **kw):
    def body(ctx: RuleContext):
        slow = ctx.table("slices").filter(pl.col("dur_ns") > ctx.params.min_us * 1000).collect()
        for (rank,), rows in slow.group_by("rank"):
            yield ctx.finding(
                rank=rank,
                sessions=rows["session"].unique().to_list(),
                title=f"{rows.height} long calls",
                message="m",
                location={"what": "long calls"},
                metrics={"calls": rows.height},
                severity="error" if rows.height > ctx.params.error_above else None,
            )

    body.__doc__ = DOC
    return rule(
        id=rule_id,
        name=name,
        severity="warning",
        escalates_to="error",
        escalation="when there are more than `error_above` long calls",
        summary="Calls are long.",
        params={
            "min_us": Param(100.0, "threshold"),
            "error_above": Param(5, "calls before error"),
            "names": Param(("a", "b"), "names"),
            "strict": Param(False, "flag"),
        },
        requires=[Requirement("slices", ("dur_ns",), what="events", collect_with="anything")],
        **kw,
    )(body)


def broken_rule():
    def body(ctx):
        raise RuntimeError("boom")

    body.__doc__ = DOC
    return rule(id="TA902", name="broken", severity="info", summary="Breaks.")(body)


def needs_level2_rule():
    def body(ctx):
        return []

    body.__doc__ = DOC
    return rule(
        id="TA903",
        name="needs-runtime",
        severity="info",
        summary="Needs runtime events.",
        requires=[
            Requirement(
                "slices",
                ("api_name",),
                what="CANN runtime events",
                collect_with="profiler_level=Level2",
                where=pl.col("api_layer") == "Runtime",
            )
        ],
    )(body)


def store(ranks=(0, 1, 2), long_calls=3):
    b = StoreBuilder()
    for r in ranks:
        b.session(r, f"s{r}", start_ns=0, end_ns=us(1e6))
        for i in range(long_calls):
            b.api(r, f"s{r}", "aclrtMemcpy", start_ns=us(1000 + i * 1000), dur_ns=us(500))
        b.api(r, f"s{r}", "aclrtMemcpy", start_ns=us(9000), dur_ns=us(10))
    return b.store()


def run(*rules, st=None, **kw):
    kw.setdefault("config_path", False)
    return evaluate(st or store(), rules=RuleSet(rules), **kw)


def test_findings_are_grouped_across_ranks():
    result = run(long_calls_rule())
    assert len(result.findings) == 1
    finding = result.findings[0]
    assert finding.ranks == [0, 1, 2]
    assert finding.ranks_label == "ranks 0-2 (3/3)"
    assert len(finding.occurrences) == 3
    assert result.rules[0].status == "fired"


def test_not_evaluated_says_what_is_missing_and_how_to_collect():
    result = run(needs_level2_rule())
    status = result.rules[0]
    assert status.status == "not_evaluated"
    assert status.reason == "missing CANN runtime events (collect with profiler_level=Level2)"
    assert result.to_dict()["not_evaluated"] == [
        {"rule": "TA903", "name": "needs-runtime", "reason": status.reason}
    ]


def test_any_of_precondition():
    def body(ctx):
        return []

    body.__doc__ = DOC
    either = rule(
        id="TA904",
        name="either",
        severity="info",
        summary="Either table.",
        requires=[
            AnyOf(
                Requirement("api_stats", ("count",), what="api stats", collect_with="Level1"),
                Requirement("slices", ("api_name",), what="CANN events", collect_with="Level1"),
            )
        ],
    )(body)
    assert run(either).rules[0].status == "clean"
    empty = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1)).store()
    reason = run(either, st=empty).rules[0].reason
    assert (
        reason
        == "missing api stats (collect with Level1) or missing CANN events (collect with Level1)"
    )


def test_not_evaluated_raised_by_body():
    def body(ctx):
        raise NotEvaluated("no transfer spans found")

    body.__doc__ = DOC
    r = rule(id="TA905", name="late-skip", severity="info", summary="Skips.")(body)
    status = run(r).rules[0]
    assert (status.status, status.reason) == ("not_evaluated", "no transfer spans found")


def test_a_failing_rule_is_isolated():
    result = run(broken_rule(), long_calls_rule())
    by_id = {r.id: r for r in result.rules}
    assert by_id["TA902"].status == "error"
    assert "RuntimeError: boom" in by_id["TA902"].error
    assert "Traceback" in by_id["TA902"].traceback
    assert by_id["TA901"].status == "fired"
    errors = result.to_dict()["errors"]
    assert errors[0]["rule"] == "TA902" and errors[0]["error"].startswith("RuntimeError")


def test_overrides_by_id_or_name_parse_types():
    r = long_calls_rule()
    result = run(r, overrides=["long-calls.min_us=1000"])
    assert result.findings == [] and result.rules[0].status == "clean"
    result = run(r, overrides={"TA901": {"min_us": "1", "names": "x, y", "strict": "yes"}})
    params = result.rules[0].params
    assert params["min_us"] == 1.0 and params["names"] == ("x", "y") and params["strict"] is True
    assert result.findings[0].metrics["calls"] == 4


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            ["long-calls.nope=1"],
            "has no parameter 'nope'; known: min_us, error_above, names, strict",
        ),
        (["nosuch.min_us=1"], "unknown rule 'nosuch'"),
        (["long-calls.min_us=fast"], "long-calls.min_us: expected a number"),
        (["long-calls.error_above=1.5"], "expected a whole number"),
        (["long-calls.strict=maybe"], "expected true or false"),
        (["min_us=1"], "expected RULE.PARAM=VALUE"),
    ],
)
def test_bad_overrides_are_clear_errors(option, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(long_calls_rule(), overrides=option)


def test_choices_are_enforced():
    def body(ctx):
        return []

    body.__doc__ = DOC
    r = rule(
        id="TA906",
        name="chooser",
        severity="info",
        summary="Choices.",
        params={"mode": Param("auto", "mode", choices=("auto", "events"))},
    )(body)
    with pytest.raises(ConfigError, match="'sessions' is not one of auto, events"):
        run(r, overrides=["chooser.mode=sessions"])


def test_config_file_and_precedence(tmp_path, monkeypatch):
    (tmp_path / "traceanalyzer.toml").write_text(
        "[rules.long-calls]\nmin_us = 1000.0\n\n[rules.TA902]\nenabled = false\n"
    )
    monkeypatch.chdir(tmp_path)
    result = evaluate(store(), rules=RuleSet([long_calls_rule(), broken_rule()]))
    by_id = {r.id: r for r in result.rules}
    assert by_id["TA901"].params["min_us"] == 1000.0 and by_id["TA901"].status == "clean"
    assert by_id["TA902"].status == "disabled"
    # --set beats the config file
    result = evaluate(
        store(), rules=RuleSet([long_calls_rule(), broken_rule()]), overrides=["TA901.min_us=1"]
    )
    assert result.rules[0].status == "fired"


def test_pyproject_tool_table(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.traceanalyzer.rules.long-calls]\nmin_us = 1000\n")
    result = evaluate(store(), rules=RuleSet([long_calls_rule()]), config_path=path)
    assert result.rules[0].params["min_us"] == 1000.0


def test_config_unknown_param_names_the_file(tmp_path):
    path = tmp_path / "traceanalyzer.toml"
    path.write_text("[rules.long-calls]\nmin_uss = 1\n")
    with pytest.raises(
        ConfigError, match="traceanalyzer.toml: rule TA901 long-calls has no parameter 'min_uss'"
    ):
        evaluate(store(), rules=RuleSet([long_calls_rule()]), config_path=path)


def test_sharding_by_rank_gives_the_same_result():
    st = store(ranks=(0, 1, 2, 3), long_calls=2)
    whole = run(long_calls_rule(), st=st).to_dict()
    sharded = run(long_calls_rule(), st=st, shard_by_rank=True).to_dict()
    assert whole == sharded


def test_partial_preconditions_are_reported_when_sharded():
    b = StoreBuilder()
    b.session(0, "s0", start_ns=0, end_ns=us(1e6)).session(1, "s1", start_ns=0, end_ns=us(1e6))
    b.api(0, "s0", "Runtime@MemCopySync", start_ns=us(10), dur_ns=us(5))
    result = run(needs_level2_rule(), st=b.store(), shard_by_rank=True)
    status = result.rules[0]
    assert status.status == "clean"
    assert status.reason.startswith("not evaluated (on ranks 1): missing CANN runtime events")


def undecided_rule(texts):
    """Says "could not judge" on every rank, in ``texts[rank]`` (``{rank}`` filled in)."""

    def body(ctx):
        sessions = ctx.table("sessions").select("rank").collect()
        for rank in sorted(set(sessions["rank"].to_list())):
            ctx.inconclusive(texts[rank].format(rank=rank), rank=rank)
        return []

    body.__doc__ = DOC
    return rule(id="TA906", name="undecided", severity="info", summary="Cannot judge.")(body)


@pytest.mark.parametrize("shard_by_rank", [False, True])
def test_could_not_judge_names_each_text_once_with_its_ranks(shard_by_rank):
    """A note that starts with its own rank ("rank 3: ...", "rank 3 stream 2: ...") is grouped
    without it, so the reason reads once for all the ranks; the notes keep their full text."""
    stream = "rank {rank} stream 2: every step is warm-up"
    texts = [stream, stream, stream, "rank 1: no steady step", "rank {rank}: no steady step"]
    texts += ["rank 40: a rank that is not its own", "only {rank} captures"]
    result = run(undecided_rule(texts), st=store(ranks=range(7)), shard_by_rank=shard_by_rank)
    status = result.rules[0]
    assert status.status == "inconclusive"
    assert status.reason == (
        "inconclusive on ranks 0-2: stream 2: every step is warm-up; "
        "inconclusive on rank 3: rank 1: no steady step; "  # another rank's name is kept
        "inconclusive on rank 4: no steady step; "
        "inconclusive on rank 5: rank 40: a rank that is not its own; "
        "inconclusive on rank 6: only 6 captures"
    )
    doc = result.to_dict()
    assert doc["inconclusive"] == [{"rule": "TA906", "name": "undecided", "reason": status.reason}]
    notes = doc["rules"][0]["notes"]  # each note as the rule wrote it, with its rank
    assert [(n["rank"], n["text"]) for n in notes][:4] == [
        (0, "rank 0 stream 2: every step is warm-up"),
        (1, "rank 1 stream 2: every step is warm-up"),
        (2, "rank 2 stream 2: every step is warm-up"),
        (3, "rank 1: no steady step"),
    ]


def test_fail_on_and_exit_code():
    r = long_calls_rule()
    assert run(r).exit_code == 0  # default never fails on findings
    assert run(r, fail_on="warning").exit_code == 1
    assert run(r, fail_on="error").exit_code == 0
    assert run(r, fail_on="error", overrides=["long-calls.error_above=1"]).exit_code == 1
    with pytest.raises(ValueError, match="fail_on"):
        run(r, fail_on="fatal")


def test_findings_json_shape(tmp_path):
    result = run(long_calls_rule(), broken_rule(), needs_level2_rule(), fail_on="warning")
    path = write_findings_json(result, tmp_path)
    assert path == tmp_path / "findings.json"
    assert not [p for p in tmp_path.iterdir() if p.name != "findings.json"]  # no temp left
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1
    assert set(doc) >= {"findings", "not_evaluated", "errors", "rules", "summary"}
    finding = doc["findings"][0]
    for key in (
        "rule",
        "severity",
        "ranks",
        "title",
        "message",
        "metrics",
        "evidence",
        "fix",
        "fingerprint",
    ):
        assert key in finding
    assert doc["summary"]["failed"] is True and doc["summary"]["by_severity"]["warning"] == 1
    assert [e["rule"] for e in doc["errors"]] == ["TA902"]
    assert [n["rule"] for n in doc["not_evaluated"]] == ["TA903"]


def test_sql_rule():
    heavy = sql_rule(
        id="TA907",
        name="many-memcpy",
        severity="info",
        summary="Many memcpy calls.",
        doc=DOC,
        query="SELECT rank, session, COUNT(*) AS calls FROM slices "
        "WHERE api_name = '{api}' GROUP BY rank, session HAVING COUNT(*) >= {min_calls}",
        title="{calls} calls to {api}",
        message="rank {rank} calls {api} {calls} times",
        location=["session"],
        metrics=["calls"],
        params={"api": Param("aclrtMemcpy", "api"), "min_calls": Param(4, "min")},
    )
    result = run(heavy, st=store(ranks=(0, 1)))
    assert [f.title for f in result.findings] == [
        "4 calls to aclrtMemcpy",
        "4 calls to aclrtMemcpy",
    ]
    assert run(heavy, st=store(ranks=(0,)), overrides=["TA907.min_calls=5"]).findings == []


def test_loading_extra_rule_dirs_and_load_errors(tmp_path):
    (tmp_path / "good.py").write_text(
        "from traceanalyzer.engine import rule\n"
        "@rule(id='TA950', name='good', severity='info', summary='Good.')\n"
        f"def good(ctx):\n    '''{DOC}'''\n    return []\n"
    )
    (tmp_path / "bad.py").write_text("raise ImportError('no such thing')\n")
    result = evaluate(store(), rule_dirs=[tmp_path], config_path=False, select=["good"])
    assert [r.name for r in result.rules] == ["good"]
    assert any("bad.py" in e["rule"] and "no such thing" in e["error"] for e in result.errors)


def test_entry_point_rule_packs(tmp_path, monkeypatch):
    from importlib import metadata

    from traceanalyzer.engine import loader

    pack = tmp_path / "pack"
    pack.mkdir()
    (pack / "packed.py").write_text(
        "from traceanalyzer.engine import rule\n"
        "@rule(id='TA960', name='packed', severity='info', summary='From a pack.')\n"
        f"def packed(ctx):\n    '''{DOC}'''\n    return []\n"
    )
    entry = metadata.EntryPoint("mypack", "pathlib:Path", loader.ENTRY_POINT_GROUP)
    monkeypatch.setattr(entry.__class__, "load", lambda self: pack)
    monkeypatch.setattr(
        loader.metadata,
        "entry_points",
        lambda group: [entry] if group == loader.ENTRY_POINT_GROUP else [],
    )
    loaded = loader.load_rules(builtin=False)
    assert [r.name for r in loaded.rules] == ["packed"] and loaded.errors == []


def test_shared_derivations_run_once_per_shard_and_parameter_values(tmp_path):
    from traceanalyzer.engine.params import Params
    from traceanalyzer.store import RankStore

    store = RankStore(tmp_path, [0])
    runs: list[dict] = []

    def steps(ctx: RuleContext) -> int:
        runs.append(dict(ctx.params))
        return ctx.params.step_pattern.count("#")

    def context(**params) -> RuleContext:
        return RuleContext(long_calls_rule(), store, Params(params), frozenset({0}))

    first = context(step_pattern="Step#", min_us=1.0)
    assert first.shared(steps, ["step_pattern"]) == 1
    assert context(step_pattern="Step#", min_us=9.0).shared(steps, ["step_pattern"]) == 1
    assert runs == [{"step_pattern": "Step#"}]  # once, and it saw only what it named
    assert context(step_pattern="##").shared(steps, ["step_pattern"]) == 2  # another value
    assert len(runs) == 2

    def reads_more(ctx: RuleContext) -> float:
        return ctx.params.min_us

    with pytest.raises(AttributeError, match="min_us"):
        first.shared(reads_more, ["step_pattern"])


def test_rules_side_by_side_derive_what_they_share_once(tmp_path):
    """Two rules asking a snapshot for the same derivation at once: the second waits for the
    first's value (the memory rules ran the memory stage twice, one per thread)."""
    import threading
    import time

    from traceanalyzer.store import RankStore

    store = RankStore(tmp_path, [0])
    started = threading.Event()
    runs = []

    def derive() -> int:
        runs.append(1)
        started.set()
        time.sleep(0.3)  # the other rule asks meanwhile
        return 7

    first = threading.Thread(target=lambda: store.memo("memory", derive))
    first.start()
    started.wait()
    assert store.memo("memory", derive) == 7
    first.join()
    assert len(runs) == 1


def test_a_rank_shard_holds_its_small_tables_in_memory_and_scans_the_large(tmp_path, monkeypatch):
    from pathlib import Path

    from traceanalyzer import store as store_module
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.ingest import ingest
    from traceanalyzer.store import RankStore, Store

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "inference_baseline"
    out = tmp_path / "out"
    ingest(sample, out, executor=LocalExecutor())
    slices = Store.open(out).table("slices").collect()
    monkeypatch.setattr(store_module, "IN_MEMORY_TABLE_ROWS", slices.height - 1)
    shard = RankStore(out, [0])
    assert "PARQUET" in shard.table("slices").explain().upper()  # too many rows: scanned
    assert shard.table("sessions").explain().startswith("DF")  # small: decoded once
    assert shard.table("slices") is shard.table("slices")  # listed once per task
    assert shard.table("slices").collect().equals(slices)
    assert shard.sessions().equals(Store.open(out).sessions())
