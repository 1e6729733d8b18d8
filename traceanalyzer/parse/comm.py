"""communication.json and communication_matrix.json → comm_ops and comm_links.

Both files are nested ``{step: {"p2p"|"collective": {"<op>@<group>": {...}}}}`` objects. The
per-kind ``Total Op Info`` entries are sums of the others and are not stored (query-time sums
give the same numbers without double counting).
"""

from __future__ import annotations

import json
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


def _table(rows: list[dict[str, Any]], us: dict[str, str], ms: dict[str, str]) -> pl.DataFrame:
    """``rows`` as a frame, with the text columns named in ``us`` (µs) and ``ms`` (ms) as ns."""
    if not rows:
        return pl.DataFrame()  # the sink gives every column, empty
    text = {column: pl.String for column in (*us.values(), *ms.values())}
    frame = pl.DataFrame(rows, schema_overrides=text, infer_schema_length=None)
    return frame.with_columns(
        *(us_expr_to_ns(pl.col(source)).alias(column) for column, source in us.items()),
        *(
            float_ms_to_ns(pl.col(source).cast(pl.Float64, strict=False)).alias(column)
            for column, source in ms.items()
        ),
    ).drop(*text)


# Far above a real file (tens of MB for a long run), far below what would exhaust memory.
MAX_BYTES = 1 << 30


def _load(path: Path) -> dict[str, Any]:
    doc = json_shape.load_json(path, max_bytes=MAX_BYTES)  # regular, capped, depth-checked
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by step")
    return doc


def _entries(doc: dict[str, Any]):  # noqa: ANN202 - generator of (step, kind, key, body)
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


def parse_communication(path: Path, sink: TableSink) -> int:
    rows: list[dict[str, Any]] = []
    for step, kind, key, body in _entries(_load(path)):
        op_name, _, group = key.partition("@")
        info = body.get("Communication Time Info", {}) or {}
        start = info.get("Start Timestamp(us)")
        rows.append(
            {
                "step": step,
                "kind": kind,
                "op_name": op_name,
                "group": group or None,
                "start_us": _text(start),
                **{source: _text(info.get(source)) for source in _OP_MS.values()},
                "wait_ratio": info.get("Wait Time Ratio"),
                "synchronization_ratio": info.get("Synchronization Time Ratio"),
                "bandwidth": json.dumps(body.get("Communication Bandwidth Info"), sort_keys=True)
                if body.get("Communication Bandwidth Info") is not None
                else None,
            }
        )
    return sink.arrow("comm_ops", arrow_table(_table(rows, {"start_ns": "start_us"}, _OP_MS)))


def parse_communication_matrix(path: Path, sink: TableSink) -> int:
    rows: list[dict[str, Any]] = []
    for step, kind, key, links in _entries(_load(path)):
        op_key, _, group = key.partition("@")
        for link, body in links.items():
            if not isinstance(body, dict):
                continue
            src, _, dst = str(link).partition("-")
            rows.append(
                {
                    "step": step,
                    "kind": kind,
                    "op_key": op_key,
                    "group": group or None,
                    "src_rank": int(src) if src.strip().isdigit() else None,
                    "dst_rank": int(dst) if dst.strip().isdigit() else None,
                    "transport_type": body.get("Transport Type"),
                    "transit_size_mb": body.get("Transit Size(MB)"),
                    "Transit Time(ms)": _text(body.get("Transit Time(ms)")),
                    "bandwidth_gbps": body.get("Bandwidth(GB/s)"),
                    "op_name": body.get("Op Name"),
                }
            )
    transit = {"transit_ns": "Transit Time(ms)"}
    return sink.arrow("comm_links", arrow_table(_table(rows, {}, transit)))
