"""communication.json and communication_matrix.json → comm_ops and comm_links.

Both files are nested ``{step: {"p2p"|"collective": {"<op>@<group>": {...}}}}`` objects. The
per-kind ``Total Op Info`` entries are sums of the others and are not stored (query-time sums
give the same numbers without double counting).

Values are gathered a column at a time, each typed as its column by one rule (:class:`_Columns`):
faster and smaller than a Python dict per link and polars' inference over the dicts, and an odd
value becomes a null instead of failing the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer import json_shape
from traceanalyzer.parse.sink import TableSink, arrow_table
from traceanalyzer.timeutil import float_ms_to_ns, us_expr_to_ns

_TOTAL = "Total Op Info"


def _text(value: Any) -> str | None:
    """A JSON number or string as text, converted with the columns it belongs to (a float's
    repr is its shortest exact digits: msprof wrote it as a float, so it is rounded already)."""
    if value is None or isinstance(value, bool | dict | list):
        return None
    return repr(value) if isinstance(value, float) else str(value)


def _number(value: Any) -> float | None:
    """A JSON number, or a string of one, as a float; anything else is null."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


# A column whose values are all of these types is built as it is; any other value sends the
# column through its converter, one value at a time (the odd file only).
_AS_IS: dict[pl.DataType, frozenset[type]] = {
    pl.String: frozenset({str, type(None)}),
    pl.Float64: frozenset({float, int, type(None)}),
}
_CONVERT: dict[pl.DataType, Callable[[Any], Any]] = {pl.String: _text, pl.Float64: _number}


class _Columns:
    """A table's values gathered per column (``values[name]``, appended as read), each column
    typed by one rule when the frame is made: strings stay, numbers of a text column become their
    text; numbers, and strings of numbers, of a float column become floats; others are null."""

    def __init__(self, types: dict[str, pl.DataType]):
        self._types = types
        self.values: dict[str, list[Any]] = {name: [] for name in types}

    def frame(self) -> pl.DataFrame:
        columns = []
        for name, dtype in self._types.items():
            values = self.values[name]
            if not set(map(type, values)) <= _AS_IS[dtype]:
                values = [_CONVERT[dtype](value) for value in values]
            columns.append(pl.Series(name, values, dtype))
        return pl.DataFrame(columns)


# Far above a real file (tens of MB for a long run), far below what would exhaust memory.
MAX_BYTES = 1 << 30


def _load(path: Path) -> dict[str, Any]:
    doc = json_shape.load_json(path, max_bytes=MAX_BYTES)  # regular, capped, depth-checked
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by step")
    return doc


def _entries(doc: dict[str, Any]) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
    """(step, kind, key, body) of every entry but the totals."""
    for step, kinds in doc.items():
        if not isinstance(kinds, dict):
            continue
        for kind, ops in kinds.items():
            if not isinstance(ops, dict):
                continue
            for key, body in ops.items():
                if key != _TOTAL and isinstance(body, dict):
                    yield step, kind, key, body


_OP_MS = {
    "elapse_ns": "Elapse Time(ms)",
    "transit_ns": "Transit Time(ms)",
    "wait_ns": "Wait Time(ms)",
    "synchronization_ns": "Synchronization Time(ms)",
    "idle_ns": "Idle Time(ms)",
}


def _ms_to_ns(column: str) -> pl.Expr:
    return float_ms_to_ns(pl.col(column))


def _bandwidth(value: Any) -> str | None:
    """The op's bandwidth figures as JSON text, keyed by transport type."""
    return None if value is None else json.dumps(value, sort_keys=True)


def parse_communication(path: Path, sink: TableSink) -> int:
    text = ("step", "kind", "op_name", "group", "start_us", "bandwidth")
    numbers = (*_OP_MS.values(), "wait_ratio", "synchronization_ratio")
    ops = _Columns({**dict.fromkeys(text, pl.String), **dict.fromkeys(numbers, pl.Float64)})
    column = ops.values
    for step, kind, key, body in _entries(_load(path)):
        op_name, _, group = key.partition("@")
        info = body.get("Communication Time Info", {}) or {}
        for name, value in (("step", step), ("kind", kind), ("op_name", op_name),
                            ("group", group or None)):  # fmt: skip
            column[name].append(value)
        column["start_us"].append(info.get("Start Timestamp(us)"))
        for source in _OP_MS.values():
            column[source].append(info.get(source))
        column["wait_ratio"].append(info.get("Wait Time Ratio"))
        column["synchronization_ratio"].append(info.get("Synchronization Time Ratio"))
        column["bandwidth"].append(_bandwidth(body.get("Communication Bandwidth Info")))
    frame = ops.frame().with_columns(
        us_expr_to_ns(pl.col("start_us")).alias("start_ns"),
        *(_ms_to_ns(source).alias(column) for column, source in _OP_MS.items()),
    )
    return sink.arrow("comm_ops", arrow_table(frame.drop("start_us", *_OP_MS.values())))


# comm_links: each link's figures, by the key msprof writes them under
_LINK_FIELDS = {
    "transport_type": "Transport Type",
    "transit_size_mb": "Transit Size(MB)",
    "transit_ms": "Transit Time(ms)",
    "bandwidth_gbps": "Bandwidth(GB/s)",
    "op_name": "Op Name",
}


def parse_communication_matrix(path: Path, sink: TableSink) -> int:
    text = ("step", "kind", "op_key", "group", "link", "transport_type", "op_name")
    numbers = ("transit_size_mb", "transit_ms", "bandwidth_gbps")
    links = _Columns({**dict.fromkeys(text, pl.String), **dict.fromkeys(numbers, pl.Float64)})
    column = links.values
    fields = [(column[name], source) for name, source in _LINK_FIELDS.items()]
    for step, kind, key, entry in _entries(_load(path)):
        op_key, _, group = key.partition("@")
        bodies = [(link, body) for link, body in entry.items() if isinstance(body, dict)]
        for name, value in (("step", step), ("kind", kind), ("op_key", op_key),
                            ("group", group or None)):  # fmt: skip
            column[name].extend([value] * len(bodies))
        for link, body in bodies:
            column["link"].append(link)
            for values, source in fields:
                values.append(body.get(source))
    ends = pl.col("link").str.splitn("-", 2)
    frame = links.frame().with_columns(
        _rank(ends.struct.field("field_0")).alias("src_rank"),
        _rank(ends.struct.field("field_1")).alias("dst_rank"),
        _ms_to_ns("transit_ms").alias("transit_ns"),
    )
    return sink.arrow("comm_links", arrow_table(frame.drop("link", "transit_ms")))


def _rank(text: pl.Expr) -> pl.Expr:
    """A link end's rank: its digits, spaces around them allowed; else null."""
    digits = text.str.strip_chars()
    return pl.when(digits.str.contains(r"^[0-9]+$")).then(digits.cast(pl.Int64, strict=False))
