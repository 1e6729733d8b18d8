"""Number formatting for finding text: durations, p-values, lists, so every rule reads alike."""

from __future__ import annotations

import math
from collections.abc import Iterable


def duration(ns: float | None) -> str:
    """``2_400_000_000`` -> ``2.4 s``; ``4_200_000`` -> ``4.2 ms``; ``850`` -> ``0.85 µs``."""
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "n/a"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns / 1e3:.2g} µs"


def megabytes(mb: float | None) -> str:
    """Device memory as the exports count it (MB of 2^20 bytes): ``1452.0`` -> ``1.42 GB``,
    ``73.06`` -> ``73.1 MB``, ``0.5`` -> ``512 KB``."""
    if mb is None or (isinstance(mb, float) and not math.isfinite(mb)):
        return "n/a"
    for unit, scale in (("TB", 1024.0**2), ("GB", 1024.0), ("MB", 1.0)):
        if abs(mb) >= scale:
            return f"{mb / scale:.3g} {unit}"
    return f"{mb * 1024:.3g} KB"


P_FLOOR = 1e-16  # below this the normal approximations behind our p-values mean nothing


def p_value(p: float) -> str:
    """``p=1e-9``, ``p=0.031``, ``p<1e-16``: a p-value with its relation, readable when tiny."""
    if p < P_FLOOR:
        return "p<1e-16"
    if p < 1e-3:
        mantissa, exponent = f"{p:.0e}".split("e")
        return f"p={mantissa}e{int(exponent)}"
    return f"p={p:.2g}"


def ratio(value: float) -> str:
    """``3.14`` -> ``3.1x``; infinite growth (from zero) -> ``from zero``."""
    return "from zero" if math.isinf(value) else f"{value:.2g}x" if value < 10 else f"{value:.0f}x"


def number(value: float) -> str:
    """Counts print as integers, fractions with up to 3 significant digits."""
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"


def join(items: Iterable[object], limit: int = 8) -> str:
    """``a, b, c`` with ``... (+N more)`` past ``limit``."""
    values = [str(i) for i in items]
    if len(values) <= limit:
        return ", ".join(values)
    return ", ".join(values[:limit]) + f", ... (+{len(values) - limit} more)"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 step``, ``4 steps``: a number with its noun, never ``step(s)``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def sentence(text: str, end: str = ".") -> str:
    """``text`` as a sentence of a report (a terminal line starts lower case)."""
    return f"{text[0].upper()}{text[1:]}{end}"
