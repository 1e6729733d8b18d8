"""The overview as text: the terminal's compact table and the Markdown sections.

Both read findings.json's ``summary.overview`` (see ``docs/overview.md``), as the typed values of
:mod:`traceanalyzer.overview.model`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from traceanalyzer.derived.captures import NO_CAPTURE
from traceanalyzer.engine.findings import compress_ranks, rank_words
from traceanalyzer.overview.model import (
    STEP,
    FindingCost,
    Graphs,
    Layers,
    Overview,
    PhaseCollectives,
    RankCollectives,
)
from traceanalyzer.report import fmt
from traceanalyzer.report.overview_memory import memory_lines, memory_markdown
from traceanalyzer.report.width import table_lines, wrap
from traceanalyzer.step_components import COLUMNS
from traceanalyzer.text import count, join, sentence
from traceanalyzer.vocabulary import EP_PATHS

# the compact columns: component groups of the breakdown (keys summed), in bar order
COMPACT = COLUMNS


def share(part: float, whole: float) -> str:
    return fmt.percent(part / whole) if whole else "n/a"


def group_share(
    mean: Mapping[str, float], keys: tuple[str, ...], step: float, missing: Collection[str]
) -> str:
    """A compact group's share of the step; "n/a" when none of its components was measured
    (``missing``: the row's ``unmeasured`` keys)."""
    if all(k in missing for k in keys):
        return "n/a"
    return share(sum(mean.get(k, 0.0) for k in keys), step)


def unmeasured_everywhere(overview: Overview) -> set[str]:
    """The components no rank measured: they have no mean (their time is in another one, which
    :func:`unmeasured_notes` names)."""
    ranks = len(overview.ranks)
    return {key for key, what in overview.unmeasured.items() if len(what.ranks) == ranks}


def unmeasured_notes(overview: Overview) -> list[str]:
    """Per component some ranks could not measure: which ranks, why, and where its time is."""
    # a column's name where the column is the component alone, else the component's label
    names = {c.key: c.label for c in overview.components}
    names |= {keys[0]: name for name, keys in COMPACT if len(keys) == 1}
    # components of one cause on the same ranks are said once
    grouped: dict[tuple[tuple[int, ...], str], list[str]] = {}
    for key, what in overview.unmeasured.items():
        cause = (tuple(what.ranks), what.reason)
        grouped.setdefault(cause, []).append(names.get(key, key))
    notes = []
    for (ranks, reason), components in grouped.items():
        notes.append(f"{', '.join(components)} not measured on {rank_words(ranks)}: {reason}")
    return notes


def source_line(overview: Overview) -> str:
    """Which data the breakdown comes from, and how it compares with the export's own step
    breakdown (step_trace_time.csv, analysis.db StepTraceTime)."""
    src = overview.source
    used = " + ".join(src.breakdown) or "nothing"
    text = f"source: {used}"
    checked, reference = src.checked_steps, src.reference or "step_trace_time.csv"
    if checked:
        tolerance, worst = fmt.percent(src.tolerance), fmt.percent(src.max_deviation)
        if src.agrees:
            text += (
                f"; agrees with {reference} within {tolerance} on "
                f"{'the' if checked == 1 else 'all'} {count(checked, 'step')}"
            )
        else:
            text += (
                f"; differs from {reference} by more than {tolerance} on "
                f"{src.differing_steps} of {count(checked, 'step')}"
            )
        text += f" (largest difference {worst} of Stage)"
    elif "events" in src.breakdown:
        text += f"; no {reference} to check against"
    return text


def check_warning(overview: Overview | None) -> str | None:
    """The self-check's warning, when the breakdown contradicts the export's own step breakdown
    beyond the tolerance: which steps and ranks, the component that differs most and by how
    much. None when it agrees or there was nothing to check against."""
    if overview is None or overview.source.agrees is not False:
        return None
    src = overview.source
    ranks = src.differing_ranks
    return (
        f"the breakdown contradicts {src.reference or 'the export'} on "
        f"{src.differing_steps} of {count(src.checked_steps, 'step')} "
        f"({rank_words(ranks)}): {src.component or 'a component'} differs by "
        f"{fmt.percent(src.max_deviation)} of Stage on rank {src.worst_rank}. "
        "Treat this overview, and the cost shares of findings on those ranks, as unreliable."
    )


def compact_rows(overview: Overview, only: Collection[int] | None = None) -> list[list[str]]:
    """Per rank (of ``only``, when given): rank, steps, mean step time, then each compact
    group's share of the step."""
    top = {c.rank: c.top_kernel for c in overview.cluster}
    rows = []
    for r in overview.ranks:
        if only is not None and r.rank not in only:
            continue
        cells = [group_share(r.mean, keys, r.step_ns, r.unmeasured) for _, keys in COMPACT]
        rows.append(
            [str(r.rank), str(r.steps), fmt.duration(r.step_ns), *cells, top.get(r.rank) or ""]
        )
    return rows


def compact_headers() -> list[str]:
    return ["rank", "steps", "step", *(name for name, _ in COMPACT), "top kernel"]


def phase_rows(overview: Overview) -> list[list[str]]:
    """Per phase: phase, iterations, share of the profile's wall time, p50 and p95 iteration
    time, time per 1k new tokens (where the batch size is known), how the forward ran, then
    each compact group's share of the phase's mean step."""
    rows = []
    for r in overview.phases.rows:
        step = r.mean.get(STEP) or 0.0
        per_token = r.ns_per_token
        rows.append(
            [
                r.phase,
                str(r.steps),
                fmt.percent(r.wall_share),
                fmt.duration(r.p50_ns),
                fmt.duration(r.p95_ns),
                fmt.duration(per_token * 1000) if per_token else "",
                _graph_cell(r.graph),
                *(group_share(r.mean, keys, step, r.unmeasured) for _, keys in COMPACT),
            ]
        )
    return rows


def phase_headers() -> list[str]:
    return ["phase", "steps", "wall", "p50", "p95", "per 1k tokens", "graph"] + [
        name for name, _ in COMPACT
    ]


def _graph_cell(graph: Mapping[str, int]) -> str:
    """``full``, or ``full 83%`` when the phase's iterations ran more than one way."""
    total = sum(graph.values())
    if not total:
        return ""
    mode, n = max(graph.items(), key=lambda kv: (kv[1], kv[0]))
    return mode if n == total else f"{mode} {fmt.percent(n / total)}"


EP_PATH_WORDS = {path: short for path, (_, short) in EP_PATHS.items()}


def ep_lines(overview: Overview) -> list[str]:
    """Per phase of an MoE model, the EP exchange its steps used and how much of it no compute
    hid; then the steps whose path does not fit their size, as information."""
    lines, misfits = [], 0
    for r in overview.phases.rows:
        ep = r.ep
        if not ep:
            continue
        paths = ", ".join(
            f"{EP_PATH_WORDS.get(p, p)} in {count(n, 'step')}" for p, n in ep.paths.items()
        )
        lines.append(
            f"{r.phase}: {paths}; {fmt.duration(ep.exchange_ns)} of exchange per step, "
            f"{fmt.percent(ep.exposed_share)} of it exposed "
            f"({fmt.percent(ep.step_share)} of the step"
            + (
                "; MC2 runs as kernels: what no other compute hides is in exposed communication)"
                if "mc2" in ep.paths
                else ")"
            )
        )
        misfits += ep.misfit_steps
    if misfits:
        lines.append(
            f"information: {misfits} step(s) used a path that does not fit their size "
            "(vllm-ascend takes MC2 up to a token capacity and all-to-all above it)"
        )
    return lines


# the export's Idle Time is said to be something else when the trace's idle is below this share
EXPORT_IDLE_EXPLAINED = 0.5
SPLIT_WORDS = (
    ("arrival_ns", "waiting for the last rank"),
    ("transfer_ns", "moving data"),
    ("other_ns", "the rest of the protocol"),
    ("idle_ns", "idle (no task)"),
)


def _split(row: PhaseCollectives | RankCollectives) -> str:
    whole = row.collective_ns or 0.0
    parts = [
        f"{share(part, whole)} {words}" for key, words in SPLIT_WORDS if (part := getattr(row, key))
    ]
    return ", ".join(parts) if parts else "not split (no plane task, no communication.json)"


def collective_lines(overview: Overview) -> list[str]:
    """Per phase, where the collectives' time per step goes; what communication.json calls
    idle; which rank the iterations waited on (``summary.overview.collectives``)."""
    section = overview.collectives
    if section is None:
        return []
    if section.error:
        return [f"not computed: {section.error}"]
    lines = [
        f"{r.phase}: {fmt.duration(r.collective_ns)} of collectives per step: {_split(r)}"
        for r in section.phases
    ]
    idle = section.export_idle
    if (
        idle
        and idle.idle_ns
        and idle.traced_idle_ns is not None
        and idle.traced_idle_ns < EXPORT_IDLE_EXPLAINED * idle.idle_ns
    ):
        peers = [int(p) for p in idle.peers]
        outside = set(idle.outside)
        named = ", ".join(f"{p}{' (not in the profile)' if p in outside else ''}" for p in peers)
        lines.append(
            f"information: communication.json counts {fmt.duration(idle.idle_ns)} of the "
            f"collectives as Idle Time; the trace shows {fmt.duration(idle.traced_idle_ns)} "
            "with no task running: the rest are waits on other planes"
            + (f", for rank {named}" if named else "")
            + ", counted here as waiting for the last rank"
        )
    path = section.critical_path
    if path and path.iterations:
        roots = [
            f"rank {r.rank}{' (not in the profile)' if r.outside else ''} in "
            f"{r.iterations} ({fmt.percent(r.share)}, {fmt.duration(r.wait_ns)} waited)"
            for r in path.roots
        ]
        lines.append(
            f"critical path: of {count(path.iterations, 'iteration')} across the ranks, the "
            f"others waited last on {join(roots, 6) if roots else 'no rank'}; "
            f"{path.balanced} balanced"
        )
    return lines


COLLECTIVE_HEADERS = ["rank", "per step", "arrival", "transfer", "other", "idle", "source"]


def collective_rank_rows(overview: Overview) -> list[list[str]]:
    """Per rank: its collectives' time per step and the split's shares of it."""
    rows = []
    for r in overview.collectives.ranks if overview.collectives else []:
        whole = r.collective_ns or 0.0
        parts = [getattr(r, key) for key, _ in SPLIT_WORDS]
        rows.append(
            [str(r.rank), fmt.duration(whole)]
            + [share(part or 0.0, whole) if part is not None else "n/a" for part in parts]
            + [r.source or ""]
        )
    return rows


def graph_lines(overview: Overview) -> list[str]:
    """Per phase with graph replays: the capture sizes they ran at against the real batches
    seen, and how much of the replayed work was padding."""
    return [_graph_line(r.phase, r.graphs) for r in overview.phases.rows if r.graphs]


def _graph_line(phase: str, graphs: Graphs) -> str:
    batches = _counted(graphs.batches)
    return (
        f"{phase}: {graphs.steps} replays at capture sizes {_counted(graphs.capture_sizes)}"
        + (f" for real batches {batches}" if batches else " (real batches unknown)")
        + f"; padding {fmt.percent(graphs.padded_share)} of the replayed tokens"
    )


# how a module's name reads where it is not a word already (attention, linear, norm, ...)
MODULE_WORDS = {"moe_experts": "MoE experts", "moe_routing": "MoE routing/exchange",
                "tp_comm": "TP comm", "sampling": "sampling/logits"}  # fmt: skip


def layer_lines(overview: Overview) -> list[str]:
    """Per phase with decoder layers: where its kernels' time goes by module, its layers'
    time, and a layer much slower than its peers."""
    return [_layer_line(r.phase, r.layers) for r in overview.phases.rows if r.layers]


def _layer_line(phase: str, layers: Layers) -> str:
    total = sum(layers.module_ns.values()) or 1.0
    modules = ", ".join(
        f"{MODULE_WORDS.get(m, m)} {fmt.percent(ns / total)}"
        for m, ns in list(layers.module_ns.items())[:5]
    )
    times = sorted(layers.layer_ns)
    median = times[len(times) // 2] if times else None
    slow = "; ".join(
        f"layer {s.layer} takes {fmt.duration(s.ns)}, "
        f"{s.ns / s.peers_ns:.1f}x its peers' {fmt.duration(s.peers_ns)}"
        for s in layers.slow_layers
    )
    return (
        f"{phase}: {modules}; {layers.layers} layers, {fmt.duration(median)} each "
        "per iteration (median)" + (f"; {slow}" if slow else "") + _attribution(layers)
    )


def _attribution(layers: Layers) -> str:
    """How a phase's layers were found, when the profile holds a graph capture: the share of
    the kernels' time whose layer came from it, and why replayed kernels were not mapped to it
    (nothing without a capture: every layer is then the sequence's)."""
    by = layers.attribution_ns
    notes = [n.note for n in layers.capture_notes if n.note != NO_CAPTURE]
    if not by.get("capture") and not notes:
        return ""
    share = fmt.percent(by.get("capture", 0.0) / (sum(by.values()) or 1.0))
    return f"; layers from the graphs' capture for {share} of the time" + "".join(
        f"; not mapped: {n}" for n in notes
    )


def _counted(counts: Mapping[str, int], shown: int = 8) -> str:
    """``16 (x3), 32 (x5)``: values with their steps, the first ``shown``."""
    items = [f"{v} (x{n})" if n > 1 else v for v, n in counts.items()]
    more = f", ... {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


# the overview's lists per phase, as the terminal titles them; what says each
PHASE_SECTIONS = (
    ("graph replays by phase", graph_lines),
    ("modules and decoder layers by phase", layer_lines),
    ("MoE expert exchange by phase", ep_lines),
)


def phase_sections(overview: Overview) -> list[tuple[str, list[str]]]:
    """The lists per phase the overview has lines for: (title, lines)."""
    return [(title, lines) for title, say in PHASE_SECTIONS if (lines := say(overview))]


def phases_known(overview: Overview) -> bool:
    """Some iteration's phase was told (else a phase table only says "unknown")."""
    return any(r.phase not in ("unknown", "idle") for r in overview.phases.rows)


def phase_note(overview: Overview) -> str | None:
    """What share of the iteration time has no known phase, and why (None: all known)."""
    unknown = next((r for r in overview.phases.rows if r.phase == "unknown"), None)
    if unknown is None:
        return None
    known = overview.phases.known_share
    what = "every iteration" if not known else f"{fmt.percent(1 - known)} of the iteration time"
    return f"phase unknown for {what}: {unknown.reason or 'no evidence'}"


def overview_table(overview: Overview, verbose: bool = False, width: int | None = None) -> str:
    """The terminal's table under the findings: where each rank's step time goes; the
    breakdown's source and check only when the check fails (as a warning) or ``verbose``.
    Within ``width`` columns (the terminal's; None: no limit): the tables adapt, the other
    lines wrap."""
    if overview.error:
        return f"overview failed: {overview.error}"
    if not overview.usable:
        return "overview: no step or window to break down"
    lines = ["where the time goes (mean per step; share of the step):"]
    if overview.headline:
        lines.append(f"  {overview.headline}")
    shown = terminal_ranks(overview)
    lines += table_lines(compact_headers(), compact_rows(overview, shown), width, TOP_KERNEL)
    if shown is not None:
        hidden = len(overview.ranks) - len(shown)
        lines.append(
            f"  ... and {hidden} more ranks: shown are the outliers, then the slowest mean "
            "steps; every rank is in report.md"
        )
    if phases_known(overview):
        lines.append("  by phase (wall: share of the profile; p50/p95 per iteration):")
        lines += table_lines(phase_headers(), phase_rows(overview), width)
    lines += [f"  {note}" for note in unmeasured_notes(overview)]
    for title, said in phase_sections(overview):
        lines.append(f"  {title}:")
        lines += [f"    {line}" for line in said]
    collectives = collective_lines(overview)
    if collectives:
        lines.append("  collectives by phase (where their time goes) and the critical path:")
        lines += [f"    {line}" for line in collectives]
    note = phase_note(overview)
    if note and (verbose or phases_known(overview)):
        lines.append(f"  {note}")
    warning = check_warning(overview)
    if warning:
        lines.append(f"  warning: {warning}")
    if verbose:
        lines.append("  " + source_line(overview))
    outliers = [c.rank for c in overview.cluster if c.outlier]
    if outliers:
        ranks = compress_ranks(outliers)
        what = count(len(outliers), "outlier rank").split(" ", 1)[1]
        lines.append(f"  {what} by mean step time (robust z > 3.5): {ranks}")
    lines += memory_lines(overview, width)
    fitted = []  # the tables fit already: what is longer wraps under its own indent
    for line in lines:
        fitted += wrap(line, width, len(line) - len(line.lstrip()) + 2)
    return "\n".join(fitted)


# the terminal's top kernel, shortened in the middle beyond this (less when the width is short)
TOP_KERNEL = 40
# A terminal shows this many ranks' rows at most (a cluster's thousand ranks would bury the
# findings above); the reports show them all.
TERMINAL_RANKS = 16


def terminal_ranks(overview: Overview) -> set[int] | None:
    """The ranks the terminal's table shows (None: every one): the outliers, then the slowest
    mean steps, :data:`TERMINAL_RANKS` in all."""
    if len(overview.ranks) <= TERMINAL_RANKS:
        return None
    outliers = [c.rank for c in overview.cluster if c.outlier]
    slowest = [r.rank for r in sorted(overview.ranks, key=lambda r: -r.step_ns)]
    return set(list(dict.fromkeys([*outliers, *slowest]))[:TERMINAL_RANKS])


def cost_text(cost: FindingCost | None) -> str:
    """One phrasing for every finding's cost (``summary.overview.costs``): the time, summed
    over which ranks, and its share of which time: ``costs 54.5 ms (74.5% of the 2 ranks' step
    time, 31.0% of their decode time)``, ``costs 12.3% of rank 3's step time``; "" when the
    finding's metrics allow no cost. With the self-check's caveat when the cost lies on ranks
    whose breakdown the export contradicts."""
    if cost is None:
        return ""
    share, ns, ranks = cost.cost_share, cost.cost_ns, cost.ranks
    whose = (
        f"rank {ranks[0]}'s" if len(ranks) == 1 else f"the {len(ranks)} ranks'" if ranks else "the"
    )
    if share is None:
        return f"costs {fmt.duration(ns)}" + (f" on {whose[:-2]}" if ranks else "") if ns else ""
    scope = f"{fmt.percent(share)} of {whose} step time"
    if cost.phase_share is not None:
        their = "its" if len(ranks) == 1 else "their"
        phases = "/".join(cost.phases or [])
        scope += f", {fmt.percent(cost.phase_share)} of {their} {phases} time"
    text = f"costs {fmt.duration(ns)} ({scope})" if ns else f"costs {scope}"
    doubtful = cost.unreliable_ranks
    if doubtful:
        text += (
            f"; unreliable: the breakdown of rank {compress_ranks(doubtful)} fails its self-check"
        )
    return text


def component_rows(overview: Overview) -> list[list[str]]:
    """Every component, mean per step over every rank's steps, with its share."""
    mean = overview.mean or {}
    step = mean.get(STEP) or 0.0
    missing = unmeasured_everywhere(overview)
    return [
        [c.label, "n/a", "n/a"]
        if c.key in missing
        else [c.label, fmt.duration(mean.get(c.key, 0.0)), share(mean.get(c.key, 0.0), step)]
        for c in overview.components
    ]


def top_rows(overview: Overview) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """The three top tables: title -> (headers, rows), totals over ranks."""
    d = fmt.duration
    kernels = [
        [k.name, k.accelerator or "", k.count, d(k.total_ns), d(k.mean_ns), d(k.p95_ns),
         fmt.percent(k.share)]
        for k in overview.top_kernels
    ]  # fmt: skip
    apis = [
        [a.kind, a.name, a.count, d(a.total_ns), d(a.mean_ns), d(a.p95_ns)]
        for a in overview.top_host_apis
    ]
    colls = [
        [c.name, c.count, d(c.total_ns), d(c.wait_ns) if c.wait_ns is not None else "n/a",
         d(c.transit_ns) if c.transit_ns is not None else "n/a", c.source or ""]
        for c in overview.top_collectives
    ]  # fmt: skip
    return {
        "Top kernels (device time)": (
            ["kernel", "accelerator", "count", "total", "mean", "p95", "share of compute"],
            kernels,
        ),
        "Top host APIs (CANN and Python ops, inclusive time)": (
            ["kind", "name", "count", "total", "mean", "p95"],
            apis,
        ),
        "Top collectives": (["collective", "count", "total", "wait", "transit", "source"], colls),
    }


def cluster_rows(overview: Overview) -> list[list[str]]:
    d = fmt.duration
    return [
        [
            str(c.rank) + (" (outlier)" if c.outlier else ""),
            str(c.steps),
            d(c.step_ns),
            d(c.compute_ns),
            d(c.comm_wait_ns),
            d(c.idle_ns),
            c.top_kernel or "",
            "n/a" if c.step_z is None else f"{c.step_z:.1f}",
        ]
        for c in overview.cluster
    ]


TEXT_COLUMNS = ("kernel", "name", "kind", "accelerator", "collective", "source")
NAME_COLUMNS = ("kernel", "top kernel", "name")  # names a report may shorten in the middle
CLUSTER_HEADERS = [
    "rank",
    "steps",
    "step (mean)",
    "compute",
    "comm wait",
    "idle",
    "top kernel",
    "robust z",
]


def overview_markdown(
    overview: Overview | None,
    md_table: Callable[[list[str], list[list[Any]]], list[str]],
    plot_files: Mapping[str, str],
) -> list[str]:
    """The "Where the time goes" section of report.md; ``plot_files`` maps the overview's
    figure names to their paths under OUT."""
    if overview is None:
        return []
    lines = ["## Where the time goes", ""]
    if not overview.usable:
        failed = overview.error
        lines += [f"Overview failed: {failed}" if failed else "No step or window to break down."]
        return [*lines, ""]
    lines += [f"**{overview.headline}**", ""] if overview.headline else []  # our words
    warning = check_warning(overview)
    lines += [f"> **Warning:** {warning}", ""] if warning else []
    lines += [
        f"Mean per step over {count(overview.steps, 'step')} of "
        f"{count(len(overview.ranks), 'rank')}; "
        f"{source_line(overview)}.",
        "",
    ]
    figures = [
        f"![{name}]({path})" for name, path in plot_files.items() if name.startswith("overview-")
    ]
    lines += [*figures, ""] if figures else []
    lines += md_table(["component", "per step", "share"], component_rows(overview)) + [""]
    lines += md_table(compact_headers(), compact_rows(overview)) + [""]
    notes = unmeasured_notes(overview)
    lines += [*(f"- {sentence(note)}" for note in notes), ""] if notes else []
    if phases_known(overview):
        lines += ["### By phase", ""] + md_table(phase_headers(), phase_rows(overview)) + [""]
    for title, said in phase_sections(overview):
        lines += [sentence(title, ":"), "", *(f"- {line}" for line in said), ""]
    collectives = collective_lines(overview)
    if collectives:
        lines += ["Collectives by phase and the critical path:", ""]
        lines += [*(f"- {line}" for line in collectives), ""]
        lines += md_table(COLLECTIVE_HEADERS, collective_rank_rows(overview)) + [""]
    note = phase_note(overview)
    lines += [sentence(note), ""] if note else []
    if len(overview.cluster) > 1:
        lines += ["### Ranks", ""]
        lines += md_table(CLUSTER_HEADERS, cluster_rows(overview)) + [""]
    for title, (headers, rows) in top_rows(overview).items():
        if rows:
            lines += [f"### {title}", ""] + md_table(headers, rows) + [""]
    lines += memory_markdown(overview, md_table, plot_files)
    return lines
