"""Mixture-of-experts serving with expert parallelism (EP): the exchanges, the expert compute
per MoE layer and rank, and who waits for whom.

An MoE layer on an EP rank runs: the router (``MoeGatingTopK``), the exchange that sends each
token to the ranks holding its experts (MC2 ``MoeDistributeDispatch*`` kernels, an all-to-all,
or an all-gather), the rank's **expert compute** (``MoeInitRouting*``, ``GroupedMatmul``,
``SwiGlu``, ``MoeTokenUnpermute``, ``MoeFinalizeRouting``), then the exchange back
(``MoeDistributeCombine*``, an all-to-all, a reduce-scatter). The exchange back ends on every
rank of the group when the last one arrives: a rank whose experts got more tokens computes
longer and the others wait for it there (``serving_profiles.md`` §3).

- :func:`moe_exchange_paths`: which exchange each step used and how much of it was exposed
  (per rank and step); a step whose path does not fit its size is flagged (outside a rule,
  the ``exchanges`` table: :func:`~traceanalyzer.derived.exchanges.exchanges_of`).
- :func:`moe_imbalance`: per MoE layer instance (the k-th MoE layer of a step, matched across
  the ranks of an EP group) each rank's expert compute, routed tokens and wait in the exchange
  back; the hot ranks and what their peers lose waiting for them. ``moe-load-imbalance``
  reports it; ``collective-straggler`` and ``slow-rank`` ask it who owns a late rank's cost, so
  one finding counts it.

Everything is read from the store: at the default patterns, the MoE layer instances and the
dense kernels' time per step that the steps' task derived (``derived.moe_layers``), else the
slices and kernels; the steps and the session metadata. The wait is taken from durations on
each rank's own clock (time in the exchange beyond the shortest one of the instance), so ranks
on different hosts need no common clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceanalyzer.analyses.steps import phase_windows
from traceanalyzer.derived.device import EXCHANGE_PARAMS, device_slices, exchange_ops_in
from traceanalyzer.derived.exchanges import exchange_paths_in, exchanges_of
from traceanalyzer.derived.moe_layers import (
    DENSE,
    DERIVED_PARAMS,
    LAYER_PARAMS,
    LAYERS,
    dense_in,
    expert_shapes,
    layers_in,
    moe_tables_of,
)
from traceanalyzer.derived.phases import PHASES, STEADY_PHASES
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.derived.windows import compute_tasks
from traceanalyzer.engine.params import Param
from traceanalyzer.engine.rule import RuleContext, helper
from traceanalyzer.intervals import window_of
from traceanalyzer.patterns import first_match
from traceanalyzer.vocabulary import (
    EP_PATHS,
    HARDWARE_PROCESS,
    session_metadata,
)

PATH_NAMES = {path: name for path, (name, _) in EP_PATHS.items()}
MOE_PARAMS = {
    **EXCHANGE_PARAMS,
    "expert_kernels": LAYER_PARAMS["expert_kernels"],
    "expert_core": LAYER_PARAMS["expert_core"],
    "ep_groups": Param(
        r"^(?:ep|mc2|exp|moe_ep|ep_group|expert\w*)$",
        "Regex on parallel_group_info group names of the EP groups (vLLM: `ep`, vllm-ascend: "
        "`mc2`); without one, the group of the exchange collectives (communication.json).",
    ),
    "token_inputs_dropped": LAYER_PARAMS["token_inputs_dropped"],
    "min_expert_excess": Param(
        0.15,
        "A rank is hot in an MoE layer when its expert compute, corrected for its device's "
        "speed, exceeds the group's median by this share ...",
    ),
    "min_expert_excess_us": Param(20.0, "... and by at least this much (µs) ..."),
    "min_token_excess": Param(
        0.1, "... and, where Input Shapes give routed tokens, gets this share more tokens."
    ),
    "routed_count_paths": Param(
        ("alltoall",),
        "Exchange paths whose grouped matmuls are shaped by the tokens routed to the rank (the "
        "all-to-all delivers exactly those). On MC2 the dispatch output, which the grouped "
        "matmul reads, is sized by the dispatch capacity, the same on every rank: there the "
        "load is judged by the expert compute time and the peers' waits alone.",
    ),
    "min_wait_share": Param(
        0.02,
        "Report when the others' wait is at least this share of their time in the judged steps.",
    ),
    "min_hot_steps": Param(2, "... in at least this many steps."),
    "min_hot_share": Param(
        0.2, "A rank is named hot when it is hot in at least this share of the judged steps."
    ),
}
# what a step must have served for its MoE layers to say something about the expert load
JUDGED_PHASES = tuple(STEADY_PHASES)
NO_EXCHANGE = (
    "no EP exchange after the expert compute (MC2 dispatch/combine, all-to-all or all-gather "
    "collectives): not expert-parallel, or the exchange is fused with the experts"
)
NO_PEERS = "needs the profiles of at least 2 ranks of an EP group (profile every rank of the group)"


# --------------------------------------------------------------------------------------------
# Exchanges
# --------------------------------------------------------------------------------------------


def _device_tasks(ctx: RuleContext) -> pl.DataFrame:
    """:func:`~traceanalyzer.derived.device.device_slices` of every rank in scope, read once
    (one scan of the slices) for the exchanges, the compute kernels and the expert kernels."""
    return ctx.shared(_read_device_tasks)


def _read_device_tasks(ctx: RuleContext) -> pl.DataFrame:
    return device_slices(ctx.table("slices"))


def _exchange_ops(ctx: RuleContext) -> pl.DataFrame:
    """EP exchange ops of every rank in scope (``derived.device.exchange_ops_in``)."""
    return exchange_ops_in(_device_tasks(ctx), ctx.params)


def _shared_exchange_ops(ctx: RuleContext) -> pl.DataFrame:
    """:func:`_exchange_ops`, read once for the exchange paths and the imbalance verdict."""
    return ctx.shared(_exchange_ops, tuple(EXCHANGE_PARAMS))


def _in_steps(ctx: RuleContext, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with ``step`` and ``phase`` of the step each row starts in (nulls outside)."""
    steps = phase_windows(ctx).filter(pl.col("step").is_not_null())
    return window_of(frame, steps, keep=["step", "phase"])


def _at_defaults(p: Any, params: Mapping[str, Param]) -> bool:
    """Whether ``p`` holds the defaults of ``params`` (those the stored tables derive with)."""
    return all(getattr(p, name) == param.default for name, param in params.items())


@helper(params=EXCHANGE_PARAMS)
def moe_exchange_paths(ctx: RuleContext) -> pl.DataFrame:
    """Per rank, session and step that ran an EP exchange: which exchange it used and how much
    of it no compute hid (the ``exchanges`` table's columns, ``derived.exchanges``): read from the
    store at the default patterns, else derived for these."""
    return ctx.shared(_exchange_paths, tuple(EXCHANGE_PARAMS))


def _compute_kernels(ctx: RuleContext) -> pl.DataFrame:
    """The compute kernels of every rank in scope, read once for the exchange paths and the
    ranks' speeds (:func:`~traceanalyzer.kernels.kernel_tasks`)."""
    return ctx.shared(_read_compute_kernels)


def _read_compute_kernels(ctx: RuleContext) -> pl.DataFrame:
    return compute_tasks(_device_tasks(ctx).lazy())


def _exchange_paths(ctx: RuleContext) -> pl.DataFrame:
    ranks = ctx.scope_ranks()
    if _at_defaults(ctx.params, EXCHANGE_PARAMS):
        return exchanges_of(ctx.store, ranks)
    steps = steps_of(ctx.store, ranks)
    return exchange_paths_in(_shared_exchange_ops(ctx), _compute_kernels(ctx), steps)


# --------------------------------------------------------------------------------------------
# EP groups
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpGroup:
    """An EP group: its name (as the export names it, else its communicator), its member
    ranks, and where it was found (``metadata``, ``communication``, ``all``)."""

    name: str
    members: tuple[int, ...]
    source: str


def _ep_groups(ctx: RuleContext, moe_ranks: list[int]) -> list[EpGroup]:
    """The EP groups of the ranks that run MoE layers: parallel_group_info groups whose name
    matches ``ep_groups`` (vLLM's `ep`, vllm-ascend's `mc2`: the same members, counted once);
    else the communicators of the exchange collectives (communication.json groups, named from
    parallel_group_info when it lists the communicator); else all those ranks, one group."""
    p = ctx.params
    present = set(moe_ranks)
    named: dict[frozenset[int], str] = {}
    labels: dict[str, str] = {}
    for raw in ctx.sessions()["metadata"].to_list():
        info = session_metadata(raw).get("parallel_group_info")
        if not isinstance(info, dict):
            continue
        for key, value in info.items():
            if not isinstance(value, dict):
                continue
            name = str(value.get("group_name") or key)
            labels.setdefault(str(key), name)
            members = frozenset(r for r in value.get("global_ranks") or [] if isinstance(r, int))
            if first_match(p.ep_groups, name) is not None and len(members & present) >= 2:
                named.setdefault(members, name)
    if named:
        return [EpGroup(n, tuple(sorted(m & present)), "metadata") for m, n in _sorted(named)]
    comm = (
        ctx.table("comm_ops")
        .filter(
            pl.col("op_name").str.contains(p.alltoall_ops)
            | pl.col("op_name").str.contains(p.allgather_ops)
        )
        .select("rank", "group")
        .unique()
        .collect()
    )
    found: dict[frozenset[int], str] = {}
    for (group,), rows in comm.group_by("group"):
        members = frozenset(int(r) for r in rows["rank"].to_list()) & present
        if group is not None and len(members) >= 2:
            found.setdefault(members, labels.get(str(group), str(group)))
    if found:
        return [EpGroup(n, tuple(sorted(m)), "communication") for m, n in _sorted(found)]
    if len(present) >= 2:
        return [EpGroup("all ranks with MoE layers", tuple(sorted(present)), "all")]
    return []


def _sorted(groups: dict[frozenset[int], str]) -> list[tuple[frozenset[int], str]]:
    return sorted(groups.items(), key=lambda kv: (min(kv[0]), len(kv[0])))


# --------------------------------------------------------------------------------------------
# Expert compute per MoE layer instance
# --------------------------------------------------------------------------------------------


def _layers(ctx: RuleContext) -> pl.DataFrame:
    """The MoE layer instances of every rank in scope (``derived.moe_layers.layers_in``): the
    store's ``moe_layers`` table at the default patterns, else derived for these."""
    p = ctx.params
    if _at_defaults(p, DERIVED_PARAMS):
        return _moe_tables(ctx)[LAYERS]
    shapes = expert_shapes(ctx.table("kernels"), p)
    return layers_in(_device_tasks(ctx), _shared_exchange_ops(ctx), shapes, p)


def _moe_tables(ctx: RuleContext) -> dict[str, pl.DataFrame]:
    """The ``moe_layers`` and ``moe_dense`` tables of every rank in scope, read once."""
    return ctx.shared(_read_moe_tables)


def _read_moe_tables(ctx: RuleContext) -> dict[str, pl.DataFrame]:
    return moe_tables_of(ctx.store, ctx.scope_ranks())


def _speeds(ctx: RuleContext, groups: list[EpGroup]) -> dict[int, float]:
    """Each rank's device speed against its group: the median, over the dense kernels of a name
    that every peer runs as often in the same step, of the rank's time in them over the peers'
    (median). A throttled rank runs every kernel longer; a hot expert rank only its experts.
    Summed per step and name first: the tens of thousands of kernels become a few thousand
    rows, and a rank with a kernel more or less in a step is not matched there."""
    p = ctx.params
    member_of = {r: i for i, g in enumerate(groups) for r in g.members}
    members = pl.col("rank").is_in(list(member_of))
    if _at_defaults(p, DERIVED_PARAMS):
        per_step = _moe_tables(ctx)[DENSE]
    else:
        per_step = dense_in(_compute_kernels(ctx).filter(members), phase_windows(ctx), p)
    dense = per_step.filter(members & pl.col("phase").is_in(JUDGED_PHASES))
    if dense.is_empty():
        return {}
    key = ["group", "sidx", "step", "name"]
    order = _session_order(ctx).cast({"rank": dense.schema["rank"]})
    ratios = (
        dense.join(order, on=["rank", "session"])
        .with_columns(
            pl.col("rank").replace_strict(member_of, return_dtype=pl.Int64).alias("group")
        )
        .with_columns(
            (pl.col("dur_ns") / pl.col("dur_ns").median().over(key)).alias("ratio"),
            pl.col("rank").n_unique().over(key).alias("_ranks"),
            pl.col("kernels").n_unique().over(key).alias("_counts"),
        )
        .filter((pl.col("_ranks") >= 2) & (pl.col("_counts") == 1))
        .group_by("rank")
        .agg(pl.col("ratio").median())
    )
    return {
        int(r): float(value) for r, value in ratios.iter_rows() if value is not None and value > 0
    }


def _session_order(ctx: RuleContext) -> pl.DataFrame:
    """rank, session, sidx: each rank's sessions in time order (the k-th profile of a rank
    meets the k-th of its peers)."""
    return ctx.sessions().select(
        "rank", "session", pl.int_range(pl.len()).over("rank").alias("sidx")
    )


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------


@dataclass
class Imbalance:
    """The expert load of one EP group in one phase, where it costs the others."""

    group: EpGroup
    phase: str | None
    hot_ranks: list[int]  # named: hot in at least min_hot_share of the judged steps
    hot_share: dict[int, float]  # rank -> share of the judged steps it is hot in
    windows: dict[int, tuple[int, int, int]]  # rank -> its longest hot run (first, last, steps)
    judged_steps: int
    hot_steps: int  # judged steps with a hot rank
    instances: pl.DataFrame  # this group and phase's judged rows (see MoeVerdict.rows)
    cost_ns: float  # the others' wait for the hot ranks, summed over ranks, layers and steps
    waiting_ns: float  # the waiting ranks' time in the judged steps
    waiting_ranks: list[int]  # the ranks that waited for a hot one

    @property
    def hot_rows(self) -> pl.DataFrame:
        """The named hot ranks' rows of the instances they are hot in."""
        return self.instances.filter(pl.col("hot") & pl.col("rank").is_in(self.hot_ranks))

    @property
    def hot_instances(self) -> pl.DataFrame:
        """Every rank's rows of the instances with a hot rank."""
        keys = self.instances.filter(pl.col("hot")).select("sidx", "step", "layer").unique()
        return self.instances.join(keys, on=["sidx", "step", "layer"])

    @property
    def share(self) -> float:
        return self.cost_ns / self.waiting_ns if self.waiting_ns else 0.0

    @property
    def by_tokens(self) -> bool:
        """Whether routed token counts took part in naming the hot ranks (else the expert
        compute time and the peers' waits alone did)."""
        return bool(self.hot_rows["by_tokens"].any())


@dataclass
class MoeVerdict:
    """What :func:`moe_imbalance` found. ``unavailable``: why it could not look (no MoE layers,
    no exchange, one rank), ``undecided``: why it could not judge (no step with every rank of a
    group serving); ``rows``: every MoE layer instance of every rank (``sidx``, ``step``,
    ``phase``, ``layer``, ``expert_ns``, ``tokens``, ``speed``, ``wait_ns``, ``owned_ns``,
    ``hot``, ``judged``, ``group``: the index in ``groups``); ``findings``: the imbalances
    that pass every threshold."""

    groups: list[EpGroup] = field(default_factory=list)
    rows: pl.DataFrame = field(default_factory=pl.DataFrame)
    findings: list[Imbalance] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)  # phase -> instances left out
    unavailable: str | None = None
    undecided: str | None = None

    @property
    def hot_ranks(self) -> set[int]:
        """The ranks a finding names hot: the cost of their lateness is the imbalance's."""
        return {r for f in self.findings for r in f.hot_ranks}

    def owned_ops(self) -> pl.DataFrame:
        """The exchange ops (rank, session, name) in which the reported imbalances own the
        wait, with ``owned_ns``: another rule that sees those waits refers to them."""
        if not self.findings:
            return pl.DataFrame(
                schema={
                    "rank": pl.Int32,
                    "session": pl.String,
                    "name": pl.String,
                    "owned_ns": pl.Int64,
                }
            )
        frames = [f.instances.filter(pl.col("owned_ns") > 0) for f in self.findings]
        return pl.concat(frames).select(
            pl.col("rank").cast(pl.Int32), "session", "name", pl.col("owned_ns").cast(pl.Int64)
        )


@helper(params=MOE_PARAMS)
def moe_imbalance(ctx: RuleContext) -> MoeVerdict:
    """The expert load per MoE layer instance and EP group, and the imbalances that cost the
    others (see :class:`MoeVerdict`); computed once for every rule that asks with the same
    parameters."""
    return ctx.shared(_verdict, tuple(MOE_PARAMS))


def _verdict(ctx: RuleContext) -> MoeVerdict:
    p = ctx.params
    layers = _layers(ctx)
    if layers.is_empty():
        has_core = _device_tasks(ctx).filter(
            (pl.col("process") == HARDWARE_PROCESS) & pl.col("name").str.contains(p.expert_core)
        )
        if has_core.is_empty():
            return MoeVerdict(unavailable="no MoE expert kernels (`expert_core`) in the trace")
        return MoeVerdict(unavailable=NO_EXCHANGE)
    groups = _ep_groups(ctx, sorted(layers["rank"].unique().to_list()))
    if not groups:
        return MoeVerdict(unavailable=NO_PEERS)
    speeds = _speeds(ctx, groups)
    rows = (
        _in_steps(ctx, layers.rename({"first_ns": "start_ns"}))
        .filter(pl.col("step").is_not_null())
        .join(_session_order(ctx).cast({"rank": layers.schema["rank"]}), on=["rank", "session"])
        .sort("rank", "session", "start_ns")
        .with_columns(pl.int_range(pl.len()).over("rank", "session", "step").alias("layer"))
        .with_columns(
            pl.col("rank")
            .replace_strict(speeds, default=1.0, return_dtype=pl.Float64)
            .alias("speed")
        )
    )
    member_of = {r: i for i, g in enumerate(groups) for r in g.members}
    rows = rows.filter(pl.col("rank").is_in(list(member_of))).with_columns(
        pl.col("rank").replace_strict(member_of, return_dtype=pl.Int64).alias("group")
    )
    verdict = MoeVerdict(groups=groups)
    judged = [_judge(p, rows.filter(pl.col("group") == i)) for i in range(len(groups))]
    verdict.rows = pl.concat([j for j in judged if not j.is_empty()], how="diagonal_relaxed")
    if verdict.rows.is_empty() or not verdict.rows["judged"].any():
        left = verdict.rows.height
        verdict.undecided = (
            f"no MoE layer to judge: {left} layer instance(s), none with every profiled rank of "
            "its EP group in a step that served the workload (warm-up, dummy or idle steps are "
            "left out); profile steps past the start-up with every rank serving"
        )
        return verdict
    left_out = (
        verdict.rows.filter(~pl.col("judged") & ~pl.col("phase").is_in(JUDGED_PHASES))
        .select("group", "sidx", "step", "layer", "phase")
        .unique()
    )
    verdict.excluded = {str(k): int(v) for k, v in left_out.group_by("phase").len().iter_rows()}
    step_ns = (
        phase_windows(ctx)
        .filter(pl.col("step").is_not_null())
        .select("rank", "session", "step", (pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"))
    )
    for i, g in enumerate(groups):
        mine = verdict.rows.filter((pl.col("group") == i) & pl.col("judged"))
        for phase in _phases(mine):
            found = _imbalance(p, g, phase, mine.filter(pl.col("iphase") == phase), step_ns)
            if found is not None:
                verdict.findings.append(found)
    return verdict


def _phases(rows: pl.DataFrame) -> list[str]:
    present = set(rows["iphase"].drop_nulls().to_list())
    return [ph for ph in PHASES if ph in present]


def _judge(p: Any, rows: pl.DataFrame) -> pl.DataFrame:
    """Each instance (sidx, step, layer) of one group: judged when every profiled member has it
    in a step that served the workload; its hot ranks; each rank's wait and the part the hot
    ranks' longer expert compute explains (``owned_ns``)."""
    if rows.is_empty():
        return rows
    key = ["sidx", "step", "layer"]
    present = rows["rank"].n_unique()
    steady = pl.col("phase").is_in(JUDGED_PHASES)
    normal = pl.col("expert_ns") / pl.col("speed")
    over = pl.col("expert_ns") - pl.col("expert_ns").median().over(key)
    # a shape's first dim is a routed count only on the paths that deliver exactly the routed
    # tokens; elsewhere it is a capacity, and counts equal on every rank tell nothing either
    rows = rows.with_columns(
        pl.when(pl.col("path").is_in(list(p.routed_count_paths))).then(pl.col("tokens"))
    )
    with_tokens = pl.col("tokens").is_not_null().all().over(key) & (
        pl.col("tokens").n_unique().over(key) > 1
    )
    tokens_hot = pl.col("tokens") >= (1 + p.min_token_excess) * pl.col("tokens").median().over(key)
    hot = (
        (normal >= (1 + p.min_expert_excess) * normal.median().over(key))
        & (over >= p.min_expert_excess_us * 1e3)
        & (~with_tokens | tokens_hot)
    )
    judged = (
        (pl.col("rank").n_unique().over(key) == present) & steady.all().over(key) & (present >= 2)
    )
    out = rows.with_columns(
        judged.alias("judged"),
        (hot & judged).alias("hot"),
        with_tokens.alias("by_tokens"),
        # the phase the instance served: the most common among its ranks
        pl.col("phase").mode().sort().first().over(key).alias("iphase"),
        (pl.col("exchange_ns") - pl.col("exchange_ns").min().over(key)).clip(0).alias("wait_ns"),
    )
    hot_expert = pl.col("expert_ns").filter(pl.col("hot")).max().over(key)
    return out.with_columns(
        pl.when(pl.col("judged") & ~pl.col("hot") & hot_expert.is_not_null())
        .then(pl.min_horizontal("wait_ns", (hot_expert - pl.col("expert_ns")).clip(0)))
        .otherwise(0)
        .alias("owned_ns")
    )


def _imbalance(
    p: Any, g: EpGroup, phase: str, rows: pl.DataFrame, step_ns: pl.DataFrame
) -> Imbalance | None:
    """The imbalance of one group in one phase, when it passes the thresholds."""
    steps = (
        rows.group_by("sidx", "step", "rank").agg(
            (pl.col("hot").mean() >= 0.5).alias("hot_step")
        )  # in most of its layers
    )
    judged_steps = steps.select("sidx", "step").unique().height
    hot_steps = steps.filter(pl.col("hot_step")).select("sidx", "step").unique().height
    if hot_steps < p.min_hot_steps or not judged_steps:
        return None
    share = {
        int(r): n / judged_steps
        for r, n in steps.group_by("rank").agg(pl.col("hot_step").sum()).iter_rows()
        if n
    }
    named = sorted(
        (r for r, s in share.items() if s >= p.min_hot_share), key=lambda r: (-share[r], r)
    )
    if not named:  # the hot spot moves among many ranks: name the most frequent ones
        top = max(share.values())
        named = sorted(r for r, s in share.items() if s == top)
    cost = float(rows["owned_ns"].sum())
    # the ranks that waited for a hot one (all of them when the hot spot moves)
    waiting = sorted(set(rows.filter(pl.col("owned_ns") > 0)["rank"].to_list()))
    # their time in the judged steps: what the wait is a share of
    judged = rows.filter(pl.col("rank").is_in(waiting)).select("rank", "session", "step").unique()
    step_time = float(
        judged.join(step_ns.cast({"rank": judged.schema["rank"]}), on=["rank", "session", "step"])[
            "step_ns"
        ].sum()
    )
    found = Imbalance(
        group=g,
        phase=None if phase == "unknown" else phase,
        hot_ranks=named,
        hot_share=share,
        windows={r: _longest_run(steps, r) for r in named},
        judged_steps=judged_steps,
        hot_steps=hot_steps,
        instances=rows,
        cost_ns=cost,
        waiting_ns=step_time,
        waiting_ranks=waiting,
    )
    return found if found.share >= p.min_wait_share and cost > 0 else None


def _longest_run(steps: pl.DataFrame, rank: int) -> tuple[int, int, int]:
    """The rank's longest run of consecutive judged steps (of one session) it is hot in:
    (first step, last step, steps)."""
    best, first, count, session = (0, 0, 0), 0, 0, None
    mine = steps.filter(pl.col("rank") == rank).sort("sidx", "step")
    for sidx, step, hot in mine.select("sidx", "step", "hot_step").iter_rows():
        if not hot:
            count = 0
        elif count and sidx == session:
            count += 1
        else:
            first, count = step, 1
        session = sidx
        if count > best[2]:
            best = (first, step, count)
    return best
