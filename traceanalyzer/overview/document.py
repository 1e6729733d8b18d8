"""The ``summary.overview`` section of findings.json, and each finding's cost in that picture.

The schema is documented in ``docs/overview.md``; reports (HTML, Markdown, terminal, diff) read
this section, never the engine, so they can be rebuilt from an output directory alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

import polars as pl

from traceanalyzer.overview.breakdown import computing_ns
from traceanalyzer.overview.compute import DEFAULT_TOP, TopSizes
from traceanalyzer.schema import COMPONENT_NAMES
from traceanalyzer.store import Store

SCHEMA_VERSION = 1
# events vs the export's own step breakdown: what "agrees" means (share of Stage)
CHECK_TOLERANCE = 0.02
# where each export format keeps its own step breakdown (sessions.source_format)
STEP_REFERENCE = {"text": "step_trace_time.csv", "db": "analysis.db StepTraceTime"}

# key, label, group: the order is the stacked bar's, bottom to top
COMPONENTS: tuple[tuple[str, str, str], ...] = (
    ("compute_ai_core_ns", "compute: AI Core", "compute"),
    ("compute_ai_vector_ns", "compute: AI Vector", "compute"),
    ("compute_mix_ns", "compute: MIX", "compute"),
    ("compute_ai_cpu_ns", "compute: AI CPU", "compute"),
    ("compute_other_ns", "compute: other", "compute"),
    ("overlapped_ns", "compute + communication (overlapped)", "communication"),
    ("comm_exposed_ns", "communication, not overlapped", "communication"),
    ("device_other_ns", "memory copies, runtime tasks", "device"),
    ("idle_host_ns", "idle: waiting on the host (launch-bound)", "idle"),
    ("idle_stream_ns", "idle: waiting on another stream", "idle"),
    ("idle_other_ns", "idle: other", "idle"),
)
# what the headline weighs: the components a performance engineer acts on, grouped
HEADLINE_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute", tuple(k for k, _, g in COMPONENTS if g == "compute") + ("overlapped_ns",)),
    ("exposed communication", ("comm_exposed_ns",)),
    ("memory copies and runtime tasks", ("device_other_ns",)),
    ("the device waiting on the host", ("idle_host_ns",)),
    ("streams waiting on other streams", ("idle_stream_ns",)),
    ("other device idle time", ("idle_other_ns",)),
)


def headline(mean: Mapping[str, float] | None) -> str | None:
    """ "Most of the step is exposed communication (64%), then ... (17%)": the two largest parts."""
    if not mean or not mean.get("step_ns"):
        return None
    parts = sorted(
        (
            (sum(mean.get(k, 0.0) for k in keys) / mean["step_ns"], name)
            for name, keys in HEADLINE_PARTS
        ),
        reverse=True,
    )
    (first, first_name), (second, second_name) = parts[0], parts[1]
    lead = "Most of the step is" if first >= 0.5 else "The largest part of the step is"
    text = f"{lead} {first_name} ({first:.0%})"
    return text + (f", then {second_name} ({second:.0%})." if second >= 0.05 else ".")


def _mean_components(frame: pl.DataFrame) -> dict[str, float]:
    return {k: float(frame[k].mean() or 0.0) for k in ("step_ns", *COMPONENT_NAMES)}


def _tops(frame: pl.DataFrame, by: list[str], n: int, extra: Iterable[pl.Expr] = ()) -> list[dict]:
    """Per-rank top tables combined: sums over ranks, p95 the worst rank's, share re-weighted."""
    if frame.is_empty():
        return []
    has_share = "share" in frame.columns
    aggs = [
        pl.col("rank").n_unique().alias("ranks"),
        pl.col("count").sum(),
        pl.col("total_ns").sum(),
        *extra,
    ]
    if has_share:
        aggs.append((pl.col("total_ns") / pl.col("share")).sum().alias("_whole"))
    if "p95_ns" in frame.columns:
        aggs.append(pl.col("p95_ns").max())
    out = (
        frame.group_by(by)
        .agg(aggs)
        .with_columns((pl.col("total_ns") / pl.col("count")).round(0).alias("mean_ns"))
        .sort(["total_ns", *by], descending=[True, *([False] * len(by))])
        .head(n)
    )
    if has_share:
        out = out.with_columns((pl.col("total_ns") / pl.col("_whole")).alias("share")).drop(
            "_whole"
        )
    return out.to_dicts()


def overview_document(
    store: Store, sizes: TopSizes = DEFAULT_TOP, failed: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """Everything the reports show of the overview, from the store's summary tables."""
    steps = store.table("summary_steps").collect().sort("rank", "session", "start_ns")
    ranks = []
    for (rank,), part in steps.group_by("rank", maintain_order=True):
        means = _mean_components(part)
        ranks.append(
            {
                "rank": int(rank),  # type: ignore[arg-type]
                "steps": part.height,
                "total_ns": int(part["step_ns"].sum()),
                "sources": sorted(set(part["source"].to_list())),
                **means,
            }
        )
    representative = None
    if steps.height:
        median = steps["step_ns"].median()
        pick = steps.with_columns((pl.col("step_ns") - median).abs().alias("_d")).sort(
            "_d", "rank", "start_ns"
        )
        row = pick.row(0, named=True)
        representative = {k: row[k] for k in ("rank", "session", "step", "start_ns", "end_ns")}
    cluster = store.table("summary_ranks").collect().sort("rank")
    mean = _mean_components(steps) if steps.height else None
    return {
        "schema_version": SCHEMA_VERSION,
        "components": [{"key": k, "label": label, "group": g} for k, label, g in COMPONENTS],
        "source": {
            "breakdown": sorted(set(steps["source"].to_list())),
            **self_check(steps, _source_formats(store)),
        },
        "steps": steps.height,
        "mean": mean,
        "headline": headline(mean),
        "computing_ns": float(steps.select(computing_ns().mean()).item() or 0.0)
        if steps.height
        else None,
        "ranks": ranks,
        "cluster": cluster.drop("session").to_dicts(),
        "representative": representative,
        "top_kernels": _tops(
            store.table("summary_kernels").collect(), ["name", "accelerator"], sizes.kernels
        ),
        "top_host_apis": _tops(
            store.table("summary_host_apis").collect(), ["kind", "name"], sizes.host_apis
        ),
        "top_collectives": _tops(
            store.table("summary_collectives").collect(),
            ["name", "source"],
            sizes.collectives,
            extra=[pl.col("wait_ns").sum(), pl.col("transit_ns").sum()],
        ),
        "sizes": asdict(sizes),
        "failed": {str(k): v for k, v in (failed or {}).items()},
        "costs": {},
    }


def _source_formats(store: Store) -> list[str]:
    """The formats the sessions were read from (stores written before the column: text)."""
    sessions = store.table("sessions")
    if "source_format" not in sessions.collect_schema().names():
        return ["text"]
    formats = sessions.select(pl.col("source_format").fill_null("text")).collect()
    return sorted(set(formats["source_format"].to_list()))


def self_check(steps: pl.DataFrame, formats: Iterable[str]) -> dict[str, Any]:
    """How the breakdown compares with the export's own step breakdown (``reference``, by the
    ``formats`` the sessions were read from): steps checked and differing beyond the
    tolerance, the worst deviation (share of Stage), its component and rank, and the ranks
    whose breakdown is therefore unreliable. ``agrees`` None: nothing to check against."""
    checked = steps.filter(pl.col("check_deviation").is_not_null())
    differing = checked.filter(pl.col("check_deviation") > CHECK_TOLERANCE)
    worst = checked.sort("check_deviation", descending=True).head(1).to_dicts()
    deviation = worst[0]["check_deviation"] if worst else None
    return {
        "reference": " / ".join(STEP_REFERENCE.get(f, f) for f in formats),
        "checked_steps": checked.height,
        "differing_steps": differing.height,
        "differing_ranks": sorted(set(differing["rank"].to_list())),
        "max_deviation": deviation,
        "component": worst[0].get("check_component") if worst else None,
        "worst_rank": worst[0]["rank"] if worst else None,
        "tolerance": CHECK_TOLERANCE,
        "agrees": None if deviation is None else deviation <= CHECK_TOLERANCE,
    }


# --------------------------------------------------------------------------------------------
# Findings in the picture: what share of the step (window) time each one costs
# --------------------------------------------------------------------------------------------


def _occurrence_cost(metrics: Mapping[str, Any]) -> tuple[float | None, float | None, str]:
    """(cost_ns over the rank's windows, share of its step time, how) from one rank's metrics:
    a rule states its cost in ``cost_ns`` / ``cost_share`` (docs/writing-rules.md)."""
    if isinstance(metrics.get("cost_ns"), (int, float)) or isinstance(
        metrics.get("cost_share"), (int, float)
    ):
        return metrics.get("cost_ns"), metrics.get("cost_share"), "cost_ns/cost_share"
    return None, None, ""


def finding_costs(
    findings: Iterable[Mapping[str, Any]], overview: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """fingerprint -> {cost_ns, cost_share, basis} for the findings whose metrics allow it.

    A finding over several ranks costs the sum over its occurrences; its share is that sum over
    the same ranks' total step (window) time.
    """
    totals = {r["rank"]: r["total_ns"] for r in overview.get("ranks", [])}
    unreliable = set((overview.get("source") or {}).get("differing_ranks") or [])
    out: dict[str, dict[str, Any]] = {}
    for finding in findings:
        occurrences = finding.get("occurrences") or [
            {"ranks": finding.get("ranks", []), "metrics": finding.get("metrics", {})}
        ]
        cost, window, shares, basis = 0.0, 0, [], ""
        for occ in occurrences:
            ns, share, how = _occurrence_cost(occ.get("metrics") or {})
            if not how:
                continue
            basis = how
            occ_window = sum(totals.get(r, 0) for r in occ.get("ranks", []))
            if ns is not None:
                cost += float(ns)
                window += occ_window
            if share is not None:
                shares.append(float(share))
            elif ns is not None and occ_window:
                shares.append(float(ns) / occ_window)
        if not basis:
            continue
        share = cost / window if window and cost else (max(shares) if shares else None)
        out[finding["fingerprint"]] = {
            "cost_ns": cost or None,
            "cost_share": None if share is None else min(share, 1.0),
            "basis": basis,
        }
        doubtful = sorted(unreliable & set(finding.get("ranks") or []))
        if doubtful:
            # the share is of step time whose breakdown the export's own record contradicts
            out[finding["fingerprint"]]["unreliable_ranks"] = doubtful
    return out


def by_cost(findings: list[Mapping[str, Any]], costs: Mapping[str, Mapping[str, Any]]) -> list:
    """Findings sorted by the share of step time they cost (those without a cost last, as they
    came: by severity)."""

    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[int, float, int]:
        index, f = item
        share = (costs.get(f.get("fingerprint", "")) or {}).get("cost_share")
        return (0, -share, index) if share is not None else (1, 0.0, index)

    return [f for _, f in sorted(enumerate(findings), key=key)]
