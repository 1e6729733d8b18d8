"""``diff`` explains each phase's change: which kernels, host gaps, synchronisations, exposed
communication or graph modes made an iteration slower or faster, and by how much.

The split is the overview's breakdown (``summary_steps``: its components sum to each
iteration's wall time), grouped as the headline groups them, so it sums to the change of the
phase's mean iteration exactly; each part is then named:

- compute (every compute component and the overlapped time) by kernel op type (its name where
  kernel_details.csv gives no type), matched across the runs by name, then by type and input
  shape; ops that vanish while others appear at the same place in the kernel sequence (Add and
  RmsNorm giving way to AddRmsNorm) are one change (``fused``, ``replaced``); what the kernels'
  own times do not account for (kernels at once on several streams, a kernel across an
  iteration's edge) is the ``unexplained`` remainder;
- idle waiting on the host by the host API or function whose time per iteration grew most
  (the innermost of those that grew about as much), idle after a synchronisation by the
  synchronising API that grew, exposed communication by the collective, copies and stream
  waits by the task;
- a change of graph mode (full, piecewise, eager) takes the idle time the launches cost
  (:data:`GRAPH_PARTS`) and the change of the kernels now launched otherwise as its own
  contribution, and a change of graph size (the capture size the replays ran at) the time of
  the graph's kernels.

Every number is per iteration of the phase, target minus base; the kernel time per module and
decoder layer comes beside it where the stores place kernels in the model.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.compare.run_tables import GRAPH_SIZE, RunTables
from traceanalyzer.overview.breakdown import COMPUTE_CLASSES
from traceanalyzer.overview.phases import phase_order
from traceanalyzer.report import fmt
from traceanalyzer.report.fmt import signed
from traceanalyzer.step_components import BY_KEY, COMPONENTS, COMPUTE, PARTS
from traceanalyzer.vocabulary import GRAPH_REPLAY_APIS, SYNC_APIS

KINDS = ("kernel", "host", "sync", "comm", "graph", "copy", "idle")  # of a contribution
UNEXPLAINED = "unexplained"
# what a change of graph mode costs: the device idle its launches leave
GRAPH_PARTS = tuple(c.key for c in COMPONENTS if c.launch_idle)
GRAPH_SHIFT = 0.10  # a graph mode's share of the phase's iterations that moves: a mode change
NO_GRAPH = "none"  # an iteration without compute has no graph mode
TOP_KERNELS = 8  # kernel contributions listed one by one; the rest are summed
KERNEL_MIN_SHARE = 0.02  # of the phase's change: a smaller kernel change is summed with the rest
INNERMOST_SHARE = 0.8  # host items that grew this much of the most: the innermost names it
FUSION_SPAN = 6  # most kernels between two neighbours that one new kernel can stand for
NOISE_SIGMAS = 2.0  # the change's noise: this many standard errors of the difference of means
DETAIL_ROWS = 3  # a kernel contribution's (name, input shape) rows
MODULE_ROWS = 10  # modules listed per phase
# torch ops that wait for the device (`.item()`): where the export records no CANN call
# (Level0) the idle after them is counted as waiting on the host, and they still name a sync
SYNC_TORCH_OPS = ("aten::item", "aten::_local_scalar_dense")
GRAPH_TOKENS = r"^(\d+)"  # a graph kernel's first input's leading dim: the captured tokens
KERNELS_RELAUNCHED = "kernels launched otherwise (in a graph in one run, eagerly in the other)"


@dataclass(frozen=True)
class Usage:
    """Calls and time per iteration of one thing in one run."""

    calls: float
    total_ns: float

    @property
    def mean_ns(self) -> float | None:
        return self.total_ns / self.calls if self.calls else None

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "mean_ns": self.mean_ns, "total_ns": self.total_ns}


NONE = Usage(0.0, 0.0)


@dataclass
class Contribution:
    """One cause of a phase's change: ``delta_ns`` per iteration, target minus base."""

    what: str
    kind: str
    delta_ns: float
    base: Usage | None = None
    target: Usage | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, change_ns: float) -> dict[str, Any]:
        evidence: dict[str, Any] = {}
        if self.base is not None or self.target is not None:
            evidence = {
                "base": (self.base or NONE).to_dict(),
                "target": (self.target or NONE).to_dict(),
            }
        return {
            "what": self.what,
            "kind": self.kind,
            "delta_ns": self.delta_ns,
            "share": self.delta_ns / change_ns if change_ns else None,
            "evidence": evidence | self.extra,
        }


@dataclass
class Explanation:
    """A phase's change, split into contributions (largest first) and the rest."""

    phase: str
    base_ns: float
    target_ns: float
    noise_ns: float | None
    contributions: list[Contribution]
    unexplained_ns: float
    modules: list[dict[str, Any]] = field(default_factory=list)

    @property
    def change_ns(self) -> float:
        return self.target_ns - self.base_ns

    @property
    def unchanged(self) -> bool:
        return not self.contributions and not self.unexplained_ns

    @property
    def within_noise(self) -> bool:
        return self.noise_ns is not None and abs(self.change_ns) < self.noise_ns

    def items(self) -> list[dict[str, Any]]:
        """``phases.rows[].explain``: the contributions, then the rest (none when unchanged)."""
        if self.unchanged:
            return []
        rest = Contribution(
            UNEXPLAINED,
            UNEXPLAINED,
            self.unexplained_ns,
            extra={"why": "kernel time the breakdown counts once: kernels at once on several "
                   "streams, or running past their iteration's end"},
        )  # fmt: skip
        return [c.to_dict(self.change_ns) for c in [*self.contributions, rest]]

    def summary(self) -> str:
        if self.unchanged:
            return f"{self.phase}: unchanged, nothing to explain."
        change = self.change_ns
        rel = f", {change / self.base_ns * 100:+.1f}%" if self.base_ns else ""
        head = f"{self.phase} {signed(change)} per iteration ({fmt.duration(self.base_ns)} -> "
        head += f"{fmt.duration(self.target_ns)}{rel})"
        top = ", ".join(f"{c.what} {signed(c.delta_ns)}" for c in self.contributions[:3])
        if self.within_noise:
            return f"{head}: within the iterations' noise (±{fmt.duration(self.noise_ns)}); {top}."
        return f"{head}: {top}."

    def to_dict(self) -> dict[str, Any]:
        """``phases.rows[].explanation``: the totals the contributions split."""
        return {
            "base_mean_ns": self.base_ns,
            "target_mean_ns": self.target_ns,
            "change_ns": self.change_ns,
            "noise_ns": self.noise_ns,
            "explained_ns": sum(c.delta_ns for c in self.contributions),
            "unexplained_ns": self.unexplained_ns,
            "summary": self.summary(),
            "modules": self.modules,
        }


def explain_phases(base: RunTables, target: RunTables) -> dict[str, Explanation]:
    """An explanation for every phase both runs have iterations of."""
    phases = set(base.steps["phase"].unique()) & set(target.steps["phase"].unique())
    return {p: explain_phase(p, base, target) for p in sorted(phases, key=phase_order)}


def explain_phase(phase: str, base: RunTables, target: RunTables) -> Explanation:
    b, t = _Phase(base, phase), _Phase(target, phase)
    change = t.mean("step_ns") - b.mean("step_ns")
    graph = _graph_change(b, t)
    contributions: list[Contribution] = []
    rest = 0.0
    graph_parts: dict[str, float] = {}
    for name, keys in PARTS:
        delta = sum(t.mean(k) - b.mean(k) for k in keys)
        if name == COMPUTE:
            kernels, relaunched = _kernels(b, t, change, graph is not None)
            contributions += kernels
            rest += delta - sum(c.delta_ns for c in [*kernels, *relaunched])
            if graph and relaunched:
                graph_parts["kernels"] = sum(c.delta_ns for c in relaunched)
                graph.extra["kernels"] = [
                    {"op": c.what, "delta_ns": c.delta_ns} for c in relaunched[:DETAIL_ROWS]
                ]
        elif graph and keys[0] in GRAPH_PARTS:
            graph_parts[keys[0]] = delta
        elif delta:
            contributions.append(_part(keys[0], delta, b, t))
    if graph:
        graph.delta_ns = sum(graph_parts.values())
        graph.extra["components"] = {
            (BY_KEY[k].label if k in BY_KEY else KERNELS_RELAUNCHED): v
            for k, v in graph_parts.items()
        }
        contributions.append(graph)
    contributions = [c for c in contributions if c.delta_ns]
    contributions.sort(key=lambda c: -abs(c.delta_ns))
    return Explanation(
        phase,
        b.mean("step_ns"),
        t.mean("step_ns"),
        _noise(b.steps["step_ns"], t.steps["step_ns"]),
        contributions,
        rest if abs(rest) >= 0.5 else 0.0,  # sums of float means: below a ns is rounding
        _modules(b, t, base.modules, target.modules),
    )


class _Phase:
    """One run's iterations of one phase, and what happened in them."""

    def __init__(self, run: RunTables, phase: str) -> None:
        self.steps = run.steps.filter(pl.col("phase") == phase)
        self.n = self.steps.height
        self.tasks = run.tasks.filter(pl.col("phase") == phase)
        self.host = run.host.filter(pl.col("phase") == phase)

    def mean(self, column: str) -> float:
        return float(self.steps[column].mean() or 0.0) if self.n else 0.0

    def usage(self, frame: pl.DataFrame, by: str) -> dict[Any, Usage]:
        """Calls and time per iteration of each ``by`` value of ``frame`` (rows of calls with
        ``dur_ns``, or aggregates with ``calls`` and ``total_ns``)."""
        if "dur_ns" in frame.columns:
            frame = frame.group_by(by).agg(
                pl.len().alias("calls"), pl.col("dur_ns").sum().alias("total_ns")
            )
        else:
            frame = frame.group_by(by).agg(pl.col("calls").sum(), pl.col("total_ns").sum())
        n = self.n or 1
        return {
            k: Usage(c / n, float(s) / n)
            for k, c, s in frame.select(by, "calls", "total_ns").iter_rows()
        }

    def graph_tokens(self, kernels: pl.DataFrame) -> int | None:
        """The tokens the phase's captured graphs are shaped for, the commonest: its steps'
        ``graph_size`` where the store has it; in a store written before it, the leading dim
        of the graph kernels' first input (None: no graph kernel with shapes)."""
        if GRAPH_SIZE in self.steps.columns:
            sizes = self.steps[GRAPH_SIZE].drop_nulls()
        else:
            sizes = (
                kernels.filter(pl.col("model_id").is_not_null())
                .select(pl.col("shape").str.extract(GRAPH_TOKENS, 1).cast(pl.Int64, strict=False))
                .to_series()
                .drop_nulls()
            )
        return None if sizes.is_empty() else int(sizes.mode().sort()[0])

    def compute(self) -> pl.DataFrame:
        return self.tasks.filter(pl.col("cls").is_in(COMPUTE_CLASSES)).with_columns(
            pl.coalesce("op_type", "name").alias("op")
        )


def _noise(base: pl.Series, target: pl.Series) -> float | None:
    """:data:`NOISE_SIGMAS` standard errors of the difference of the two mean iterations."""
    if base.len() < 2 or target.len() < 2:
        return None
    var = float(base.var() or 0.0) / base.len() + float(target.var() or 0.0) / target.len()
    return NOISE_SIGMAS * math.sqrt(var)


# ---------------------------------------------------------------------------- parts


def _part(key: str, delta: float, b: _Phase, t: _Phase) -> Contribution:
    """A component's change, named by what in it moved most."""
    component = BY_KEY[key]
    kind, label = component.kind, component.label
    extra: dict[str, Any] = {"component": {"key": key, "label": label,
                                           "base_ns": b.mean(key), "target_ns": t.mean(key)}}  # fmt: skip
    if component.task_class:  # a device task's time: named by the task that moved
        cls = component.task_class
        ub = b.usage(b.tasks.filter(pl.col("cls") == cls), "name")
        ut = t.usage(t.tasks.filter(pl.col("cls") == cls), "name")
    elif kind in ("host", "sync"):
        sync = pl.col("api_name").is_in(list(SYNC_APIS)) & (pl.col("kind") == "CANN")
        # the kinds of host call both runs recorded: one without Python tracer events has
        # every Python function "gone"
        both = set(b.host["kind"]) & set(t.host["kind"])
        pick = (sync if kind == "sync" else ~sync.fill_null(False)) & pl.col("kind").is_in(both)
        ub, ut = b.usage(b.host.filter(pick), "name"), t.usage(t.host.filter(pick), "name")
    else:
        return Contribution(label, kind, delta, extra=extra)
    grown = _moved(ub, ut, delta)
    culprit = _culprit(ub, ut, grown)
    if culprit is None:
        return Contribution(label, kind, delta, extra=extra)
    # what else moved the same way: one call named, a host that slowed everywhere still shows
    extra["moved"] = [{"what": n, "delta_ns": m if delta >= 0 else -m}
                      for n, m in list(grown.items())[:DETAIL_ROWS + 2]]  # fmt: skip
    if kind == "host" and culprit in SYNC_TORCH_OPS:
        kind = "sync"
    return Contribution(culprit, kind, delta, ub.get(culprit), ut.get(culprit), extra)


def _moved(
    base: Mapping[str, Usage], target: Mapping[str, Usage], delta: float
) -> dict[str, float]:
    """Each thing's change of time per iteration in the direction of ``delta``, those that
    moved that way, most first."""
    sign = 1.0 if delta >= 0 else -1.0
    moved = {
        name: sign * ((target.get(name) or NONE).total_ns - (base.get(name) or NONE).total_ns)
        for name in {*base, *target}
    }
    return dict(sorted(((n, m) for n, m in moved.items() if m > 0), key=lambda nm: (-nm[1], nm[0])))


def _culprit(
    base: Mapping[str, Usage], target: Mapping[str, Usage], grown: Mapping[str, float]
) -> str | None:
    """What moved most; of the things that moved about as much (:data:`INNERMOST_SHARE`), the
    shortest per call: a host function's time includes the calls inside it, and the innermost
    one names the cause."""
    if not grown:
        return None
    most = max(grown.values())
    near = [name for name, m in grown.items() if m >= INNERMOST_SHARE * most]

    def per_call(name: str) -> tuple[float, str]:
        use = target.get(name) or base.get(name) or NONE
        return (use.mean_ns or math.inf, name)

    return min(near, key=per_call)


# ---------------------------------------------------------------------------- graph mode


def _graph_modes(phase: _Phase) -> dict[str, float]:
    if not phase.n:
        return {}
    counts = phase.steps["graph"].fill_null(NO_GRAPH).value_counts()
    return {str(m): n / phase.n for m, n in counts.iter_rows()}


def _graph_change(b: _Phase, t: _Phase) -> Contribution | None:
    """A contribution for a change of graph mode (its delta filled in by the caller), or None."""
    mb, mt = _graph_modes(b), _graph_modes(t)
    if not mb or not mt:
        return None
    shift = max(abs(mt.get(m, 0.0) - mb.get(m, 0.0)) for m in {*mb, *mt})
    if max(mb, key=mb.__getitem__) == max(mt, key=mt.__getitem__) and shift < GRAPH_SHIFT:
        return None
    replays = pl.col("api_name").is_in(list(GRAPH_REPLAY_APIS))
    rb, rt = (
        p.usage(p.host.filter(replays).with_columns(pl.lit("r").alias("k")), "k") for p in (b, t)
    )
    in_graph = {
        side: {"graph": float(p.tasks["model_id"].is_not_null().sum()) / (p.n or 1),
               "eager": float(p.tasks["model_id"].is_null().sum()) / (p.n or 1)}
        for side, p in (("base", b), ("target", t))
    }  # fmt: skip
    return Contribution(
        f"graph mode {_modes_text(mb)} -> {_modes_text(mt)}",
        "graph",
        0.0,
        rb.get("r", NONE),
        rt.get("r", NONE),
        {"modes": {"base": mb, "target": mt}, "tasks_per_iteration": in_graph,
         "calls_are": f"graph replays ({', '.join(GRAPH_REPLAY_APIS)})"},
    )  # fmt: skip


def _modes_text(modes: Mapping[str, float]) -> str:
    if len(modes) == 1:
        return next(iter(modes))
    ordered = sorted(modes.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{m} {fmt.percent(s)}" for m, s in ordered)


# ---------------------------------------------------------------------------- kernels


def _kernels(
    b: _Phase, t: _Phase, change: float, graph_changed: bool
) -> tuple[list[Contribution], list[Contribution]]:
    """The compute part's change by kernel op, fusions and graph size; and, when the graph
    mode changed, the ops that ran in a graph in one run and eagerly in the other (apart: the
    same kernel launched otherwise takes another time, and the graph mode is why)."""
    kb, kt = b.compute(), t.compute()
    out: list[Contribution] = []
    tokens_b, tokens_t = b.graph_tokens(kb), t.graph_tokens(kt)
    if tokens_b is not None and tokens_t is not None and tokens_b != tokens_t:
        graph = pl.col("model_id").is_not_null()
        gb, gt = b.usage(kb.filter(graph), "cls"), t.usage(kt.filter(graph), "cls")
        ub, ut = _sum(gb.values()), _sum(gt.values())
        out.append(
            Contribution(
                f"graph size {tokens_b} -> {tokens_t} tokens",
                "graph",
                ut.total_ns - ub.total_ns,
                ub,
                ut,
                {"calls_are": "kernels of the captured graphs"},
            )  # fmt: skip
        )
        kb, kt = kb.filter(~graph), kt.filter(~graph)
    ub, ut = b.usage(kb, "op"), t.usage(kt, "op")
    removed: dict[str, Usage] = {}
    for group in _replacements(kb, kt, ub, ut):
        out.append(_group_contribution(group, ub, ut, removed))
    kinds = _match_kinds(kb, kt)
    ops = []
    for op in sorted({*ub, *ut} - {o for g in _done(out) for o in g}):
        was, gone, target = ub.get(op, NONE), removed.get(op, NONE), ut.get(op, NONE)
        base = Usage(was.calls - gone.calls, was.total_ns - gone.total_ns)
        status = "new" if op not in ub else "gone" if op not in ut else "changed"
        extra = {"status": status, "matched_by": kinds.get(op, "name")}
        ops.append(Contribution(op, "kernel", target.total_ns - base.total_ns, base, target, extra))
    ops.sort(key=lambda c: -abs(c.delta_ns))
    relaunched = _relaunched(kb, kt, ops) if graph_changed else []
    ops = [c for c in ops if c not in relaunched]
    floor = max(KERNEL_MIN_SHARE * abs(change), 0.5)
    listed = [c for c in ops[:TOP_KERNELS] if abs(c.delta_ns) >= floor]
    others = [c for c in ops if c not in listed]
    for c in listed:
        c.extra["kernels"] = _detail(b, t, kb, kt, c.what)
    if others and any(c.delta_ns for c in others):
        ob, ot = _sum(c.base or NONE for c in others), _sum(c.target or NONE for c in others)
        out.append(
            Contribution(
                f"other kernels ({len(others)} ops)",
                "kernel",
                sum(c.delta_ns for c in others),
                ob,
                ot,
                {"ops": [c.what for c in others[:20]]},
            )  # fmt: skip
        )
    return out + listed, relaunched


def _relaunched(kb: pl.DataFrame, kt: pl.DataFrame, ops: list[Contribution]) -> list[Contribution]:
    """The ``ops`` whose share of calls inside a graph replay moved by :data:`GRAPH_SHIFT`."""
    in_graph = pl.col("model_id").is_not_null().mean()
    shares = [dict(k.group_by("op").agg(in_graph).iter_rows()) for k in (kb, kt)]
    return [
        c for c in ops
        if abs((shares[1].get(c.what) or 0.0) - (shares[0].get(c.what) or 0.0)) >= GRAPH_SHIFT
    ]  # fmt: skip


def _sum(uses: Iterable[Usage]) -> Usage:
    listed = list(uses)
    return Usage(sum((u.calls for u in listed), 0.0), sum((u.total_ns for u in listed), 0.0))


def _done(contributions: list[Contribution]) -> list[list[str]]:
    """The ops a fusion or replacement contribution stands for (their whole new ops)."""
    return [c.extra.get("to", []) for c in contributions]


def _match_kinds(kb: pl.DataFrame, kt: pl.DataFrame) -> dict[str, str]:
    """How each op is matched across the runs: ``type`` when kernel_details gives its op type
    (its kernels may be named otherwise in the other run), else ``name``."""
    typed = pl.concat([kb.select("op_type"), kt.select("op_type")])["op_type"].drop_nulls()
    return dict.fromkeys(typed.unique().to_list(), "type")


def _detail(
    b: _Phase, t: _Phase, kb: pl.DataFrame, kt: pl.DataFrame, op: str
) -> list[dict[str, Any]]:
    """An op's kernels by name and input shape, matched by both, else by the shape alone (a
    kernel renamed in the other run): the rows that moved most."""
    key = pl.concat_str(pl.col("name"), pl.lit("\x00"), pl.col("shape").fill_null(""))
    ub = b.usage(kb.filter(pl.col("op") == op).with_columns(key.alias("k")), "k")
    ut = t.usage(kt.filter(pl.col("op") == op).with_columns(key.alias("k")), "k")
    if len(ub) <= 1 and len(ut) <= 1 and set(ub) == set(ut):
        return []
    pairs = [(k, k) for k in ub if k in ut]
    by_shape = {k.split("\x00", 1)[1]: k for k in ut if k not in ub}
    for k in [k for k in ub if k not in ut]:
        shape = k.split("\x00", 1)[1]
        pairs.append((k, by_shape.pop(shape, None)))
    pairs += [(None, k) for k in by_shape.values()]
    rows = []
    for kb_, kt_ in pairs:
        bu, tu = ub.get(kb_, NONE) if kb_ else NONE, ut.get(kt_, NONE) if kt_ else NONE
        name, shape = (kt_ or kb_ or "\x00").split("\x00", 1)
        rows.append({"name": name, "shape": shape or None,
                     "base_name": kb_.split("\x00", 1)[0] if kb_ else None,
                     "delta_ns": tu.total_ns - bu.total_ns,
                     "base": bu.to_dict(), "target": tu.to_dict()})  # fmt: skip
    rows.sort(key=lambda r: -abs(r["delta_ns"]))
    return rows[:DETAIL_ROWS]


# ---------------------------------------------------------------------------- fusion


@dataclass(frozen=True)
class _Group:
    """Ops that gave way (``before``, in the base) to ops at their place (``after``)."""

    before: tuple[str, ...]
    after: tuple[str, ...]


def _sequence(kernels: pl.DataFrame) -> list[str | None]:
    """The ops in time order per rank session, a None between two sessions."""
    ordered = kernels.sort("rank", "session", "start_ns")
    out: list[str | None] = []
    last = None
    for rank, session, op in ordered.select("rank", "session", "op").iter_rows():
        if (rank, session) != last and out:
            out.append(None)
        last = (rank, session)
        out.append(op)
    return out


def _replacements(
    kb: pl.DataFrame, kt: pl.DataFrame, ub: Mapping[str, Usage], ut: Mapping[str, Usage]
) -> list[_Group]:
    """Ops new in the target, each with the base ops they took the place of: the most common
    block of new ops between two neighbours, and what the base ran between the same
    neighbours (within :data:`FUSION_SPAN` kernels), every op of which ran fewer times per
    iteration in the target."""
    new = set(ut) - set(ub)
    if not new:
        return []
    fewer = {op for op in ub if (ut.get(op) or NONE).calls < ub[op].calls}
    contexts: Counter[tuple[str | None, tuple[str, ...], str | None]] = Counter()
    seq_t = _sequence(kt)
    i = 0
    while i < len(seq_t):
        if seq_t[i] in new:
            j = i
            while j + 1 < len(seq_t) and seq_t[j + 1] in new:
                j += 1
            before = seq_t[i - 1] if i else None
            after = seq_t[j + 1] if j + 1 < len(seq_t) else None
            contexts[(before, tuple(seq_t[i : j + 1]), after)] += 1  # type: ignore[arg-type]
            i = j + 1
        else:
            i += 1
    seq_b = _sequence(kb)
    where: dict[str, list[int]] = {}
    for pos, op in enumerate(seq_b):
        if op is not None:
            where.setdefault(op, []).append(pos)
    groups, claimed = [], set()
    for (left, block, right), _ in contexts.most_common():
        if left is None or right is None or set(block) & claimed:
            continue
        between: Counter[tuple[str, ...]] = Counter()
        for pos in where.get(left, []):
            for end in range(pos + 1, min(pos + FUSION_SPAN + 2, len(seq_b))):
                if seq_b[end] is None:
                    break
                if seq_b[end] == right:
                    between[tuple(seq_b[pos + 1 : end])] += 1  # type: ignore[arg-type]
                    break
        for ops, _ in between.most_common():
            if ops and set(ops) <= fewer and not set(ops) & claimed:
                groups.append(_Group(tuple(dict.fromkeys(ops)), tuple(dict.fromkeys(block))))
                claimed |= set(ops) | set(block)
                break
    return groups


def _group_contribution(
    group: _Group, ub: Mapping[str, Usage], ut: Mapping[str, Usage], removed: dict[str, Usage]
) -> Contribution:
    """One contribution for a fusion or replacement: the new ops' time less the time of the
    calls of the old ones that are gone (at their base mean; what is left of an old op is its
    own contribution)."""
    for op in group.before:
        fewer = max(ub[op].calls - (ut.get(op) or NONE).calls, 0.0)
        removed[op] = Usage(fewer, fewer * (ub[op].mean_ns or 0.0))
    before = _sum(removed[op] for op in group.before)
    after = _sum(ut[op] for op in group.after)
    olds, news = len(group.before), len(group.after)
    word = "fused" if olds > news else "split" if olds < news else "replaced"
    what = f"{' + '.join(group.before)} -> {' + '.join(group.after)} ({word})"
    return Contribution(
        what, "kernel", after.total_ns - before.total_ns, before, after,
        {"status": word, "from": list(group.before), "to": list(group.after)},
    )  # fmt: skip


# ---------------------------------------------------------------------------- modules


def _modules(
    b: _Phase, t: _Phase, base_columns: Sequence[str], target_columns: Sequence[str]
) -> list[dict[str, Any]]:
    """Kernel time per iteration by module and by decoder layer (where both runs' stores
    place kernels in the model), the rows that moved most."""
    rows = []
    for column in [c for c in base_columns if c in target_columns]:
        ub = b.usage(b.compute().filter(pl.col(column).is_not_null()), column)
        ut = t.usage(t.compute().filter(pl.col(column).is_not_null()), column)
        for value in {*ub, *ut}:
            bu, tu = ub.get(value, NONE), ut.get(value, NONE)
            rows.append({"column": column, "value": value, "base_ns": bu.total_ns,
                         "target_ns": tu.total_ns, "delta_ns": tu.total_ns - bu.total_ns})  # fmt: skip
    rows.sort(key=lambda r: (-abs(r["delta_ns"]), r["column"], str(r["value"])))
    return [r for r in rows if r["delta_ns"]][:MODULE_ROWS]
