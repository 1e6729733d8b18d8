"""findings.json's ``summary.overview``, as typed values (``docs/overview.md``).

The overview's builders (:mod:`traceanalyzer.overview.document` and its sections) return these,
:func:`~traceanalyzer.json_shape.to_json` writes them into findings.json field by field, and the
reports, the terminal and ``diff`` read them back with :func:`read_overview`: an older
document's missing sections read as empty ones, and a damaged one's fields too, each named by
:func:`overview_problems` (for which ``report.documents.read_findings`` refuses the findings.json
of an output folder someone sent).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from traceanalyzer.json_shape import FLATTEN, from_json
from traceanalyzer.step_components import COMPONENT_NAMES

SCHEMA_VERSION = 1
STEP = "step_ns"  # the mean step's wall time, beside its components
MEAN_KEYS = (STEP, *COMPONENT_NAMES)
WHERE = "summary.overview"  # where findings.json keeps it

Means = dict[str, float]  # step_ns and every component (ns), of a mean step


class Run(NamedTuple):
    """A lane's windows of one phase, in a row (ns from the lane's origin)."""

    start_ns: int
    end_ns: int
    phase: str | None


# ---------------------------------------------------------------- the breakdown


@dataclass(frozen=True, kw_only=True)
class ComponentName:
    """A component as findings.json names it (:mod:`traceanalyzer.step_components`)."""

    key: str
    label: str
    group: str


@dataclass(frozen=True, kw_only=True)
class Unmeasured:
    """A component some ranks could not measure: those ranks, and why (where its time is)."""

    ranks: list[int]
    reason: str


@dataclass(frozen=True, kw_only=True)
class Source:
    """Which data the breakdown comes from, and how it compares with the export's own."""

    breakdown: list[str]
    reference: str
    checked_steps: int
    differing_steps: int
    differing_ranks: list[int]
    max_deviation: float | None
    component: str | None
    worst_rank: int | None
    tolerance: float
    agrees: bool | None  # None: nothing to check against


@dataclass(frozen=True, kw_only=True)
class RankRow:
    """One rank's steps, and its mean step (written as the row's own keys)."""

    rank: int
    steps: int
    total_ns: int
    window_ns: int | None  # None: a document before it (the steps' total stands for it)
    phase_ns: dict[str, int]
    sources: list[str]
    unmeasured: list[str]
    mean: Means = field(metadata={FLATTEN: MEAN_KEYS})

    @property
    def step_ns(self) -> float:
        return self.mean.get(STEP) or 0.0


@dataclass(frozen=True, kw_only=True)
class ClusterRow:
    """A rank of the cluster view (``summary_ranks``)."""

    rank: int
    steps: int
    step_ns: float
    compute_ns: float
    comm_wait_ns: float
    idle_ns: float
    top_kernel: str | None
    top_kernel_ns: int | None
    step_z: float | None
    outlier: bool


class Rect(NamedTuple):
    """A rectangle of the strip: tasks of one row and class merged (ns from the step's start)."""

    row: int  # an index into the rows
    cls: str  # the tasks' class (overview.breakdown)
    start_ns: int
    end_ns: int
    tasks: int
    busy_ns: int
    name: str  # the longest task's


@dataclass(frozen=True, kw_only=True)
class StepTimeline:
    rows: list[str]
    span_ns: int
    rects: list[Rect]


@dataclass(frozen=True, kw_only=True)
class Representative:
    """The step whose time is the median of all steps, and its device streams."""

    rank: int
    session: str
    step: int | None  # None: the whole window
    start_ns: int
    end_ns: int
    timeline: StepTimeline | None


# ---------------------------------------------------------------- top tables


@dataclass(frozen=True)
class TopSizes:
    """How many rows each top-N table keeps (``run --top-kernels/--top-apis/--top-collectives``)."""

    kernels: int = 20
    host_apis: int = 20
    collectives: int = 10


DEFAULT_TOP = TopSizes()


@dataclass(frozen=True, kw_only=True)
class TopKernel:
    name: str
    accelerator: str | None
    ranks: int
    count: int
    total_ns: int
    p95_ns: int | None
    mean_ns: float
    share: float | None


@dataclass(frozen=True, kw_only=True)
class TopHostApi:
    kind: str
    name: str
    ranks: int
    count: int
    total_ns: int
    p95_ns: int | None
    mean_ns: float
    share: float | None


@dataclass(frozen=True, kw_only=True)
class TopCollective:
    name: str
    source: str
    ranks: int
    count: int
    total_ns: int
    wait_ns: int | None
    transit_ns: int | None
    mean_ns: float


# ---------------------------------------------------------------- phases


@dataclass(frozen=True, kw_only=True)
class EpExchange:
    """A phase's expert-parallel exchange (an MoE model's)."""

    steps: int
    paths: dict[str, int]
    exchange_ns: float
    exposed_ns: float
    exposed_share: float | None
    step_share: float | None
    misfit_steps: int


@dataclass(frozen=True, kw_only=True)
class Graphs:
    """A phase's graph replays: capture sizes and real batches (value -> steps)."""

    steps: int
    capture_sizes: dict[str, int]
    batches: dict[str, int]
    padded_share: float | None


@dataclass(frozen=True, kw_only=True)
class CaptureNote:
    note: str
    ns: float


@dataclass(frozen=True, kw_only=True)
class SlowLayer:
    layer: int
    ns: float
    peers_ns: float


@dataclass(frozen=True, kw_only=True)
class Layers:
    """A phase's module and decoder-layer profile (per step)."""

    steps: int
    module_ns: dict[str, float]
    attribution_ns: dict[str, float]
    capture_notes: list[CaptureNote]
    layers: int
    layer_ns: list[float]
    moe_layers: list[int]
    slow_layers: list[SlowLayer]


@dataclass(frozen=True, kw_only=True)
class PhaseRow:
    phase: str
    steps: int
    ranks: int
    total_ns: int
    wall_share: float | None
    p50_ns: float
    p95_ns: float
    mean: Means
    unmeasured: list[str]
    headline: str | None
    tokens: int | None
    tokens_steps: int
    ns_per_token: float | None
    graph: dict[str, int]
    phase_source: dict[str, int]
    step_source: dict[str, int]
    reason: str | None
    ep: EpExchange | None
    graphs: Graphs | None
    layers: Layers | None
    top_kernels: list[TopKernel]
    top_host_apis: list[TopHostApi]


@dataclass(frozen=True, kw_only=True)
class PhaseLane:
    """A rank's phases over time, as runs of one phase."""

    rank: int
    span_ns: int
    runs: list[Run]


@dataclass(frozen=True, kw_only=True)
class Phases:
    rows: list[PhaseRow]
    known_share: float | None
    timeline: list[PhaseLane]


# ---------------------------------------------------------------- device memory


@dataclass(frozen=True, kw_only=True)
class Peaks:
    """A memory component's peaks over a rank's sessions (reserved at the allocated peak only
    where that peak is known)."""

    samples: int
    peak_allocated_mb: float | None
    peak_allocated_ns: int | None
    reserved_at_peak_allocated_mb: float | None
    peak_reserved_mb: float | None
    peak_reserved_ns: int | None

    def json_absent(self) -> Collection[str]:
        return ("reserved_at_peak_allocated_mb",) if self.peak_allocated_mb is None else ()


@dataclass(frozen=True, kw_only=True)
class OutsideModule:
    module: str
    peak_reserved_mb: float | None


@dataclass(frozen=True, kw_only=True)
class Unfreed:
    """Allocations never freed, of one name and source."""

    name: str
    count: int
    size_mb: float
    largest_mb: float
    alloc_ns: int
    source: str


@dataclass(frozen=True, kw_only=True)
class TokenBucket:
    up_to: int
    steps: int
    peak_mb: float
    activation_mb: float


@dataclass(frozen=True, kw_only=True)
class MemoryPhase:
    phase: str
    steps: int
    peak_mb: float
    p50_peak_mb: float
    activation_mb: float
    mb_per_1k_tokens: float | None
    by_tokens: list[TokenBucket]


@dataclass(frozen=True, kw_only=True)
class MemoryRank:
    rank: int
    sessions: int
    components: dict[str, Peaks]
    outside_torch_mb: float | None
    outside_modules: list[OutsideModule]
    in_use_mb: float | None
    capacity_mb: float | None
    headroom_mb: float | None
    static: list[Unfreed]
    phases: list[MemoryPhase]


class MemoryPoint(NamedTuple):
    """A slot of a memory line: its time from the rank's first record, its lowest and highest."""

    at_ns: int
    min_mb: float
    max_mb: float


@dataclass(frozen=True, kw_only=True)
class MemoryLane:
    """A drawn rank: each line's points, and its windows' runs on the same clock."""

    rank: int
    lines: dict[str, list[MemoryPoint]]
    runs: list[Run]


@dataclass(frozen=True, kw_only=True)
class Memory:
    """The device memory per rank; ``reason`` when the profile recorded none."""

    ranks: list[MemoryRank]
    reason: str | None
    capacity_mb: float | None
    capacity_reason: str | None
    timeline: list[MemoryLane]

    def json_absent(self) -> Collection[str]:
        return ("capacity_reason", "timeline") if self.reason is not None else ("reason",)


# ---------------------------------------------------------------- collectives


@dataclass(frozen=True, kw_only=True)
class PhaseCollectives:
    """A phase's collectives per step, and the split of their time."""

    phase: str
    collective_ns: float
    arrival_ns: float | None
    transfer_ns: float | None
    other_ns: float | None
    idle_ns: float | None
    export_idle_ns: float | None
    steps: int
    ranks: int
    source: str | None


@dataclass(frozen=True, kw_only=True)
class RankCollectives:
    """A rank's collectives per step, and the split of their time."""

    rank: int
    collective_ns: float
    arrival_ns: float | None
    transfer_ns: float | None
    other_ns: float | None
    idle_ns: float | None
    export_idle_ns: float | None
    steps: int
    source: str | None


@dataclass(frozen=True, kw_only=True)
class ExportIdle:
    """communication.json's Idle Time, and what the trace says it is."""

    idle_ns: int
    ops: int
    traced_idle_ns: int | None
    traced_arrival_ns: int | None
    peers: dict[str, int]
    outside: list[int]


@dataclass(frozen=True, kw_only=True)
class Root:
    rank: int
    iterations: int
    share: float
    wait_ns: float
    outside: bool


@dataclass(frozen=True, kw_only=True)
class CriticalPath:
    iterations: int
    balanced: int
    roots: list[Root]
    sequence: list[int | None]


@dataclass(frozen=True, kw_only=True)
class Collectives:
    phases: list[PhaseCollectives]
    ranks: list[RankCollectives]
    export_idle: ExportIdle | None
    critical_path: CriticalPath | None
    error: str | None = None  # the section failed (the rest of the overview stands)

    def json_absent(self) -> Collection[str]:
        if self.error is None:
            return ("error",)
        return ("phases", "ranks", "export_idle", "critical_path")


# ---------------------------------------------------------------- findings in the picture


@dataclass(frozen=True, kw_only=True)
class FindingCost:
    """A finding's cost in the overview's picture: the time, whose step time it is a share of,
    and of which phases' (``costs``, by fingerprint)."""

    cost_ns: float | None
    cost_share: float | None
    basis: str
    ranks: list[int]
    phases: list[str] | None = None
    phase_share: float | None = None
    unreliable_ranks: list[int] | None = None  # whose breakdown fails its self-check

    def json_absent(self) -> Collection[str]:
        absent = () if self.phases is not None else ("phases", "phase_share")
        return (*absent, *(() if self.unreliable_ranks else ("unreliable_ranks",)))


# ---------------------------------------------------------------- the whole


@dataclass(frozen=True, kw_only=True)
class Overview:
    """Where the time goes, over the whole run (``docs/overview.md``: the table, key by key)."""

    schema_version: int
    components: list[ComponentName]
    unmeasured: dict[str, Unmeasured]
    source: Source
    steps: int
    mean: Means | None
    headline: str | None
    computing_ns: float | None
    ranks: list[RankRow]
    cluster: list[ClusterRow]
    representative: Representative | None
    top_kernels: list[TopKernel]
    top_host_apis: list[TopHostApi]
    top_collectives: list[TopCollective]
    phases: Phases
    memory: Memory | None  # None: a document before it
    collectives: Collectives | None  # None: no collectives
    sizes: TopSizes
    failed: dict[str, str]  # rank -> why its summary could not be computed
    costs: dict[str, FindingCost]  # finding fingerprint -> its cost
    error: str | None = None  # the overview failed: nothing else is written

    def json_absent(self) -> Collection[str]:
        if self.error is None:
            return ("error",)
        return tuple(f for f in self.__dataclass_fields__ if f not in ("schema_version", "error"))

    @property
    def usable(self) -> bool:
        """Something to show: it did not fail, and some rank has steps."""
        return not self.error and bool(self.ranks)


def read_overview(value: Any) -> Overview:
    """A ``summary.overview`` value as typed values (what does not fit reads as empty)."""
    return from_json(Overview, value, WHERE)[0]


def overview_problems(value: Any) -> list[str]:
    """The fields of a ``summary.overview`` value that do not fit (``summary.overview.mean.
    step_ns: expected a number, got a string``)."""
    return from_json(Overview, value, WHERE)[1]


def overview_of(doc: Mapping[str, Any]) -> Overview | None:
    """A findings document's overview (None: an older run, or the overview was off)."""
    value = (doc.get("summary") or {}).get("overview")
    return None if value is None else read_overview(value)
