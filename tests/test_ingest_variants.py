"""Hand-made rank directories for each format generation and each quirk the format doc lists.

These are written byte by byte here (not by the synth generator) so the parser is checked
against the documented shapes independently of our own writer.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from traceanalyzer.cli import EXIT_PARTIAL, main
from traceanalyzer.discover import discover
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store

T0 = "1736408883700000"


def _x(
    name: str,
    pid: int,
    tid: int,
    ts: str,
    dur: float,
    args: dict | None = None,
    cat: str | None = None,
) -> dict:
    event = {"name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "ph": "X"}
    if cat:
        event["cat"] = cat
    if args is not None:
        event["args"] = args
    return event


def _m(pid: int, process: str, threads: dict[int, str], label: str = "CPU") -> list[dict]:
    out = [
        {"name": "process_name", "pid": pid, "tid": 0, "args": {"name": process}, "ph": "M"},
        {"name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}, "ph": "M"},
    ]
    out += [
        {"name": "thread_name", "pid": pid, "tid": t, "args": {"name": n}, "ph": "M"}
        for t, n in threads.items()
    ]
    return out


def _trace_bytes(framework: list[dict], msprof: list[dict], join: str = ", ") -> bytes:
    """torch_npu framing: framework part, then the msprof part appended as `,{...}]`."""
    dump = lambda events: ", ".join(json.dumps(e, ensure_ascii=False) for e in events)  # noqa: E731
    return (
        "[" + dump(framework) + join.rstrip() + (" " if join == ", " else "") + dump(msprof) + "]"
    ).encode()


def _write_rank(
    root: Path, name: str, info: dict, files: dict[str, bytes | str], info_name: str | None = None
) -> Path:
    rank_dir = root / name
    out = rank_dir / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    rank = info.get("rank_id")
    (
        rank_dir
        / (
            info_name
            or (f"profiler_info_{rank}.json" if rank is not None else "profiler_info.json")
        )
    ).write_text(json.dumps(info, indent=4))
    (rank_dir / "profiler_metadata.json").write_text(json.dumps({"ENV_VARIABLES": {}}))
    for fname, content in files.items():
        (out / fname).write_bytes(content.encode() if isinstance(content, str) else content)
    return rank_dir


HW_PID, CANN_PID, PY_PID = 3170820512, 3170820320, 3096504


def _g2_trace(
    stream_key: str = "Physic Stream Id", comm_process: str = "HCCL", prefix: str = "Hccl@"
) -> bytes:
    framework = [
        {
            "ph": "X",
            "name": "aten::add",
            "pid": PY_PID,
            "tid": PY_PID,
            "ts": f"{T0}.125",
            "dur": 10.5,
            "cat": "cpu_op",
            "args": {"Sequence number": 1},
        },
        {"ph": "i", "name": "marker", "pid": PY_PID, "tid": PY_PID, "ts": f"{T0}.130", "s": "t"},
        {
            "ph": "s",
            "bp": "e",
            "name": "torch_to_npu",
            "id": 1736408883700020001,
            "pid": PY_PID,
            "tid": PY_PID,
            "ts": f"{T0}.125",
            "cat": "async_npu",
        },
        *_m(PY_PID, "Python", {PY_PID: f"Thread {PY_PID}"}),
    ]
    msprof = [
        _x(
            "AscendCL@aclrtMemcpy",
            CANN_PID,
            77,
            f"{T0}.200",
            3.25,
            {
                "Thread Id": 77,
                "Mode": "ACL_RTS",
                "level": "acl",
                "id": "aclrtMemcpy",
                "item_id": "0",
                "connection_id": 5,
            },
        ),
        _x(
            f"{prefix}Launch_Ffts",
            CANN_PID,
            77,
            f"{T0}.300",
            1.0,
            {
                "Thread Id": 77,
                "Mode": "master",
                "level": "hccl",
                "id": "0",
                "item_id": "0",
                "connection_id": 6,
            },
        ),
        *_m(CANN_PID, "CANN", {77: "Thread 77"}),
        _x(
            "add_kernel",
            HW_PID,
            2,
            "1736408883700020.001",
            2.5,
            {
                "Model Id": 4294967295,
                "Task Type": "AI_CORE",
                stream_key: 2,
                "Task Id": 11,
                "Batch Id": 0,
                "Subtask Id": 4294967295,
                "connection_id": 990,
            },
        ),
        _x(
            "MEMCPY_ASYNC",
            HW_PID,
            3,
            "1736408883700021.000",
            1.0,
            {
                "Model Id": 7,
                "Task Type": "SDMA_SQE",
                stream_key: 3,
                "Task Id": 12,
                "data size(Byte)": 92928,
                "memcpy direction": "device to device",
            },
        ),
        _x(
            "Notify Wait",
            HW_PID,
            40,
            "1736408883700022.000",
            100.0,
            {"Model Id": 4294967295, "Task Type": "NOTIFY_WAIT_SQE", stream_key: 40, "Task Id": 13},
        ),
        *_m(
            HW_PID, "Ascend Hardware", {2: "Stream 2", 3: "Stream 3", 40: "Stream 40"}, label="NPU"
        ),
        _x(
            "hcom_allReduce__1_0_1",
            HW_PID + 64,
            0,
            f"{T0}.400",
            5.0,
            {
                "connection_id": 1,
                "model id": 4294967295,
                "data_type": "FP32",
                "alg_type": "MESH",
                "count": 8,
            },
        ),
        *_m(HW_PID + 64, comm_process, {0: "Group 0 Communication"}, label="NPU"),
        {
            "name": "AI Core Freq",
            "ts": T0,
            "pid": HW_PID + 32,
            "tid": 0,
            "args": {"MHz": 1800},
            "ph": "C",
        },
        {
            "name": "APP/HBM",
            "ts": f"{T0}.500",
            "pid": HW_PID + 32,
            "tid": 0,
            "args": {"KB": 1.5, "Extra": 2},
            "ph": "C",
        },
        *_m(HW_PID + 32, "AI Core Freq", {}, label="NPU"),
        {
            "ph": "f",
            "bp": "e",
            "name": "torch_to_npu",
            "id": 1736408883700020001,
            "pid": HW_PID,
            "tid": 2,
            "ts": "1736408883700020.001",
            "cat": "async_npu",
        },
        {
            "ph": "f",
            "bp": "e",
            "name": "HostToDevice99",
            "id": "99",
            "pid": HW_PID,
            "tid": 3,
            "ts": "1736408883700021.000",
            "cat": "HostToDevice",
        },
    ]
    return _trace_bytes(framework, msprof, join=",")


G2_KERNEL = (
    "Step Id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim,Mix Block Dim,HF32 Eligible,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,Context ID,aicore_time(us),aic_total_cycles\r\n"
    '50,4294967295,11,2,add_kernel,Add,dynamic,AI_CORE,1736408883700020.001\t,2.500,0,8,0,NO,"""8,16;8,16""",FLOAT;FLOAT,ND;ND,"""8,16""",FLOAT,ND,N/A,1.5,100\r\n'
)
# the rows' times lie within their session's (a file of another session is left out)
G1_KERNEL = (
    "Step Id,Model ID,Task ID,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim,Mix Block Dim,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,Context ID,aicore_time(us)\n"
    '1,4294967295,279,3,add_kernel,Add,AI_CORE,"1736408883758972.912\t",12.5,0,1,0,"""1""",FLOAT,ND,"""1""",FLOAT,ND,N/A,1.0\n'
    '1,N/A,N/A,N/A,hcom_broadcast__445_0,hcom_broadcast_,HCCL,"1736408883758999.000\t",5,0,0,0,,,,,,,N/A,0\n'
)
G3_KERNEL = (
    "Step Id,Device_id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Dim,Mix Block Dim,HF32 Eligible,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,Context ID\n"
    '13,0,4294967295,34473,2,aclnnInplaceZero_ZerosLikeAiCore_ZerosLike,ZerosLike,dynamic,AI_VECTOR_CORE,1736408883773569.640\t,1892.920,0,40,0,NO,"""375815680""",FLOAT,ND,"""375815680""",FLOAT,ND,N/A\n'
)
CURRENT_KERNEL = (
    "Step Id,Device_id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),Duration(us),Wait Time(us),Block Num,Mix Block Num,HF32 Eligible,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats\n"
    '1,3,12,5,2,k,MatMul,static,MIX_AIC,1736408883754971.710\t,10.000,0,24,48,YES,"""4,4""",BF16,ND,"""4,4""",BF16,ND\n'
)
G2_API = "Level,API Name,Time(us),Count,Avg(us),Min(us),Max(us),Variance\nacl,aclrtMemcpy,776.87,17,45.698,22.14,112.44,650.087\nhccl,Launch_Ffts,1.0,1,1.0,1.0,1.0,0\n"
G3_API = "Device_id,Level,API Name,Time(us),Count,Avg(us),Min(us),Max(us),Variance\nhost,runtime,MemCopySync,1286.06,41,31.367,19.34,103.28,313.956\nhost,communication,hcom_allReduce_,5,1,5,5,5,0\n"
OPERATORS = (
    "Name,Input Shapes,Call Stack,Host Self Duration(us),Host Total Duration(us),Device Self Duration(us),Device Total Duration(us),Device Self Duration With AICore(us),Device Total Duration With AICore(us)\r\n"
    'aten::add,"[[8, 16], [8, 16]]","a.py(1): f;\r\nb.py(2): g;\r\nc.py(3): <module>",10.5,10.5,2.5,2.5,2.5,2.5\r\n'
)
STEP_G2 = "Step,Computing,Communication(Not Overlapped),Overlapped,Communication,Free,Stage,Bubble,Communication(Not Overlapped and Exclude Receive),Preparing\r\n50,231290.09999999995,10,0,10,5.5,0,0,10,1.25\r\n"
TASK_TIME = "Device_id,kernel_name,kernel_type,stream_id,task_id,task_time(us),task_start(us),task_stop(us)\n0,N/A,PROFILING_ENABLE,1404,4,0.000,1736408883754971.710\t,1736408883754971.710\t\n0,main_kernel,MIX_AIC,2,5,1.5,1736408883754972.000\t,1736408883754973.500\t\n"
COMM = json.dumps(
    {"step50": {"p2p": {}, "collective": {
        "hcom_allReduce__586_0_1@17522688603477080586": {"Communication Time Info": {"Start Timestamp(us)": 1736408883732241.5, "Elapse Time(ms)": 79.0895, "Transit Time(ms)": 0.2391, "Wait Time(ms)": 5.6466, "Synchronization Time(ms)": 5.6157, "Idle Time(ms)": 73.2037, "Wait Time Ratio": 0.9594, "Synchronization Time Ratio": 0.9591}, "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 0.5}}},
        "Total Op Info": {"Communication Time Info": {"Elapse Time(ms)": 79.0895}}}}}
)  # fmt: skip
MATRIX = json.dumps(
    {
        "step50": {
            "p2p": {},
            "collective": {
                "allreduce-top1@175": {
                    "0-1": {
                        "Transport Type": "HCCS",
                        "Transit Size(MB)": 0.5,
                        "Transit Time(ms)": 0.1,
                        "Bandwidth(GB/s)": 5,
                        "Op Name": "hcom_allReduce__586_2_1",
                    }
                }
            },
        }
    }
)


def _info(rank_id: object, level: str = "Level1", export: object = "text", **extra: object) -> dict:
    info = {
        "config": {"experimental_config": {"_profiler_level": level, "_export_type": export}},
        "end_info": {"collectionTimeEnd": 1736408884023552840},
    }
    if rank_id is not None:
        info["rank_id"] = rank_id
    info.update(extra)
    return info


@pytest.fixture
def generations(tmp_path: Path) -> Path:
    root = tmp_path / "profiling_data"
    _write_rank(
        root, "host_1_20250109160000123_ascend_pt", _info(0),
        {"trace_view.json": _g2_trace(), "kernel_details.csv": G2_KERNEL, "api_statistic.csv": G2_API,
         "operator_details.csv": OPERATORS, "step_trace_time.csv": STEP_G2,
         "communication.json": COMM, "communication_matrix.json": MATRIX},
    )  # fmt: skip
    _write_rank(
        root / "nested" / "deeper",
        "g1_ascend_pt",
        _info(1, export="text"),
        {"trace_view.json": _g2_trace(stream_key="Stream Id"), "kernel_details.csv": G1_KERNEL},
    )
    _write_rank(
        root,
        "g3_ascend_pt",
        _info(
            "2", level="Level2", export=["text"], torch_npu_version="2.7.1", cann_version="8.3.RC1"
        ),
        {"kernel_details.csv": G3_KERNEL, "api_statistic.csv": G3_API},
    )
    _write_rank(
        root, "current_ascend_pt", _info("3", export=["text", "db"]),
        {"trace_view.json": _g2_trace(comm_process="Communication", prefix="Communication@"), "kernel_details.csv": CURRENT_KERNEL, "task_time.csv": TASK_TIME},
    )  # fmt: skip
    return root


def test_all_generations_ingest(generations: Path, tmp_path: Path) -> None:
    result = ingest(generations, tmp_path / "out")
    assert not result.partial, result.to_dict()
    by_rank = {o.rank: o for o in result.outcomes}
    assert {r: o.generation for r, o in by_rank.items()} == {
        0: "g2",
        1: "g1",
        2: "g3",
        3: "current",
    }
    store = Store.open(tmp_path / "out")
    kernels = store.table("kernels").collect().sort("rank")
    assert kernels.filter(pl.col("rank") == 1)["start_ns"].to_list() == [
        1736408883758972912,
        1736408883758999000,
    ]
    g1_comm = kernels.filter((pl.col("rank") == 1) & (pl.col("accelerator_core") == "HCCL")).row(
        0, named=True
    )
    assert g1_comm["task_id"] is None and g1_comm["stream_id"] is None
    g2 = kernels.filter(pl.col("rank") == 0).row(0, named=True)
    assert g2["model_id"] is None and g2["block_num"] == 8 and g2["input_shapes"] == "8,16;8,16"
    assert json.loads(g2["extra"]) == {"aicore_time(us)": "1.5", "aic_total_cycles": "100"}
    assert kernels.filter(pl.col("rank") == 2)["device_id"].to_list() == [0]
    current = kernels.filter(pl.col("rank") == 3).row(0, named=True)
    assert (current["block_num"], current["mix_block_num"], current["model_id"]) == (24, 48, 12)


def test_trace_variants_and_exact_times(generations: Path, tmp_path: Path) -> None:
    ingest(generations, tmp_path / "out")
    slices = Store.open(tmp_path / "out").table("slices").collect()
    for rank in (0, 1, 3):
        hw = slices.filter(
            (pl.col("rank") == rank) & (pl.col("process") == "Ascend Hardware")
        ).sort("start_ns")
        assert hw["stream_id"].to_list() == [
            2,
            3,
            40,
        ]  # "Physic Stream Id" (G2+) or "Stream Id" (G1)
        assert hw["start_ns"].to_list() == [
            1736408883700020001,
            1736408883700021000,
            1736408883700022000,
        ]
        assert hw["dur_ns"].to_list() == [2500, 1000, 100000]
        memcpy = hw.filter(pl.col("name") == "MEMCPY_ASYNC").row(0, named=True)
        assert (memcpy["memcpy_direction"], memcpy["memcpy_size"], memcpy["model_id"]) == (
            "device to device",
            92928,
            7,
        )
    current = slices.filter(pl.col("rank") == 3)
    assert "Communication" in set(current["process"])
    assert set(current.filter(pl.col("process") == "CANN")["api_layer"]) == {
        "AscendCL",
        "Communication",
    }
    instant = slices.filter((pl.col("rank") == 0) & (pl.col("ph") == "i")).row(0, named=True)
    assert (instant["start_ns"], instant["dur_ns"]) == (1736408883700000130, 0)


def test_counters_with_integer_ts(generations: Path, tmp_path: Path) -> None:
    ingest(generations, tmp_path / "out")
    counters = (
        Store.open(tmp_path / "out")
        .table("counters")
        .filter(pl.col("rank") == 0)
        .collect()
        .sort("ts_ns", "series")
    )
    assert counters.select("name", "series", "ts_ns", "value").rows() == [
        ("AI Core Freq", "MHz", 1736408883700000000, 1800.0),
        ("APP/HBM", "Extra", 1736408883700000500, 2.0),
        ("APP/HBM", "KB", 1736408883700000500, 1.5),
    ]


def test_flows_paired_and_unpaired(generations: Path, tmp_path: Path) -> None:
    ingest(generations, tmp_path / "out")
    flows = Store.open(tmp_path / "out").table("flows").filter(pl.col("rank") == 0).collect()
    paired = flows.filter(pl.col("cat") == "async_npu").row(0, named=True)
    assert (paired["src_process"], paired["dst_process"], paired["dst_thread"]) == (
        "Python",
        "Ascend Hardware",
        "Stream 2",
    )
    assert paired["end_ns"] == int(paired["flow_id"])
    orphan = flows.filter(pl.col("cat") == "HostToDevice").row(0, named=True)
    assert orphan["start_ns"] is None and orphan["end_ns"] == 1736408883700021000


def test_csv_tables(generations: Path, tmp_path: Path) -> None:
    ingest(generations, tmp_path / "out")
    store = Store.open(tmp_path / "out")
    api = store.table("api_stats").collect()
    assert set(api["level"]) == {"acl", "hccl", "runtime", "communication"}
    assert api.filter(pl.col("rank") == 2)["device_id"].unique().to_list() == ["host"]
    ops = store.table("operators").collect().row(0, named=True)
    assert ops["call_stack"] == "a.py(1): f\nb.py(2): g\nc.py(3): <module>"
    assert ops["host_self_ns"] == 10500
    step = store.table("step_times").collect().row(0, named=True)
    assert (step["step"], step["computing_ns"], step["preparing_ns"]) == (50, 231290100, 1250)
    tasks = store.table("task_times").collect().sort("start_ns")
    assert tasks["kernel_name"].to_list() == [None, "main_kernel"]
    assert tasks["end_ns"].to_list() == [1736408883754971710, 1736408883754973500]
    comm = store.table("comm_ops").collect().row(0, named=True)
    assert (comm["op_name"], comm["group"], comm["elapse_ns"]) == (
        "hcom_allReduce__586_0_1",
        "17522688603477080586",
        79089500,
    )
    link = store.table("comm_links").collect().row(0, named=True)
    assert (link["src_rank"], link["dst_rank"], link["transport_type"]) == (0, 1, "HCCS")


def test_missing_files_are_empty_tables_and_reported(generations: Path, tmp_path: Path) -> None:
    result = ingest(generations, tmp_path / "out")
    g3 = next(o for o in result.outcomes if o.rank == 2)
    assert "trace_view.json" in g3.missing_files
    # Files only some exports have are "not collected", with what writes them.
    assert "memory_record.csv (profile_memory=True)" in g3.not_collected
    assert "memory_record.csv" not in g3.missing_files
    assert (
        Store.open(tmp_path / "out").table("slices").filter(pl.col("rank") == 2).collect().height
        == 0
    )


def _complete_events_before(data: bytes, cut: int) -> list[dict]:
    """Events that end before byte ``cut`` (an independent scan with the stdlib decoder)."""
    decoder, text, pos, out = json.JSONDecoder(), data.decode(), 1, []
    while pos < len(text):
        while text[pos] in ", ]":
            pos += 1
            if pos >= len(text):
                return out
        event, end = decoder.raw_decode(text, pos)
        if len(text[:end].encode()) > cut:
            return out
        out.append(event)
        pos = end
    return out


@pytest.mark.parametrize("cut_fraction", [0.02, 0.15, 0.5, 0.77, 0.93, 0.999, 1.0])
def test_truncated_trace_keeps_complete_events(tmp_path: Path, cut_fraction: float) -> None:
    full = _g2_trace()
    cut = int(len(full) * cut_fraction) if cut_fraction < 1 else len(full) - 1  # 1.0: only `]` lost
    root = tmp_path / "in"
    _write_rank(root, "r_ascend_pt", _info(0), {"trace_view.json": full[:cut]})
    result = ingest(root, tmp_path / "out")
    outcome = result.outcomes[0]
    assert any(
        "truncated" in w and "trace_view.json" in w and "bytes 0.." in w for w in outcome.warnings
    ), outcome.warnings
    assert outcome.status == "ingested" and result.partial  # analysed, but events were lost
    assert outcome.incomplete_files[0].startswith("trace_view.json (truncated: kept bytes 0..")
    [warning] = [w for w in outcome.warnings if "truncated" in w]
    assert outcome.incomplete_files[0].split("truncated: ")[1].rstrip(")") in warning
    expected = sorted(
        e["name"] for e in _complete_events_before(full, cut) if e["ph"] in ("X", "i")
    )
    kept = Store.open(tmp_path / "out").table("slices").collect()
    assert sorted(kept["name"].to_list()) == expected


def test_malformed_csv_row_skipped_with_line_number(tmp_path: Path) -> None:
    bad = G2_API + "acl,aclrtFree,1.0\nacl,aclrtMalloc,2.0,1,2.0,2.0,2.0,0\n"
    # A second bad file in the same session: each file's rejected lines are its own.
    bad_kernels = G2_KERNEL + "only,three,fields\r\n"  # this file has CRLF line ends
    root = tmp_path / "in"
    files = {"api_statistic.csv": bad, "kernel_details.csv": bad_kernels}
    _write_rank(root, "r_ascend_pt", _info(0), files)
    result = ingest(root, tmp_path / "out")
    malformed = [w for w in result.outcomes[0].warnings if "malformed row skipped" in w]
    kernel_bad_line = bad_kernels.count("\n")
    assert len(malformed) == 2, malformed
    assert any("api_statistic.csv: line 4: malformed row skipped" in w for w in malformed)
    assert any(f"kernel_details.csv: line {kernel_bad_line}: malformed" in w for w in malformed)
    api = Store.open(tmp_path / "out").table("api_stats").collect()
    assert api["api_name"].to_list() == ["aclrtMemcpy", "Launch_Ffts", "aclrtMalloc"]


def test_discovery_reports_raw_only_takes_db_only_and_rank_fallbacks(tmp_path: Path) -> None:
    root = tmp_path / "in"
    raw = root / "raw_ascend_pt"
    (raw / "PROF_000001_20250109160000123_ABCDEFGHIJKLMNOP").mkdir(parents=True)
    (raw / "FRAMEWORK").mkdir()
    db = root / "db_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    db.mkdir(parents=True)
    (db / "ascend_pytorch_profiler_0.db").write_bytes(b"")
    _write_rank(
        root,
        "a_ascend_pt",
        _info(None),
        {"api_statistic.csv": G2_API},
        info_name="profiler_info_5.json",
    )
    _write_rank(
        root,
        "b_ascend_pt",
        _info(None),
        {"kernel_details.csv": G3_KERNEL.replace("\n13,0,", "\n13,7,")},
        info_name="profiler_info.json",
    )
    found = discover(root)
    messages = " | ".join(p.message for p in found.problems)
    assert "raw data only" in messages and "analyse(" in messages
    # A Db-only rank is a session (read from its database), its rank from the file name.
    ranks = {s.path.name: (s.rank, s.rank_source, s.formats) for s in found.sessions}
    assert ranks == {
        "a_ascend_pt": (5, "file_name", ["text"]),
        "b_ascend_pt": (7, "device_id", ["text"]),
        "db_ascend_pt": (0, "file_name", ["db"]),
    }
    assert "missing ranks: 1, 2, 3, 4, 6" in messages


def test_sessions_of_one_rank_are_kept_apart_in_time_order(tmp_path: Path) -> None:
    root = tmp_path / "in"
    for name, end in (("late_ascend_pt", 300), ("early_ascend_pt", 100), ("mid_ascend_pt", 200)):
        info = _info(0)
        info["end_info"]["collectionTimeEnd"] = 1736408884000000000 + end
        _write_rank(root, name, info, {"api_statistic.csv": G2_API})
    found = discover(root)
    assert [s.session for s in found.sessions] == [
        "early_ascend_pt",
        "mid_ascend_pt",
        "late_ascend_pt",
    ]
    assert any("3 sessions" in p.message for p in found.problems)
    ingest(root, tmp_path / "out")
    assert Store.open(tmp_path / "out").sessions().height == 3


def test_removed_session_leaves_the_store(generations: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ingest(generations, out)
    import shutil

    shutil.rmtree(generations / "current_ascend_pt")
    second = ingest(generations, out)
    assert {o.status for o in second.outcomes} == {"cached"}
    assert sorted(Store.open(out).sessions()["rank"].to_list()) == [0, 1, 2]


@pytest.mark.parametrize(
    "inner", ["ASCEND_PROFILER_OUTPUT", "ASCEND_PROFILER_OUTPUT/trace_view.json"]
)
def test_pointing_inside_a_rank_dir_means_the_rank(
    generations: Path, tmp_path: Path, inner: str
) -> None:
    rank_dir = generations / "host_1_20250109160000123_ascend_pt"
    result = ingest(rank_dir / inner, tmp_path / "out")
    assert [(o.rank, o.status) for o in result.outcomes] == [(0, "ingested")]


def test_ingest_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on first use of its Python constructors: ~0.3 s of every worker."""
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "inference_baseline"
    probe = (
        "import sys; from pathlib import Path; from traceanalyzer.ingest import ingest; "
        f"r = ingest(Path({str(sample)!r}), Path({str(tmp_path / 'out')!r})); "
        "assert not r.failed, r.failed; print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize(
    ("ts", "expected_ns"),
    [
        ("1736408883700000.930", 1736408883700000930),  # torch_npu's own shape
        (1736408883700000, 1736408883700000000),  # integer, as on an AI Core Freq counter
        ("1736408883700000.930\t", 1736408883700000930),  # a CSV habit, escaped in JSON
        (" 1736408883700000.5", 1736408883700000500),  # padding, fewer decimals
        ("1736408883700000.9304", 1736408883700000930),  # more decimals: rounded to the ns
    ],
)
def test_trace_ts_text_shapes_are_exact(tmp_path: Path, ts: object, expected_ns: int) -> None:
    events = [*_m(PY_PID, "Python", {1: "python thread"}), _x("step", PY_PID, 1, ts, 1.0)]
    root = tmp_path / "in"
    _write_rank(root, "r_ascend_pt", _info(0), {"trace_view.json": json.dumps(events)})
    ingest(root, tmp_path / "out")
    slices = Store.open(tmp_path / "out").table("slices").collect()
    assert slices["start_ns"].to_list() == [expected_ns]


def test_discovery_follows_links_once_and_never_loops(tmp_path: Path) -> None:
    root = tmp_path / "in"
    _write_rank(root, "r0_ascend_pt", _info(0), {"trace_view.json": json.dumps([])})
    elsewhere = tmp_path / "shared_storage"
    _write_rank(elsewhere, "r1_ascend_pt", _info(1), {"trace_view.json": json.dumps([])})
    (root / "collected").mkdir()
    (root / "collected" / "r1").symlink_to(elsewhere / "r1_ascend_pt")  # a link into storage
    (root / "collected" / "again").symlink_to(elsewhere)  # the same rank dir, reached twice
    (root / "collected" / "loop").symlink_to(root)  # a link back to an ancestor
    (root / "collected" / "r0").symlink_to(root / "r0_ascend_pt")  # inside: followed, once
    found = discover(root, follow_links=True)
    assert sorted(s.rank for s in found.sessions) == [0, 1]
    # by default a link that leaves the input is reported, not followed
    found = discover(root)
    assert [s.rank for s in found.sessions] == [0]
    assert sorted(p.path for p in found.problems if "not followed" in p.message) == [
        str(root / "collected" / "again"),
        str(root / "collected" / "r1"),
    ]


@pytest.mark.parametrize("content", [b"", b"  \n"])
def test_empty_trace_is_reported_and_makes_the_run_partial(tmp_path: Path, content: bytes) -> None:
    """A profiler killed before it wrote the trace leaves an empty file: say so, never a silent
    "no device tasks"."""
    root = tmp_path / "in"
    _write_rank(
        root, "r_ascend_pt", _info(0), {"trace_view.json": content, "kernel_details.csv": G2_KERNEL}
    )
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(tmp_path / "out")])
    assert result.exit_code == EXIT_PARTIAL, result.output
    assert f"incomplete (data lost): trace_view.json (empty: {len(content)} bytes, no events)" in (
        result.output
    )
    assert "export was probably interrupted" in result.output


def test_unparseable_csv_is_an_incomplete_file(tmp_path: Path) -> None:
    root = tmp_path / "in"
    files = {
        "trace_view.json": _g2_trace(),
        "op_statistic.csv": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    }
    _write_rank(root, "r_ascend_pt", _info(0), files)
    result = ingest(root, tmp_path / "out")
    outcome = result.outcomes[0]
    assert outcome.status == "ingested" and result.partial
    assert outcome.incomplete_files == ["op_statistic.csv (could not be parsed)"], outcome.warnings


def _salvaged(tmp_path: Path, trace: bytes) -> tuple[pl.DataFrame, object]:
    root = tmp_path / "in"
    _write_rank(root, "r_ascend_pt", _info(0), {"trace_view.json": trace})
    result = ingest(root, tmp_path / "out")
    return Store.open(tmp_path / "out").table("slices").collect(), result


def test_invalid_utf8_is_replaced_and_every_event_kept(tmp_path: Path) -> None:
    full = _g2_trace()
    expected = sorted(e["name"] for e in json.loads(full) if e["ph"] in ("X", "i"))
    at = full.index(b"aclrtMemcpy")
    damaged = full[:at] + b"acl\xff\xferMemcpy" + full[at + len(b"aclrtMemcpy") :]
    slices, result = _salvaged(tmp_path, damaged)
    assert len(slices) == len(expected)
    assert "AscendCL@acl\ufffd\ufffdrMemcpy" in set(slices["name"])
    assert not result.partial  # nothing lost, two characters replaced
    assert any("2 invalid UTF-8 sequence(s) replaced" in w for w in result.outcomes[0].warnings)


def test_a_malformed_event_mid_file_costs_only_that_event(tmp_path: Path) -> None:
    full = _g2_trace()
    events = json.loads(full)
    victim = next(e for e in events if e["ph"] == "X" and e["name"] == "aten::add")
    text = json.dumps(victim, ensure_ascii=False).encode()
    assert full.count(text) == 1
    damaged = full.replace(text, text.replace(b'"name": "aten::add"', b'"name": aten::add'))
    slices, result = _salvaged(tmp_path, damaged)
    expected = sorted(e["name"] for e in events if e["ph"] in ("X", "i") and e is not victim)
    assert sorted(slices["name"].to_list()) == expected
    outcome = result.outcomes[0]
    assert result.partial and outcome.incomplete_files[0].startswith(
        "trace_view.json (malformed: 1 byte range(s)"
    )
    start = damaged.index(b'"name": aten::add')
    (warning,) = [w for w in outcome.warnings if "kept every well-formed event" in w]
    begin, end = map(int, re.search(r"dropped bytes (\d+)\.\.(\d+) of", warning).groups())
    assert begin < start < end and end - begin < 2 * len(text)  # that event, nothing more


def test_nul_padding_after_the_array_is_ignored_with_a_warning(tmp_path: Path) -> None:
    full = _g2_trace()
    slices, result = _salvaged(tmp_path, full + b"\x00" * 4096)
    assert len(slices) == sum(e["ph"] in ("X", "i") for e in json.loads(full))
    assert not result.partial
    assert any(
        "4096 byte(s) after the closing bracket ignored" in w for w in result.outcomes[0].warnings
    )


def test_garbage_after_the_bracket_is_bounded_work(tmp_path: Path) -> None:
    slices, result = _salvaged(tmp_path, b"[" + bytes(range(256)) * 2000 + b"}, {" * 3000)
    assert slices.is_empty() and result.partial and not result.failed


def test_many_malformed_rows_make_one_warning_per_reason(tmp_path: Path) -> None:
    rows = "".join(f"acl,aclrtMemcpy,{i}.0,1,1,1,1,0\n" for i in range(50))
    bad = "".join("acl,short\n" for _ in range(500))
    root = tmp_path / "in"
    _write_rank(root, "r_ascend_pt", _info(0), {"api_statistic.csv": G2_API + rows + bad})
    outcome = ingest(root, tmp_path / "out").outcomes[0]
    (warning,) = [w for w in outcome.warnings if "malformed" in w]
    first = G2_API.count("\n") + 50 + 1
    listed = ", ".join(str(first + i) for i in range(10))
    assert (
        f"lines {listed} and 490 more: malformed rows skipped (wrong number of fields: too few)"
        in warning
    )


def test_run_summary_is_a_table_with_notes_grouped_across_ranks(tmp_path: Path) -> None:
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
    result = CliRunner().invoke(main, ["run", str(sample), "--out", str(tmp_path / "o"), "-j", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "session", "status"]
    )
    assert [line.split()[0] for line in lines[header + 1 : header + 3]] == ["0", "1"]
    assert lines[header + 1].split()[2:5] == ["ingested", "g2", "Level1"]
    grouped = [line for line in lines if line.strip().startswith("ranks 0, 1: not collected")]
    assert len(grouped) == 1 and "l2_cache.csv" in grouped[0]
    # what the whole generation never writes is in ingest.json, and said once only with -v
    assert not [line for line in lines if "task_time.csv" in line]
    note = "G2 exports never write task_time.csv (tables from them are empty)"
    doc = json.loads((tmp_path / "o" / "ingest.json").read_text())
    assert doc["notes"] == [note]
    verbose = CliRunner().invoke(main, ["run", str(sample), "--out", str(tmp_path / "o"), "-v"])
    assert [line for line in verbose.output.splitlines() if "task_time.csv" in line] == [
        f"  {note}"
    ]
    assert all(s["not_in_generation"] == ["task_time.csv"] for s in doc["sessions"])
    assert all("task_time" not in " ".join(s["not_collected"]) for s in doc["sessions"])


def test_only_pids_whose_events_go_unnamed_are_warned_of(tmp_path: Path) -> None:
    """A Level0 export's CANN layer has labels and thread names but no process_name, and only
    starts HostToDevice flows (the real Level0 export): nothing the rules read goes unnamed, so
    nothing is said. Slices of a pid with no metadata at all are named 'pid <n>' and said."""
    full = json.loads(_g2_trace())
    cann_meta = [e for e in full if e["ph"] == "M" and e["pid"] == CANN_PID]
    level0 = [e for e in full if e["pid"] != CANN_PID]
    level0 += [e for e in cann_meta if e["name"] != "process_name"]
    flow = {"ph": "s", "name": "HostToDevice9", "cat": "HostToDevice", "id": "9"}
    level0.append({**flow, "pid": CANN_PID, "tid": 77, "ts": f"{T0}.300"})
    stray = _x("orphan", 4242, 1, f"{T0}.400", 1.0)
    for name, events, said in (("quiet", level0, False), ("stray", [*level0, stray], True)):
        root = tmp_path / name
        _write_rank(root, "r_ascend_pt", _info(0), {"trace_view.json": json.dumps(events)})
        result = ingest(root, tmp_path / f"{name}-out")
        warned = [w for w in result.outcomes[0].warnings if "no process_name" in w]
        assert bool(warned) is said, warned
        if said:
            assert warned[0].startswith("1 pids with events")
            slices = Store.open(tmp_path / f"{name}-out").table("slices").collect()
            assert "pid 4242" in set(slices["process"])
