"""The verbs both fixture builders speak, defined once: ``span``, ``step``, ``api``, ``replay``,
``task``, ``kernel``, ``compute_task``, ``event_wait``, ``memcpy_async``, ``counter`` and
``memory``.

:class:`FixtureVerbs` holds each verb's signature, defaults, documentation and argument checks
(times are exact int ns, ``us()`` writes microseconds; :class:`Launch` is a task's host launch),
and hands what it checked to its builder as one fact (:class:`Span`, :class:`ApiCall`,
:class:`Task`, ...). The builders differ only in how a fact lands:

- :class:`~traceanalyzer.kit.testing.store_builder.StoreBuilder` lands it as canonical store
  rows, in memory; its verbs take the ``rank`` and ``session`` the rows belong to first
  (:func:`~traceanalyzer.kit.testing.store_builder.per_session`);
- :class:`~traceanalyzer.kit.testing.rank_builder.RankBuilder` lands it as the events of a Text
  export (one rank's session), which ingest then reads.

A keyword that only one side can write (an API call's ``connection_id`` in the store, a task's
HW ``args`` in the files, ...) is refused by the other by name (:meth:`FixtureVerbs._cannot`).
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal, NoReturn, TypeVar

DEFAULT_KERNEL = "aclnnMm_MatMulCommon_MatMulV2"


def us(value: float | str) -> int:
    """Microseconds as written to exact integer nanoseconds: ``us(1100.5) == 1_100_500``,
    ``us("0.0005") == 1`` (half a ns rounds up). A float counts as its shortest repr, so
    ``us(0.1)`` is 100 ns, not the binary float times 1000."""
    if isinstance(value, bool):
        raise TypeError(f"not a time: {value!r}")
    ns = Decimal(repr(value) if isinstance(value, float) else value) * 1000
    return int(ns.to_integral_value(ROUND_HALF_UP))


def exact_ns(value: Any, name: str) -> int:
    """``value`` as int ns; a float is refused, as it would not be exact (use :func:`us`)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be int nanoseconds, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be int nanoseconds, not {type(value).__name__} {value!r} "
            "(write us(...) for microseconds)"
        ) from None


def exact_times(start_ns: Any, dur_ns: Any, prefix: str = "") -> tuple[int, int]:
    """A start and a duration as int ns (:func:`exact_ns`; ``prefix`` names them in errors)."""
    return exact_ns(start_ns, f"{prefix}start_ns"), exact_ns(dur_ns, f"{prefix}dur_ns")


def copy_task_type(direction: str) -> str:
    """The device task type of an async copy: SDMA on the device, PCIe DMA to or from the host."""
    return "SDMA_SQE" if direction == "device to device" else "PCIE_DMA_SQE"


def split_api_name(name: str) -> tuple[str, str]:
    """``"aclrtMemcpy"`` (AscendCL) or ``"Layer@api"`` -> (layer, api)."""
    layer, _, api = name.rpartition("@")
    return layer or "AscendCL", api


@dataclass(frozen=True)
class Launch:
    """The host launch of a device task (``task(..., launch=Launch(us(150)))``): ``AscendCL@<api>``
    from ``start_ns`` for ``dur_ns`` around its ``Node@launch``, on ``thread`` (None: the
    builder's CANN thread), linked to the task by the launch's connection id on the task, a
    HostToDevice flow onto it, or both (``linked_by``; a Level1 export has both)."""

    start_ns: int
    dur_ns: int = 20_000
    api: str = "aclnnMm"
    thread: str | None = None
    linked_by: Literal["connection_id", "flow", "both"] = "both"

    def __post_init__(self) -> None:
        exact_times(self.start_ns, self.dur_ns, "Launch.")
        if self.linked_by not in ("connection_id", "flow", "both"):
            raise ValueError(
                f"linked_by must be connection_id, flow or both, not {self.linked_by!r}"
            )

    @property
    def node(self) -> tuple[int, int]:
        """Start and duration of the ``Node@launch`` inside the API call (where the flow leaves)."""
        return self.start_ns + self.dur_ns // 4, self.dur_ns // 2

    @property
    def by_connection_id(self) -> bool:
        return self.linked_by != "flow"

    @property
    def by_flow(self) -> bool:
        return self.linked_by != "connection_id"


# ---- the facts a verb hands to its builder: checked, times in int ns from the session start --
@dataclass(frozen=True)
class Span:
    name: str
    start_ns: int
    dur_ns: int
    thread: str | None  # None: the builder's main thread
    cat: str


@dataclass(frozen=True)
class Step:
    number: int
    start_ns: int
    dur_ns: int


@dataclass(frozen=True)
class ApiCall:
    layer: str  # "AscendCL", "Runtime", "Node", ...
    api: str
    start_ns: int
    dur_ns: int
    thread: str | None  # None: the builder's CANN thread
    connection_id: int | None
    mode: str | None


@dataclass(frozen=True)
class Task:
    name: str
    stream: int
    start_ns: int
    dur_ns: int
    task_type: str
    model_id: int | None = None
    connection_id: int | None = None
    args: dict[str, Any] | None = None
    launch: Launch | None = None


@dataclass(frozen=True)
class Kernel:
    name: str
    stream: int
    start_ns: int
    dur_ns: int
    op_type: str
    core: str
    input_shapes: str | None
    input_data_types: str | None
    model_id: int | None
    launch: Launch | None


@dataclass(frozen=True)
class MemcpyAsync:
    stream: int
    start_ns: int  # the aclrtMemcpyAsync call
    dur_ns: int
    task_start_ns: int  # its copy task
    task_dur_ns: int
    size: int
    direction: str
    thread: str | None  # None: the builder's CANN thread

    @property
    def task_type(self) -> str:
        return copy_task_type(self.direction)


@dataclass(frozen=True)
class CounterSample:
    name: str
    ts_ns: int
    value: float
    process: str | None  # None: the counter's name
    series: str


@dataclass(frozen=True)
class MemoryRecord:
    component: str
    ts_ns: int
    allocated_mb: float | None  # None for APP: the process's memory is reserved only
    reserved_mb: float


MEMORY_COMPONENTS = ("PTA", "GE", "PTA+GE", "APP")  # memory_record.csv's components

V = TypeVar("V", bound="FixtureVerbs")


class FixtureVerbs(ABC):
    """The builder verbs, once: each checks its arguments and lands one fact (``_land_*``)."""

    # ---- framework ------------------------------------------------------------------------
    def span(
        self: V,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str | None = None,
        cat: str = "cpu_op",
    ) -> V:
        """A Python-side span: a torch op (``cpu_op``), a ``python_function`` or an mstx range
        (``cat``; the files write torch ops) on ``thread`` (None: the main thread)."""
        self._land_span(Span(name, *exact_times(start_ns, dur_ns), thread, cat))
        return self

    def step(self: V, number: int, *, start_ns: int, dur_ns: int) -> V:
        """A ``ProfilerStep#<number>`` window on the main thread (in the files also the Step Id
        column and a step_trace_time row)."""
        self._land_step(Step(number, *exact_times(start_ns, dur_ns)))
        return self

    # ---- CANN -----------------------------------------------------------------------------
    def api(
        self: V,
        name: str,
        *,
        start_ns: int,
        dur_ns: int,
        thread: str | None = None,
        connection_id: int | None = None,
        mode: str | None = None,
    ) -> V:
        """A host CANN API call: ``aclrtMemcpy`` (AscendCL) or ``Layer@api``
        (``Runtime@MemCopySync``) on ``thread`` (None: the CANN thread). ``connection_id``
        (the store only; the files number their calls) links it to a task by hand; ``mode`` is
        its CANN ``Mode`` arg (the files write ``ACL_RTS``, or the API for a Runtime call)."""
        layer, api = split_api_name(name)
        start, dur = exact_times(start_ns, dur_ns)
        self._land_api(ApiCall(layer, api, start, dur, thread, connection_id, mode))
        return self

    def replay(self: V, *, start_ns: int, dur_ns: int = 30_000, thread: str | None = None) -> V:
        """``AscendCL@aclmdlRIExecuteAsync``: one graph replay (its tasks carry a ``model_id``)
        on ``thread`` (None: the CANN thread)."""
        return self.api("aclmdlRIExecuteAsync", start_ns=start_ns, dur_ns=dur_ns, thread=thread)

    # ---- device ---------------------------------------------------------------------------
    def task(
        self: V,
        name: str,
        *,
        stream: int,
        start_ns: int,
        dur_ns: int,
        task_type: str | None = None,
        model_id: int | None = None,
        connection_id: int | None = None,
        args: dict[str, Any] | None = None,
        launch: Launch | None = None,
    ) -> V:
        """A device task without op info (waits, copies, records) on ``Ascend Hardware`` stream
        ``stream``: ``task_type`` defaults to the name, ``model_id`` marks a task of a captured
        graph (see :meth:`replay`). ``connection_id`` (the store only) links it to a host call
        by hand; ``args`` (the files only) go into the HW event (``{"data size(Byte)": 4096}``).

        ``launch`` adds its host launch (:class:`Launch`) instead of a ``connection_id``.
        """
        if launch is not None and connection_id is not None:
            raise ValueError("a task takes a connection_id or a launch, not both")
        start, dur = exact_times(start_ns, dur_ns)
        self._land_task(
            Task(name, stream, start, dur, task_type or name, model_id, connection_id, args, launch)
        )
        return self

    def kernel(
        self: V,
        name: str = DEFAULT_KERNEL,
        *,
        stream: int = 2,
        start_ns: int,
        dur_ns: int,
        op_type: str = "MatMulV2",
        core: str = "AI_CORE",
        input_shapes: str | None = None,
        input_data_types: str | None = None,
        model_id: int | None = None,
        launch: Launch | None = None,
    ) -> V:
        """A kernel: its device task on ``Ascend Hardware`` stream ``stream`` (task type
        ``core``) with its kernel_details row (and, in the files, an op_statistic entry).
        Without ``input_shapes`` / ``input_data_types`` the store leaves them empty and the
        files write ``1,4096`` / ``DT_BF16``. ``model_id`` marks a kernel of a captured graph
        (see :meth:`replay`).

        ``launch`` adds its host launch (:class:`Launch`): ``AscendCL@<api>`` around
        ``Node@launch``, linked to the kernel by connection id, HostToDevice flow or both.
        """
        start, dur = exact_times(start_ns, dur_ns)
        shapes = (input_shapes, input_data_types)
        kernel = Kernel(name, stream, start, dur, op_type, core, *shapes, model_id, launch)
        self._land_kernel(kernel)
        return self

    def compute_task(
        self: V,
        name: str = DEFAULT_KERNEL,
        *,
        stream: int = 2,
        start_ns: int,
        dur_ns: int,
        core: str = "AI_CORE",
        model_id: int | None = None,
        connection_id: int | None = None,
        launch: Launch | None = None,
    ) -> V:
        """A compute task alone (task type ``core``) on ``Ascend Hardware`` stream ``stream``:
        a :meth:`kernel` without its kernel_details row, as a Level0 export, or a fixture whose
        rule reads no op info, has it. The other keywords are :meth:`task`'s."""
        return self.task(
            name,
            stream=stream,
            start_ns=start_ns,
            dur_ns=dur_ns,
            task_type=core,
            model_id=model_id,
            connection_id=connection_id,
            launch=launch,
        )

    def event_wait(self: V, *, stream: int, start_ns: int, dur_ns: int) -> V:
        """``EVENT_WAIT`` (task type ``EVENT_WAIT_SQE``): ``stream`` waits for an event another
        stream records (``aclrtStreamWaitEvent``)."""
        return self.task(
            "EVENT_WAIT",
            stream=stream,
            start_ns=start_ns,
            dur_ns=dur_ns,
            task_type="EVENT_WAIT_SQE",
        )

    def memcpy_async(
        self: V,
        *,
        stream: int,
        start_ns: int,
        task_start_ns: int,
        task_dur_ns: int,
        dur_ns: int = 12_000,
        size: int = 1 << 20,
        direction: str = "host to device",
        thread: str | None = None,
    ) -> V:
        """``aclrtMemcpyAsync`` (at ``start_ns`` on ``thread``, None: the CANN thread) linked by
        a HostToDevice flow to its MEMCPY_ASYNC copy task on ``stream`` (at ``task_start_ns``;
        SDMA ``device to device``, else PCIe DMA) of ``size`` bytes."""
        call = exact_times(start_ns, dur_ns)
        task = exact_times(task_start_ns, task_dur_ns, "task_")
        self._land_memcpy_async(MemcpyAsync(stream, *call, *task, size, direction, thread))
        return self

    def counter(
        self: V,
        name: str,
        *,
        ts_ns: int,
        value: float,
        process: str | None = None,
        series: str = "MHz",
    ) -> V:
        """One counter sample (``AI Core Freq`` in MHz by default), held until the next one; the
        files write the ``AI Core Freq`` counter only. ``process`` defaults to the name."""
        self._land_counter(CounterSample(name, exact_ns(ts_ns, "ts_ns"), value, process, series))
        return self

    def memory(
        self: V,
        component: str,
        *,
        ts_ns: int,
        reserved_mb: float,
        allocated_mb: float | None = None,
    ) -> V:
        """One memory_record.csv row (``profile_memory=True``): ``component``'s totals after an
        allocator event, in MB of 2^20 bytes: ``PTA`` (torch's caching allocator), ``GE``,
        ``PTA+GE`` with ``allocated_mb`` and ``reserved_mb``; ``APP`` (the process's device
        memory, as msprof samples it) with ``reserved_mb`` only."""
        if component not in MEMORY_COMPONENTS:
            raise ValueError(f"component must be one of {', '.join(MEMORY_COMPONENTS)}")
        if (component == "APP") != (allocated_mb is None):
            raise ValueError("APP records reserved_mb only; PTA, GE and PTA+GE allocated_mb too")
        ts = exact_ns(ts_ns, "ts_ns")
        self._land_memory(MemoryRecord(component, ts, allocated_mb, reserved_mb))
        return self

    # ---- how a fact lands: the one thing the builders do differently --------------------
    @abstractmethod
    def _land_span(self, span: Span) -> None: ...

    @abstractmethod
    def _land_step(self, step: Step) -> None: ...

    @abstractmethod
    def _land_api(self, call: ApiCall) -> None: ...

    @abstractmethod
    def _land_task(self, task: Task) -> None: ...

    @abstractmethod
    def _land_kernel(self, kernel: Kernel) -> None: ...

    @abstractmethod
    def _land_memcpy_async(self, copy: MemcpyAsync) -> None: ...

    @abstractmethod
    def _land_counter(self, sample: CounterSample) -> None: ...

    @abstractmethod
    def _land_memory(self, record: MemoryRecord) -> None: ...

    def _cannot(self, verb: str, keyword: str, value: Any, why: str) -> NoReturn:
        """Refuse a keyword this builder cannot write (the other builder can)."""
        raise ValueError(f"{self._builder_name()}.{verb} cannot write {keyword}={value!r}: {why}")

    def _builder_name(self) -> str:
        return type(self).__name__


VERBS = tuple(name for name in vars(FixtureVerbs) if not name.startswith("_"))  # its public methods
