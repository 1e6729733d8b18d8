"""Number and time formatting shared by every report (HTML, Markdown, terminal, diff).

Metric values are formatted from their *key*, because rules name metrics by convention:
``*_ns`` are durations, ``share*``/``*fraction`` are 0..1 shares, ``*_p`` are p-values,
``*ratio`` are ratios. That keeps rules free of presentation code.
"""

from __future__ import annotations

import math
from typing import Any

from traceanalyzer import text as _text

SEVERITY_ORDER = ("error", "warning", "info")


def trace_us(ns: int) -> str:
    """Exact torch_npu clock string for an int64 ns time: ``1736408883000455.123`` (µs, 3 dp).

    Integer arithmetic only: going through float64 would lose the last digits of an epoch time.
    """
    ns = int(ns)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    return f"{sign}{ns // 1000}.{ns % 1000:03d}"


def duration(ns: float | int | None) -> str:
    """``2_524_978_840`` -> ``2.52 s`` (same rendering as finding text)."""
    return _text.duration(ns)


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


def is_trace_time(key: str) -> bool:
    """A metric that is a point on the trace clock (``*start_ns``, ``*end_ns``), not a length."""
    k = key.lower()
    return k.endswith("start_ns") or k.endswith("end_ns")


def since(ns: int, origin_ns: int) -> str:
    """A trace time relative to its session's start: ``+2.52 s``."""
    return f"+{duration(int(ns) - int(origin_ns))}"


def metric(key: str, value: Any) -> str:
    """Format one finding metric by its naming convention (see module docstring)."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return ", ".join(metric(key, v) for v in value)
    k = key.lower()
    if is_trace_time(k):
        return f"{trace_us(int(value))} µs"
    if k.endswith("_ns") or "_ns_" in k:
        return duration(value)
    if k.endswith("_p") or k.startswith("p_") or k.endswith("_p_value"):
        return _text.p_value(float(value))
    if "share" in k or "fraction" in k:
        return percent(float(value))
    if k.endswith("ratio"):
        return _text.ratio(float(value)) if math.isfinite(float(value)) else "n/a"
    return number(value)


def label(key: str) -> str:
    """``worst_span_ns`` -> ``worst span``: metric keys read as words (units come from the value)."""
    words = key.removesuffix("_ns").replace("_", " ")
    return words


def where(finding: Any) -> str:
    """``rank 0``, ``ranks 0-3 (4/8), in decode``: a finding's ranks, and the serving phases it
    concerns when it names some."""
    phases = finding.get("phases") or []
    label = str(finding.get("ranks_label") or "")
    return f"{label}, in {', '.join(phases)}" if phases else label
