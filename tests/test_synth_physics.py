"""The scenarios carry the physics of the field cases, and every file agrees with trace_view.json."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from synth_support import load_trace, process_names

from traceanalyzer.synth import generate

OUT = "ASCEND_PROFILER_OUTPUT"


def _ns(ts: str) -> int:
    whole, frac = ts.split(".")
    return int(whole) * 1000 + int(frac)


def _cann(events: list[dict]) -> list[dict]:
    procs = process_names(events)
    return [e for e in events if e["ph"] == "X" and procs.get(e["pid"]) == "CANN"]


def _hw(events: list[dict]) -> list[dict]:
    procs = process_names(events)
    return [e for e in events if e["ph"] == "X" and procs.get(e["pid"]) == "Ascend Hardware"]


def _windows(events: list[dict]) -> list[tuple[int, int, int]]:
    """(begin, end, tid) of each capture window on the CANN layer."""
    cann = sorted(_cann(events), key=lambda e: _ns(e["ts"]))
    begins = [e for e in cann if e["name"] == "AscendCL@aclmdlRICaptureBegin"]
    ends = [e for e in cann if e["name"] == "AscendCL@aclmdlRICaptureEnd"]
    assert len(begins) == len(ends) > 0
    return [
        (_ns(b["ts"]), _ns(e["ts"]) + round(e["dur"] * 1000), b["tid"])
        for b, e in zip(begins, ends, strict=True)
    ]


def _inside(events: list[dict], name: str, win: tuple[int, int, int]) -> int:
    s, e, tid = win
    return sum(
        1 for x in _cann(events) if x["name"] == name and x["tid"] == tid and s <= _ns(x["ts"]) < e
    )


def _slope(ys: list[float]) -> float:
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


def test_capture_growth_memcpys_grow_and_healthy_stay_flat(tmp_path: Path) -> None:
    sick = load_trace(generate("capture-growth", tmp_path / "g", level=2, rounds=2, layers=1)[0])
    well = load_trace(generate("capture-healthy", tmp_path / "h", level=2, rounds=2, layers=1)[0])
    for events, growing in ((sick, True), (well, False)):
        wins = _windows(events)
        assert len(wins) == 22
        memcpys = [_inside(events, "AscendCL@aclrtMemcpy", w) for w in wins]
        nested = [_inside(events, "Runtime@MemCopySync", w) for w in wins]
        assert memcpys == nested  # Level2: each aclrtMemcpy has its Runtime@MemCopySync
        assert all(_inside(events, "AscendCL@hcom_allReduce_", w) >= 1 for w in wins)
        durations = [e - s for s, e, _ in wins]
        if growing:
            assert _slope(memcpys) > 1.5 and memcpys[-1] > 3 * memcpys[0]
            assert _slope(durations) > 0
        else:
            assert abs(_slope(memcpys)) < 0.2


def test_profiled_rounds_are_sessions_that_remember_unprofiled_rounds(tmp_path: Path) -> None:
    """Seed 000 profiled rounds 1, 45 and 100 only: each is a session of the same rank/process,
    and round r's captures count every capture of rounds 1..r-1 (profiled or not)."""
    rounds, captures = [1, 45, 100], 3
    knobs = {"captures": captures, "layers": 1, "growth": 1.0, "noise": 0.0, "base_memcpy": 6}
    dirs = generate(
        "capture-growth", tmp_path, level=2, profiled_rounds="1,45,100", steps=1, **knobs
    )
    assert len(dirs) == 3
    stamps = [d.name.rsplit("_", 3)[-3] for d in dirs]
    assert all(len(s) == 17 for s in stamps) and stamps == sorted(set(stamps))
    assert len({d.name.rsplit("_", 3)[0] for d in dirs}) == 1  # same host and pid
    infos = [json.loads((d / "profiler_info_0.json").read_text()) for d in dirs]
    assert [i["rank_id"] for i in infos] == [0, 0, 0]
    for key in ("start_cnt", "start_monotonic"):
        values = [i["start_info"][key] for i in infos]
        assert values == sorted(set(values))
    prev_end = 0
    for r, d, info in zip(rounds, dirs, infos, strict=True):
        events = load_trace(d)
        xs = [e for e in events if e["ph"] == "X"]
        first, last = min(_ns(e["ts"]) for e in xs), max(_ns(e["ts"]) for e in xs)
        assert prev_end < first and last < info["end_info"]["collectionTimeEnd"]
        prev_end = info["end_info"]["collectionTimeEnd"]
        steps = sorted(e["name"] for e in xs if e["name"].startswith("ProfilerStep#"))
        assert steps[0] == f"ProfilerStep#{r}"
        assert len(steps) == (2 if r == rounds[-1] else 1)  # decode steps follow the last round
        memcpys = [_inside(events, "AscendCL@aclrtMemcpy", w) for w in _windows(events)]
        assert memcpys == [6 + (r - 1) * captures + i for i in range(captures)]
        stats = {
            row["API Name"]: int(row["Count"])
            for row in csv.DictReader(
                (d / OUT / "api_statistic.csv").read_text(encoding="utf-8").splitlines()
            )
            if row["Level"] == "runtime"
        }
        assert stats["MemCopySync"] == sum(memcpys)


def test_capture_on_main_thread_and_no_runtime_at_level1(tmp_path: Path) -> None:
    d = generate("capture-growth", tmp_path, rounds=1, captures=3, layers=1)[0]
    events = load_trace(d)
    python_pid = next(p for p, n in process_names(events).items() if n == "Python")
    assert {tid for _, _, tid in _windows(events)} == {python_pid}
    assert not [e for e in _cann(events) if e["name"].startswith("Runtime@")]


def test_level0_has_no_cann_and_no_statistics(tmp_path: Path) -> None:
    d = generate("capture-growth", tmp_path, level=0, rounds=1, captures=2, layers=1)[0]
    assert "CANN" not in process_names(load_trace(d)).values()
    names = {p.name for p in (d / OUT).iterdir()}
    assert not names & {
        "api_statistic.csv",
        "op_statistic.csv",
        "communication.json",
        "communication_matrix.json",
    }
    assert {"trace_view.json", "kernel_details.csv", "step_trace_time.csv"} <= names


def _span(events: list[dict]) -> list[dict]:
    return [
        e
        for e in events
        if e.get("cat") == "cpu_op" and e["name"] == "batch_get_into_multi_buffers"
    ]


def test_store_stall_waits_overlap_the_span(tmp_path: Path) -> None:
    healthy_rank, sick_rank = generate("store-stall", tmp_path, ranks=2, sick="1")
    for rank_dir, sick in ((healthy_rank, False), (sick_rank, True)):
        events = load_trace(rank_dir)
        spans = _span(events)
        assert len(spans) == 2
        hw = _hw(events)
        for sp in spans:
            s, e = _ns(sp["ts"]), _ns(sp["ts"]) + round(sp["dur"] * 1000)
            waits = [
                t
                for t in hw
                if t["tid"] in (39, 40, 43, 46)
                and t["args"]["Task Type"] in ("NOTIFY_WAIT_SQE", "EVENT_WAIT_SQE")
                and _ns(t["ts"]) < e
                and _ns(t["ts"]) + t["dur"] * 1000 > s
            ]
            memcpy = [t for t in hw if t["name"] == "MEMCPY_ASYNC" and s <= _ns(t["ts"]) < e]
            assert len(memcpy) == 16
            assert all(t["args"]["memcpy direction"] == "host to device" for t in memcpy)
            if sick:
                assert sp["dur"] > 2e6 and len(waits) == 4
                assert {t["args"]["Task Type"] for t in waits} == {
                    "NOTIFY_WAIT_SQE",
                    "EVENT_WAIT_SQE",
                }
            else:
                assert sp["dur"] < 50_000 and not waits
        # every MEMCPY_ASYNC is reached by a HostToDevice flow from an aclrtMemcpyAsync call
        starts = {e["id"]: e for e in events if e.get("cat") == "HostToDevice" and e["ph"] == "s"}
        ends = [
            e for e in events if e.get("cat") == "HostToDevice" and e["ph"] == "f" and e["tid"] == 9
        ]
        assert len(ends) == 32 and all(f["id"] in starts for f in ends)


def test_store_session_style(tmp_path: Path) -> None:
    plain = generate("store-stall", tmp_path / "p", profile_style="session")[0]
    marked = generate("store-stall", tmp_path / "m", profile_style="session", mark_transfer=1)[0]
    events = load_trace(plain)
    assert not _span(events)
    assert not [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert "traceanalyzer.window" not in json.loads((plain / "profiler_metadata.json").read_text())
    assert (
        json.loads((marked / "profiler_metadata.json").read_text())["traceanalyzer.window"]
        == "store_transfer"
    )
    header = (plain / OUT / "kernel_details.csv").read_text(encoding="utf-8").split(",", 1)[0]
    assert header != "Step Id"
    # as in a real export, the waits are launched inside the window by the model thread, each
    # with a HostToDevice flow onto its task; the copies come from another thread (the store call)
    flows: dict[str, dict[str, dict]] = {}
    for e in events:
        if e.get("cat") == "HostToDevice":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    onto = {(f["s"]["tid"], f["f"]["tid"]) for f in flows.values() if {"s", "f"} <= f.keys()}
    copier = {e["tid"] for e in _cann(events) if e["name"] == "AscendCL@aclrtMemcpyAsync"}
    launcher = {tid for tid, stream in onto if stream in (39, 40, 43, 46)}
    assert len(copier) == 1 and len(launcher) == 1 and copier != launcher
    assert {stream for tid, stream in onto if tid in launcher} == {39, 40, 43, 46}
    assert {stream for tid, stream in onto if tid in copier} == {9}
    launches = {e["name"] for e in _cann(events) if e["tid"] in launcher}
    assert launches == {"AscendCL@aclrtStreamWaitEvent", "AscendCL@hcom_allGather_"}


def _csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("generation", ["g1", "g2", "g3", "current"])
def test_files_agree_with_trace_view(tmp_path: Path, generation: str) -> None:
    d = generate("store-stall", tmp_path, generation=generation, level=2, sick="0")[0]
    events = load_trace(d)
    procs = process_names(events)
    cann = Counter(e["name"].split("@", 1)[1] for e in _cann(events))
    api = {r["API Name"]: int(r["Count"]) for r in _csv(d / OUT / "api_statistic.csv")}
    assert api == dict(cann)
    kernels = _csv(d / OUT / "kernel_details.csv")
    with_op = [
        e
        for e in _hw(events)
        if e["args"]["Task Type"] in ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV")
    ]
    comm = [
        e
        for e in events
        if e["ph"] == "X" and procs.get(e["pid"]) in ("HCCL", "Communication") and e["tid"] == 0
    ]
    assert len(kernels) == len(with_op) + len(comm)
    ops = sum(int(r["Count"]) for r in _csv(d / OUT / "op_statistic.csv"))
    assert ops == len(with_op)
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    assert len(_csv(d / OUT / "step_trace_time.csv")) == len(steps)
    computing = sum(
        e["dur"]
        for e in events
        if e["name"] == "Computing" and procs[e["pid"]] == "Overlap Analysis"
    )
    assert sum(
        float(r["Computing"]) for r in _csv(d / OUT / "step_trace_time.csv")
    ) == pytest.approx(computing)
    torch_ops = [
        e for e in events if e.get("cat") == "cpu_op" and not e["name"].startswith("ProfilerStep#")
    ]
    assert len(_csv(d / OUT / "operator_details.csv")) == len(torch_ops)
    coll = json.loads((d / OUT / "communication.json").read_text())
    n_coll = sum(len([k for k in v["collective"] if k != "Total Op Info"]) for v in coll.values())
    assert n_coll == len(comm)
    info = json.loads(next(d.glob("profiler_info_*.json")).read_text())
    assert isinstance(info["rank_id"], str if generation in ("g3", "current") else int)
    assert ("cann_version" in info) == (generation in ("g3", "current"))
