"""The overview per serving phase: how each kind of engine iteration spends its time.

A vLLM profile is a sequence of iterations that behave nothing alike: a prefill is compute on
long sequences, a decode a short graph replay, a dummy run pads an idle data-parallel rank. The
mean over all of them describes none. ``summary.overview.phases`` gives each phase its own
breakdown, percentiles, throughput and top tables, the share of the profile's wall time it
holds, and a strip of the phases over time (``docs/overview.md``).
"""

from __future__ import annotations

import polars as pl

from traceanalyzer.derived.phases import IDLE_PHASE as IDLE  # a window, not an iteration
from traceanalyzer.derived.phases import PHASES
from traceanalyzer.derived.phases import UNKNOWN_PHASE as UNKNOWN
from traceanalyzer.overview.breakdown import unmeasured
from traceanalyzer.overview.headline import headline, mean_components
from traceanalyzer.overview.model import (
    CaptureNote,
    EpExchange,
    Graphs,
    Layers,
    PhaseLane,
    PhaseRow,
    Phases,
    Run,
    SlowLayer,
    TopHostApi,
    TopKernel,
)
from traceanalyzer.overview.tops import ALL_PHASES, combined_tops
from traceanalyzer.store import Store

PHASE_TOP = 5  # rows of each phase's top tables
TIMELINE_RANKS = 8  # ranks on the phase strip (the first ones; the table has every rank)
TIMELINE_RUNS = 600  # most runs a rank's strip keeps (beyond: resampled to as many slots)


def _phase(frame: pl.DataFrame) -> pl.Expr:
    # stores written before the phases have none: their windows are of an unknown phase
    return pl.col("phase").fill_null(UNKNOWN) if "phase" in frame.columns else pl.lit(UNKNOWN)


def iterations(windows: pl.DataFrame) -> pl.DataFrame:
    """The windows that are engine iterations (not the idle time between two)."""
    return windows.filter(_phase(windows) != IDLE)


def phase_totals(steps: pl.DataFrame) -> dict[str, int]:
    """Total step time per phase (a rank's: what a finding's cost is a share of)."""
    if steps.is_empty():
        return {}
    totals = steps.group_by(_phase(steps).alias("phase")).agg(pl.col("step_ns").sum())
    return {str(p): int(ns) for p, ns in totals.sort("phase").iter_rows()}


def whole_session(tops: pl.DataFrame) -> pl.DataFrame:
    """A per-phase top table's rows over the whole session."""
    if "phase" not in tops.columns:
        return tops
    return tops.filter(pl.col("phase").fill_null(ALL_PHASES) == ALL_PHASES)


_ORDER = {p: i for i, p in enumerate(PHASES)}


def phase_order(phase: str) -> tuple[int, str]:
    """A phase's place in the reports: in :data:`PHASES` order, any other after them by name."""
    return (_ORDER.get(phase, len(_ORDER)), phase)


def _counts(part: pl.DataFrame, column: str) -> dict[str, int]:
    values = part[column].drop_nulls().value_counts(sort=True)
    return {str(v): int(n) for v, n in values.iter_rows()}


# a decoder layer this much slower than the median of its peers (the layers of its kind: MoE
# or dense), and by this much, is named in the layer profile
SLOW_LAYER_RATIO, SLOW_LAYER_NS = 1.3, 5_000


def layer_times(store: Store) -> pl.DataFrame:
    """Per phase, decoder layer (null: outside the layers), module and how they were found
    (``attribution``, and ``capture_note``: why a replayed kernel was not mapped to its
    capture): the kernels' time and the steps it is over (``kernel_layers``; no rows for a
    store without layers)."""
    table = store.table("kernel_layers")
    steps = table.group_by("phase").agg(
        pl.struct("rank", "session", "step").n_unique().alias("steps")
    )
    return (
        table.group_by("phase", "layer", "module", "attribution", "capture_note")
        .agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("dur_ns"))
        .join(steps, on="phase")
        .collect()
    )


def _layers(times: pl.DataFrame) -> Layers | None:
    """One phase's module and layer profile: the mean time per step of each module, and of
    each decoder layer, with the layers much slower than their peers named; None without
    layers."""
    if times.is_empty():
        return None
    steps = int(times["steps"].max())  # type: ignore[arg-type]
    modules = times.group_by("module").agg(pl.col("dur_ns").sum()).sort("dur_ns", descending=True)
    layered = times.filter(pl.col("layer").is_not_null())
    per_layer = (
        layered.group_by("layer")
        .agg(
            (pl.col("dur_ns").sum() / steps).alias("ns"),
            (pl.col("module") == "moe_experts").any().alias("moe"),
        )
        .sort("layer")
    )
    peers = pl.col("ns").median().over("moe")
    slow = per_layer.with_columns(peers.alias("peers_ns")).filter(
        (pl.col("ns") >= SLOW_LAYER_RATIO * pl.col("peers_ns"))
        & (pl.col("ns") - pl.col("peers_ns") >= SLOW_LAYER_NS)
    )
    attribution = times.group_by("attribution").agg(pl.col("dur_ns").sum()).sort("attribution")
    notes = (
        times.filter(pl.col("capture_note").is_not_null())
        .group_by("capture_note")
        .agg(pl.col("dur_ns").sum())
        .sort("dur_ns", "capture_note", descending=[True, False])
    )
    return Layers(
        steps=steps,
        module_ns={str(m): float(ns) / steps for m, ns in modules.iter_rows()},
        attribution_ns={str(a): float(ns) / steps for a, ns in attribution.iter_rows()},
        capture_notes=[
            CaptureNote(note=str(n), ns=float(ns) / steps) for n, ns in notes.head(3).iter_rows()
        ],
        layers=per_layer.height,
        layer_ns=[float(ns) for ns in per_layer["ns"].to_list()],
        moe_layers=[int(x) for x in per_layer.filter(pl.col("moe"))["layer"].to_list()],
        slow_layers=[
            SlowLayer(layer=int(r["layer"]), ns=float(r["ns"]), peers_ns=float(r["peers_ns"]))
            for r in slow.iter_rows(named=True)
        ],
    )


def _row(
    phase: str, part: pl.DataFrame, wall_ns: int, kernels, host_apis, layers: pl.DataFrame
) -> PhaseRow:
    durations = part["step_ns"]
    known = part.filter(pl.col("tokens").is_not_null())
    tokens = int(known["tokens"].sum()) if known.height else None
    means = mean_components(part)
    return PhaseRow(
        phase=phase,
        steps=part.height,
        ranks=part["rank"].n_unique(),
        total_ns=int(durations.sum()),
        wall_share=float(durations.sum()) / wall_ns if wall_ns else None,
        # the median: the mean of the two middle steps of an even count, not the upper one
        p50_ns=float(durations.median() or 0.0),
        p95_ns=float(durations.quantile(0.95, "nearest") or 0.0),
        mean=means,
        unmeasured=unmeasured(part),
        headline=None if phase == IDLE else headline(means),
        tokens=tokens,
        tokens_steps=known.height,
        # the time of the steps whose batch size is known, per token they brought
        ns_per_token=float(known["step_ns"].sum()) / tokens if tokens else None,
        graph=_counts(part, "graph"),
        phase_source=_counts(part, "phase_source"),
        step_source=_counts(part, "step_source"),
        # why, for a phase that could not be told: the commonest reason
        reason=next(iter(_counts(part, "phase_reason")), None) if phase == UNKNOWN else None,
        ep=_ep_exchange(part),
        graphs=_graphs(part),
        layers=_layers(layers.filter(pl.col("phase") == phase)),
        top_kernels=combined_tops(
            kernels.filter(pl.col("phase") == phase), ["name", "accelerator"], PHASE_TOP, TopKernel
        ),
        top_host_apis=combined_tops(
            host_apis.filter(pl.col("phase") == phase), ["kind", "name"], PHASE_TOP, TopHostApi
        ),
    )


def _graphs(part: pl.DataFrame) -> Graphs | None:
    """The phase's graph replays: the capture sizes they ran at and the real batches seen
    (value -> steps), and the share of the replayed tokens that were padding; None without a
    replay of a known size (eager steps)."""
    replayed = part.filter(pl.col("graph_size").is_not_null())
    if replayed.is_empty():
        return None
    padded = replayed.filter(pl.col("padded_tokens").is_not_null())
    size = int(padded["graph_size"].sum()) if padded.height else 0
    return Graphs(
        steps=replayed.height,
        capture_sizes=_sorted_counts(replayed, "graph_size"),
        batches=_sorted_counts(part, "batch"),
        padded_share=int(padded["padded_tokens"].sum()) / size if size else None,
    )


def _sorted_counts(part: pl.DataFrame, column: str) -> dict[str, int]:
    """Value -> steps of a numeric column, in the values' order."""
    values = part[column].drop_nulls().value_counts().sort(column)
    return {str(v): int(n) for v, n in values.iter_rows()}


def _ep_exchange(part: pl.DataFrame) -> EpExchange | None:
    """The phase's expert-parallel exchange (an MoE model's): steps that ran one, the steps of
    each path, the mean time in it and its exposed share, the steps whose path does not fit
    their size; None without any."""
    ran = part.filter(pl.col("ep_path").is_not_null())
    if ran.is_empty():
        return None
    exchange, exposed = int(ran["ep_exchange_ns"].sum()), int(ran["ep_exposed_ns"].sum())
    return EpExchange(
        steps=ran.height,
        paths=_counts(ran, "ep_path"),
        exchange_ns=exchange / ran.height,
        exposed_ns=exposed / ran.height,
        exposed_share=exposed / exchange if exchange else None,
        step_share=exposed / int(ran["step_ns"].sum()) if ran["step_ns"].sum() else None,
        misfit_steps=int((ran["ep_fits"] == False).sum()),  # noqa: E712 (nulls: unknown)
    )


def _timeline(windows: pl.DataFrame) -> list[PhaseLane]:
    """Per rank (the first :data:`TIMELINE_RANKS`), its windows in time order as runs of one
    phase: ``[start, end, phase]`` in ns from the rank's first window, neighbours of one phase
    merged. A rank of more than :data:`TIMELINE_RUNS` runs is drawn at that resolution: its
    time cut into as many equal slots, each of the phase that holds most of it."""
    out = []
    windows = windows.filter(pl.col("start_ns").is_not_null())  # placed in time
    for rank in sorted(windows["rank"].unique().to_list())[:TIMELINE_RANKS]:
        part = windows.filter(pl.col("rank") == rank).sort("start_ns")
        runs, span = lane_runs(part, int(part["start_ns"].min()))  # type: ignore[arg-type]
        out.append(PhaseLane(rank=int(rank), span_ns=span, runs=runs))
    return out


def lane_runs(windows: pl.DataFrame, origin: int, apart: bool = True) -> tuple[list[Run], int]:
    """``windows`` (start_ns, end_ns, phase; in time order) as runs of one phase in ns from
    ``origin``, neighbours of one phase merged (``apart=False``: only where they meet), and
    their span; past :data:`TIMELINE_RUNS` runs, at that many slots (:func:`resampled`)."""
    runs: list[Run] = []
    for start, end, phase in windows.select("start_ns", "end_ns", "phase").iter_rows():
        if runs and runs[-1].phase == phase and (apart or runs[-1].end_ns >= start - origin):
            runs[-1] = runs[-1]._replace(end_ns=end - origin)
        else:
            runs.append(Run(start - origin, end - origin, phase))
    span = max((r.end_ns for r in runs), default=0)
    return (resampled(runs, span) if len(runs) > TIMELINE_RUNS and span > 0 else runs), span


def resampled(runs: list[Run], span: int) -> list[Run]:
    """``runs`` at :data:`TIMELINE_RUNS` slots: each slot of the phase that holds most of it,
    neighbours of one phase merged."""
    slot = span / TIMELINE_RUNS
    held: list[dict[str, float]] = [{} for _ in range(TIMELINE_RUNS)]
    for start, end, phase in runs:
        first, last = int(start // slot), min(int((end - 1) // slot), TIMELINE_RUNS - 1)
        for i in range(first, last + 1):
            overlap = min(end, (i + 1) * slot) - max(start, i * slot)
            held[i][phase] = held[i].get(phase, 0.0) + max(overlap, 0.0)
    out: list[Run] = []
    for i, phases in enumerate(held):
        if not phases:
            continue
        phase = max(phases, key=lambda p: (phases[p], p))
        start, end = round(i * slot), round((i + 1) * slot)
        if out and out[-1].phase == phase and out[-1].end_ns == start:
            out[-1] = out[-1]._replace(end_ns=end)
        else:
            out.append(Run(start, end, phase))
    return out


def phases_section(
    windows: pl.DataFrame,
    kernels: pl.DataFrame,
    host_apis: pl.DataFrame,
    layers: pl.DataFrame | None = None,
) -> Phases:
    """``summary.overview.phases`` from the store's summary tables: one row per phase present
    (in :data:`~traceanalyzer.derived.phases.PHASES` order), what share of the iteration time
    has a known phase, and the phase strip."""
    if windows.is_empty():
        return Phases(rows=[], known_share=None, timeline=[])
    windows = windows.with_columns(_phase(windows).alias("phase"))
    wall = int(windows["step_ns"].sum())
    if layers is None:
        layers = pl.DataFrame(schema={"phase": pl.String, "layer": pl.Int64, "module": pl.String,
                                      "attribution": pl.String, "capture_note": pl.String,
                                      "dur_ns": pl.Int64, "steps": pl.UInt32})  # fmt: skip
    rows = [
        _row(phase, windows.filter(pl.col("phase") == phase), wall, kernels, host_apis, layers)
        for phase in sorted(windows["phase"].unique().to_list(), key=phase_order)
    ]
    served = sum(r.total_ns for r in rows if r.phase != IDLE)
    known = sum(r.total_ns for r in rows if r.phase not in (IDLE, UNKNOWN))
    return Phases(
        rows=rows, known_share=known / served if served else None, timeline=_timeline(windows)
    )
