"""How often the derived phase of an iteration is the serving generator's, over a matrix; and
what deriving the steps costs a whole run.

    python benchmarks/bench_phases.py [--iterations 16] [--limit N]
    python benchmarks/bench_phases.py --cost [--mb 200] [--repeat 3]

Every combination of marker style (python functions, scopes, annotation, legacy annotation,
ProfilerStep, none, and two mixes), graph mode, attention-kernel style and traffic (plain,
speculative, without shapes, dummy batches with idle gaps, several prompts unchunked, a large
batch with small chunks): one rank each, generated, ingested, and its steps derived at the
default parameters. Prints the counts of right, unknown and wrong labels, the profiles whose
windows do not match the generator's iterations, and the commonest misses (docs/serving.md §5).

``--cost``: cold ``traceanalyzer run``s of one ``--mb`` MB rank (``inference-baseline`` with
``tp_comm=1``, the benchmark rank of docs/benchmarks/compare.md, and a ``serving`` rank of the
same size), each timed from outside; the run's own line "steps and launches ... (the steps and
their EP exchanges X s)" gives the derivation's time inside the same run, so the figure is a
same-run share.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from traceanalyzer.derived.tables import steps_of
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store
from traceanalyzer.synth import generate
from traceanalyzer.synth.scenarios import serving

MARKERS = ("python", "scopes", "annotation", "legacy", "profiler_step", "none")
MIXES = ("python,scopes", "profiler_step,python")
TRAFFIC: tuple[dict, ...] = (
    {},
    {"spec_tokens": 2},
    {"shapes": False},
    {"dummy_every": 5, "idle_every": 6},
    {"prompts": 3, "chunked": False},
    {"batch": 64, "chunk": 512},
)


def cases(iterations: int) -> list[dict]:
    return [
        {"markers": m, "graph": g, "style": s, "iterations": iterations, "layers": 1, **extra}
        for m, g, s, extra in itertools.product(
            (*MARKERS, *MIXES), serving.GRAPHS, serving.STYLES, TRAFFIC
        )
    ]


def truth(knobs: dict) -> list[str]:
    """The generator's phases of the iterations the markers can separate: a dummy batch runs
    no execute_model, and only the Python tracer (or device work alone) shows it apart."""
    phases = [it.phase for it in serving.plan({**serving.KNOBS, **knobs}, 0) if it.phase != "idle"]
    markers = knobs["markers"]
    if markers.startswith("profiler_step") or not ("python" in markers or markers == "none"):
        phases = [p for p in phases if p != "dummy"]  # inside the step or window around it
    return phases


CACHE = Path(os.environ.get("TRACEANALYZER_BENCH_CACHE", "/tmp/traceanalyzer-bench"))
# the run's own log line: "steps and launches of N ranks in X s (the steps Y s)"
STEPS_LINE = re.compile(
    r"steps and launches of \d+ ranks? in [0-9.]+ s \(the steps and their EP exchanges ([0-9.]+) s"
)


def cost(mb: int, repeat: int) -> None:
    cli = Path(sys.executable).with_name("traceanalyzer")
    for scenario, knobs in (("inference-baseline", {"tp_comm": 1}), ("serving", {})):
        rank = CACHE / f"phases_{scenario}_{mb}mb"
        if not rank.is_dir():
            generate(scenario, rank, ranks=1, target_mb=mb, **knobs)
        shares = []
        for _ in range(repeat):
            out = Path(tempfile.mkdtemp(prefix="bench-phases-run-"))
            started = time.perf_counter()
            done = subprocess.run(
                [str(cli), "run", str(rank), "--out", str(out / "o"), "--jobs", "1"],
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - started
            shutil.rmtree(out, ignore_errors=True)
            found = STEPS_LINE.search(done.stdout + done.stderr)
            if found:
                shares.append((float(found.group(1)), wall))
        for steps_s, wall in shares:
            print(
                f"{scenario} {mb} MB: run {wall:.2f} s, steps {steps_s:.2f} s ({steps_s / wall:.1%})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--limit", type=int, default=None, help="run only the first N cases")
    parser.add_argument("--cost", action="store_true", help="time the derivation in whole runs")
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.cost:
        cost(args.mb, args.repeat)
        return
    counts: collections.Counter[str] = collections.Counter()
    misses: collections.Counter[tuple] = collections.Counter()
    root = Path(tempfile.mkdtemp(prefix="bench-phases-"))
    try:
        for i, knobs in enumerate(cases(args.iterations)[: args.limit]):
            d = root / f"c{i}"
            generate("serving", d / "in", ranks=1, **knobs)
            ingest(d / "in", d / "out", jobs=1)
            steps = steps_of(Store.open(d / "out"), [0]).filter(pl.col("step_source") != "gap")
            got, want = steps["phase"].to_list(), truth(knobs)
            if len(got) != len(want):
                counts["profiles with other windows"] += 1
                continue
            counts["profiles"] += 1
            extra = {k: v for k, v in knobs.items() if k not in ("iterations", "layers")}
            for g, t in zip(got, want, strict=True):
                verdict = "right" if g == t else "unknown" if g == "unknown" else "wrong"
                counts[verdict] += 1
                if verdict != "right":
                    misses[(verdict, g, t, str(extra))] += 1
            shutil.rmtree(d)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    labelled = counts["right"] + counts["unknown"] + counts["wrong"]
    for key in ("profiles", "profiles with other windows", "right", "unknown", "wrong"):
        share = f" ({counts[key] / labelled:.1%})" if key in ("right", "unknown", "wrong") else ""
        print(f"{key}: {counts[key]}{share}")
    for (verdict, got, want, knobs), n in misses.most_common(20):
        print(f"  {n:4d} {verdict}: {got} for {want}  {knobs}")


if __name__ == "__main__":
    main()
