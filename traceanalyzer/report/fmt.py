"""Number and time formatting shared by every report (HTML, Markdown, terminal, diff).

A finding's metric and a rule's key figure are printed in the unit their rule declared
(:mod:`traceanalyzer.engine.units`): :func:`metric` is the one conversion, so rules hold no
presentation code and no report guesses a unit from a name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from traceanalyzer import text as _text
from traceanalyzer.engine.units import COUNT, NS, P_VALUE, RATIO, SHARE, TRACE_NS

SEVERITY_ORDER = ("error", "warning", "info")
# the rules that did not judge, by status: what the reports call them
UNDECIDED = {"inconclusive": "Inconclusive", "not_evaluated": "Not evaluated"}


def trace_us(ns: int) -> str:
    """Exact torch_npu clock string for an int64 ns time: ``1736408883000455.123`` (µs, 3 dp).

    Integer arithmetic only: going through float64 would lose the last digits of an epoch time.
    """
    ns = int(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


duration = _text.duration  # ``2_524_978_840`` -> ``2.52 s``, as finding text renders it


def signed(ns: float) -> str:
    """``+84.1 µs``, ``-2.3 ms``: a change of time."""
    return ("+" if ns >= 0 else "-") + duration(abs(ns))


def number(value: float | int | None) -> str:
    """Integers with thousands separators, floats with 3 significant digits."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def percent(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value * 100:.1f}%" if value < 0.995 or value > 1 else f"{value * 100:.0f}%"


def change(rel: float | None) -> str:
    """A relative change: ``+12.5%``, ``-98.4%``; a rise to twice or more as a factor
    (3.4 µs -> 66.3 µs: ``19.5x``, not ``+1850.0%``); "" when unknown."""
    if rel is None or not math.isfinite(rel):
        return ""
    return f"{rel + 1:.1f}x" if rel >= 1 else f"{rel * 100:+.1f}%"


def since(ns: int, origin_ns: int) -> str:
    """A trace time relative to its session's start: ``+2.52 s``."""
    return f"+{duration(int(ns) - int(origin_ns))}"


def metric(value: Any, unit: str = "") -> str:
    """A metric's or a key figure's value in its declared ``unit``: ``NS`` a duration,
    ``TRACE_NS`` the trace's clock, ``SHARE`` a percentage, ``P_VALUE``, ``RATIO``, ``COUNT``
    (or "") a number, any other unit after the number (``1,800 MHz``); "n/a" for nothing."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ", ".join(metric(v, unit) for v in value)
    if unit == TRACE_NS:
        return f"{trace_us(int(value))} µs"
    if unit == NS:
        return duration(value)
    if unit == P_VALUE:
        return _text.p_value(float(value))
    if unit == SHARE:
        return percent(float(value))
    if unit == RATIO:
        return _text.ratio(float(value)) if math.isfinite(float(value)) else "n/a"
    if unit in ("", COUNT):
        return number(value)
    return f"{number(value)} {unit}"


def label(key: str) -> str:
    """``worst_span_ns`` -> ``worst span``: metric keys read as words (units come from the value)."""
    return key.removesuffix("_ns").replace("_", " ")


def where(finding: Any) -> str:
    """``rank 0``, ``ranks 0-3 (4/8), in decode``: a finding's ranks, and the serving phases it
    concerns when it names some."""
    phases = finding.get("phases") or []
    label = str(finding.get("ranks_label") or "")
    return f"{label}, in {', '.join(phases)}" if phases else label


def undecided(doc: Mapping[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rules of a findings document that did not judge, by status: its heading, and the
    rules (a status none has is left out)."""
    rules = doc.get("rules", [])
    return [
        (heading, listed)
        for status, heading in UNDECIDED.items()
        if (listed := [r for r in rules if r.get("status") == status])
    ]
