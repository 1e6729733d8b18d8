"""Number and string formatting exactly as torch_npu/msprof print them.

Times are carried as integer nanoseconds everywhere in the generator so that
the µs strings on disk are exact (``"1736408883704643.212"``), never rounded
through a float. Durations are printed as Python float reprs, as ``json.dumps``
would print the floats torch_npu and msprof hold.
"""

from __future__ import annotations

import json
from functools import lru_cache

EPOCH_NS = 1_736_408_883_000_000_000
"""Default time base (Jan 2025, like the real G2 export); fixtures add µs offsets to it."""


def ts_us(ns: int) -> str:
    """Integer ns -> µs string with exactly 3 decimals (torch_npu ``convert_ns2us_str``)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


def dur_us(ns: int) -> str:
    """Integer ns -> µs as the JSON/CSV float repr (``53.741``, ``0.0``)."""
    return repr(ns / 1000)


def csv_ts(ns: int) -> str:
    """Absolute CSV timestamp: 3 decimals plus the trailing TAB torch_npu/msprof add."""
    return ts_us(ns) + "\t"


@lru_cache(maxsize=1 << 16)
def js(text: str) -> str:
    """JSON string literal as ``json.dumps(..., ensure_ascii=False)`` writes it."""
    return json.dumps(text, ensure_ascii=False)


def r3(value: float) -> float:
    """Round to 3 decimals as msprof's summary exporters do."""
    return round(value, 3)
