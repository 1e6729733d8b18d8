"""``generate()``: scenario name + knobs -> complete ``*_ascend_pt`` rank directories."""

from __future__ import annotations

from pathlib import Path
from random import Random
from typing import Any

from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import RankConfig, RankWriter
from traceanalyzer.synth.scenarios import get_scenario
from traceanalyzer.synth.scenarios.timeline import Timeline

HOST = "npu-node0"
BASE_OSPID = 3096504


def generate(
    scenario: str,
    out: Path,
    *,
    ranks: int = 1,
    seed: int = 0,
    generation: str = "g2",
    level: int = 1,
    target_mb: float | None = None,
    **knobs: Any,
) -> list[Path]:
    """Write ``ranks`` rank directories of ``scenario`` under ``out`` and return them.

    The same arguments always give the same bytes: all randomness comes from
    ``random.Random`` seeded per rank, and no clock, uuid or hash order is used.
    ``target_mb`` pads each rank with decode steps until its trace_view.json
    reaches about that size.
    """
    if level not in (0, 1, 2):
        raise ValueError(f"level must be 0, 1 or 2, not {level!r}")
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    sc = get_scenario(scenario)
    params = sc.resolve(knobs)
    gen = get_generation(generation)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    group = list(range(max(ranks, 2)))
    target = int(target_mb * 1_000_000) if target_mb else None
    dirs = []
    for rank in range(ranks):
        rng = Random(seed * 100_003 + rank)
        start = EPOCH_NS + 1_000_000 * rank  # ranks start a millisecond apart
        cfg = RankConfig(
            rank=rank,
            generation=gen,
            level=level,
            ospid=BASE_OSPID + 7919 * rank,
            host=HOST,
            start_ns=start,
            group=group,
            schedule=sc.schedule(params),
            metadata=sc.metadata(params),
            env=sc.env,
        )
        rw = RankWriter(out, cfg)
        tl = Timeline(rw, rng, start + 50_000)
        sc.run(tl, params)
        tl.pad_to(target)
        dirs.append(rw.close())
    return dirs
