"""TA018 tail-iteration: iterations much slower than their phase's typical, each followed to the
rank the others waited on (its root) and what that rank did meanwhile."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import polars as pl

from traceanalyzer.kit import (
    NS,
    STEADY_PHASES,
    Evidence,
    FigureContext,
    Finding,
    KeyFigure,
    Mark,
    RuleContext,
    Tail,
    TailVerdict,
    analysed_window_ns,
    collective_split,
    compress_ranks,
    cost_over,
    moe_imbalance,
    phases,
    rule,
    tail_iterations,
)
from traceanalyzer.kit import text as fmt

EVIDENCE_TAILS, WAITERS_SHOWN, CHAINS_SHOWN = 4, 3, 8
CAUSE_TEXT = {
    "host": "its host was busy elsewhere while its device waited",
    "device": "a kernel ran longer than it usually does",
    "sync": "its host blocked in a synchronisation while its device waited",
    "comm": "its own communication took longer",
}
FIXES = {
    ("host", "gc"): "Python's garbage collector paused the host: freeze the long-lived objects "
    "after start-up (`gc.freeze()`), raise the collection thresholds (`gc.set_threshold`), or "
    "collect between requests, not inside an iteration",
    ("host", "compile"): "a kernel was compiled in the serving loop (a new shape reached a Triton "
    "or torch.compile kernel): warm up every batch and sequence shape at start-up (capture "
    "sizes), fix the dynamic dimension, or cache the compiled kernels "
    "(TRITON_CACHE_DIR on local disk, a persistent torch.compile cache)",
    ("host", "python"): "the host ran Python work inside the iteration on that rank only: move "
    "it out of the step (scheduling, logging, data loading), bind the process to its NUMA "
    "node's cores (CPU_AFFINITY_CONF=1) and look for other load on that host",
    ("host", "not told"): "the host was busy with something the profile does not show: "
    "profile with with_stack=True (Python frames) and gc_detect_threshold, and look for "
    "other load on that host",
    ("sync",): "the host blocked in a synchronisation (`.item()`, `.cpu()`, "
    "`torch.npu.synchronize()`) waiting for a long task on another stream: move the copy off "
    "the critical path (non_blocking copies, pinned memory) or the sync out of the iteration",
    ("device",): "one kernel ran much longer than its own median on that rank: check its "
    "input shapes in that iteration, the device's frequency and health (aicore-freq-throttle), "
    "and whether it fell back to the AI CPU",
    ("comm",): "the rank's own communication took longer: check its links (slow-link) and "
    "whether it waited for a rank outside the profile (profile every rank of the group)",
}


@rule(
    id="TA018",
    name="tail-iteration",
    severity="warning",
    scope="global",
    summary="Iterations much slower than their phase's typical, followed to the rank the others "
    "waited on (its root) and what it did: a host function (Python frames, a compile, a GC), "
    "a synchronisation, a slow kernel, or its own communication.",
    fix="Fix the root rank's late work named in the finding: the others only wait for it.",
    # a hot expert rank's lateness is moe-load-imbalance's: asked who owns which tail
    uses=[tail_iterations, moe_imbalance],
    requires=[phases(*STEADY_PHASES)],
    units={"what_if_ns": NS, "median_ns": NS, "wait_ns": NS},
)
def tail_iteration(ctx: RuleContext) -> Iterator[Finding]:
    """
    ## What it detects
    Engine iterations much slower than their phase's typical one (a TPOT spike), and where the
    excess comes from. An iteration is the same engine step on every rank of a group: the
    ranks' steps (the `steps` table's) are matched through the collectives they share (the
    `collectives` table, matched by name or by order), not by their index, so ranks whose
    profiles start at different iterations still line up; a rank that shares no collective is
    a group of its own (a single-rank profile). Its time is the median of its ranks' step
    times. Per phase (`prefill`, `decode`, ...; at least `min_iterations` of them), an
    iteration is a **tail** when its time's robust z-score exceeds `tail_z` and it is at least
    `min_excess` and `min_excess_us` above the phase's median (at most `max_tail_share` of a
    phase's iterations: more is a phase of two kinds, not tails).

    Each tail is followed to its **root**: in every collective instance the rank that waited
    least arrived last, and the others' wait beyond its own is attributed to it; the root is
    the rank the others waited on most in the iteration (a rank outside the profile when the
    last profiled arriver itself waited on a plane to it). It must explain at least
    `root_share` of the excess: otherwise every rank was slower alike (a bigger batch, a slow
    link) and nothing is reported. On a rank alone the root is the rank.

    What the root did, in its **late window** (from its previous collective to the one it was
    late at; alone: the iteration): kernels beyond their own median time (`device`, the slow
    kernel named), or its device idle while its host was elsewhere: blocked in a
    synchronisation (`sync`), or running Python frames, a compile or a garbage collection
    (`host`, the innermost frame named); else its own communication took longer (`comm`).
    Findings are grouped by root rank and cause. Metrics: `root_rank`, `cause`, `windows`
    (`[start_ns, end_ns]` of each tail iteration on the root's clock), `cost_ns` (their time
    beyond the phase's median, summed), `what_if_ns` (their time had the root not been late),
    `waiting_ranks` and `wait_ns` (the others' wait for the root, mean over them, summed).
    This finding owns the waits inside its tail iterations: `collective-straggler` leaves
    them out; a tail whose root is a hot expert rank in that step is `moe-load-imbalance`'s
    (left out here); `slow-rank` compares median step times, which tails do not move.

    ## Why it matters
    In DP+EP serving every rank meets every other in each MoE layer's exchange, so one rank's
    hiccup stalls all of them: a Triton recompile, a GC pause or one slow kernel on one rank
    shows on every other rank as a long dispatch or all-reduce, in another file. The mean step
    time hides a few spikes; the median ignores them; users see them as TPOT p99.

    ## How to fix
    On the root rank, the late work named:
    - `host` / gc: freeze long-lived objects after start-up (`gc.freeze()`), raise the
      collection thresholds, collect outside iterations;
    - `host` / compile: warm up every shape at start-up, cache compiled kernels
      (`TRITON_CACHE_DIR`, a persistent compile cache);
    - `host` / Python frames: move that work out of the iteration, bind cores
      (`CPU_AFFINITY_CONF=1`);
    - `sync`: remove the blocking `.item()` / `.cpu()` / `synchronize()` from the iteration;
    - `device`: check the slow kernel's shapes, the device's frequency and AI CPU fallbacks;
    - `comm`: check the rank's links (`slow-link`), profile every rank of the group.

    ## Example
    ```
    TA018 tail-iteration [warning] rank 2 (decode)
    rank 2 makes 3 of 24 decode iterations 2.01 ms slower (2.6x the median 1.24 ms): the
    other 3 ranks wait for it in MoeDistributeDispatchV2 while its host runs a garbage
    collection (GC, 2 ms) [costs 6.03 ms]
    ```
    Silent on a slowdown every rank shares with no late rank (a bigger batch, a slow link:
    no rank waits for another), on the normal variation of a phase, and on a phase of two
    kinds of iteration. A single-rank profile gets the same analysis, without waiters.

    ## References
    - vllm-ascend #14324 (Triton recompile on one rank: ~2 s TPOT spikes,
      `MoeDistributeDispatchV2` 2.1 s on the others); vLLM RFC #52777 (collective time split
      into transfer, arrival skew and host skew).
    - HTA critical path analysis (single-rank); msprof-analyze `slow_rank` (step times only).
    """
    verdict = ctx.once(_verdict)
    for phase, why in sorted(verdict.skipped.items()):
        if verdict.judged:
            ctx.note(f"{phase}: not judged: {why}")
        else:  # no phase could be judged: "could not judge", never "clean"
            ctx.inconclusive(f"{phase}: not judged: {why}")
    if verdict.shared:
        by_phase: dict[str, list[float]] = {}
        for _, phase, excess in verdict.shared:
            by_phase.setdefault(phase, []).append(excess)
        for phase, excesses in sorted(by_phase.items()):
            ctx.note(
                f"{phase}: {fmt.count(len(excesses), 'iteration')} slower by "
                f"{fmt.duration(sum(excesses) / len(excesses))} on average on every rank "
                "alike, no rank late for the others (a bigger batch or a slow link): no root",
                iterations=len(excesses),
            )
    tails = _not_moe(ctx, verdict.tails)
    if not tails:
        judged = ", ".join(f"{n} {ph}" for ph, n in sorted(verdict.judged.items()))
        if judged:
            ctx.note(f"no tail iteration with a root among {judged} iterations")
        return
    windows = analysed_window_ns(ctx)
    groups: dict[tuple[int, str], list[Tail]] = {}
    for t in tails:
        groups.setdefault((t.root, t.cause), []).append(t)
    offsets = verdict.alignment.offsets if verdict.alignment else {}
    for (root, cause), tails in sorted(groups.items()):
        yield _finding(ctx, root, cause, tails, verdict.judged, windows, offsets)


def _verdict(ctx: RuleContext) -> TailVerdict:
    """The tails, once for the detection and the key figures (a fixture's store keeps
    nothing)."""
    return tail_iterations(ctx)


def _not_moe(ctx: RuleContext, tails: list[Tail]) -> list[Tail]:
    """``tails`` less those whose root is a hot expert rank in that iteration's step:
    moe-load-imbalance owns that wait (its finding names the rank and the expert load)."""
    if not tails:  # nothing to leave out: the MoE verdict is not derived for it
        return tails
    moe = moe_imbalance(ctx)
    if not moe.findings:
        return tails
    hot = {
        (int(r), str(s), int(n))
        for f in moe.findings
        for r, s, n in f.hot_rows.select("rank", "session", "step").iter_rows()
    }
    kept = [
        t for t in tails
        if (t.root, t.windows.get(t.root, ("",))[0], t.steps.get(t.root, -1)) not in hot
    ]  # fmt: skip
    if len(kept) < len(tails):
        ctx.note(
            f"{len(tails) - len(kept)} tail iteration(s) whose root is a hot expert rank left "
            "out: moe-load-imbalance owns their waits"
        )
    return kept


def _what(tails: list[Tail]) -> tuple[str, str]:
    """The commonest kind of late work and its commonest name."""
    kinds: dict[tuple[str, str], int] = {}
    for t in tails:
        if t.work is not None:
            key = (t.work.what, t.work.name)
            kinds[key] = kinds.get(key, 0) + 1
    if not kinds:
        return "not told", ""
    return max(kinds, key=lambda k: (kinds[k], k))


def _fix(cause: str, what: str) -> str:
    return FIXES.get((cause, what)) or FIXES.get((cause,)) or FIXES[("host", "not told")]


def _late_text(t_cause: str, what: str, name: str) -> str:
    if t_cause == "device":
        return f"kernel `{name}` runs longer than its median"
    if t_cause == "sync":
        return f"its host blocks in `{name}`"
    if t_cause == "host":
        if what == "gc":
            return "its host runs a garbage collection"
        if what == "compile":
            return f"its host compiles (`{name}`)"
        if what == "python":
            return f"its host runs `{name}`"
        return "its host does not launch (nothing in the profile says why)"
    return "it waits in its own communication"


def _finding(
    ctx: RuleContext,
    root: int,
    cause: str,
    tails: list[Tail],
    judged: dict[str, int],
    windows: dict[int, int],
    offsets: dict[int, int],
) -> Finding:
    tails = sorted(tails, key=lambda t: t.windows.get(root, next(iter(t.windows.values())))[1])
    phase_names = sorted({t.phase for t in tails})
    cost = sum(t.excess_ns for t in tails)
    what_if = sum(t.what_if_ns for t in tails)
    wait_total = sum(sum(t.waits.values()) / max(len(t.waits), 1) for t in tails)
    waiting = sorted({r for t in tails for r in t.waits})
    median = sum(t.median_ns for t in tails) / len(tails)
    per = cost / len(tails)
    what, name = _what(tails)
    profiled = all(t.profiled for t in tails)
    on = root if profiled else min(next(iter(t.windows)) for t in tails)
    spans = [t.windows.get(on) or next(iter(t.windows.values())) for t in tails]
    iterations_of = " + ".join(f"{judged.get(ph, 0)} {ph}" for ph in phase_names)
    late_ops = sorted({t.late_op["kind"] for t in tails if t.late_op})
    where = f" in {fmt.join(late_ops, 2)}" if late_ops else ""
    who = f"rank {root}" + ("" if profiled else " (outside the profile)")
    if waiting:
        others = (
            f"rank {waiting[0]} waits" if len(waiting) == 1
            else f"the other {len(waiting)} ranks wait"
        )  # fmt: skip
        title = (
            f"{who} makes {len(tails)} of {iterations_of} iterations {fmt.duration(per)} slower "
            f"({(median + per) / median:.1f}x the median {fmt.duration(median)}): {others} for "
            f"it{where} while {_late_text(cause, what, name)}"
        )
    else:
        title = (
            f"{who}: {len(tails)} of {iterations_of} iterations {fmt.duration(per)} slower "
            f"({(median + per) / median:.1f}x the median {fmt.duration(median)}) while "
            f"{_late_text(cause, what, name)}"
        )
    lines = [
        f"{len(tails)} {'/'.join(phase_names)} iteration(s) take {fmt.duration(per)} more than "
        f"their phase's median ({fmt.duration(median)}): {fmt.duration(cost)} in all.",
    ]
    if waiting:
        lines.append(
            f"The other ranks ({compress_ranks(waiting)}) wait for {who} in them: "
            f"{fmt.duration(wait_total)} each in all (mean over them){where}. Had it not been "
            f"late they would have taken {fmt.duration(what_if)} instead of "
            f"{fmt.duration(cost + sum(t.median_ns for t in tails))}."
        )
    if not profiled:
        lines.append(
            f"Rank {root} is not in the profile: the last profiled rank to arrive itself "
            f"waited on its plane to rank {root}. Profile every rank of the group to see why."
        )
    else:
        lines.append(
            f"Meanwhile on rank {root}: {CAUSE_TEXT[cause]} ({_late_text(cause, what, name)})."
        )
    for t in tails[:EVIDENCE_TAILS]:
        work = t.work
        doing = (
            f": {work.name or work.what} {fmt.duration(work.dur_ns)}" if work is not None else ""
        )
        lines.append(
            f"- step {t.steps.get(on, '?')} of rank {on} ({t.phase}): "
            f"{fmt.duration(t.iteration_ns)} (+{fmt.duration(t.excess_ns)}), rank {root} late "
            f"by {fmt.duration(t.lateness_ns)}{doing}"
        )
    return ctx.finding(
        rank=root if profiled else on,
        sessions=sorted({s[0] for s in spans}),
        title=title,
        message="\n".join(lines),
        location={"root_rank": root, "cause": cause},
        metrics={
            "root_rank": root,
            "cause": cause,
            "late_work": what,
            "late_name": name,
            "windows": [[s[1], s[2]] for s in spans],
            "tail_iterations": len(tails),
            "what_if_ns": what_if,
            "median_ns": median,
            "wait_ns": wait_total,
            "waiting_ranks": waiting,
        },
        evidence=list(_evidence(tails, root, on)),
        fix=f"On rank {root}: {_fix(cause, what)}.",
        series=_series(tails, on, offsets),
        score=cost,
        phases=phase_names,
        cost=cost_over(cost, windows.get(on)),
        cost_ranks=[on],
    )


def _evidence(tails: list[Tail], root: int, on: int) -> Iterable[Evidence]:
    """Per tail (the worst first): the root's late work, its late collective and the waiting
    ranks' longest waits."""
    for t in sorted(tails, key=lambda t: -t.excess_ns)[:EVIDENCE_TAILS]:
        w = t.work
        if w is not None and w.dur_ns:
            yield Evidence(
                rank=w.rank, session=w.session, name=w.name or w.what, process=w.process,
                thread=w.thread, start_ns=w.start_ns, dur_ns=w.dur_ns,
                detail=f"late work ({w.cause}: {w.what}) in an iteration "
                f"{fmt.duration(t.excess_ns)} over its phase's median",
            )  # fmt: skip
        op = t.late_op
        if op is not None:
            yield Evidence(
                rank=op["rank"], session=op["session"], name=op["name"],
                start_ns=op["start_ns"], dur_ns=op["end_ns"] - op["start_ns"],
                detail=f"arrives last (rank {root}): the others wait for it",
            )  # fmt: skip
        for rank, wait in sorted(t.waits.items(), key=lambda kv: -kv[1])[:WAITERS_SHOWN]:
            session, start, end = t.windows.get(rank, ("", None, None))
            yield Evidence(
                rank=rank, session=session, name="waits for rank " + str(root),
                start_ns=start, dur_ns=None if start is None else end - start,
                detail=f"waits {fmt.duration(wait)} in its collectives in this iteration",
            )  # fmt: skip


def _series(tails: list[Tail], on: int, offsets: dict[int, int]) -> dict[str, list[Any]]:
    """Per tail its times (the figure), and ``chain``: per waiting rank its wait in the
    collective the root was late at, and the root's late work on that rank's clock (the
    overlay's arrows)."""
    chain = []
    for t in tails:
        work = t.work
        for rank, op in sorted(t.waiter_ops.items())[:CHAINS_SHOWN]:
            seen = None  # the root's late work, on the waiting rank's clock
            if work is not None and rank in offsets and work.rank in offsets:
                seen = work.start_ns + offsets[work.rank] - offsets[rank]
            chain.append(
                [rank, op["session"], op["name"], op["start_ns"], op["end_ns"] - op["start_ns"],
                 seen, work.dur_ns if work else None, work.name or work.what if work else None,
                 work.rank if work else None, work.session if work else None,
                 work.start_ns if work else None]
            )  # fmt: skip
    return {
        "start_ns": [(t.windows.get(on) or next(iter(t.windows.values())))[1] for t in tails],
        "iteration_ns": [t.iteration_ns for t in tails],
        "median_ns": [t.median_ns for t in tails],
        "lateness_ns": [t.lateness_ns for t in tails],
        "chain": chain,
    }


@tail_iteration.figure(
    caption="Each tail iteration's time against its phase's median (grey), and how much of it "
    "the others waited for the root (red)."
)
def _figure(fig: FigureContext) -> Any:
    series = fig.finding.get("series") or {}
    if not series.get("iteration_ns"):
        return None
    figure, (ax,) = fig.new(7.0, 2.6)
    x = [str(i + 1) for i in range(len(series["iteration_ns"]))]
    ax.bar(x, [v / 1e6 for v in series["iteration_ns"]], color="#4f81bd", width=0.6,
           label="iteration")  # fmt: skip
    ax.bar(x, [v / 1e6 for v in series["lateness_ns"]], color="#c0504d", width=0.35,
           label="root's lateness")  # fmt: skip
    ax.plot(x, [v / 1e6 for v in series["median_ns"]], color="#9ca3af", label="phase median")
    ax.set_xlabel("tail iteration (in time order)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7, frameon=False)
    return figure


@tail_iteration.marks
def _marks(finding: dict[str, Any]) -> Iterable[Mark]:
    """The evidence, and the chain of waits: on the root, an arrow from its late work to the
    collective it was late at; on each waiting rank, its wait in that collective with an arrow
    to the root's late work drawn on that rank's clock (its own trace), and one to the root's
    own mark (the overlay of every rank)."""
    chain = (finding.get("series") or {}).get("chain") or []
    waiters: dict[tuple[Any, Any], list[int]] = {}  # the root's late work -> who waited for it
    for link in chain:
        waiters.setdefault((link[8], link[10]), []).append(int(link[0]))
    then: dict[int, str] = {}  # rank -> the arrow from its latest late work to its collective
    for e in finding.get("evidence") or []:
        if e.get("start_ns") is None:
            continue
        detail = e.get("detail") or ""
        key, flows_in, flows_out = (e["rank"], e["start_ns"]), [], []
        if detail.startswith("late work"):
            flows_in = [f"work:{key[0]}:{key[1]}:{w}" for w in waiters.get(key, [])]
            then[key[0]] = f"then:{key[0]}:{key[1]}"
            flows_out = [then[key[0]]]
        elif detail.startswith("arrives last") and key[0] in then:
            flows_in = [then.pop(key[0])]
        yield Mark(
            rank=int(e["rank"]), session=str(e.get("session") or ""), name=e.get("name") or "",
            start_ns=int(e["start_ns"]), dur_ns=e.get("dur_ns"),
            track="root's late work" if detail.startswith("late work") else "waits",
            args={"detail": detail}, flows_in=tuple(flows_in), flows_out=tuple(flows_out),
        )  # fmt: skip
    for i, link in enumerate(chain):
        rank, session, name, start, dur, seen, work_dur, work_name, root, _, work_start = link
        here = f"chain:{i}"
        flows_out = [here] + (
            [f"work:{root}:{work_start}:{rank}"] if work_start is not None else []
        )
        yield Mark(
            rank=int(rank), session=str(session), name=f"waits in {name}", start_ns=int(start),
            dur_ns=dur, track="waits for the root", args={"root": root},
            flows_out=tuple(flows_out),
        )  # fmt: skip
        if seen is not None:
            yield Mark(
                rank=int(rank), session=str(session),
                name=f"rank {root}: {work_name} (its clock, aligned)", start_ns=int(seen),
                dur_ns=work_dur, track="the root's late work", flows_in=(here,),
            )  # fmt: skip


@tail_iteration.key_figures(
    KeyFigure("tail_iterations", "tail iterations this rank is the root of", unit="count"),
    KeyFigure(
        "tail_cost_ns",
        "tail iterations' time beyond their phase's median, as root",
        better="lower",
        unit="ns",
    ),  # fmt: skip
    KeyFigure(
        "collective_arrival_ns",
        "collective time waiting for the last rank, per step",
        better="lower",
        unit="ns",
    ),  # fmt: skip
    KeyFigure(
        "collective_transfer_ns", "collective time moving data, per step", better="lower", unit="ns"
    ),  # fmt: skip
    KeyFigure(
        "collective_idle_ns",
        "collective time with no task running, per step",
        better="lower",
        unit="ns",
    ),  # fmt: skip
)
def _key_figures(ctx: RuleContext) -> pl.DataFrame:
    """Per rank: the tails it is the root of and their cost; its collectives' split per step."""
    verdict = ctx.once(_verdict)
    roots: dict[int, list[float]] = {}
    for t in verdict.tails:
        roots.setdefault(t.root, []).append(t.excess_ns)
    split = collective_split(ctx)
    tails = pl.DataFrame(
        {
            "rank": list(roots),
            "tail_iterations": [len(v) for v in roots.values()],
            "tail_cost_ns": [sum(v) for v in roots.values()],
        },
        schema={"rank": pl.Int32, "tail_iterations": pl.Int64, "tail_cost_ns": pl.Float64},
    )
    return split.join(tails, on="rank", how="full", coalesce=True).with_columns(
        pl.col("tail_iterations").fill_null(0), pl.col("tail_cost_ns").fill_null(0.0)
    )
