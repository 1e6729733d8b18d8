"""The ``summary.overview`` section of findings.json, and each finding's cost in that picture.

The schema is documented in ``docs/overview.md``; reports (HTML, Markdown, terminal, diff) read
this section, never the engine, so they can be rebuilt from an output directory alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import polars as pl

from traceanalyzer.engine.advice import collect_hint, store_facts
from traceanalyzer.engine.findings import Finding, Occurrence, bounded_share
from traceanalyzer.overview.breakdown import computing_ns, unmeasured
from traceanalyzer.overview.collectives import collectives_section
from traceanalyzer.overview.headline import headline, mean_components, phase_headline
from traceanalyzer.overview.memory import memory_section
from traceanalyzer.overview.model import (
    DEFAULT_TOP,
    SCHEMA_VERSION,
    ClusterRow,
    ComponentName,
    FindingCost,
    Overview,
    RankRow,
    Representative,
    Source,
    TopCollective,
    TopHostApi,
    TopKernel,
    TopSizes,
    Unmeasured,
)
from traceanalyzer.overview.phases import (
    iterations,
    layer_times,
    phase_totals,
    phases_section,
    whole_session,
)
from traceanalyzer.overview.timeline import step_timeline
from traceanalyzer.overview.tops import combined_tops
from traceanalyzer.step_components import COMPONENTS
from traceanalyzer.store import Store

# events vs the export's own step breakdown: what "agrees" means (share of Stage)
CHECK_TOLERANCE = 0.02
# where each export format keeps its own step breakdown (sessions.source_format)
STEP_REFERENCE = {"text": "step_trace_time.csv", "db": "analysis.db StepTraceTime"}


def overview_document(
    store: Store,
    sizes: TopSizes = DEFAULT_TOP,
    failed: Mapping[int, str] | None = None,
    capacity_gb: float = 0.0,
) -> Overview:
    """Everything the reports show of the overview, from the store's summary tables;
    ``capacity_gb``: the device's memory (``memory.capacity_gb``; 0: unknown)."""
    windows = store.table("summary_steps").collect().sort("rank", "session", "start_ns")
    kernels = store.table("summary_kernels").collect()
    host_apis = store.table("summary_host_apis").collect()
    steps = iterations(windows)
    # every window, the idle time between iterations too: what a finding's cost is a share of,
    # as the rules take it (kit.cost)
    window_ns = {
        int(r): int(ns)
        for r, ns in windows.group_by("rank").agg(pl.col("step_ns").sum()).iter_rows()
    }
    ranks = [
        RankRow(
            rank=int(rank),  # type: ignore[arg-type]
            steps=part.height,
            total_ns=int(part["step_ns"].sum()),
            window_ns=window_ns.get(int(rank), int(part["step_ns"].sum())),  # type: ignore[arg-type]
            phase_ns=phase_totals(part),
            sources=sorted(set(part["source"].to_list())),
            unmeasured=unmeasured(part),
            mean=mean_components(part),
        )
        for (rank,), part in steps.group_by("rank", maintain_order=True)
    ]
    representative = None
    if steps.height:
        median = steps["step_ns"].median()
        pick = steps.with_columns((pl.col("step_ns") - median).abs().alias("_d")).sort(
            "_d", "rank", "start_ns"
        )
        row = pick.row(0, named=True)
        step = {k: row[k] for k in ("rank", "session", "step", "start_ns", "end_ns")}
        representative = Representative(**step, timeline=step_timeline(store, step))
    cluster = store.table("summary_ranks").collect().sort("rank")
    mean = mean_components(steps) if steps.height else None
    phases = phases_section(windows, kernels, host_apis, layer_times(store))
    return Overview(
        schema_version=SCHEMA_VERSION,
        components=[ComponentName(key=c.key, label=c.label, group=c.group) for c in COMPONENTS],
        unmeasured=_unmeasured(store, steps, ranks),
        source=Source(
            breakdown=sorted(set(steps["source"].to_list())),
            **self_check(windows, _source_formats(store)),
        ),
        steps=steps.height,
        mean=mean,
        # a serving profile leads with its phases: one mean over them describes none
        headline=phase_headline(phases.rows) or headline(mean),
        computing_ns=float(steps.select(computing_ns().mean()).item() or 0.0)
        if steps.height
        else None,
        ranks=ranks,
        cluster=[ClusterRow(**r) for r in cluster.drop("session").to_dicts()],
        representative=representative,
        top_kernels=combined_tops(
            whole_session(kernels), ["name", "accelerator"], sizes.kernels, TopKernel
        ),
        top_host_apis=combined_tops(
            whole_session(host_apis), ["kind", "name"], sizes.host_apis, TopHostApi
        ),
        top_collectives=combined_tops(
            store.table("summary_collectives").collect(),
            ["name", "source"],
            sizes.collectives,
            TopCollective,
            extra=[pl.col("wait_ns").sum(), pl.col("transit_ns").sum()],
        ),
        phases=phases,
        memory=memory_section(store, capacity_gb),
        collectives=collectives_section(store),
        sizes=sizes,
        failed={str(k): v for k, v in (failed or {}).items()},
        costs={},
    )


def _unmeasured(store: Store, steps: pl.DataFrame, ranks: list[RankRow]) -> dict[str, Unmeasured]:
    """Per component some ranks could not measure: those ranks, and why (where its time is
    then, and what would measure it, from what their export says it collected)."""
    out = {}
    for c in COMPONENTS:
        on = [r.rank for r in ranks if c.key in r.unmeasured]
        if not on:
            continue
        mine = steps.filter(pl.col("rank").is_in(on))
        timeless = c.no_timeline is not None and (mine["source"] == "step_trace_time").all()
        why, collect, table = (
            (c.no_timeline, "ProfilerActivity.NPU", "slices")
            if timeless
            else (c.unmeasured.why, c.unmeasured.collect, c.unmeasured.table)
        )
        out[c.key] = Unmeasured(
            ranks=on, reason=why + collect_hint(collect, store_facts(store, on), table)
        )
    return out


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
    whose breakdown is therefore unreliable. ``agrees`` None: nothing to check against.
    A step counts for itself, or (``check_scope`` session) its session counts once."""
    # a check of a session's total is written on each of its windows: count it once
    per_session = pl.col("check_scope").fill_null("step") == "session"
    checked = (
        steps.filter(pl.col("check_deviation").is_not_null())
        .with_columns(pl.when(~per_session).then(pl.col("step")).alias("_unit"))
        .unique(["rank", "session", "_unit"], keep="first", maintain_order=True)
    )
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


# how a finding's cost was derived: the rule stated it (written as its metrics cost_ns/cost_share)
COST_BASIS = "cost_ns/cost_share"


def finding_costs(findings: Iterable[Finding], overview: Overview) -> dict[str, FindingCost]:
    """fingerprint -> its :class:`FindingCost`, for the findings whose rule states a cost.

    A finding over several ranks costs the sum over its occurrences; its share is that sum over
    the same ranks' total step (window) time. A finding that names its phases also gets
    ``phase_share``: the cost over those phases' time on its ranks. The ranks are the
    finding's ``cost_ranks`` where it names them (whose time was lost), else its ranks.
    """
    totals = {r.rank: r.total_ns if r.window_ns is None else r.window_ns for r in overview.ranks}
    phase_ns = {r.rank: r.phase_ns for r in overview.ranks}
    unreliable = set(overview.source.differing_ranks)
    out: dict[str, FindingCost] = {}
    for finding in findings:
        occurrences: Sequence[Finding | Occurrence] = finding.occurrences or [finding]
        cost, window, shares, costed, stated = 0.0, 0, [], set(), False
        phases = list(finding.phases)
        in_phases = 0  # the time of those phases on the finding's ranks
        for occ in occurrences:
            ns, share = (occ.cost.ns, occ.cost.share) if occ.cost else (None, None)
            if ns is None and share is None:
                continue  # no cost stated, or the rule could not tell it here: n/a, never 0
            stated = True
            lost_on = occ.cost_ranks or occ.ranks
            costed.update(lost_on)
            occ_window = sum(totals.get(r, 0) for r in lost_on)
            if ns is not None:
                cost += float(ns)
                window += occ_window
                in_phases += sum(phase_ns.get(r, {}).get(ph, 0) for r in lost_on for ph in phases)
            if share is not None:
                shares.append(float(share))
            elif ns is not None and occ_window:
                shares.append(float(ns) / occ_window)
        if not stated:
            continue
        share = cost / window if window and cost else (max(shares) if shares else None)
        concerned = phases and cost and in_phases  # and against the time of those phases
        out[finding.fingerprint] = FindingCost(
            cost_ns=cost or None,
            cost_share=bounded_share(share),
            basis=COST_BASIS,
            ranks=sorted(costed),  # whose step time the share is of, and the time summed over
            phases=phases if concerned else None,
            phase_share=bounded_share(cost / in_phases) if concerned else None,
            # the share is of step time whose breakdown the export's own record contradicts
            unreliable_ranks=sorted(unreliable & set(finding.ranks)) or None,
        )
    return out


def by_cost(findings: list[Mapping[str, Any]], costs: Mapping[str, FindingCost]) -> list:
    """Findings sorted by the share of step time they cost (those without a cost last, as they
    came: by severity)."""

    def key(item: tuple[int, Mapping[str, Any]]) -> tuple[int, float, int]:
        index, f = item
        cost = costs.get(f.get("fingerprint", ""))
        share = None if cost is None else cost.cost_share
        return (0, -share, index) if share is not None else (1, 0.0, index)

    return [f for _, f in sorted(enumerate(findings), key=key)]
