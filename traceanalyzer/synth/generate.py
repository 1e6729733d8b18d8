"""``generate()``: scenario name + knobs -> complete ``*_ascend_pt`` rank directories.

A rank usually has one profiler session; scenarios that profile several parts of
one run (``capture-growth --set profiled_rounds=1,45,100``) get one directory per
session, all of the same rank and process, later sessions later in time.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from random import Random
from typing import Any

from traceanalyzer.synth.fmt import EPOCH_NS
from traceanalyzer.synth.profiles import get_generation
from traceanalyzer.synth.rank import EXPORTS, RankConfig, RankWriter, check_export
from traceanalyzer.synth.scenarios import get_scenario
from traceanalyzer.synth.scenarios.timeline import Timeline

HOST = "npu-node0"
BASE_OSPID = 3096504
RANK_PID_STEP = 7919  # rank r's process is BASE_OSPID + r * RANK_PID_STEP
PROFILER_TURNAROUND_NS = 2_000_000_000
"""Between two sessions of one process: stop, parse and restart the profiler (about 2 s)."""


# The rank directories generate() writes: its host, a pid of its series, a timestamp
_OWN_DIR = re.compile(rf"{re.escape(HOST)}_([0-9]+)_[0-9]{{17}}_ascend_pt")
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"


class OutInUse(ValueError):
    """``--out`` holds rank directories already: another scenario there would mix with them."""


def _is_own(name: str) -> bool:
    match = _OWN_DIR.fullmatch(name)
    pid = int(match[1]) if match else -1
    return pid >= BASE_OSPID and (pid - BASE_OSPID) % RANK_PID_STEP == 0


def clear_out(out: Path, force: bool = False) -> list[Path]:
    """Make ``out`` ready for a scenario: refuse it (:class:`OutInUse`, naming them) when it
    holds rank directories, since the next run would read one mixed collection; with
    ``force``, remove the ones generate() writes (named for its host and process series) and
    return them, and refuse any other rank directory. Nothing else in ``out`` is touched."""
    try:
        entries = sorted(os.scandir(out), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    ranks = [
        e for e in entries
        if e.name.endswith("_ascend_pt") or os.path.isdir(os.path.join(e.path, OUTPUT_DIR))
    ]  # fmt: skip
    if not ranks:
        return []
    names = ", ".join(e.name for e in ranks[:5]) + (", ..." if len(ranks) > 5 else "")
    if not force:
        raise OutInUse(
            f"--out {out} already holds {len(ranks)} rank director(ies) ({names}): a scenario "
            "written beside them makes one mixed collection; --force replaces synth's own, or "
            "choose another --out"
        )
    foreign = [e.name for e in ranks if not (_is_own(e.name) and e.is_dir(follow_symlinks=False))]
    if foreign:
        raise OutInUse(
            f"--out {out} holds rank directories synth did not write ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}): --force replaces only synth's own; move "
            "them, or choose another --out"
        )
    for entry in ranks:
        shutil.rmtree(entry.path)
    return [Path(e.path) for e in ranks]


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
    force: bool | None = None,
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
    ``both``; the formats are two views of the same session. ``force``: None writes beside
    whatever ``out`` holds; False or True first applies :func:`clear_out` (refuse rank
    directories there, or replace synth's own), once every argument is known to be valid.
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
    check_export(gen, EXPORTS[export])
    out = Path(out)
    if force is not None:
        clear_out(out, force)
    out.mkdir(parents=True, exist_ok=True)
    group = list(range(ranks))  # one rank is a group of one: no peer profiled elsewhere
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
                ospid=BASE_OSPID + RANK_PID_STEP * rank,
                host=HOST,
                start_ns=start,
                group=group,
                schedule=sc.scheduled(plan.knobs),
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
