"""What ``diff``'s explanation reads of one run's store, each per phase of its iterations.

Nothing is derived twice: the iterations and their breakdown are the overview's
(``summary_steps``), the device tasks and their class the overview's (``device_tasks``), the
phase of a task or a host call the phase of the iteration it starts in (``window_of``, as the
overview's top tables place them). Never a trace file: only the store ``run`` wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceanalyzer.derived.phases import IDLE_PHASE, UNKNOWN_PHASE
from traceanalyzer.intervals import window_of
from traceanalyzer.overview.compute import device_tasks
from traceanalyzer.overview.tops import CANN_CALL, PYTHON_OP_CATEGORY, TORCH_OP, collective_kind
from traceanalyzer.step_components import COMPONENT_NAMES
from traceanalyzer.store import Store, StoreError

PYTHON_FUNCTION_CATEGORY = "python_function"  # the Python tracer's spans
# what a Python tracer span's name says of one process only: the line of its file
# (`runner.py(1838): execute_model`, which another version moves) and an object's address
# (`<built-in method format of str object at 0xfffcc49e9d50>`)
PER_PROCESS_NAME = r"\(\d+\)| at 0x[0-9a-fA-F]+"
# what places a kernel in the model, where the store has it: the derived table of each
# kernel's decoder layer and module, else the columns of kernel_details' table
LAYERS_TABLE = "kernel_layers"
MODULE_COLUMNS = ("module", "layer")
# the capture size a step's graph replay ran at, where the steps have it
GRAPH_SIZE = "graph_size"
KEYS = ["rank", "session"]
# what reading a store can raise: none (StoreError), a damaged Parquet file, an unreadable one
UNREADABLE = (StoreError, pl.exceptions.PolarsError, OSError)
TASK_KEYS = [*KEYS, "stream_id", "start_ns"]


@dataclass(frozen=True)
class RunTables:
    """One run's iterations (``steps``: summary_steps rows but idle gaps, with ``phase``), its
    device tasks that start in them (``tasks``: name, ``cls``, model_id, phase, graph, op type,
    input shape, and the module columns the store has), and its host calls per phase
    (``host``: phase, kind, name, api_name, calls, total_ns)."""

    steps: pl.DataFrame
    tasks: pl.DataFrame
    host: pl.DataFrame
    modules: tuple[str, ...] = ()  # the columns of ``tasks`` that place a kernel in the model


def read_run(out_dir: Path) -> RunTables:
    """The tables of ``out_dir``'s store (:class:`~traceanalyzer.store.StoreError` when there
    is none)."""
    store = Store.open(out_dir)
    summary = store.table("summary_steps")
    graph_size = [GRAPH_SIZE] if GRAPH_SIZE in summary.collect_schema().names() else []
    steps = (
        summary.filter(pl.col("phase").fill_null(UNKNOWN_PHASE) != IDLE_PHASE)
        .select(*KEYS, "step", "start_ns", "end_ns", "step_ns", *COMPONENT_NAMES,
                pl.col("phase").fill_null(UNKNOWN_PHASE), "graph", *graph_size)
        .collect()
    )  # fmt: skip
    ranks = steps["rank"].unique().to_list()
    windows = steps.select(*KEYS, "start_ns", "end_ns", "phase", "graph")
    tasks, modules = _tasks(store, ranks, windows)
    return RunTables(steps, tasks, _host(store, ranks, windows), modules)


def _tasks(
    store: Store, ranks: list[int], windows: pl.DataFrame
) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """The device tasks in the iterations, and the columns that place them in the model."""
    tasks = device_tasks(store, ranks).select(
        *TASK_KEYS, "dur_ns", "name", "cls", "model_id", "task_type"
    )
    placed = window_of(tasks, windows, keep=["phase", "graph"]).filter(
        pl.col("phase").is_not_null()
    )
    # the op type and input shape of each kernel: kernel_details' row of the task that starts
    # at that instant on that stream (as the overview finds its accelerator)
    kernels = store.table("kernels").filter(pl.col("rank").is_in(ranks))
    in_kernels = [c for c in MODULE_COLUMNS if c in kernels.collect_schema().names()]
    listed = (
        kernels.select(*TASK_KEYS, pl.col("type").alias("op_type"),
                       pl.col("input_shapes").alias("shape"), *in_kernels)
        .unique(TASK_KEYS, keep="first")
        .collect()
    )  # fmt: skip
    placed = placed.join(listed, on=TASK_KEYS, how="left")
    modules: tuple[str, ...] = tuple(in_kernels)
    if LAYERS_TABLE in store.table_names and not in_kernels:
        layers = store.table(LAYERS_TABLE).filter(pl.col("rank").is_in(ranks))
        modules = tuple(c for c in MODULE_COLUMNS if c in layers.collect_schema().names())
        placed = placed.join(
            layers.select(*TASK_KEYS, *modules).unique(TASK_KEYS, keep="first").collect(),
            on=TASK_KEYS,
            how="left",
        )
    return placed.with_columns(
        pl.when(pl.col("cls") == "comm")
        .then(collective_kind("name"))
        .otherwise(pl.col("name"))
        .alias("name")
    ), modules


def _host(store: Store, ranks: list[int], windows: pl.DataFrame) -> pl.DataFrame:
    """CANN calls (kind ``CANN``), torch ops (``op``) and Python tracer spans (``Python``)
    per phase: calls and total time."""
    calls = (
        store.table("slices")
        .filter(
            pl.col("rank").is_in(ranks)
            & (CANN_CALL | TORCH_OP | (pl.col("cat") == PYTHON_FUNCTION_CATEGORY))
        )
        .select(
            *KEYS,
            "start_ns",
            "dur_ns",
            "api_name",
            pl.when(CANN_CALL)
            .then(pl.lit("CANN"))
            .when(pl.col("cat") == PYTHON_OP_CATEGORY)
            .then(pl.lit("op"))
            .otherwise(pl.lit("Python"))
            .alias("kind"),
            pl.col("name").str.replace_all(PER_PROCESS_NAME, ""),
        )
        .collect()
    )
    placed = window_of(calls, windows, keep=["phase"]).filter(pl.col("phase").is_not_null())
    return placed.group_by("phase", "kind", "name").agg(
        pl.col("api_name").first(),
        pl.len().alias("calls"),
        pl.col("dur_ns").sum().alias("total_ns"),
    )
