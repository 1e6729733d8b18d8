"""communication.json and communication_matrix.json → comm_ops and comm_links.

Both files are nested ``{step: {"p2p"|"collective": {"<op>@<group>": {...}}}}`` objects. The
per-kind ``Total Op Info`` entries are sums of the others and are not stored (query-time sums
give the same numbers without double counting).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traceanalyzer import json_shape
from traceanalyzer.parse.sink import TableSink, table_from_rows
from traceanalyzer.timeutil import us_to_ns

_TOTAL = "Total Op Info"


def _ms_to_ns(value: Any) -> int | None:
    if value is None or value == "":
        return None
    return round(float(value) * 1_000_000)


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
                # Written as a JSON float by msprof: already rounded to float64 at the source.
                "start_ns": us_to_ns(repr(start)) if isinstance(start, float) else us_to_ns(start),
                "elapse_ns": _ms_to_ns(info.get("Elapse Time(ms)")),
                "transit_ns": _ms_to_ns(info.get("Transit Time(ms)")),
                "wait_ns": _ms_to_ns(info.get("Wait Time(ms)")),
                "synchronization_ns": _ms_to_ns(info.get("Synchronization Time(ms)")),
                "idle_ns": _ms_to_ns(info.get("Idle Time(ms)")),
                "wait_ratio": info.get("Wait Time Ratio"),
                "synchronization_ratio": info.get("Synchronization Time Ratio"),
                "bandwidth": json.dumps(body.get("Communication Bandwidth Info"), sort_keys=True)
                if body.get("Communication Bandwidth Info") is not None
                else None,
            }
        )
    return sink.arrow("comm_ops", table_from_rows(rows))


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
                    "transit_ns": _ms_to_ns(body.get("Transit Time(ms)")),
                    "bandwidth_gbps": body.get("Bandwidth(GB/s)"),
                    "op_name": body.get("Op Name"),
                }
            )
    return sink.arrow("comm_links", table_from_rows(rows))
