"""The overview's device memory in every report: the terminal's lines, report.md's section,
report.html's section and its timeline figures (SVG, drawn with :mod:`traceanalyzer.chart`).

Reads findings.json's ``summary.overview.memory`` (``docs/overview.md``), typed
(:class:`~traceanalyzer.overview.model.Memory`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from traceanalyzer.chart import Chart, Swatch
from traceanalyzer.overview.model import Memory, MemoryLane, MemoryRank, Overview, TokenBucket
from traceanalyzer.report.htmlkit import details, esc, table
from traceanalyzer.report.overview_plots import PHASE_COLORS
from traceanalyzer.report.plots import svg_file
from traceanalyzer.report.width import table_lines
from traceanalyzer.text import megabytes, sentence

SVG_PREFIX = "memory-timeline-rank"  # plots/memory-timeline-rank<R>.svg
TERMINAL_RANKS = 16  # the ranks that hold the most; report.md and report.html list them all
HEADERS = [
    "rank", "PTA allocated", "PTA reserved", "unused at peak", "GE", "APP (process)",
    "outside torch", "headroom",
]  # fmt: skip
PHASE_HEADERS = ["rank", "phase", "steps", "peak allocated", "p50 peak", "activations", "per 1k tokens", "by batch size"]  # fmt: skip
LINE_COLORS = {
    "APP": "#7c3aed",
    "PTA reserved": "#f59e0b",
    "PTA allocated": "#1d4ed8",
    "GE allocated": "#0d9488",
}


def _ranks(overview: Overview | None) -> list[MemoryRank]:
    """The memory section's ranks (none for a run before it)."""
    return overview.memory.ranks if overview and overview.memory else []


def _peak(rank: MemoryRank, component: str, what: str) -> float | None:
    peaks = rank.components.get(component)
    return None if peaks is None else getattr(peaks, f"peak_{what}_mb")


def _unused(rank: MemoryRank) -> float | None:
    """PTA's reserved memory it did not use when its allocated memory peaked."""
    pta = rank.components.get("PTA")
    if pta is None or pta.reserved_at_peak_allocated_mb is None or pta.peak_allocated_mb is None:
        return None
    return pta.reserved_at_peak_allocated_mb - pta.peak_allocated_mb


def _outside(rank: MemoryRank) -> str:
    modules = ", ".join(
        f"{m.module} {megabytes(m.peak_reserved_mb)}" for m in rank.outside_modules[:3]
    )
    if rank.outside_torch_mb is None:
        return f"modules: {modules}" if modules else "n/a"
    return megabytes(rank.outside_torch_mb) + (f" ({modules})" if modules else "")


def _most_held(ranks: list[MemoryRank], limit: int) -> list[MemoryRank]:
    return sorted(ranks, key=lambda r: -(r.in_use_mb or 0.0))[:limit]


def rank_rows(overview: Overview, limit: int | None = None) -> list[list[str]]:
    """Per rank (the ``limit`` that hold the most, when given): the peaks per component,
    PTA's reserved memory unused at its allocated peak, what lies outside torch, the
    headroom."""
    ranks = _ranks(overview)
    if limit is not None and len(ranks) > limit:
        ranks = sorted(_most_held(ranks, limit), key=lambda r: r.rank)
    m = megabytes
    return [
        [
            str(r.rank),
            m(_peak(r, "PTA", "allocated")),
            m(_peak(r, "PTA", "reserved")),
            m(_unused(r)),
            m(_peak(r, "GE", "allocated")),
            m(_peak(r, "APP", "reserved")),
            _outside(r),
            m(r.headroom_mb),
        ]
        for r in ranks
    ]


def _by_batch(buckets: list[TokenBucket]) -> str:
    return ", ".join(f"≤{b.up_to}: {megabytes(b.peak_mb)}" for b in buckets[:4])


def phase_rows(overview: Overview, limit: int | None = None) -> list[list[str]]:
    """Per rank and phase: the steps, the highest and the typical allocated peak, the
    activations (peak - baseline: what the batch allocates), their growth per 1k new tokens,
    the peak per batch size; none when no step's phase is known."""
    ranks = _ranks(overview)
    known = {p.phase for r in ranks for p in r.phases} - {"unknown"}
    if not known:
        return []
    rows = []
    for r in ranks[:limit]:
        for p in r.phases:
            per_k = p.mb_per_1k_tokens
            rows.append(
                [
                    str(r.rank),
                    p.phase,
                    str(p.steps),
                    megabytes(p.peak_mb),
                    megabytes(p.p50_peak_mb),
                    megabytes(p.activation_mb),
                    megabytes(per_k) if per_k is not None else "",
                    _by_batch(p.by_tokens),
                ]
            )
    return rows


def notes(memory: Memory, limit: int | None = None) -> list[str]:
    """The capacity (or why it is unknown) and the largest allocations never freed (of the
    ``limit`` ranks that hold the most, when given)."""
    out = []
    if memory.capacity_mb is None:
        out.append(
            "capacity unknown, so no headroom: no export records the device's memory; "
            "--set memory.capacity_gb=64 (Atlas A2/A3) gives the headroom and memory-growth's "
            "time to out-of-memory"
        )
    else:
        out.append(f"capacity {megabytes(memory.capacity_mb)} (memory.capacity_gb)")
    ranks = memory.ranks if limit is None else _most_held(memory.ranks, limit)
    for r in ranks:
        static = "; ".join(
            f"{s.name}" + (f" x{s.count}" if s.count > 1 else "") + f" {megabytes(s.size_mb)}"
            for s in r.static
        )
        if static:
            out.append(f"never freed on rank {r.rank} (largest first): {static}")
    return out


def memory_lines(overview: Overview, width: int | None = None) -> list[str]:
    """The terminal's memory lines (none when the profile did not collect memory), its tables
    within ``width`` columns (None: no limit)."""
    rows = rank_rows(overview, TERMINAL_RANKS)
    if overview.memory is None or not rows:
        return []
    lines = ["device memory (peak per rank; profile_memory=True):"]
    lines += table_lines(HEADERS, rows, width)
    phases = phase_rows(overview, 1)  # of the first rank: the others' are in report.md
    if phases:
        lines.append("  peak allocated by phase (activations: peak - baseline, the median):")
        lines += table_lines(PHASE_HEADERS[1:-1], [row[1:-1] for row in phases], width)
    lines += [f"  {note}" for note in notes(overview.memory, 1)]
    return lines


def memory_markdown(
    overview: Overview,
    md_table: Callable[[list[str], list[list[Any]]], list[str]],
    plot_files: Mapping[str, str],
) -> list[str]:
    """report.md's "Device memory" section."""
    memory = overview.memory
    if memory is None:
        return []
    lines = ["### Device memory", ""]
    if not memory.ranks:
        return [*lines, f"Not collected: {memory.reason}.", ""]
    lines += md_table(HEADERS, rank_rows(overview)) + [""]
    lines += [f"- {sentence(note)}" for note in notes(memory)] + [""]
    figures = [f"![{n}]({p})" for n, p in plot_files.items() if n.startswith(SVG_PREFIX)]
    lines += [*figures, ""] if figures else []
    phases = phase_rows(overview)
    if phases:
        lines += ["Peak allocated by phase and batch size:", ""]
        lines += md_table(PHASE_HEADERS, phases) + [""]
    return lines


def memory_html(overview: Overview, figures: Mapping[str, bytes]) -> str:
    """report.html's device memory section: the table, each drawn rank's timeline, the phases."""
    memory = overview.memory
    if memory is None:
        return ""
    if not memory.ranks:
        return f'<p class="small muted">Device memory not collected: {esc(memory.reason)}.</p>'
    body = table(HEADERS, rank_rows(overview), numeric=tuple(range(1, 6)) + (7,))
    body += "".join(f'<p class="small muted">{esc(sentence(n))}</p>' for n in notes(memory))
    for name in sorted(n for n in figures if n.startswith(SVG_PREFIX)):
        rank = name.removeprefix(SVG_PREFIX).removesuffix(".svg")
        body += (
            f"<figure>{figures[name].decode('utf-8')}<figcaption>Rank {esc(rank)}: device "
            "memory over time, each line's highest value (its lowest shaded below it), over the "
            "steps shaded by phase.</figcaption></figure>"
        )
    phases = phase_rows(overview)
    if phases:
        body += table(PHASE_HEADERS, phases, numeric=(2, 3, 4, 5, 6))
    return details("Device memory", body, open_=True)


def memory_figures(overview: Overview) -> dict[str, bytes]:
    """One SVG per drawn rank (``memory-timeline-rank<R>.svg``)."""
    lanes = overview.memory.timeline if overview.memory else []
    return {
        f"{SVG_PREFIX}{lane.rank}.svg": svg_file(chart.to_svg())
        for lane in lanes
        if (chart := timeline_chart(lane)) is not None
    }


def timeline_chart(lane: MemoryLane) -> Chart | None:
    """A rank's memory over time: each line's highest value per slot as a step line, its
    lowest shaded under it, and the steps' phases shaded behind."""
    lines = {k: v for k, v in lane.lines.items() if v}
    if not lines:
        return None
    top = max(p.max_mb for points in lines.values() for p in points)
    scale, unit = (1024.0, "GB") if top >= 2048 else (1.0, "MB")
    chart = Chart(9.0, 2.8)
    (ax,) = chart.axes
    seen = []
    for start, end, phase in lane.runs:
        ax.axvspan(start / 1e9, end / 1e9, color=PHASE_COLORS.get(phase, "#9ca3af"), alpha=0.15)
        seen += [phase] if phase not in seen else []
    handles = []
    for name, color in LINE_COLORS.items():
        points = lines.get(name)
        if not points:
            continue
        seconds = [p.at_ns / 1e9 for p in points]
        highest = [p.max_mb / scale for p in points]
        lowest = [p.min_mb / scale for p in points]
        ax.fill_between(seconds, highest, lowest, step="post", color=color, alpha=0.2)
        ax.step(seconds, highest, where="post", color=color, linewidth=1.2)
        handles.append(Swatch(color, name))
    handles += [Swatch(PHASE_COLORS.get(p, "#9ca3af"), p, alpha=0.4) for p in seen]
    ax.set_xlabel("seconds from the first record")
    ax.set_ylabel(unit)
    ax.legend(
        handles=handles, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0)
    )
    return chart
