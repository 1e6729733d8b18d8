"""``rules new NAME``: write a working rule file and its fixtures, ready to edit and test.

The scaffold is a complete, passing rule ("host API calls matching a pattern take too long")
with every part a rule can have -- detection, a figure, key figures for ``diff`` and timeline
marks -- so an author starts from green and changes one thing at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from traceanalyzer.engine.loader import FIXTURES_DIR, rule_files

USER_ID_START = 100  # ids below are reserved for built-in rules

RULE_TEMPLATE = '''\
"""{rule_id} {name}: {summary}"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    CANN_PROCESS,
    COUNT,
    NS,
    PALETTE,
    Chart,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Mark,
    Param,
    RuleContext,
    analysed_window_ns,
    cost_over,
    evidence_marks,
    host_api,
    rule,
    text,
)

@rule(
    id="{rule_id}",
    name="{name}",
    severity="warning",
    summary="{summary}",
    fix="Say what to change: an env var, a code change, a version.",
    params={{
        "api_pattern": Param(r"^aclrtSynchronizeStream", "Regex on CANN api_name to watch."),
        "min_ms": Param(10.0, "Report calls longer than this (ms)."),
    }},
    # the data it reads; without it: "not evaluated: missing CANN API events (collect with ...)"
    requires=[host_api()],
    # how the reports print its metrics that are not plain numbers (NS: a duration, SHARE, ...)
    units={{"worst_ns": NS}},
)
def {func}(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Host CANN API calls matching `api_pattern` that take longer than `min_ms`.

    ## Why it matters
    Explain the cost in the user's terms (step time, TTFT, capture time).

    ## How to fix
    The concrete change, and its caveats.

    ## Example
    ```
    {rule_id} {name} [warning] rank 0
    3 calls matching `^aclrtSynchronizeStream` take longer than 10 ms (worst 42 ms)
    ```

    ## References
    - Where this knowledge comes from (issue, doc, field report).
    """
    p = ctx.params
    windows = analysed_window_ns(ctx)  # per rank: the time a cost is a share of
    for (rank,), calls in _slow_calls(ctx).group_by("rank"):
        worst = calls.sort("dur_ns", descending=True)
        yield ctx.finding(
            rank=rank,
            sessions=calls["session"].unique().sort().to_list(),
            title=f"{{calls.height}} calls matching `{{p.api_pattern}}` take longer than "
            f"{{p.min_ms:g}} ms (worst {{text.duration(worst['dur_ns'][0])}})",
            message=f"Rank {{rank}}: {{calls.height}} slow calls, "
            f"{{text.duration(calls['dur_ns'].sum())}} in total.",
            # where the problem is, never when or on which rank: the fingerprint, the grouping
            # of ranks into one finding and `diff` all key on it
            location={{"api_pattern": p.api_pattern}},
            metrics={{"calls": calls.height, "worst_ns": worst["dur_ns"][0]}},
            # the time it costs, and its share of the rank's window: the reports rank by it
            cost=cost_over(float(calls["dur_ns"].sum()), windows.get(rank)),
            evidence=[
                Evidence(
                    rank=rank,
                    session=row["session"],
                    name=row["name"],
                    process=row["process"],
                    thread=row["thread"],
                    start_ns=row["start_ns"],
                    dur_ns=row["dur_ns"],
                )
                for row in worst.head(10).iter_rows(named=True)
            ],
            # what the figure draws: every slow call, in time order
            series={{"duration_ns": calls.sort("start_ns")["dur_ns"].to_list()}},
            score=float(calls["dur_ns"].sum()),
        )


def _calls(ctx: RuleContext) -> pl.LazyFrame:
    """The CANN calls the rule watches (shared by the body and the key figures)."""
    watched = pl.col("api_name").str.contains(ctx.params.api_pattern)
    return ctx.table("slices").filter((pl.col("process") == CANN_PROCESS) & watched)


def _slow_calls(ctx: RuleContext) -> pl.DataFrame:
    return _calls(ctx).filter(pl.col("dur_ns") > ctx.params.min_ms * 1e6).collect()


@{func}.figure(caption="Duration of each slow call, in time order, per rank.")
def _figure(fig: FigureContext) -> Chart | None:
    series = [(ranks, s) for ranks, s in fig.series_by_rank() if s.get("duration_ns")]
    if not series:
        return None
    figure, (ax,) = fig.new(7.0, 2.8)  # SVG; fig.matplotlib(...) for the whole matplotlib API
    for i, (ranks, s) in enumerate(series):
        ms = [d / 1e6 for d in s["duration_ns"]]
        label = "rank " + ", ".join(map(str, ranks))
        ax.plot(range(len(ms)), ms, marker="o", color=PALETTE[i % len(PALETTE)], label=label)
    ax.axhline(fig.params.min_ms, color="#9ca3af", linestyle="--", linewidth=1)
    ax.set_xlabel("slow call (time order)", fontsize=9)
    ax.set_ylabel("ms", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    return figure


@{func}.key_figures(
    KeyFigure("calls", "calls matching the pattern", unit=COUNT),
    KeyFigure("slow_calls", "slow calls", better="lower", unit=COUNT),
    KeyFigure("call_ns_total", "time in matching calls", better="lower", unit=NS),
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank, whether or not the rule fired: `diff` compares these between two runs."""
    slow = pl.col("dur_ns") > ctx.params.min_ms * 1e6
    return (
        _calls(ctx)
        .group_by("rank")
        .agg(
            pl.len().alias("calls"),
            slow.sum().alias("slow_calls"),
            pl.col("dur_ns").sum().alias("call_ns_total"),
        )
        .collect()
    )


@{func}.marks
def _marks(finding: Mapping[str, Any]) -> Iterator[Mark]:
    """On the timeline (annotations.json): each slow call of the evidence, on its own track."""
    for mark in evidence_marks(finding):
        yield Mark(
            rank=mark.rank,
            session=mark.session,
            name=f"slow: {{mark.name}}",
            start_ns=mark.start_ns,
            dur_ns=mark.dur_ns,
            track="slow calls",
            category="{name}",
        )
'''

FIXTURE_TEMPLATE = '''\
"""Fixtures for {name}: stores where the rule must fire, and where it must stay silent.

Run them with `traceanalyzer rules test {name} --rules {folder}`.
"""

from __future__ import annotations

from traceanalyzer.kit.testing import Store, StoreBuilder, fixture, us


def calls(durations_us: list[float]) -> Store:
    """One synchronisation call per duration (µs), 100 µs apart."""
    b = StoreBuilder()
    b.session(0, "s0", start_ns=0, end_ns=us(1_000_000))
    t = us(1_000)
    for dur in map(us, durations_us):
        b.api(0, "s0", "aclrtSynchronizeStream", start_ns=t, dur_ns=dur)
        t += dur + us(100)
    return b.store()


@fixture(expect="fire", ranks=[0], contains="take longer than 10 ms", cost=(us(42_000), 0.0))
def fire_one_slow_call() -> Store:
    return calls([50, 42_000, 60])


@fixture(expect="fire", params={{"min_ms": 1.0}}, ranks=[0])
def fire_with_lower_threshold() -> Store:
    return calls([50, 2_000, 60])


@fixture(expect="silent")
def silent_all_fast() -> Store:
    return calls([50, 60, 70])


@fixture(expect="silent")
def silent_slow_but_other_api() -> Store:
    b = StoreBuilder()
    b.session(0, "s0", start_ns=0, end_ns=us(1_000_000))
    b.api(0, "s0", "aclrtMemcpy", start_ns=us(1_000), dur_ns=us(42_000))
    return b.store()


@fixture(expect="not_evaluated", reason="collect with profiler_level=Level1")
def not_evaluated_without_cann_layer() -> Store:
    b = StoreBuilder()
    b.session(0, "s0", start_ns=0, end_ns=us(1_000_000), profiler_level="Level0")
    b.task(0, "s0", "MatMul", stream=2, start_ns=us(100), dur_ns=us(50))
    return b.store()
'''


_DECLARED_ID = re.compile(r"""\bid\s*=\s*["']([A-Z]{2,4}\d{3,4})["']""")


def declared_ids(folders: Iterable[Path]) -> set[str]:
    """Rule ids written in the rule files of ``folders``, even in files that do not load (a
    file that cannot be read, a dangling link say, declares none)."""
    ids = set()
    for folder in folders:
        for path in rule_files(folder) if folder.is_dir() else ():
            try:
                text = path.read_text("utf-8", errors="replace")
            except OSError:
                continue
            ids.update(match.group(1) for match in _DECLARED_ID.finditer(text))
    return ids


def next_rule_id(taken: Iterable[str]) -> str:
    """The first ``TA1xx`` id no rule uses (``TA001``-``TA099`` are reserved for built-ins)."""
    used = {int(t[2:]) for t in taken if t.startswith("TA") and t[2:].isdigit()}
    number = USER_ID_START
    while number in used:
        number += 1
    return f"TA{number:03d}"


def scaffold_rule(
    name: str, folder: Path, *, rule_id: str | None = None, taken_ids: Iterable[str] = ()
) -> tuple[Path, Path]:
    """Write ``folder/<name>.py`` and ``folder/fixtures/<name>.py``; refuse to overwrite. A
    write that fails (OSError) leaves neither."""
    module = name.replace("-", "_")
    rule_file = folder / f"{module}.py"
    fixture_file = folder / FIXTURES_DIR / f"{module}.py"
    for path in (rule_file, fixture_file):
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path} already exists")
    values = {
        "name": name,
        "func": module,
        "rule_id": rule_id or next_rule_id(taken_ids),
        "summary": "Host API calls matching a pattern take too long.",
        "folder": folder,
    }
    fixture_file.parent.mkdir(parents=True, exist_ok=True)
    created: list[Path] = []
    try:
        for path, template in ((rule_file, RULE_TEMPLATE), (fixture_file, FIXTURE_TEMPLATE)):
            # "x": created, never opened if it exists, nor through a link (a dangling one too,
            # which exists() does not see)
            with open(path, "x", encoding="utf-8") as fh:
                created.append(path)
                fh.write(template.format(**values))
    except OSError:
        for path in created:  # no half-written rule is left behind
            path.unlink(missing_ok=True)
        raise
    return rule_file, fixture_file
