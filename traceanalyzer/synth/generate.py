"""``generate()``: scenario name + knobs -> complete ``*_ascend_pt`` rank directories.

A rank usually has one profiler session; scenarios that profile several parts of
one run (``capture-growth --set profiled_rounds=1,45,100``) get one directory per
session, all of the same rank and process, later sessions later in time.
"""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import Any

from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import EXPORTS, RankConfig, RankWriter
from traceanalyzer.synth.scenarios import get_scenario
from traceanalyzer.synth.scenarios.timeline import Timeline

HOST = "npu-node0"
BASE_OSPID = 3096504
PROFILER_TURNAROUND_NS = 2_000_000_000
"""Between two sessions of one process: stop, parse and restart the profiler (about 2 s)."""


def generate(
    scenario: str,
    out: Path,
    *,
    ranks: int = 1,
    seed: int = 0,
    generation: str = "g2",
    level: int = 1,
    target_mb: float | None = None,
    export: str = "text",
    **knobs: Any,
) -> list[Path]:
    """Write the rank directories of ``scenario`` under ``out`` and return them.

    One directory per rank, or per rank and session when the scenario splits the run
    into several profiler sessions; returned rank by rank, each rank's in time order.

    The same arguments always give the same bytes: all randomness comes from
    ``random.Random`` seeded per rank, and no clock, uuid or hash order is used.
    ``target_mb`` pads each rank with decode steps until its trace_view.json
    reaches about that size. ``export`` is torch_npu's export type: ``text`` (trace_view.json
    and the CSVs), ``db`` (``ascend_pytorch_profiler_{rank}.db`` and ``analysis.db``) or
    ``both``; the formats are two views of the same session.
    """
    if level not in (0, 1, 2):
        raise ValueError(f"level must be 0, 1 or 2, not {level!r}")
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    if export not in EXPORTS:
        raise ValueError(f"export must be one of {', '.join(EXPORTS)}, not {export!r}")
    sc = get_scenario(scenario)
    params = sc.resolve(knobs)
    plans = sc.sessions(params)  # also validates session knobs, before anything is written
    gen = get_generation(generation)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    group = list(range(max(ranks, 2)))
    target = int(target_mb * 1_000_000) if target_mb else None
    dirs = []
    for rank in range(ranks):
        rng = Random(seed * 100_003 + rank)
        first = EPOCH_NS + 1_000_000 * rank  # ranks start a millisecond apart
        start, prev_len = first, 0
        for i, plan in enumerate(plans):
            if i:  # after the previous session, its turnaround and the unprofiled work
                start += prev_len + PROFILER_TURNAROUND_NS + int(plan.idle_before * prev_len)
                start += rng.randrange(1_000_000)
            cfg = RankConfig(
                rank=rank,
                generation=gen,
                level=level,
                ospid=BASE_OSPID + 7919 * rank,
                host=HOST,
                start_ns=start,
                group=group,
                schedule=sc.schedule(plan.knobs),
                metadata=sc.metadata(plan.knobs),
                env=sc.env,
                clock_offset_ns=start - first,
                export=EXPORTS[export],
            )
            rw = RankWriter(out, cfg)
            tl = Timeline(rw, rng, start + 50_000)
            sc.run(tl, plan.knobs)
            tl.pad_to(target)
            dirs.append(rw.close())
            prev_len = rw.session_end - start
    return dirs
