"""communication.json and communication_matrix.json for the collective ops of a rank.

torch_npu splits msprof's ``analyze/communication*.json`` by step (``"step{N}"``,
or ``"step"`` without a schedule). Key sets and nesting follow the real G2
export; the numbers are derived from the generated HCCL ops so that time totals
agree with ``trace_view.json``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

TRANSPORTS = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")
_TYPE_RE = re.compile(
    r"alltoallvc|alltoallv|alltoall|allreduce|allgather|reducescatter|batchsendrecv|broadcast|receive|send|scatter|reduce"
)


@dataclass
class CollectiveRecord:
    """One collective op as the communication analysis sees it (ns / bytes)."""

    name: str
    start: int
    dur: int
    transit: int
    wait: int
    sync: int
    size: int  # bytes sent per peer link
    link_factor: dict[int, float] = field(default_factory=dict)  # peer -> slower transfer


def _zero_bw() -> dict:
    return {
        "Transit Size(MB)": 0,
        "Transit Time(ms)": 0,
        "Bandwidth(GB/s)": 0,
        "Large Packet Ratio": 0,
        "Size Distribution": {},
    }


def _ratio(part: float, transit: float) -> float:
    return round(part / (part + transit), 4) if part + transit else 0


def _op_info(op: CollectiveRecord, peers: int) -> dict:
    elapse = op.dur / 1e6
    transit = op.transit / 1e6
    wait = op.wait / 1e6
    sync = op.sync / 1e6
    size_mb = op.size / 1e6 * peers
    bw = round(size_mb / transit, 4) if transit else 0  # MB per ms is GB/s
    bandwidth = {t: _zero_bw() for t in TRANSPORTS}
    moved = {"Transit Size(MB)": size_mb, "Transit Time(ms)": transit, "Bandwidth(GB/s)": bw}
    bandwidth["SDMA"] = {**moved, "Large Packet Ratio": 0, "Size Distribution": {}}
    bandwidth["HCCS"] = {
        **moved,
        "Large Packet Ratio": 0.0,
        "Size Distribution": {str(op.size / 1e6): [peers, transit]},
    }
    return {
        "Communication Time Info": {
            "Start Timestamp(us)": op.start / 1000,
            "Elapse Time(ms)": elapse,
            "Transit Time(ms)": transit,
            "Wait Time(ms)": wait,
            "Synchronization Time(ms)": sync,
            "Idle Time(ms)": elapse - transit - wait,
            "Wait Time Ratio": _ratio(wait, transit),
            "Synchronization Time Ratio": _ratio(sync, transit),
        },
        "Communication Bandwidth Info": bandwidth,
    }


def _total(infos: list[dict]) -> dict:
    keys = (
        "Elapse Time(ms)",
        "Transit Time(ms)",
        "Wait Time(ms)",
        "Synchronization Time(ms)",
        "Idle Time(ms)",
    )
    time = {k: sum(i["Communication Time Info"][k] for i in infos) for k in keys}
    tr, wa, sy = time["Transit Time(ms)"], time["Wait Time(ms)"], time["Synchronization Time(ms)"]
    time["Wait Time Ratio"] = _ratio(wa, tr)
    time["Synchronization Time Ratio"] = _ratio(sy, tr)
    bandwidth = {}
    for t in TRANSPORTS:
        size = sum(i["Communication Bandwidth Info"][t]["Transit Size(MB)"] for i in infos)
        ttime = sum(i["Communication Bandwidth Info"][t]["Transit Time(ms)"] for i in infos)
        dist: dict[str, list] = {}
        for i in infos:
            for k, (c, tm) in i["Communication Bandwidth Info"][t]["Size Distribution"].items():
                prev = dist.get(k, [0, 0.0])
                dist[k] = [prev[0] + c, prev[1] + tm]
        bandwidth[t] = {
            "Transit Time(ms)": ttime,
            "Transit Size(MB)": size,
            "Size Distribution": dist,
        }
    return {"Communication Time Info": time, "Communication Bandwidth Info": bandwidth}


def _matrix_links(op: CollectiveRecord, rank: int, group: list[int], with_name: bool) -> dict:
    """Each link of the op (a slow one's transfer ``link_factor`` times longer)."""
    out = {}
    for peer in group:
        local = peer == rank
        size = op.size / 1e6
        ms = op.transit * op.link_factor.get(peer, 1.0) / 1e6 / (20 if local else 1)
        link = {
            "Transport Type": "LOCAL" if local else "HCCS",
            "Transit Size(MB)": size,
            "Transit Time(ms)": ms,
            "Bandwidth(GB/s)": round(size / ms, 4) if ms else 0,
        }
        if with_name:
            link["Op Name"] = op.name
        out[f"{rank}-{peer}"] = link
    return out


def communication_documents(
    steps: dict[str, list[CollectiveRecord]], rank: int, group: list[int], group_hash: str
) -> tuple[dict, dict]:
    """communication.json's and communication_matrix.json's documents; ``steps`` maps
    ``"step{N}"`` (or ``"step"``) to that step's collectives."""
    peers = max(len(group) - 1, 1)
    comm: dict = {}
    matrix: dict = {}
    for step, ops in steps.items():
        coll: dict = {}
        for op in ops:
            coll[f"{op.name}@{group_hash}"] = _op_info(op, peers)
        if coll:
            coll["Total Op Info"] = _total(list(coll.values()))
        comm[step] = {"p2p": {}, "collective": coll}
        mcoll: dict = {}
        by_type: dict[str, list[CollectiveRecord]] = {}
        for op in ops:
            m = _TYPE_RE.search(op.name.lower())
            by_type.setdefault(m.group(0) if m else "invalid", []).append(op)
        for typ, tops in by_type.items():
            ranked = sorted(tops, key=lambda o: (-o.dur, o.start))
            picks = {
                "top1": ranked[0],
                "middle": ranked[len(ranked) // 2],
                "bottom1": ranked[-1],
                "bottom2": ranked[max(len(ranked) - 2, 0)],
                "bottom3": ranked[max(len(ranked) - 3, 0)],
            }
            for label in ("top1", "middle", "bottom1"):
                mcoll[f"{typ}-{label}@{group_hash}"] = _matrix_links(
                    picks[label], rank, group, True
                )
            transit = sum(o.transit for o in tops)
            peers_slow = {p for o in tops for p in o.link_factor}
            agg = CollectiveRecord(
                typ,
                ranked[0].start,
                sum(o.dur for o in tops),
                transit,
                0,
                0,
                sum(o.size for o in tops),
                {
                    p: sum(o.transit * o.link_factor.get(p, 1.0) for o in tops) / transit
                    for p in peers_slow
                    if transit
                },
            )
            mcoll[f"{typ}-total@{group_hash}"] = _matrix_links(agg, rank, group, False)
            for label in ("bottom2", "bottom3"):
                mcoll[f"{typ}-{label}@{group_hash}"] = _matrix_links(
                    picks[label], rank, group, True
                )
        matrix[step] = {"p2p": {}, "collective": mcoll}
    return comm, matrix


def write_communication(out_dir: Path, documents: tuple[dict, dict]) -> None:
    """Write communication.json and communication_matrix.json."""
    comm, matrix = documents
    (out_dir / "communication.json").write_text(json.dumps(comm), encoding="utf-8")
    (out_dir / "communication_matrix.json").write_text(json.dumps(matrix), encoding="utf-8")
