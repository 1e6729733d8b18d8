"""The components a step's wall time is split into (the overview's breakdown), declared once.

Each component is a column of ``summary_steps`` (ns; the components of a step sum to its wall
time) and a key of the mean step in findings.json's ``summary.overview``. The schema, the
breakdown, the headline, the reports' tables, colours and figures, and ``diff`` all read
:data:`COMPONENTS`: a component is added here, and every one of them shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE = "compute"  # the headline part of the compute components (and diff's kernels split it)
# where a component's time is without a device timeline (the export's own step breakdown alone)
_NO_TIMELINE = "no device timeline (trace_view.json)"
_NO_ACCELERATOR = (
    f"{_NO_TIMELINE} and no kernel in kernel_details.csv: the step's compute (from the export's "
    "step breakdown) is in compute: other"
)
_NO_DEVICE_IDLE = (
    f"{_NO_TIMELINE}: the export's step breakdown gives compute, communication and their "
    "overlap; copies and what the device waited on are in idle: other"
)


@dataclass(frozen=True, kw_only=True)
class Unmeasured:
    """Why a step's data may not measure a component, and where its time is then (the
    breakdown still sums to the step); how the data that tells it apart is collected, and the
    table that data fills (said from what the export collected: ``engine.advice``)."""

    why: str
    collect: str
    table: str


@dataclass(frozen=True, kw_only=True)
class Component:
    """One component of a step's wall time."""

    key: str  # its column (ns)
    label: str  # how the reports name it
    group: str  # compute, communication, device or idle: its family in the stacked bar
    doc: str  # its column's description (docs/schema.md)
    column: str  # the compact tables' column its time is summed into
    part: str  # the headline's part its time is summed into (diff's explanation splits by it)
    colour: str  # in the bars, the heat map and the timeline strip
    # the device tasks whose time it is (:mod:`traceanalyzer.overview.breakdown`'s classes; the
    # strip colours them as the component, diff names a change by them)
    task_class: str | None = None
    kind: str = "kernel"  # what diff's explanation calls a change of it
    lost: bool = False  # time the step loses: less is better (compute is neutral in diff)
    launch_idle: bool = False  # device idle a graph's launches leave (diff: a graph-mode change)
    unmeasured: Unmeasured | None = None  # why a step's data may not measure it
    no_timeline: str | None = None  # where its time is without a device timeline


# in the stacked bar's order, bottom to top
COMPONENTS: tuple[Component, ...] = (
    Component(
        key="compute_ai_core_ns", label="compute: AI Core", group="compute", column="compute",
        part=COMPUTE, colour="#1d4ed8", task_class="ai_core", no_timeline=_NO_ACCELERATOR,
        doc="Compute on AI Core (cube), not overlapped by communication.",
    ),
    Component(
        key="compute_ai_vector_ns", label="compute: AI Vector", group="compute",
        column="compute", part=COMPUTE, colour="#0891b2", task_class="ai_vector",
        no_timeline=_NO_ACCELERATOR, doc="Compute on AI Vector cores, not overlapped.",
        unmeasured=Unmeasured(
            why="no Accelerator Core from kernel_details.csv (absent, or N/A as a Level0 export "
            "writes it) and the trace's Task Type calls AI Vector kernels AI_CORE, so their "
            "compute is in AI Core",
            collect="profiler_level=Level1",
            table="kernels",
        ),
    ),
    Component(
        key="compute_mix_ns", label="compute: MIX", group="compute", column="compute",
        part=COMPUTE, colour="#0d9488", task_class="mix", no_timeline=_NO_ACCELERATOR,
        doc="Compute of MIX kernels (MIX_AIC / MIX_AIV), not overlapped.",
    ),
    Component(
        key="compute_ai_cpu_ns", label="compute: AI CPU", group="compute", column="compute",
        part=COMPUTE, colour="#65a30d", task_class="ai_cpu", no_timeline=_NO_ACCELERATOR,
        doc="Compute on AI CPU, not overlapped.",
    ),
    Component(
        key="compute_other_ns", label="compute: other", group="compute", column="compute",
        part=COMPUTE, colour="#93c5fd", task_class="compute_other",
        doc="Compute of other or unknown accelerators, not overlapped.",
    ),
    Component(
        key="overlapped_ns", label="compute + communication (overlapped)",
        group="communication", column="overlap", part=COMPUTE, colour="#a78bfa",
        doc="Compute and communication at the same time.",
    ),
    Component(
        key="comm_exposed_ns", label="communication, not overlapped", group="communication",
        column="comm", part="exposed communication", colour="#7c3aed", task_class="comm",
        kind="comm", lost=True,
        doc="Communication with no compute beside it (not overlapped).",
    ),
    Component(
        key="device_other_ns", label="memory copies, runtime tasks", group="device",
        column="copies", part="memory copies and runtime tasks", colour="#f59e0b",
        task_class="device_other", kind="copy", no_timeline=_NO_DEVICE_IDLE,
        doc="Only memory copies (SDMA, PCIe DMA) and runtime tasks run: no compute, no "
        "communication.",
    ),
    Component(
        key="idle_host_ns", label="idle: waiting on the host (launch-bound)", group="idle",
        column="idle host", part="the device waiting on the host", colour="#dc2626",
        kind="host", lost=True, launch_idle=True, no_timeline=_NO_DEVICE_IDLE,
        doc="Device idle, waiting on the host: the next task was launched after its stream ran "
        "dry (host-launch-bound's definition: longer than the dispatch latency, not a pause, "
        "not after a host synchronisation, not in a graph capture).",
    ),
    Component(
        key="idle_sync_ns", label="idle: after a host synchronisation", group="idle",
        column="idle sync", part="the device drained by host synchronisations",
        colour="#f43f5e", kind="sync", lost=True, launch_idle=True,
        no_timeline=_NO_DEVICE_IDLE,
        doc="Device idle after a host synchronisation: the host blocked in it while the stream "
        "drained, and launched the next task only after (sync-in-step's domain).",
        unmeasured=Unmeasured(
            why="no CANN API events, so the device's idle after a host synchronisation is in "
            "idle host",
            collect="profiler_level=Level1",
            table="slices",
        ),
    ),
    Component(
        key="idle_stream_ns", label="idle: waiting on another stream", group="idle",
        column="idle stream", part="streams waiting on other streams", colour="#f97316",
        task_class="wait", kind="idle", lost=True, no_timeline=_NO_DEVICE_IDLE,
        doc="Device idle in wait tasks (EVENT_WAIT, Notify Wait) on another stream's event.",
    ),
    Component(
        key="idle_other_ns", label="idle: other", group="idle", column="idle other",
        part="other device idle time", colour="#d1d5db", kind="idle", lost=True,
        launch_idle=True,
        doc="Device idle for any other reason (nothing ran, nothing waited).",
    ),
)  # fmt: skip
COMPONENT_NAMES: tuple[str, ...] = tuple(c.key for c in COMPONENTS)
BY_KEY: dict[str, Component] = {c.key: c for c in COMPONENTS}


def summed_by(attribute: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The components grouped by one of their attributes (``column``, ``part``): each value
    with its components' keys, in the order the values first appear."""
    groups: dict[str, list[str]] = {}
    for c in COMPONENTS:
        groups.setdefault(getattr(c, attribute), []).append(c.key)
    return tuple((name, tuple(keys)) for name, keys in groups.items())


# the compact tables' columns (terminal, report.md), and the headline's parts
COLUMNS = summed_by("column")
PARTS = summed_by("part")
