"""``rules new NAME``: write a working rule file and its fixtures, ready to edit and test.

The scaffold is a complete, passing rule ("host API calls matching a pattern take too long"),
so an author starts from green and changes one thing at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from traceanalyzer.engine.loader import FIXTURES_DIR

USER_ID_START = 100  # built-in rules use TA001-TA099

RULE_TEMPLATE = '''\
"""{rule_id} {name}: {summary}"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceanalyzer.engine import Evidence, Finding, Param, Requirement, RuleContext, rule
from traceanalyzer.engine import text as fmt


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
    requires=[
        Requirement(
            "slices",
            ("api_name",),
            what="CANN API events",
            collect_with="profiler_level=Level1",
            where=pl.col("process") == "CANN",
        )
    ],
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
    3 calls to aclrtSynchronizeStream take longer than 10 ms (worst 42 ms)
    ```

    ## References
    - Where this knowledge comes from (issue, doc, field report).
    """
    p = ctx.params
    slow = (
        ctx.table("slices")
        .filter(
            (pl.col("process") == "CANN")
            & pl.col("api_name").str.contains(p.api_pattern)
            & (pl.col("dur_ns") > p.min_ms * 1e6)
        )
        .collect()
    )
    for (rank,), calls in slow.group_by("rank"):
        worst = calls.sort("dur_ns", descending=True)
        yield ctx.finding(
            rank=rank,
            sessions=calls["session"].unique().sort().to_list(),
            title=f"{{calls.height}} calls matching `{{p.api_pattern}}` take longer than "
            f"{{p.min_ms:g}} ms (worst {{fmt.duration(worst['dur_ns'][0])}})",
            message=f"Rank {{rank}}: {{calls.height}} slow calls, "
            f"{{fmt.duration(calls['dur_ns'].sum())}} in total.",
            location={{"api_pattern": p.api_pattern}},
            metrics={{"calls": calls.height, "worst_ns": worst["dur_ns"][0]}},
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
            score=float(calls["dur_ns"].sum()),
        )
'''

FIXTURE_TEMPLATE = '''\
"""Fixtures for {name}: stores where the rule must fire, and where it must stay silent.

Run them with `traceanalyzer rules test {name} --rules {folder}`.
"""

from __future__ import annotations

from traceanalyzer.engine.ruletest import fixture
from traceanalyzer.engine.testing import StoreBuilder
from traceanalyzer.store import Store


def calls(durations_us: list[float]) -> Store:
    b = StoreBuilder()
    b.session(0, "s0", 0, 1_000_000)
    t = 1_000.0
    for dur in durations_us:
        b.cann(0, "s0", "AscendCL@aclrtSynchronizeStream", t, dur)
        t += dur + 100
    return b.store()


@fixture(expect="fire", ranks=[0], contains="take longer than 10 ms")
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
    b.session(0, "s0", 0, 1_000_000)
    b.cann(0, "s0", "AscendCL@aclrtMemcpy", 1_000, 42_000)
    return b.store()


@fixture(expect="not_evaluated", reason="collect with profiler_level=Level1")
def not_evaluated_without_cann_layer() -> Store:
    b = StoreBuilder()
    b.session(0, "s0", 0, 1_000_000, profiler_level="Level0")
    b.task(0, "s0", 2, "MatMul", 100, 50)
    return b.store()
'''


def next_rule_id(taken: Iterable[str]) -> str:
    used = {int(t[2:]) for t in taken if t.startswith("TA") and t[2:].isdigit()}
    number = USER_ID_START
    while number in used:
        number += 1
    return f"TA{number:03d}"


def scaffold_rule(
    name: str, folder: Path, *, rule_id: str | None = None, taken_ids: Iterable[str] = ()
) -> tuple[Path, Path]:
    """Write ``folder/<name>.py`` and ``folder/fixtures/<name>.py``; refuse to overwrite."""
    module = name.replace("-", "_")
    rule_file = folder / f"{module}.py"
    fixture_file = folder / FIXTURES_DIR / f"{module}.py"
    for path in (rule_file, fixture_file):
        if path.exists():
            raise FileExistsError(f"{path} already exists")
    values = {
        "name": name,
        "func": module,
        "rule_id": rule_id or next_rule_id(taken_ids),
        "summary": "Host API calls matching a pattern take too long.",
        "folder": folder,
    }
    fixture_file.parent.mkdir(parents=True, exist_ok=True)
    rule_file.write_text(RULE_TEMPLATE.format(**values), "utf-8")
    fixture_file.write_text(FIXTURE_TEMPLATE.format(**values), "utf-8")
    return rule_file, fixture_file
