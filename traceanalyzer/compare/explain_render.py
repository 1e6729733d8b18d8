"""How ``diff`` shows why each phase changed and which settings did: lines for the terminal,
sections of diff.html and diff.md, and a waterfall per regressed or improved phase (base ->
each contribution -> target), drawn by the SVG chart (no matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceanalyzer.chart import Chart
from traceanalyzer.compare.explain import UNEXPLAINED, Explanation
from traceanalyzer.compare.phase_diff import PHASE_CHANGE, PhaseDiff
from traceanalyzer.compare.settings_diff import value_text
from traceanalyzer.report import fmt
from traceanalyzer.report.fmt import signed
from traceanalyzer.report.htmlkit import esc, table
from traceanalyzer.report.markdown import md_table, md_text

TEXT_ROWS = 5  # contributions per phase in the terminal (diff.json and the reports have all)
WATERFALL_ROWS = 8  # contributions drawn one by one; the rest is one bar
WATERFALL_VERDICTS = ("regressed", "improved")  # the phases that get a waterfall
MODULE_WORDS = 3  # modules (and layers) the terminal and the reports name per phase
SLOWER, FASTER, TOTAL = "#dc2626", "#16a34a", "#64748b"


def _calls(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def evidence_text(item: Mapping[str, Any]) -> str:
    """A contribution's evidence in words: calls and mean time per iteration, both runs."""
    ev = item.get("evidence") or {}
    said = []
    if "base" in ev and "target" in ev:
        b, t = ev["base"], ev["target"]
        said.append(
            f"{_calls(b['calls'])} calls at {fmt.duration(b['mean_ns'])} -> "
            f"{_calls(t['calls'])} at {fmt.duration(t['mean_ns'])} per iteration"
        )
    component = ev.get("component")
    if component:  # the time the device lost, which the call named above explains
        label = component["label"] if said else ""
        said.append(
            f"{label} {fmt.duration(component['base_ns'])} -> "
            f"{fmt.duration(component['target_ns'])}".strip()
        )
    return "; ".join(said) or str(ev.get("why") or "")


def _share(item: Mapping[str, Any]) -> str:
    share = item.get("share")
    return "" if share is None else f"{share * 100:.0f}%".replace("-0%", "0%")


def explain_text(phases: PhaseDiff) -> list[str]:
    """Why each phase changed, the largest contributions first (the terminal's)."""
    if phases.explain_error:
        return [f"why each phase changed: {phases.explain_error}"]
    if not phases.explanations:
        return []
    if all(e.unchanged for e in phases.explanations.values()):
        return ["why each phase changed: no phase changed, nothing to explain"]
    lines = ["why each phase changed (per iteration, target - base, largest first):"]
    for explanation in phases.explanations.values():
        lines.append(f"  {explanation.summary()}")
        items = _shown(explanation)
        for item in items[:TEXT_ROWS]:
            said = "" if item["what"] == UNEXPLAINED else f": {evidence_text(item)}"
            lines.append(
                f"    {signed(item['delta_ns']):>10} {_share(item):>5}  {item['kind']:<11} "
                f"{item['what']}{said}"
            )
        if len(items) > TEXT_ROWS:
            lines.append(f"    ... {len(items) - TEXT_ROWS} more in diff.json")
        if explanation.modules:
            lines.append(f"    {modules_text(explanation.modules)}")
    return lines


def modules_text(modules: list[dict[str, Any]]) -> str:
    """``by module: linear +290 µs; by layer: 1 +73.6 µs, 0 +72.4 µs``: the kernel time that
    moved most per module and per decoder layer (:data:`MODULE_WORDS` of each)."""
    parts = []
    for column in dict.fromkeys(m["column"] for m in modules):
        moved = [m for m in modules if m["column"] == column][:MODULE_WORDS]
        said = ", ".join(f"{m['value']} {signed(m['delta_ns'])}" for m in moved)
        parts.append(f"by {column}: {said}")
    return "; ".join(parts)


NOT_COMPARED = "not compared (a store could not be read)"


def settings_text(settings: list[dict[str, Any]] | None) -> list[str]:
    if settings is None:
        return [f"settings and versions: {NOT_COMPARED}"]
    if not settings:
        return ["settings and versions: unchanged"]
    return ["settings changed (base -> target):"] + [
        f"  {setting}: {base} -> {target}" + (f"  [ranks {ranks}]" if ranks else "")
        for setting, _, base, target, ranks in _setting_rows(settings)
    ]


# ---------------------------------------------------------------------------- waterfall


def waterfall_phases(phases: PhaseDiff) -> list[str]:
    """The phases that get a waterfall: regressed or improved; or, where no verdict could be
    given (a phase not told, fewer than 3 iterations), a mean iteration that moved by the
    verdict's threshold and beyond its noise."""
    out = []
    for row in phases.rows:
        explained = phases.explanations.get(row.phase)
        if explained is None or explained.unchanged:
            continue
        moved = (
            explained.base_ns
            and abs(explained.change_ns) >= PHASE_CHANGE * explained.base_ns
            and explained.noise_ns is not None  # at least 2 iterations on each side
            and not explained.within_noise
        )
        if row.verdict in WATERFALL_VERDICTS or (row.verdict == "too few" and moved):
            out.append(row.phase)
    return out


def waterfall_chart(explanation: Explanation) -> Chart:
    """Base mean iteration, each contribution as a step (red: slower, green: faster), target."""
    items = explanation.items()
    named = [(i["what"], i["delta_ns"]) for i in items if i["what"] != UNEXPLAINED]
    steps = named[:WATERFALL_ROWS]
    if len(named) > WATERFALL_ROWS:
        steps.append(
            (f"the other {len(named) - WATERFALL_ROWS}", sum(d for _, d in named[WATERFALL_ROWS:]))
        )
    steps += [
        (i["what"], i["delta_ns"]) for i in items if i["what"] == UNEXPLAINED and i["delta_ns"]
    ]
    base, target = explanation.base_ns, explanation.target_ns
    scale, unit = (1e6, "ms") if max(base, target) >= 1e6 else (1e3, "µs")
    # rows from the top: the base, each step, the target
    top = len(steps) + 1
    levels, running = [base, target], base
    moves = []  # y, from, to
    for y, (_, delta) in zip(range(top - 1, 0, -1), steps, strict=True):
        moves.append((y, running, running + delta))
        running += delta
        levels.append(running)
    spread = max(levels) - min(levels) or 0.05 * base
    lo = max(0.0, min(levels) - spread)  # the axis starts near the steps, not at 0

    chart = Chart(7.5, 0.9 + 0.3 * (top + 1))
    (ax,) = chart.axes

    def bar(y: float, start: float, end: float, colour: str) -> None:
        left, width = min(start, end) / scale, max(abs(end - start), 1e-9) / scale
        ax.broken_barh([(left, width)], (y - 0.35, 0.7), facecolors=colour)

    bar(top, lo, base, TOTAL)
    bar(0, lo, target, TOTAL)
    for y, start, end in moves:
        bar(y, start, end, SLOWER if end > start else FASTER)
        ax.text(max(start, end) / scale, y, f" {signed(end - start)}", fontsize=8, va="center")
    ax.set_yticks(range(top + 1), ["target", *reversed([w for w, _ in steps]), "base"], fontsize=8)
    ax.set_xlim(lo / scale, (max(levels) + 0.25 * spread) / scale)
    ax.set_ylim(-0.6, top + 0.6)
    ax.set_xlabel(f"mean iteration ({unit}; the axis starts at {fmt.duration(lo)})")
    ax.set_title(
        f"{explanation.phase}: {fmt.duration(base)} -> {fmt.duration(target)} per iteration "
        f"({signed(target - base)})"
    )
    ax.grid(True, axis="x")
    return chart


def waterfalls(phases: PhaseDiff) -> dict[str, str]:
    """Phase -> its waterfall's SVG (:func:`waterfall_phases`)."""
    return {p: waterfall_chart(phases.explanations[p]).to_svg() for p in waterfall_phases(phases)}


# ---------------------------------------------------------------------------- html, markdown


def _shown(explanation: Explanation) -> list[dict[str, Any]]:
    """The contributions, and the rest when there is one."""
    return [i for i in explanation.items() if i["what"] != UNEXPLAINED or i["delta_ns"]]


def _rows(explanation: Explanation) -> list[list[Any]]:
    return [
        [item["what"], item["kind"], signed(item["delta_ns"]), _share(item), evidence_text(item)]
        for item in _shown(explanation)
    ]


HEADERS = ["what", "kind", "change per iteration", "share", "evidence (base -> target)"]


def explain_html(phases: PhaseDiff, svgs: Mapping[str, str]) -> str:
    if phases.explain_error:
        return f"<h2>Why each phase changed</h2><p>{esc(phases.explain_error)}</p>"
    if not phases.explanations:
        return ""
    parts = ["<h2>Why each phase changed</h2>"]
    for phase, explanation in phases.explanations.items():
        parts.append(f"<h3>{esc(phase)}</h3><p>{esc(explanation.summary())}</p>")
        if phase in svgs:
            parts.append(f'<div class="figure">{svgs[phase]}</div>')
        if not explanation.unchanged:
            parts.append(table(HEADERS, _rows(explanation), numeric=(2, 3)))
        if explanation.modules:
            parts.append(f'<p class="small">{esc(modules_text(explanation.modules))}</p>')
    return "".join(parts)


SETTINGS_HEADERS = ["setting", "source", "base", "target", "ranks"]


def _setting_rows(settings: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [s["setting"], s["source"], value_text(s["base"]), value_text(s["target"]),
         ", ".join(map(str, s["ranks"]))]
        for s in settings
    ]  # fmt: skip


def settings_html(settings: list[dict[str, Any]] | None) -> str:
    if settings is None:
        return f"<h2>Settings and versions</h2><p>{esc(NOT_COMPARED)}</p>"
    if not settings:
        return "<h2>Settings and versions</h2><p>Unchanged.</p>"
    return "<h2>Settings changed</h2>" + table(SETTINGS_HEADERS, _setting_rows(settings))


def explain_markdown(phases: PhaseDiff, plot_files: Mapping[str, str]) -> list[str]:
    if phases.explain_error:
        return ["## Why each phase changed", "", md_text(phases.explain_error), ""]
    if not phases.explanations:
        return []
    lines = ["## Why each phase changed", ""]
    for phase, explanation in phases.explanations.items():
        lines += [f"### {md_text(phase)}", "", md_text(explanation.summary()), ""]
        if phase in plot_files:
            lines += [f"![{md_text(phase)} waterfall]({plot_files[phase]})", ""]
        if not explanation.unchanged:
            lines += [*md_table(HEADERS, _rows(explanation)), ""]
        if explanation.modules:
            lines += [md_text(modules_text(explanation.modules)), ""]
    return lines


def settings_markdown(settings: list[dict[str, Any]] | None) -> list[str]:
    if settings is None:
        return ["## Settings and versions", "", NOT_COMPARED, ""]
    if not settings:
        return ["## Settings and versions", "", "Unchanged.", ""]
    return ["## Settings changed", "", *md_table(SETTINGS_HEADERS, _setting_rows(settings)), ""]
