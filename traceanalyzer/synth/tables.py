"""The CSV summary files, written row by row or aggregated in constant memory.

Each writer mirrors one producer: ``kernel_details.csv``, ``operator_details.csv``
and ``step_trace_time.csv`` come from torch_npu's Python ``csv.writer`` (CRLF
rows, except operator_details which the real export has with LF);
``api_statistic.csv`` and ``op_statistic.csv`` are msprof summaries copied
verbatim (LF). Headers per generation and level follow the format reference §2.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from traceanalyzer.synth.fmt import csv_ts, r3
from traceanalyzer.synth.profiles import (
    G1_METRIC_COLUMNS,
    PIPE_UTILIZATION_COLUMNS,
    SHAPE_COLUMNS,
    Generation,
)

# task_time.csv (msprof's task_time_*.csv; current torch_npu exports only).
TASK_TIME_HEADER = [
    "Device_id",
    "kernel_name",
    "kernel_type",
    "stream_id",
    "task_id",
    "task_time(us)",
    "task_start(us)",
    "task_stop(us)",
]
OPERATOR_DETAILS_HEADER = [
    "Name",
    "Input Shapes",
    "Call Stack",
    "Host Self Duration(us)",
    "Host Total Duration(us)",
    "Device Self Duration(us)",
    "Device Total Duration(us)",
    "Device Self Duration With AICore(us)",
    "Device Total Duration With AICore(us)",
]


def kernel_details_header(gen: Generation, level: int, with_step: bool) -> list[str]:
    head = ["Step Id"] if with_step else []
    if gen.device_id_column:
        head.append("Device_id")
    if level == 0:
        return head + [
            "Name",
            "Type",
            "Accelerator Core",
            "Start Time(us)",
            "Duration(us)",
            "Wait Time(us)",
            gen.block_dim,
        ]
    head += ["Model ID", "Task ID", "Stream ID", "Name", "Type"]
    if gen.has_op_state:
        head.append("OP State")
    head += [
        "Accelerator Core",
        "Start Time(us)",
        "Duration(us)",
        "Wait Time(us)",
        gen.block_dim,
        gen.mix_block_dim,
    ]
    if gen.has_op_state:
        head.append("HF32 Eligible")
    head += [*SHAPE_COLUMNS, "Context ID"]
    head += list(PIPE_UTILIZATION_COLUMNS if gen.has_op_state else G1_METRIC_COLUMNS)
    return head


def api_statistic_header(gen: Generation) -> list[str]:
    head = ["Level", "API Name", "Time(us)", "Count", "Avg(us)", "Min(us)", "Max(us)", "Variance"]
    return (["Device_id"] if gen.device_id_column else []) + head


def op_statistic_header(gen: Generation) -> list[str]:
    head = [
        "OP Type",
        "Core Type",
        "Count",
        "Total Time(us)",
        "Min Time(us)",
        "Avg Time(us)",
        "Max Time(us)",
        "Ratio(%)",
    ]
    return (["Device_id"] if gen.device_id_column else []) + head


def step_trace_header(gen: Generation) -> list[str]:
    head = [
        "Step",
        "Computing",
        "Communication(Not Overlapped)",
        "Overlapped",
        "Communication",
        "Free",
        "Stage",
        "Bubble",
        "Communication(Not Overlapped and Exclude Receive)",
    ]
    if gen.step_preparing_column:
        head.append("Preparing")
    return (["Device_id"] if gen.device_id_column else []) + head


class CsvFile:
    """A streamed CSV file with a fixed line terminator (``\\r\\n`` or ``\\n``)."""

    def __init__(self, path: Path, header: list[str], crlf: bool) -> None:
        self._fh: IO[str] = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115 - streamed, closed in close()
        self._writer = csv.writer(self._fh, lineterminator="\r\n" if crlf else "\n")
        self._writer.writerow(header)

    def row(self, values: list[object]) -> None:
        self._writer.writerow(values)

    def close(self) -> None:
        self._fh.close()


@dataclass
class Agg:
    """Running count/sum/sum-of-squares/min/max of durations in ns (exact ints)."""

    count: int = 0
    total: int = 0
    sq: int = 0
    lo: int = 0
    hi: int = 0

    def add(self, ns: int) -> None:
        if self.count == 0 or ns < self.lo:
            self.lo = ns
        if self.count == 0 or ns > self.hi:
            self.hi = ns
        self.count += 1
        self.total += ns
        self.sq += ns * ns

    @property
    def variance_us2(self) -> float:
        """Population variance in µs² (msprof api_statistic ``Variance``)."""
        mean = self.total / self.count
        return (self.sq / self.count - mean * mean) / 1e6


class _Statistic:
    """Durations aggregated per key (an msprof summary's rows)."""

    def __init__(self) -> None:
        self.aggs: dict[tuple[str, str], Agg] = {}

    def add(self, first: str, second: str, dur: int) -> None:
        key = (first, second)
        agg = self.aggs.get(key)
        if agg is None:
            agg = self.aggs[key] = Agg()
        agg.add(dur)


class ApiStatistic(_Statistic):
    """api_statistic.csv: CANN events aggregated per (level, API name), sorted by API name."""

    def write(self, path: Path, gen: Generation) -> None:
        f = CsvFile(path, api_statistic_header(gen), crlf=False)
        for (level, api), a in sorted(self.aggs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            row: list[object] = ["host"] if gen.device_id_column else []
            row += [
                level,
                api,
                r3(a.total / 1000),
                a.count,
                r3(a.total / a.count / 1000),
                r3(a.lo / 1000),
                r3(a.hi / 1000),
                r3(max(a.variance_us2, 0.0)),
            ]
            f.row(row)
        f.close()


class OpStatistic(_Statistic):
    """op_statistic.csv: kernels aggregated per (OP Type, Core Type), sorted by total time desc."""

    def write(self, path: Path, gen: Generation, device: int) -> None:
        f = CsvFile(path, op_statistic_header(gen), crlf=False)
        grand = sum(a.total for a in self.aggs.values()) or 1
        for (op_type, core), a in sorted(self.aggs.items(), key=lambda kv: (-kv[1].total, kv[0])):
            row: list[object] = [device] if gen.device_id_column else []
            row += [
                op_type,
                core,
                a.count,
                r3(a.total / 1000),
                r3(a.lo / 1000),
                r3(a.total / a.count / 1000),
                r3(a.hi / 1000),
                r3(a.total * 100 / grand),
            ]
            f.row(row)
        f.close()


@dataclass
class StepTotals:
    """Overlap Analysis sums of one step, in ns."""

    step: str
    start: int
    end: int
    computing: int = 0
    communication: int = 0
    not_overlapped: int = 0
    free: int = 0
    first_device: int | None = None


def step_trace_rows(gen: Generation, device: int, steps: list[StepTotals]) -> list[list[object]]:
    """step_trace_time.csv's rows as torch_npu's TraceStepTimeParser computes them (µs, unrounded)."""
    dev_col = device if gen.npu_label_with_device else -1
    rows = []
    for s in steps:
        comm = s.communication / 1000
        not_ov = s.not_overlapped / 1000
        row: list[object] = [dev_col] if gen.device_id_column else []
        row += [
            s.step,
            s.computing / 1000,
            not_ov,
            comm - not_ov,
            comm,
            s.free / 1000,
            (s.end - s.start) / 1000,
            0,
            not_ov,
        ]
        if gen.step_preparing_column:
            first = s.first_device if s.first_device is not None else s.start
            row.append(max(first - s.start, 0) / 1000)
        rows.append(row)
    return rows


def write_step_trace(path: Path, gen: Generation, rows: list[list[object]]) -> None:
    """step_trace_time.csv (CRLF, from torch_npu's csv.writer)."""
    f = CsvFile(path, step_trace_header(gen), crlf=True)
    for row in rows:
        f.row(row)
    f.close()


# The PipeUtilization pipes of a busy core: (share of its busy time, ratio) of the AIC's mac,
# scalar, mte1, mte2 and fixpipe, and of the AIV's vec, scalar, mte2 and mte3.
_AIC_PIPES = ((0.5, 0.52), (0.7, 0.73), (0.8, 0.85), (0.9, 0.91), (0.1, 0.08))
_AIV_PIPES = ((0.2, 0.186), (0.1, 0.087), (0.55, 0.552), (0.65, 0.667))


def _busy(busy: float, cycles: int, pipes: tuple[tuple[float, float], ...]) -> list[object]:
    return [busy, cycles, *(v for share, ratio in pipes for v in (r3(busy * share), ratio))]


def kernel_row_tail(gen: Generation, core: str, dur_ns: int) -> list[object]:
    """Plausible PipeUtilization counters for a kernel (N/A for non-AI tasks, as msprof prints)."""
    n = len(PIPE_UTILIZATION_COLUMNS if gen.has_op_state else G1_METRIC_COLUMNS)
    if core not in ("AI_CORE", "AI_VECTOR_CORE", "MIX_AIC", "MIX_AIV"):
        return ["N/A"] * n
    busy = r3(dur_ns / 1000 * 0.95)
    cycles = dur_ns * 18 // 10
    if not gen.has_op_state:
        return [busy, cycles] + [0.0] * (n - 2)
    # each core: time, cycles, pipes, icache miss rate; then the cube utilization (%)
    if core in ("AI_CORE", "MIX_AIC"):  # the AIV idle
        return [*_busy(busy, cycles, _AIC_PIPES), 0.001, 0.0, 0, *[0.0] * 8, 0.023, 66.3]
    return [0.0, 0, *[0.0] * 11, *_busy(busy, cycles, _AIV_PIPES), 0.023, 0]  # the AIC idle


__all__ = [
    "OPERATOR_DETAILS_HEADER",
    "Agg",
    "ApiStatistic",
    "CsvFile",
    "OpStatistic",
    "StepTotals",
    "api_statistic_header",
    "kernel_details_header",
    "kernel_row_tail",
    "op_statistic_header",
    "step_trace_header",
    "step_trace_rows",
    "write_step_trace",
]


# npu_module_mem.csv: reserved MB per CANN component, as in the real G2 export (the other
# components it lists stay at 0.0; a few stand in for them).
MODULE_RESERVED_MB = {
    "SLOG": 0.0,
    "APP": 1452.0,
    "GE": 76.0,
    "HCCL": 404.0625,
    "RUNTIME": 92.1875,
    "AICPU": 0.0,
    "DRV": 0.0,
    "TS": 0.0,
}
MODULE_MEM_PERIOD_NS = 20_000_000  # msprof samples it about every 20 ms


def module_mem_samples(
    start_ns: int,
    end_ns: int,
    held: Callable[[int], tuple[int, int, int]] | None = None,
) -> list[tuple[str, int, float]]:
    """npu_module_mem.csv's samples, component by component: (component, ts ns, reserved MB).
    ``held``: the device memory model's (PTA reserved, GE reserved, outside both) bytes at a
    time, which the APP, GE and HCCL modules then follow (the runtime keeps its own)."""
    times = [*range(start_ns, end_ns, MODULE_MEM_PERIOD_NS), end_ns]
    if held is None:
        return [(c, ts, mb) for c, mb in MODULE_RESERVED_MB.items() for ts in times]
    runtime = MODULE_RESERVED_MB["RUNTIME"]
    out = []
    for component, mb in MODULE_RESERVED_MB.items():
        for ts in times:
            pta, ge, outside = (b / (1 << 20) for b in held(ts))
            level = {"APP": pta, "GE": ge, "HCCL": outside - runtime}.get(component, mb)
            out.append((component, ts, level))
    return out


def write_module_mem(
    path: Path, gen: Generation, device: int, samples: list[tuple[str, int, float]]
) -> None:
    """npu_module_mem.csv: an msprof summary copied verbatim (LF)."""
    lead = ["Device_id"] if gen.device_id_column else []
    f = CsvFile(path, [*lead, "Component", "Timestamp(us)", "Total Reserved(MB)", "Device"], False)
    for component, ts, reserved in samples:
        f.row([*([device] if lead else []), component, csv_ts(ts), reserved, f"NPU:{device}"])
    f.close()
