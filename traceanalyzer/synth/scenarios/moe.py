"""``moe-ep``: a mixture-of-experts model served with expert parallelism (EP) across the ranks.

Each iteration is what vllm-ascend runs for one scheduler step of a DeepSeek-class model
(``serving_profiles.md`` §3): per MoE layer the dense part (norms, projections, the attention,
the router's ``MoeGatingTopK``), the EP exchange that sends each token to the ranks holding its
experts (MC2 ``MoeDistributeDispatchV2`` kernels, an ``hcom_alltoallv`` or an
``hcom_allGather``), the rank's expert compute (``MoeInitRoutingV2``, two ``GroupedMatmul`` with
a ``SwiGlu`` between them, ``MoeTokenUnpermute`` on the all-gather path) and the exchange that
brings the results back (``MoeDistributeCombineV2``, an ``hcom_alltoallv`` or an
``hcom_reduceScatter``). The exchange back ends on every rank of the group when the last one
arrives: a rank whose experts got more tokens computes longer and the others wait for it
inside the exchange.

The ranks' timings are simulated together (:func:`simulate`, deterministic: every rank's
generator computes the same group timeline and writes its own part), so the waits in each
rank's trace are those its peers' compute implies. The knobs:

- ``ep`` (EP group size, 0: every rank), ``hot_rank`` (-1: balanced), ``skew`` (its routed
  tokens over the mean), ``persistence`` (share of the iterations it is hot, one window from
  ``hot_from``), ``rotate`` (the hot spot moves to the next rank every iteration);
- ``comm``: ``auto`` (MC2 up to ``mc2_capacity`` tokens, all-to-all above, as vllm-ascend picks
  on A3), ``mc2``, ``alltoall`` or ``allgather``; ``prefill_every`` adds prefill iterations of
  ``chunk`` tokens;
- ``graph``: decode iterations replay a FULL graph (shapes of the capture size, no token count
  in them); ``shapes`` off writes no Input Shapes;
- ``dummy_ranks`` run ``_dummy_run`` batches every ``dummy_every`` iterations: their padding
  tokens route alike, so the first rank of the group looks hot there (a decoy for rules that do
  not leave dummy steps out); ``warmup`` iterations (``profile_run``) look hot on the last rank;
- decoys: ``slow_rank`` is slow for another reason, ``slow_cause``: ``host`` (its device idles
  ``slow_us`` before the expert compute, waiting for launches), ``throttle`` (every kernel
  ``throttle`` times longer, AI Core frequency lowered) or ``link`` (its exchanges finish
  ``slow_us`` later: a slow link);
- ``group_name``: the EP group's name in parallel_group_info (vLLM's ``ep``), ``mc2_group``
  off leaves out vllm-ascend's ``mc2`` group;
- tail iterations: ``tail_rank`` is late by ``tail_ms`` in the iterations ``tail_at`` (from 0),
  ``tail_cause``: its host busy before the forward (``host``: Python frames, ``compile``: a
  Triton compile, ``gc``, ``sync``: ``.item()`` behind a long copy), or ``device`` (a matmul of
  layer ``tail_layer`` that much longer); every other rank waits for it in the next exchange;
- decoys: ``shared_at`` makes every rank ``shared_factor`` slower in those iterations (a bigger
  batch: no late rank), ``slow_link`` (``A-B`` or ``all``) makes that link's transfers
  ``link_factor`` slower (every exchange ends later on every rank; ``comm=auto`` then runs the
  all-to-all, whose links the export tells); ``profile_from`` (``R:N``) starts rank R's profile N
  iterations later than the others'.

:func:`simulate` is the truth: tests compare the rule's hot rank and cost with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from random import Random

from traceanalyzer.synth.ops import GRAPH_MODEL_ID, MS, STALL_CAUSES, US, KernelSpec, host_stall
from traceanalyzer.synth.rank import INVALID_MODEL, RankWriter
from traceanalyzer.synth.scenarios.serving import (
    RUNNER,
    SAMPLER,
    WORKER,
    Iteration,
    attention_kernel,
    numbers,
)
from traceanalyzer.synth.scenarios.timeline import Timeline
from traceanalyzer.vocabulary import EP_PATHS

KNOBS = {
    "iterations": 16,
    "layers": 4,
    "ep": 0,
    "hot_rank": 1,
    "skew": 2.0,
    "persistence": 1.0,
    "hot_from": 0,
    "rotate": False,
    "comm": "auto",
    "mc2_capacity": 512,
    "prefill_every": 0,
    "chunk": 1024,
    "batch": 32,
    "topk": 8,
    "graph": True,
    "shapes": True,
    "dummy_ranks": "",
    "dummy_every": 0,
    "warmup": 0,
    "slow_rank": -1,
    "slow_cause": "host",
    "slow_us": 150.0,
    "throttle": 1.4,
    "group_name": "ep",
    "mc2_group": True,
    "tail_rank": -1,
    "tail_at": "",
    "tail_ms": 2.0,
    "tail_cause": "host",
    "tail_layer": 1,
    "shared_at": "",
    "shared_factor": 1.6,
    "slow_link": "",
    "link_factor": 4.0,
    "profile_from": "",
}
HELP = (
    "MoE serving with expert parallelism: a hot expert rank makes the others wait in the EP "
    "exchange (knobs: iterations, layers, ep, hot_rank=-1 for balanced, skew, persistence, "
    "hot_from, rotate, comm=auto|mc2|alltoall|allgather, mc2_capacity, prefill_every, chunk, "
    "batch, topk, graph, shapes, dummy_ranks, dummy_every, warmup, slow_rank, "
    "slow_cause=host|throttle|link, slow_us, throttle, group_name, mc2_group; tail "
    "iterations: tail_rank is late in the iterations tail_at by tail_ms, tail_cause="
    "host|compile|gc|sync|device (device: a kernel of layer tail_layer); decoys: shared_at "
    "makes every rank shared_factor slower there (a bigger batch), slow_link=A-B (or all) "
    "makes that link's transfers link_factor slower (comm=auto then runs all-to-all); profile_from=R:N starts rank R's profile "
    "N iterations later)"
)
PATHS = tuple(EP_PATHS)
CAUSES = ("host", "throttle", "link")
HIDDEN, INTER = 7168, 2048
NOMINAL_MHZ = 1800
COMM_STREAM = 4


def _k(api: str, op_type: str, core: str = "AI_CORE") -> KernelSpec:
    return KernelSpec(f"aclnn{api}", f"aclnn{api}_{op_type}_{op_type}", op_type, core, 0.0)


RMSNORM = _k("RmsNorm", "RmsNorm", "AI_VECTOR_CORE")
MATMUL = _k("Mm", "MatMulV2")
ADD = _k("Add", "Add", "AI_VECTOR_CORE")
GATING = _k("MoeGatingTopK", "MoeGatingTopK", "AI_VECTOR_CORE")
PERMUTE = _k("MoeTokenPermute", "MoeTokenPermute", "AI_VECTOR_CORE")
INIT_ROUTING = _k("MoeInitRoutingV2", "MoeInitRoutingV2", "AI_VECTOR_CORE")
GMM = replace(
    _k("GroupedMatmulV4", "GroupedMatmul"),
    dtypes=";".join(["DT_BF16", "DT_BF16", *["DT_UNDEFINED"] * 5, "INT64", "DT_UNDEFINED"]),
)
SWIGLU = _k("SwiGlu", "SwiGlu", "AI_VECTOR_CORE")
UNPERMUTE = _k("MoeTokenUnpermute", "MoeTokenUnpermute", "AI_VECTOR_CORE")
DISPATCH = _k("MoeDistributeDispatchV2", "MoeDistributeDispatchV2", "MIX_AIV")
COMBINE = _k("MoeDistributeCombineV2", "MoeDistributeCombineV2", "MIX_AIV")
# the exchange there and back on each path (MC2 kernels, or HCCL ops on the comm stream)
EXCHANGES = {"mc2": (DISPATCH, COMBINE), "alltoall": ("alltoallv", "alltoallv"),
             "allgather": ("allGather", "reduceScatter")}  # fmt: skip


LOCAL_EXPERTS = 8


def _gmm_rows(path: str, graph: bool, tokens: int, ep: int, topk: int, routed: int) -> int:
    """The first dim of a GroupedMatmul's ``x`` on each path (``docs/serving.md``, MoE): only
    the all-to-all delivers exactly the routed rows; MC2's dispatch output is sized by its
    capacity, ``global_bs * min(local experts, top-k)`` with ``global_bs = bs * ep`` (op-plugin
    ``MoeDistributeDispatchV2KernelOpApi.cpp``), and the all-gather path's ``init_routing``
    output by every gathered token times top-k (``MoeInitRoutingV2KernelNpuOpApi.cpp``): the
    same on every rank, whatever the routing. A replayed graph holds its capture's shapes."""
    if path == "mc2" or graph:
        return tokens * ep * min(LOCAL_EXPERTS, topk)
    if path == "allgather":
        return tokens * ep * topk
    return routed


def _gmm_shapes(rows: int, k: int, n: int) -> str:
    """A GroupedMatmul's Input Shapes, its nine input slots in the op's order (x; weight; bias;
    scale; offset; antiquant_scale; antiquant_offset; group_list; per_token_scale), an absent
    one empty (ops-transformer ``grouped_matmul_def.cpp``; msprof writes no dims for it)."""
    return f"{rows},{k};{LOCAL_EXPERTS},{k},{n};;;;;;{LOCAL_EXPERTS};"


@dataclass
class Task:
    """One device task of a rank, at ``start`` ns from the iteration's start."""

    spec: KernelSpec | str  # a kernel, or the HCCL op type of a collective
    start: int
    dur: int
    shapes: str = ""
    wait: int = 0  # a collective's wait for its peers
    slow: dict[int, float] = field(default_factory=dict)  # a collective's slow links' factors


@dataclass
class RankIteration:
    """One rank's part of an iteration: its phase, batch and device tasks."""

    phase: str  # prefill | decode | dummy | warmup
    tokens: int
    requests: int
    path: str
    graph: bool
    tasks: list[Task] = field(default_factory=list)
    forward_end: int = 0  # when its last forward kernel ends
    hot: int | None = None  # the group's hot rank in this iteration (the truth)
    waits: list[int] = field(default_factory=list)  # its wait in each layer's exchange back
    # a tail iteration's late work on its rank: (start, duration, cause), from the iteration's
    # start (host causes: the device idles until the host is back)
    stall: tuple[int, int, str] | None = None


@dataclass
class Plan:
    """The whole run: iteration start times (from the session start) and each rank's part."""

    starts: list[int]
    ranks: dict[int, list[RankIteration]]


def groups(world: int, ep: int) -> list[list[int]]:
    """The EP groups: consecutive blocks of ``ep`` ranks (``ep`` 0: one group of all)."""
    size = ep or world
    if size < 2 or world % size:
        raise ValueError(f"ep={ep} must be at least 2 and divide the {world} ranks")
    return [list(range(g, g + size)) for g in range(0, world, size)]


def _path(knobs: dict, tokens: int) -> str:
    if knobs["comm"] == "auto" and str(knobs["slow_link"]).strip():
        # MC2 moves its data inside its kernels, where no link is told: a slow link is seen
        # through the collectives' links (communication_matrix.json, the planes' transfers)
        return "alltoall"
    if knobs["comm"] == "auto":
        return "mc2" if tokens <= knobs["mc2_capacity"] else "alltoall"
    if knobs["comm"] not in PATHS:
        raise ValueError(f"comm must be auto or one of {', '.join(PATHS)}, not {knobs['comm']!r}")
    return knobs["comm"]


def _phase(knobs: dict, i: int, rank: int) -> str:
    if i < knobs["warmup"]:
        return "warmup"
    j = i - knobs["warmup"]
    every = knobs["dummy_every"]
    if every and j % every == every - 1 and rank in numbers(knobs["dummy_ranks"]):
        return "dummy"
    if knobs["prefill_every"] and j % knobs["prefill_every"] == 0:
        return "prefill"
    return "decode"


def _hot(knobs: dict, i: int, members: list[int], phases: list[str]) -> tuple[int | None, float]:
    """The group's hot rank in iteration ``i`` and its skew (routed tokens over the mean)."""
    if "warmup" in phases:  # the memory profile run routes its dummy tokens alike
        return members[-1], 3.0
    if "dummy" in phases:  # padding tokens (zeros) all pick the first experts
        return members[0], 3.0
    j = i - knobs["warmup"]
    window = round(knobs["persistence"] * (knobs["iterations"] - knobs["warmup"]))
    if knobs["hot_rank"] < 0 or not knobs["hot_from"] <= j < knobs["hot_from"] + window:
        return None, 1.0
    if knobs["hot_rank"] not in members:
        return None, 1.0
    at = members.index(knobs["hot_rank"])
    if knobs["rotate"]:
        at = (at + j) % len(members)
    return members[at], knobs["skew"]


def _routed(mean: int, members: list[int], hot: int | None, skew: float, rng: Random) -> dict:
    """Routed tokens per rank: the hot one ``skew`` times the mean, the rest share what is left
    (the total is the group's tokens times top-k, whoever gets them)."""
    n = len(members)
    if hot is None:
        shares = {r: 1.0 for r in members}
    else:
        skew = min(skew, float(n))
        rest = (n - skew) / (n - 1)
        shares = {r: skew if r == hot else rest for r in members}
    return {r: max(int(mean * s * rng.uniform(0.97, 1.03)), 1) for r, s in shares.items()}


def _dur(rng: Random, us: float, speed: float) -> int:
    return max(int(us * speed * rng.uniform(0.95, 1.05) * 100), 1) * 10


def slow_link(knobs: dict, world: int) -> dict[int, dict[int, float]]:
    """rank -> {peer: factor} of the slow links (``slow_link``: ``A-B``, or ``all``)."""
    text, factor = str(knobs["slow_link"]).strip(), knobs["link_factor"]
    if not text:
        return {}
    if text == "all":
        return {r: {p: factor for p in range(world) if p != r} for r in range(world)}
    a, _, b = text.partition("-")
    if not (a.isdigit() and b.isdigit()) or int(a) == int(b):
        raise ValueError(f"slow_link must be A-B (two ranks) or all, not {text!r}")
    return {int(a): {int(b): factor}, int(b): {int(a): factor}}


def simulate(knobs: dict, world: int) -> Plan:
    """Every rank's iterations, simulated group by group (see the module docstring)."""
    if knobs["slow_cause"] not in CAUSES:
        raise ValueError(f"slow_cause must be one of {', '.join(CAUSES)}")
    if knobs["tail_cause"] not in STALL_CAUSES:
        raise ValueError(f"tail_cause must be one of {', '.join(STALL_CAUSES)}")
    total = knobs["warmup"] + knobs["iterations"]
    plan = Plan([], {r: [] for r in range(world)})
    start = 0
    for i in range(total):
        plan.starts.append(start)
        ends = []
        for members in groups(world, knobs["ep"]):
            ends.append(_group_iteration(knobs, i, members, plan))
        start = max(ends) + 80 * US  # the scheduler, and the DP ranks' metadata sync
    return plan


def _group_iteration(knobs: dict, i: int, members: list[int], plan: Plan) -> int:
    """Simulate iteration ``i`` of one EP group; returns when its last rank is done."""
    rng = Random(i * 7919 + members[0])
    phases = [_phase(knobs, i, r) for r in members]
    prefill = "prefill" in phases
    tokens = knobs["chunk"] if prefill else knobs["batch"]
    path = _path(knobs, tokens)
    graph = knobs["graph"] and not prefill and "warmup" not in phases
    hot, skew = _hot(knobs, i, members, phases)
    slow, cause = knobs["slow_rank"], knobs["slow_cause"]
    j = i - knobs["warmup"]
    bigger = knobs["shared_factor"] if j in numbers(knobs["shared_at"]) else 1.0
    speed = {
        r: (knobs["throttle"] if (r == slow and cause == "throttle") else 1.0) * bigger
        for r in members
    }
    late = int(knobs["slow_us"] * US)
    tail = knobs["tail_rank"] if j in numbers(knobs["tail_at"]) else None
    tail = tail if tail in members and "warmup" not in phases else None
    stall = int(knobs["tail_ms"] * MS)
    links = slow_link(knobs, max(max(members) + 1, len(members)))
    its = {}
    for r, phase in zip(members, phases, strict=True):
        t, reqs = (tokens, 1) if phase == "prefill" else (knobs["batch"], knobs["batch"])
        its[r] = RankIteration(phase, t, reqs, path, graph, hot=hot)
    clock = {r: 15 * US for r in members}
    if tail is not None and knobs["tail_cause"] != "device":
        # the host is busy elsewhere before the forward: the device idles until it launches
        its[tail].stall = (clock[tail], stall, knobs["tail_cause"])
        clock[tail] += stall
    scale = max(1.0, tokens / 64)
    there, back = EXCHANGES[path]

    def run(r: int, spec: KernelSpec, us: float, shapes: str = "", extra: int = 0) -> None:
        dur = _dur(rng, us, speed[r]) + extra
        its[r].tasks.append(Task(spec, clock[r], dur, shapes))
        clock[r] += dur + 1 * US

    def exchange(spec: KernelSpec | str, transfer_us: float) -> dict[int, int]:
        """Every rank enters when its work is done; all leave when the last is in (and the
        data has moved, over the slowest link); a slow rank's link delays its own exit."""
        last = max(clock.values())
        transfer = _dur(rng, transfer_us, 1.0)
        slowest = max((f for r in members for f in links.get(r, {}).values()), default=1.0)
        waits = {}
        for r in members:
            extra = late if (r == slow and cause == "link") else 0
            end = last + int(transfer * slowest) + extra
            waits[r] = last - clock[r]
            slow_peers = {p: f for p, f in links.get(r, {}).items() if p in members}
            its[r].tasks.append(
                Task(spec, clock[r], end - clock[r], wait=waits[r], slow=slow_peers)
            )
            clock[r] = end + 2 * US
        return waits

    for layer in range(knobs["layers"]):
        slow_kernel = (
            stall
            if tail is not None and knobs["tail_cause"] == "device" and layer == knobs["tail_layer"]
            else 0
        )
        routed = _routed(tokens * knobs["topk"], members, hot, skew, rng)
        for r in members:
            it = its[r]
            attention = attention_kernel(
                Iteration("prefill" if it.phase == "prefill" else "decode", it.tokens,
                          it.requests, no_cache=it.phase == "prefill"),
                "v0.13", it.tokens, it.requests, knobs["shapes"],
            )  # fmt: skip
            run(r, RMSNORM, 6 * scale**0.5)
            run(r, MATMUL, 30 * scale, extra=slow_kernel if r == tail else 0)
            run(r, attention, 40 * scale**0.8, attention.shapes)
            run(r, MATMUL, 20 * scale)
            run(r, ADD, 3)
            run(r, RMSNORM, 6 * scale**0.5)
            run(r, GATING, 8 * scale**0.5)
            if path == "alltoall":
                run(r, PERMUTE, 6 + 0.004 * tokens * knobs["topk"])
        exchange(there, 25 + 0.01 * tokens)
        for r in members:
            n = routed[r]
            rows = _gmm_rows(path, its[r].graph, tokens, len(members), knobs["topk"], n)
            x = _gmm_shapes(rows, HIDDEN, INTER * 2) if knobs["shapes"] else ""
            if r == slow and cause == "host":
                clock[r] += late  # the device idles until the host launches the experts
            if path != "mc2":
                run(r, INIT_ROUTING, 5 + 0.01 * n)
            run(r, GMM, 20 + 0.12 * n, x)
            run(r, SWIGLU, 3 + 0.01 * n)
            run(r, GMM, 15 + 0.08 * n, _gmm_shapes(rows, INTER, HIDDEN) if knobs["shapes"] else "")
            if path == "allgather":
                run(r, UNPERMUTE, 5 + 0.01 * n)
        waits = exchange(back, 25 + 0.01 * tokens)
        for r in members:
            its[r].waits.append(waits[r])
            if path == "alltoall":
                run(r, UNPERMUTE, 6 + 0.004 * tokens * knobs["topk"])
    ends = []
    for r in members:
        run(r, RMSNORM, 6 * scale**0.5)
        run(r, MATMUL, 60 * scale)  # the LM head
        its[r].forward_end = clock[r]
        ends.append(clock[r] + (20 if its[r].phase in ("dummy", "warmup") else 90) * US)
        plan.ranks[r].append(its[r])
    return plan.starts[i] + max(ends)


# --------------------------------------------------------------------------- one rank's files


def _hashes(members: list[int]) -> dict[str, str]:
    """Communicator names (torch_npu's parallel_group_info keys) of a group's ranks."""
    base = 13_000_000_000_000_000_000 + 7 * members[0]
    return {"ep": str(base + 1), "mc2": str(base + 2), "dp": str(base + 3)}


def parallel_groups(knobs: dict, world: int, rank: int) -> dict:
    """parallel_group_info as torch_npu records it, vLLM's group names: the EP group
    (``group_name``), vllm-ascend's ``mc2`` group with the same members, the DP group, and the
    whole world (``mc2_group`` off: no mc2 group, as when MC2 is not in use)."""
    members = next(g for g in groups(world, knobs["ep"]) if rank in g)
    h = _hashes(members)
    info = {
        h["ep"]: (knobs["group_name"], members),
        h["mc2"]: ("mc2", members),
        h["dp"]: ("dp", members),
        "17522688603477080586": ("default_group", list(range(world))),
    }
    if not knobs["mc2_group"]:
        del info[h["mc2"]]
    return {
        key: {"group_name": name, "group_rank": ranks.index(rank), "global_ranks": ranks}
        for key, (name, ranks) in info.items()
    }


def run(tl: Timeline, knobs: dict) -> None:
    rw = tl.rw
    # an expert-parallel group has peers: one rank written is one profiled rank of two
    world, rank = max(len(rw.cfg.group), 2), rw.cfg.rank
    plan = simulate(knobs, world)
    members = next(g for g in groups(world, knobs["ep"]) if rank in g)
    # the EP group's communicator carries the exchanges (communication.json's group)
    rw.cfg.group, rw.cfg.group_hash = members, _hashes(members)["ep"]
    rw.cfg.metadata["parallel_group_info"] = parallel_groups(knobs, world, rank)
    base = tl.t
    if knobs["slow_rank"] == rank and knobs["slow_cause"] == "throttle":
        rw.ai_core_freq(base, int(NOMINAL_MHZ / knobs["throttle"]))
    skip = _profile_from(knobs).get(rank, 0)
    for start, it in list(zip(plan.starts, plan.ranks[rank], strict=True))[skip:]:
        _iteration(rw, base + start, it)
        rw.flush()
    tl.t = base + plan.starts[-1] + 2 * MS


def _profile_from(knobs: dict) -> dict[int, int]:
    """rank -> iterations its profile leaves out at the start (``profile_from``: ``R:N,...``)."""
    out = {}
    for item in str(knobs["profile_from"]).replace(" ", "").split(","):
        if item:
            rank, _, n = item.partition(":")
            out[int(rank)] = int(n)
    return out


def _iteration(rw: RankWriter, s: int, it: RankIteration) -> None:
    """One rank's iteration from ``s``: host markers, launches (or a graph replay), tasks."""
    host = s + 10 * US
    if it.stall is not None:
        at, dur, cause = it.stall
        host_stall(rw, s + at - 5 * US, dur, cause)
        host += dur
    if it.graph:
        rw.api("AscendCL@", "aclmdlRIExecuteAsync", host, 30 * US, mode="ACL_RTS")
        rw.cpu_op("acl_graph_replay", host - 2 * US, 34 * US)
        host += 40 * US
    for task in it.tasks:
        start = s + task.start
        if isinstance(task.spec, str):  # an HCCL op on the communication stream
            launch = None if it.graph else min(max(host, start - 30 * US), start - 20 * US)
            rw.collective(
                task.spec, start, task.dur, host_tid=rw.main_tid, stream=COMM_STREAM,
                host_start=launch if launch is not None else start - 20 * US, host_dur=15 * US,
                wait_ns=task.wait, count=it.tokens * HIDDEN, slow_peers=task.slow,
            )  # fmt: skip
            host = max(host, (launch or host) + 16 * US)
            continue
        spec = replace(task.spec, shapes=task.shapes or task.spec.shapes)
        conn = None
        if not it.graph:
            # the host runs ahead of the device, one launch after the other
            at = min(host, start - 3 * US)
            conn = rw.api("AscendCL@", spec.api, at, 2 * US, tid=rw.dequeue_tid, mode="ACL_NN")
            rw.h2d(conn, True, rw.dequeue_tid, at, rw.hw_pid, 2, start)
            host = at + 3 * US
        rw.kernel(
            2, spec.name, spec.op_type, spec.core, start, task.dur, conn=conn,
            model_id=GRAPH_MODEL_ID if it.graph else INVALID_MODEL,
            in_shapes=task.shapes or "1,4096", in_types=spec.dtypes,
        )  # fmt: skip
    fe = s + it.forward_end
    executed = max(host, s + 60 * US) + 5 * US
    if it.phase in ("dummy", "warmup"):
        end = fe + 10 * US
        rw.api("AscendCL@", "aclrtSynchronizeStream", executed, end - executed)
        if it.phase == "warmup":  # the run before the graph capture, then the capture
            rw.api("AscendCL@", "aclmdlRICaptureBegin", end + 2 * US, 10 * US)
            rw.api("AscendCL@", "aclmdlRICaptureEnd", end + 14 * US, 10 * US)
            end += 26 * US
        rw.python_function(f"{RUNNER}(3139): _dummy_run", s, end - s + 2 * US)
        if it.phase == "warmup":
            rw.python_function(f"{RUNNER}(3101): profile_run", s - 4 * US, end - s + 8 * US)
        else:
            rw.python_function(f"{WORKER}(1048): execute_dummy_batch", s - 2 * US, end - s + 6 * US)
        return
    rw.python_function(f"{RUNNER}(1838): execute_model", s - 3 * US, executed - s + 3 * US)
    rw.python_function(f"{WORKER}(656): execute_model", s - 6 * US, executed - s + 9 * US)
    sample = executed + 6 * US
    sampler = fe + 10 * US
    conn = rw.api("AscendCL@", SAMPLER.api, sample + 2 * US, 4 * US, tid=rw.dequeue_tid)
    rw.h2d(conn, True, rw.dequeue_tid, sample + 2 * US, rw.hw_pid, 2, sampler)
    rw.kernel(
        2, SAMPLER.name, SAMPLER.op_type, SAMPLER.core, sampler, 12 * US, conn=conn,
        in_shapes=SAMPLER.shapes,
    )  # fmt: skip
    synced = sampler + 16 * US
    rw.api("AscendCL@", "aclrtSynchronizeStream", sample + 8 * US, synced - sample - 8 * US)
    rw.api("AscendCL@", "aclrtMemcpy", synced + 2 * US, 25 * US)
    end = synced + 30 * US
    rw.python_function(f"{RUNNER}(2240): sample_tokens", sample, end - sample)
    rw.python_function(f"{WORKER}(693): sample_tokens", sample - 3 * US, end - sample + 6 * US)
