"""TA011 risky-settings: settings recorded in profiler_metadata.json that cost performance."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    COMPUTE_TASK_TYPES,
    Evidence,
    Finding,
    KeyFigure,
    NotEvaluated,
    Param,
    Params,
    Requirement,
    RuleContext,
    analysed_window_ns,
    analysed_windows,
    cost_over,
    kernel_tasks,
    overlap_join,
    rule,
    session_metadata,
    total_length,
)
from traceanalyzer.kit import text as fmt

ENV_KEY = "ENV_VARIABLES"
NO_ENV = (
    "profiler_metadata.json records no ENV_VARIABLES (collect with torch_npu's profiler, which "
    "writes them next to profiler_info.json)"
)


@dataclass(frozen=True)
class Setting:
    """A risky value of one environment variable: when it applies, what it costs, the fix."""

    name: str
    severity: str
    risky: Callable[[str, Params], bool]
    headline: str
    cost: str
    fix: str
    measured: str | None = None  # what the trace measures of its cost ("device idle")


def _int(value: str) -> int | None:
    try:
        return int(value.strip())
    except ValueError:
        return None


SETTINGS = (
    Setting(
        "ASCEND_LAUNCH_BLOCKING",
        "warning",
        lambda v, p: v.strip().lower() in p.blocking_values,
        "every operator launch waits for the device",
        "every operator launch blocks the host until the device has run it: the torch_npu task "
        "queue is bypassed, host and device no longer overlap, and the device idles between "
        "every two kernels while the host prepares the next one",
        "unset ASCEND_LAUNCH_BLOCKING (or set it to 0) for performance runs; it is a debugging "
        "switch to locate the operator that raises an error",
        measured="device idle",
    ),
    Setting(
        "ASCEND_GLOBAL_LOG_LEVEL",
        "warning",
        lambda v, p: v.strip() in p.debug_log_levels,
        "CANN logs at debug/info level on the launch path",
        "debug (0) or info (1) logging: CANN formats and writes log lines on the host for API "
        "calls and operator launches, which lengthens every launch (host-bound decode) and "
        "fills the disk under ~/ascend/log",
        "set ASCEND_GLOBAL_LOG_LEVEL=3 (error), the default, for performance runs",
    ),
    Setting(
        "ASCEND_SLOG_PRINT_TO_STDOUT",
        "warning",
        lambda v, p: v.strip().lower() in p.blocking_values,
        "CANN log lines are printed to stdout",
        "CANN log lines go to stdout, synchronously, from the launching threads",
        "unset ASCEND_SLOG_PRINT_TO_STDOUT for performance runs",
    ),
    Setting(
        "TASK_QUEUE_ENABLE",
        "warning",
        lambda v, p: v.strip() in p.task_queue_off_values,
        "torch_npu's launch queue is off",
        "torch_npu's task queue is off: the Python thread runs each operator's launch itself "
        "instead of handing it to the dequeue thread, so Python work and launches no longer "
        "overlap",
        "set TASK_QUEUE_ENABLE=1 (or 2 in eager mode; 2 conflicts with graph mode in inference)",
    ),
    Setting(
        "ACLNN_CACHE_LIMIT",
        "info",
        lambda v, p: (n := _int(v)) is not None and n < p.min_aclnn_cache_limit,
        "the aclnn operator cache is smaller than the default 10000",
        "the aclnn operator cache holds fewer entries than the default 10000: operators fall out "
        "of it and are prepared again on the host (tiling, executor creation) on later launches",
        "unset ACLNN_CACHE_LIMIT (default 10000) or raise it, e.g. ACLNN_CACHE_LIMIT=100000 "
        "when the host is the bottleneck",
    ),
)


@rule(
    id="TA011",
    name="risky-settings",
    severity="warning",
    summary="Settings recorded in profiler_metadata.json that cost performance.",
    fix="Unset debugging switches for performance runs; each finding names the setting, what it "
    "costs and the value to use.",
    params={
        "blocking_values": Param(
            ("1", "true", "yes", "on"), "Values that turn a boolean switch on (lower case)."
        ),
        "debug_log_levels": Param(
            ("0", "1"), "ASCEND_GLOBAL_LOG_LEVEL values that log on the hot path (debug, info)."
        ),
        "task_queue_off_values": Param(("0",), "TASK_QUEUE_ENABLE values that turn it off."),
        "min_aclnn_cache_limit": Param(
            10000, "ACLNN_CACHE_LIMIT below this (the default 10000) is flagged."
        ),
        "ignore": Param((), "Setting names never to report (e.g. ACLNN_CACHE_LIMIT)."),
    },
    requires=[
        Requirement(
            "sessions",
            ("metadata",),
            what="profiler_metadata.json",
            collect_with="torch_npu's profiler (it writes profiler_metadata.json)",
        )
    ],
)
def risky_settings(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Environment settings recorded in `profiler_metadata.json` (`ENV_VARIABLES`, which torch_npu
    fills from a fixed list, and keys added with `prof.add_metadata`) that cost performance:
    - `ASCEND_LAUNCH_BLOCKING=1`: every launch synchronous;
    - `ASCEND_GLOBAL_LOG_LEVEL` 0 or 1 (`debug_log_levels`): debug/info logging on the host path;
    - `ASCEND_SLOG_PRINT_TO_STDOUT=1`: logs printed synchronously;
    - `TASK_QUEUE_ENABLE=0`: torch_npu's launch queue off;
    - `ACLNN_CACHE_LIMIT` below `min_aclnn_cache_limit`: aclnn operators re-prepared on the host.
    One finding per setting and value, grouped over the ranks that have it. For
    `ASCEND_LAUNCH_BLOCKING` the cost is measured too: the device idle time in the analysed
    window (what blocking launches leave between kernels).

    ## Why it matters
    These switches are set while debugging and forgotten: a profile taken with them measures the
    debugging setup, not the service. `ASCEND_LAUNCH_BLOCKING=1` alone turns a device-bound decode
    into a host-bound one; debug logging adds host time to every operator.

    ## How to fix
    Unset them for performance runs (each finding gives the value to use):
    `unset ASCEND_LAUNCH_BLOCKING`, `export ASCEND_GLOBAL_LOG_LEVEL=3`, `TASK_QUEUE_ENABLE=1`,
    `unset ACLNN_CACHE_LIMIT`. Settings you keep on purpose go into `ignore`.

    ## Example
    ```
    TA011 risky-settings [warning] ranks 0, 1 (2/2)
    ASCEND_LAUNCH_BLOCKING=1: every operator launch blocks the host until the device has run
    it; the device idles 62% of the analysed window
    ```
    Silent on empty (unset) values and on the recommended ones (`ASCEND_GLOBAL_LOG_LEVEL=3`,
    `ASCEND_LAUNCH_BLOCKING=0`, `TASK_QUEUE_ENABLE=1|2`). Not evaluated when no session recorded
    `ENV_VARIABLES`.

    ## References
    - torch_npu `_dump_metadata` (the recorded `ENV_VARIABLES` list) and the CANN environment
      variable reference (`ASCEND_LAUNCH_BLOCKING`, `ASCEND_GLOBAL_LOG_LEVEL`, `ACLNN_CACHE_LIMIT`).
    - msprof-analyze advisor `EnvironmentVariableChecker`
      (`advisor/rules/en/environment_variable_info.yaml`).
    """
    found = risky_found(ctx)
    if found is None:
        raise NotEvaluated(NO_ENV)
    if not found:
        ctx.note("no risky setting recorded")
        return
    by_name = {s.name: s for s in SETTINGS}
    window = analysed_window_ns(ctx)
    for (name, value), where in found.items():
        setting = by_name[name]
        for rank in sorted({r for r, _ in where}):
            sessions = sorted(s for r, s in where if r == rank)
            yield _finding(ctx, setting, value, rank, sessions, window.get(rank))


def risky_found(ctx: RuleContext) -> dict[tuple[str, str], list[tuple[int, str]]] | None:
    """(setting, value) -> the (rank, session)s that recorded it; None when no session
    recorded its environment at all."""
    p = ctx.params
    recorded = False
    found: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for row in ctx.sessions().iter_rows(named=True):
        env = recorded_settings(session_metadata(row.get("metadata")))
        if env is None:
            continue
        recorded = True
        for setting in SETTINGS:
            value = env.get(setting.name)
            if setting.name in p.ignore or value is None or not value.strip():
                continue
            if setting.risky(value, p):
                found.setdefault((setting.name, value.strip()), []).append(
                    (int(row["rank"]), row["session"])
                )
    return found if recorded else None


def recorded_settings(metadata: Mapping[str, Any]) -> dict[str, str] | None:
    """The environment a session recorded: ENV_VARIABLES plus same-named top-level keys."""
    env = metadata.get(ENV_KEY)
    names = {s.name for s in SETTINGS}
    extra = {k: v for k, v in metadata.items() if k in names}
    if not isinstance(env, dict) and not extra:
        return None
    merged = {**(env if isinstance(env, dict) else {}), **extra}
    return {str(k): "" if v is None else str(v) for k, v in merged.items()}


def _finding(
    ctx: RuleContext,
    setting: Setting,
    value: str,
    rank: int,
    sessions: list[str],
    window_ns: int | None,
) -> Finding:
    idle_ns = _device_idle_ns(ctx, rank) if setting.measured else None
    measured = ""
    if idle_ns is not None and window_ns:
        measured = f"; the device idles {idle_ns / window_ns:.0%} of the analysed window"
    message = "\n".join(
        [
            f"Rank {rank} ran with {setting.name}={value} (profiler_metadata.json).",
            f"Cost: {setting.cost}.",
            *(
                [
                    f"Measured: the device idles {fmt.duration(idle_ns)} of the "
                    f"{fmt.duration(window_ns)} analysed window (an upper bound of what blocking "
                    "launches cost)."
                ]
                if idle_ns is not None and window_ns
                else []
            ),
        ]
    )
    return ctx.finding(
        rank=rank,
        sessions=sessions,
        severity=setting.severity,  # type: ignore[arg-type]
        title=f"{setting.name}={value}: {setting.headline}{measured}",
        message=message,
        location={"setting": setting.name, "value": value},
        cost=cost_over(idle_ns, window_ns),  # unmeasured: n/a
        evidence=[
            Evidence(
                rank=rank,
                session=s,
                name=f"{setting.name}={value}",
                detail="profiler_metadata.json ENV_VARIABLES",
            )
            for s in sessions
        ],
        fix=setting.fix[0].upper() + setting.fix[1:] + ".",
        score=float(idle_ns or 0),
    )


def _device_idle_ns(ctx: RuleContext, rank: int) -> int | None:
    """Time of the rank's analysed window in which no kernel runs (None without kernels)."""
    windows = analysed_windows(ctx).filter(pl.col("rank") == rank)
    kernels = kernel_tasks(ctx.table("slices"), COMPUTE_TASK_TYPES, ranks=[rank])
    if kernels.is_empty() or windows.is_empty():
        return None
    inside = overlap_join(windows, kernels).select(
        "rank",
        pl.col("overlap_start_ns").alias("start_ns"),
        pl.col("overlap_end_ns").alias("end_ns"),
    )
    busy = int(total_length(inside, by=["rank"])["covered_ns"].sum()) if inside.height else 0
    window = int((windows["end_ns"] - windows["start_ns"]).sum())
    return max(window - busy, 0)


@risky_settings.key_figures(
    KeyFigure("risky_settings", "risky settings recorded", better="lower", unit="count"),
)
def _key_figures(ctx: RuleContext) -> list[dict[str, Any]]:
    """Per rank: how many distinct risky settings its sessions recorded (null: none recorded)."""
    found = risky_found(ctx) or {}
    counts: dict[int, int] = {}
    for where in found.values():
        for rank in {r for r, _ in where}:
            counts[rank] = counts.get(rank, 0) + 1
    recorded = sorted(
        {
            int(row["rank"])
            for row in ctx.sessions().iter_rows(named=True)
            if recorded_settings(session_metadata(row.get("metadata"))) is not None
        }
    )
    return [{"rank": r, "risky_settings": counts.get(r, 0)} for r in recorded]
