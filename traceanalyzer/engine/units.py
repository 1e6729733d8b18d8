"""The units a finding's metric or a rule's key figure is declared in: how the reports print it.

A rule declares its metrics' units (``@rule(units={"wait_ns": NS, "hot_share": SHARE})``) and
its key figures' (``KeyFigure(..., unit=NS)``); ``report.fmt.metric`` is the one conversion of
a value in its unit to text. A metric without a declared unit is a plain number.
"""

from __future__ import annotations

NS = "ns"  # a duration in ns: 2.52 s
TRACE_NS = "trace_ns"  # a time on the trace's own clock, in ns: 1736408885527946.217 µs
SHARE = "share"  # a fraction of 1: 98.9%
P_VALUE = "p"  # a p-value: p=2e-10
RATIO = "ratio"  # a factor: 3.7x
COUNT = "count"  # a plain number: 1,234 (so is ""); any other unit is printed after it: 1,800 MHz
