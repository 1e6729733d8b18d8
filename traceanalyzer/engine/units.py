"""The units a finding's metric or a rule's key figure is declared in: how the reports print it.

A rule declares its metrics' units (``@rule(units={"wait_ns": NS, "hot_share": SHARE})``) and
its key figures' (``KeyFigure(..., unit=NS)``); ``report.fmt.metric`` is the one conversion of
a value in its unit to text. A metric without a declared unit is a plain number.
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

NS = "ns"  # a duration in ns: 2.52 s
TRACE_NS = "trace_ns"  # a time on the trace's own clock, in ns: 1736408885527946.217 µs
SHARE = "share"  # a fraction of 1: 98.9%
P_VALUE = "p"  # a p-value: p=2e-10
RATIO = "ratio"  # a factor: 3.7x
COUNT = "count"  # a plain number: 1,234 (so is ""); any other unit is printed after it: 1,800 MHz


def unit_of(key: str, units: Mapping[str, str]) -> str:
    """The unit ``units`` declares for ``key``: its own entry, else the first ``*`` pattern
    that matches it (a key made at run time: ``phase_share_*``); "" when none does."""
    if key in units:
        return units[key]
    return next(
        (unit for name, unit in units.items() if "*" in name and fnmatchcase(key, name)), ""
    )
