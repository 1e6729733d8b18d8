"""Scale benchmark: wall time and peak RSS of `traceanalyzer run` against ranks x MB per rank.

Not a test. Generates synthetic collections once into a cache (``--cache``), then runs the CLI
as a subprocess per case and executor, polling the RSS of the driver and of every worker process
(psutil, every 50 ms), and reads each worker's own peak RSS from ``ingest.json``. Figures are
also given as ratios against floors measured in the same run:

- *read floor*: reading every input byte once (``read()`` in 8 MB chunks, page cache warm, as
  the inputs were just generated or read);
- *single-rank floor*: ``run`` of one 50 MB rank with the local executor (the serial cost of a
  rank, used for the parallel efficiency: N x T1 / (jobs x T)).

Usage (the figures in docs/scale.md)::

    python benchmarks/bench_scale.py --cache /tmp/ta-bench/cache --work /tmp/ta-bench/work \\
        --cases 8x50,32x50,64x50,1x200 --executors processes,ray --jobs 2 \\
        --json docs/scale-bench.json

The fixed cost of a rank (``--small N``: N small synthetic ranks, ~120 KB each, with the
default executor; the all-files decode of them all is the floor; N/4 of the same ranks give
the cost per rank; the store's files and size on disk are counted against the input's)::

    python benchmarks/bench_scale.py --small 2000 --jobs 2 --json /tmp/small-2000.json --clean

Needs psutil (installed with ``traceanalyzer[ray]``; else ``pip install psutil``). The 64x50
case writes ~3.6 GB of input and ~1 GB of store: check ``df -h`` first; ``--clean`` removes the
stores afterwards (the input cache is kept for re-runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

SCENARIO = "inference-baseline"
KNOBS = {"tp_comm": 1}  # an all-reduce per layer: communication tables are not empty


@dataclass
class Sample:
    wall_s: float
    driver_rss_mb: float
    worker_rss_mb: float  # max over worker processes (pool workers, Ray workers)
    infra_rss_mb: float  # Ray's own daemons (raylet, GCS, ...), summed at their peak
    worker_self_peak_mb: float | None  # max peak_rss_mb the ingest workers report
    exit_code: int
    workers_seen: int = 0
    ingest_task_s: float = 0.0  # sum of the per-session ingest seconds (single-threaded work)
    statuses: dict[str, int] = field(default_factory=dict)
    cpu_s: float | None = None  # user + system CPU of the run and the workers it waited for
    executor: str = ""  # the executor the run says it chose (not quiet runs only)
    stages: dict[str, float] = field(default_factory=dict)  # seconds the run log prints per stage


@dataclass
class Case:
    ranks: int
    mb: int
    executor: str
    input_mb: float
    cold: Sample
    warm: Sample
    derived: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- inputs


def ensure_inputs(cache: Path, cases: list[tuple[int, int]]) -> dict[tuple[int, int], Path]:
    """Generate the largest collection per size once; smaller rank counts are hard-linked subsets."""
    from traceanalyzer.synth import generate

    roots: dict[tuple[int, int], Path] = {}
    for mb in sorted({mb for _, mb in cases}):
        most = max(r for r, m in cases if m == mb)
        base = cache / f"r{most}x{mb}"
        if not base.is_dir():
            print(f"generating {most} ranks x {mb} MB into {base} ...", file=sys.stderr)
            tmp = base.with_suffix(".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            generate(SCENARIO, tmp, ranks=most, target_mb=mb, **KNOBS)
            tmp.rename(base)
        dirs = sorted(base.iterdir())
        for ranks, m in cases:
            if m != mb:
                continue
            if ranks == most:
                roots[(ranks, mb)] = base
                continue
            sub = cache / f"r{ranks}x{mb}"
            if not sub.is_dir():
                sub.mkdir()
                for d in dirs[:ranks]:
                    shutil.copytree(d, sub / d.name, copy_function=os.link)  # no extra bytes
            roots[(ranks, mb)] = sub
    return roots


def input_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def tree_size(root: Path) -> dict[str, int]:
    """Files and directories under ``root`` (itself counted), their size on disk as ``du``
    gives it (st_blocks x 512 of every file and directory, a hard-linked file once; the
    directories' share apart: a block each) and the files' apparent bytes (st_size)."""
    files = dirs = on_disk = dirs_on_disk = apparent = 0
    seen: set[tuple[int, int]] = set()
    for here, _, names in os.walk(root):
        for path, is_dir in [(here, True)] + [(os.path.join(here, n), False) for n in names]:
            st = os.lstat(path)
            dirs, files = dirs + is_dir, files + (not is_dir)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            on_disk += st.st_blocks * 512
            dirs_on_disk += st.st_blocks * 512 if is_dir else 0
            apparent += 0 if is_dir else st.st_size
    return {
        "files": files,
        "dirs": dirs,
        "on_disk_bytes": on_disk,
        "dirs_on_disk_bytes": dirs_on_disk,
        "apparent_bytes": apparent,
    }


def read_floor(root: Path) -> float:
    """Seconds to read every byte under ``root`` once."""
    started = time.perf_counter()
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                while fh.read(8 << 20):
                    pass
    return time.perf_counter() - started


# The all-files decode of a whole collection in one process (bench_ingest.py's floor, for
# every rank): each trace_view.json by DuckDB's reader with bench_ingest's COLUMNS, each CSV as
# text columns, every other JSON (the side files, profiler_info, profiler_metadata) by
# json.loads; one connection, each table replaced by the next. The files are listed and the
# libraries imported before the clock starts.
DECODE_FLOOR = """
import json, os, resource, sys, time
import duckdb
root, columns = sys.argv[1], sys.argv[2]
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
def quoted(path):
    return "'" + path.replace("'", "''") + "'"
traces, csvs, sides = [], [], []
for here, _, names in sorted(os.walk(root)):
    for name in sorted(names):
        path = os.path.join(here, name)
        if name == 'trace_view.json':
            traces.append(path)
        elif name.endswith('.csv'):
            csvs.append(path)
        elif name.endswith('.json'):
            sides.append(path)
con = duckdb.connect()
t0, c0 = time.perf_counter(), cpu()
for path in traces:
    con.execute("CREATE OR REPLACE TABLE t AS SELECT * FROM read_json(" + quoted(path)
                + ", format='array', columns=" + columns + ")")
t1 = time.perf_counter()
for path in csvs:
    con.execute("CREATE OR REPLACE TABLE c AS SELECT * FROM read_csv(" + quoted(path)
                + ", all_varchar = true)")
t2 = time.perf_counter()
for path in sides:
    with open(path, 'rb') as fh:
        json.loads(fh.read())
t3 = time.perf_counter()
print('RESULT', json.dumps({'seconds': t3 - t0, 'cpu_seconds': cpu() - c0, 'traces_s': t1 - t0,
      'csvs_s': t2 - t1, 'side_jsons_s': t3 - t2, 'traces': len(traces), 'csvs': len(csvs),
      'side_jsons': len(sides)}))
"""


def decode_floor(root: Path) -> dict[str, Any]:
    """Seconds (and CPU seconds) of the all-files decode of every rank under ``root``."""
    from bench_ingest import COLUMNS

    proc = subprocess.run(
        [sys.executable, "-c", DECODE_FLOOR, str(root), COLUMNS], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the decode floor failed: {proc.stderr.strip()[-2000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


# --------------------------------------------------------------------------- measuring


class RssPoller(threading.Thread):
    """Peak RSS of the driver, of each worker process and of Ray's daemons, every 50 ms."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.driver = 0
        self.workers: dict[int, int] = {}
        self.infra: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.driver = max(self.driver, self.root.memory_info().rss)
                children = self.root.children(recursive=True)
            except psutil.Error:
                break
            for child in children:
                try:
                    rss = child.memory_info().rss
                    cmd = " ".join(child.cmdline())
                except psutil.Error:
                    continue
                # pool workers run multiprocessing.spawn; Ray workers are titled "ray::<task>"
                is_worker = "multiprocessing" in cmd or cmd.startswith("ray::")
                into = self.workers if is_worker else self.infra
                into[child.pid] = max(into.get(child.pid, 0), rss)
            self.stop.wait(0.05)


# The run log's lines that time a stage (the ingest's is what the wall time leaves).
STAGE_LINES = {
    "steps": re.compile(r"^steps and launches of \d+ ranks? in ([\d.]+) s", re.M),
    "rules": re.compile(r"^evaluated \d+ rule\(s\) in ([\d.]+) s", re.M),
    "overview": re.compile(r"^overview of \d+ ranks? in ([\d.]+) s", re.M),
}
EXECUTOR_LINE = re.compile(r"^executor: (\S+)", re.M)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cli(root: Path, out: Path, executor: str | None, jobs: int, quiet: bool = True) -> Sample:
    """One ``traceanalyzer run`` (``executor`` None: the CLI's default). Not ``quiet``: the run
    logs its stages, read into ``stages`` and ``executor``."""
    cmd = [sys.executable, "-m", "traceanalyzer.cli", "run", str(root), "--out", str(out)]
    cmd += ["--executor", executor] if executor else []
    # a JSON run logs nothing: not quiet, the terminal report (stdout, thrown away) it is
    cmd += ["-j", str(jobs)] + (["-q", "--format", "json"] if quiet else [])
    cpu0 = children_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    poller = RssPoller(proc.pid)
    poller.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    cpu = children_cpu() - cpu0  # the workers count where the run waited for them (not Ray's)
    poller.stop.set()
    poller.join()
    if proc.returncode not in (0, 1):
        print(err.decode()[-3000:], file=sys.stderr)
    reported, task_s, statuses = [], 0.0, {}
    ingest_doc = out / "ingest.json"
    if ingest_doc.is_file():
        for s in json.loads(ingest_doc.read_text())["sessions"]:
            statuses[s["status"]] = statuses.get(s["status"], 0) + 1
            if s.get("status") == "ingested":
                task_s += s.get("seconds") or 0.0
                if s.get("peak_rss_mb"):
                    reported.append(s["peak_rss_mb"])
    mb = 1 / 2**20
    log = err.decode(errors="replace")
    stages = {
        stage: float(m[1]) for stage, pattern in STAGE_LINES.items() if (m := pattern.search(log))
    }
    chosen = EXECUTOR_LINE.search(log)
    return Sample(
        wall_s=round(wall, 2),
        driver_rss_mb=round(poller.driver * mb, 1),
        worker_rss_mb=round(max(poller.workers.values(), default=0) * mb, 1),
        infra_rss_mb=round(sum(poller.infra.values()) * mb, 1),
        worker_self_peak_mb=max(reported) if reported else None,
        exit_code=proc.returncode,
        workers_seen=len(poller.workers),
        ingest_task_s=round(task_s, 2),
        statuses=statuses,
        cpu_s=round(cpu, 2),
        executor=chosen[1] if chosen else "",
        stages=stages,
    )


# --------------------------------------------------------------------------- report


def table(cases: list[Case], floors: dict[str, Any]) -> str:
    lines = [
        "| ranks x MB | input MB | executor | cold s | MB/s | x read floor | parallel eff. "
        "| driver RSS MB | max worker RSS MB | x single rank | warm s | warm/cold |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        d = c.derived
        worker = c.cold.worker_rss_mb or c.cold.driver_rss_mb
        lines.append(
            f"| {c.ranks} x {c.mb} | {c.input_mb:.0f} | {c.executor} | {c.cold.wall_s:.1f} "
            f"| {d['mb_per_s']:.1f} | {d['x_read_floor']:.0f} | {d['parallel_efficiency']:.0%} "
            f"| {c.cold.driver_rss_mb:.0f} | {worker:.0f} | {d['x_single_rank']:.2f} "
            f"| {c.warm.wall_s:.2f} "
            f"| {d['warm_fraction']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/ta-bench/cache"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/ta-bench/work"))
    ap.add_argument("--cases", default="8x50,32x50,64x50,1x200")
    ap.add_argument("--executors", default="processes,ray")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, help="Write all figures here.")
    ap.add_argument("--clean", action="store_true", help="Remove the stores afterwards.")
    ap.add_argument(
        "--realistic",
        type=int,
        metavar="N",
        help="Instead of --cases: N copies of the realistic rank (bench_inputs.py: the real "
        "export with every file tiled, a 200 MB trace) against that rank alone, with processes.",
    )
    ap.add_argument(
        "--small",
        type=int,
        metavar="N",
        help="Instead of --cases: N small ranks (bench_inputs.py: synth inference-baseline, 4 "
        "steps of 1 layer, ~120 KB each) with the default executor, against the all-files "
        "decode of them all; the per-rank fixed cost from N and N/4 ranks; the store's files "
        "and size against the input's.",
    )
    args = ap.parse_args(argv)
    if args.realistic:
        realistic(args)
        return
    if args.small is not None:
        if args.small < 2:
            ap.error("--small needs at least 2 ranks (its fixed cost compares N with N/4)")
        small(args)
        return

    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
    args.cache.mkdir(parents=True, exist_ok=True)
    roots = ensure_inputs(args.cache, cases + [(1, 50)])
    args.work.mkdir(parents=True, exist_ok=True)

    # floors, measured now on this machine
    single = roots[(1, 50)]
    read_floor(single)  # warm the page cache like the cases below
    single_read = read_floor(single)
    one = run_cli(single, args.work / "floor-1x50", "local", 1)
    floors = {
        "single_rank_mb": round(input_mb(single), 1),
        "single_rank_read_s": round(single_read, 3),
        "single_rank_local_run_s": one.wall_s,
        "single_rank_local_rss_mb": one.driver_rss_mb,
        "cpus": os.cpu_count(),
        "jobs": args.jobs,
    }
    print(json.dumps(floors), file=sys.stderr)

    results: list[Case] = []
    for ranks, mb in cases:
        root = roots[(ranks, mb)]
        size = input_mb(root)
        read_s = read_floor(root)
        for executor in args.executors.split(","):
            out = args.work / f"out-{ranks}x{mb}-{executor}"
            shutil.rmtree(out, ignore_errors=True)
            cold = run_cli(root, out, executor, args.jobs)
            warm = run_cli(root, out, executor, args.jobs)
            case = Case(ranks, mb, executor, round(size, 1), cold, warm)
            case.derived = {
                "read_s": round(read_s, 2),
                "mb_per_s": size / cold.wall_s,
                "s_per_rank": cold.wall_s / ranks,
                "x_read_floor": cold.wall_s / read_s,
                # against N x one 50 MB rank run alone with the local executor (start-up included)
                "x_single_rank": cold.wall_s / (ranks * one.wall_s * mb / 50),
                # share of jobs x wall spent in single-threaded rank ingest work: a lower bound,
                # as start-up, discovery and the rules count as idle
                "parallel_efficiency": cold.ingest_task_s / (args.jobs * cold.wall_s),
                "warm_fraction": warm.wall_s / cold.wall_s,
                "load_avg_1m": os.getloadavg()[0],
            }
            results.append(case)
            print(json.dumps(asdict(case)), file=sys.stderr)
            if args.clean:
                shutil.rmtree(out, ignore_errors=True)

    by = {(c.ranks, c.mb, c.executor): c for c in results}
    comparisons: dict[str, Any] = {}
    for executor in args.executors.split(","):
        a, b = by.get((64, 50, executor)), by.get((8, 50, executor))
        if a and b and b.cold.worker_rss_mb:
            comparisons[f"{executor}: worker RSS 64 / 8 ranks"] = round(
                a.cold.worker_rss_mb / b.cold.worker_rss_mb, 3
            )
            comparisons[f"{executor}: driver RSS 64 / 8 ranks"] = round(
                a.cold.driver_rss_mb / b.cold.driver_rss_mb, 3
            )
    for ranks, mb in cases:
        p, r = by.get((ranks, mb, "processes")), by.get((ranks, mb, "ray"))
        if p and r:
            comparisons[f"ray overhead per rank, {ranks}x{mb} (s)"] = round(
                (r.cold.wall_s - p.cold.wall_s) / ranks, 3
            )
    print(table(results, floors))
    print()
    for key, value in comparisons.items():
        print(f"- {key}: {value}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "floors": floors,
                    "cases": [asdict(c) for c in results],
                    "comparisons": comparisons,
                },
                indent=1,
            )
            + "\n"
        )


def realistic(args: argparse.Namespace, mb: int = 200) -> None:
    """The scale figures on realistic ranks: N of them against one, each run cold then warm.

    - throughput per core: N x the rank's MB / cold s / min(jobs, N) worker processes, against
      the single rank's MB / cold s / the cores its own threads share (goal: within 15%);
    - per-worker peak: the largest worker's (or the single run's driver) RSS (goal: flat);
    - warm re-run: the warm run's seconds against the cold run's (goal: a fixed cost, + <= 5%).
    """
    from bench_inputs import build_input, build_realistic_collection

    single, many = build_input(mb), build_realistic_collection(args.realistic, mb)
    args.work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {"ranks": args.realistic, "jobs": args.jobs, "rank_mb": mb}
    for label, root, executor in (("one", single, "local"), ("many", many, "processes")):
        read_floor(root)  # the page cache warm, as for the floor
        out = args.work / f"out-realistic-{label}"
        shutil.rmtree(out, ignore_errors=True)
        cold = run_cli(root, out, executor, args.jobs)
        warm = run_cli(root, out, executor, args.jobs)
        figures[label] = {
            "input_mb": round(input_mb(root), 1),
            "cold": asdict(cold),
            "warm": asdict(warm),
            "load_avg_1m": os.getloadavg()[0],
        }
        print(json.dumps({label: figures[label]}), file=sys.stderr)
        if args.clean:
            shutil.rmtree(out, ignore_errors=True)
    one, many_ = figures["one"], figures["many"]
    per_core_one = one["input_mb"] / one["cold"]["wall_s"] / (os.cpu_count() or 1)
    per_core_many = many_["input_mb"] / many_["cold"]["wall_s"] / min(args.jobs, args.realistic)
    worker = many_["cold"]["worker_rss_mb"] or many_["cold"]["driver_rss_mb"]
    figures["derived"] = {
        "throughput_per_core_x_single": round(per_core_many / per_core_one, 3),
        "worker_peak_x_single": round(worker / one["cold"]["driver_rss_mb"], 3),
        "warm_fraction": round(many_["warm"]["wall_s"] / many_["cold"]["wall_s"], 4),
        "warm_s_single": one["warm"]["wall_s"],
    }
    print(json.dumps(figures["derived"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


def _stages(sample: Sample) -> dict[str, float]:
    """The run's seconds by stage: those its log prints, and the ingest as what is left of the
    wall time (so it also holds the start-up, discovery and the reports)."""
    stages = {k: sample.stages[k] for k in STAGE_LINES if k in sample.stages}
    stages["ingest_and_rest"] = round(sample.wall_s - sum(stages.values()), 3)
    stages["ingest_tasks"] = sample.ingest_task_s  # the sessions' own seconds, summed
    return stages


def small(args: argparse.Namespace) -> dict[str, Any]:
    """The fixed cost of a rank: N small ranks run cold, then warm, against the all-files
    decode floor of them all (goal: cold <= 5x the floor); N/4 of the same ranks run cold, for
    the cost per rank (the slope) and the run's own (the intercept); the store's files and
    size on disk against the input's (goal: <= 1.5x)."""
    from bench_inputs import build_small_collection

    n = args.small
    quarter = max(1, n // 4)  # fewer than n: n >= 2
    root, part = build_small_collection(n), build_small_collection(quarter, of=n)
    args.work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {
        "ranks": n,
        "quarter_ranks": quarter,
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "executor": "default (auto)",
        "input": {"root": str(root), **tree_size(root)},
    }
    read_floor(root)  # the page cache warm, for the floor and the runs alike
    figures["floor"] = decode_floor(root)
    print(json.dumps({"floor": figures["floor"]}), file=sys.stderr)
    outs = {label: args.work / f"out-small-{label}" for label in ("n", "quarter")}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    read_floor(part)
    runs = {"quarter_cold": run_cli(part, outs["quarter"], None, args.jobs, quiet=False)}
    runs["cold"] = run_cli(root, outs["n"], None, args.jobs, quiet=False)
    runs["warm"] = run_cli(root, outs["n"], None, args.jobs, quiet=False)
    for label, sample in runs.items():
        figures[label] = asdict(sample)
        print(json.dumps({label: figures[label]}), file=sys.stderr)
        if sample.exit_code not in (0, 1) or set(sample.statuses) - {"ingested", "cached"}:
            raise RuntimeError(f"the {label} run failed: {figures[label]}")
    figures["load_avg_1m"] = os.getloadavg()[0]
    stores = {label: tree_size(out) for label, out in outs.items()}
    tables = {label: tree_size(out / "tables") for label, out in outs.items()}
    figures["store"] = {"all": stores["n"], "tables": tables["n"]}
    figures["quarter_store"] = {"all": stores["quarter"], "tables": tables["quarter"]}
    if args.clean:
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)

    cold, warm, q = runs["cold"], runs["warm"], runs["quarter_cold"]
    floor_s, inp = figures["floor"]["seconds"], figures["input"]
    slope = (cold.wall_s - q.wall_s) / (n - quarter)
    stages, q_stages = _stages(cold), _stages(q)
    figures["stages_s"] = stages
    figures["quarter_stages_s"] = q_stages
    figures["derived"] = {
        "cold_x_floor": round(cold.wall_s / floor_s, 2),  # goal <= 5
        "warm_x_floor": round(warm.wall_s / floor_s, 2),
        "floor_s_per_rank": round(floor_s / n, 5),
        "cold_s_per_rank": round(cold.wall_s / n, 5),
        # the fixed cost: from the cold runs of N and N/4 ranks
        "per_rank_s": round(slope, 5),
        "intercept_s": round(cold.wall_s - slope * n, 3),
        "stage_s_per_rank": {k: round(v / n, 5) for k, v in stages.items()},
        "stage_slope_s_per_rank": {
            k: round((v - q_stages.get(k, 0.0)) / (n - quarter), 5) for k, v in stages.items()
        },
        # goal <= 1.5 on disk
        "store_x_input_on_disk": round(stores["n"]["on_disk_bytes"] / inp["on_disk_bytes"], 3),
        "store_x_input_apparent": round(stores["n"]["apparent_bytes"] / inp["apparent_bytes"], 3),
        "store_files": stores["n"]["files"],
        "store_dirs": stores["n"]["dirs"],
        "store_files_per_rank": round(stores["n"]["files"] / n, 2),
        "store_dirs_per_rank": round(stores["n"]["dirs"] / n, 2),
        # a directory takes a block: the store's on-disk bytes that are directories
        "store_dirs_share_on_disk": round(
            stores["n"]["dirs_on_disk_bytes"] / stores["n"]["on_disk_bytes"], 3
        ),
        "table_files_per_rank": round(tables["n"]["files"] / n, 2),
        "input_files_per_rank": round(inp["files"] / n, 2),
        "warm_fraction": round(warm.wall_s / cold.wall_s, 4),
    }
    d = figures["derived"]
    figures["goals"] = {
        "cold <= 5x floor": d["cold_x_floor"] <= 5,
        "store on disk <= 1.5x input": d["store_x_input_on_disk"] <= 1.5,
    }
    print(json.dumps({k: figures[k] for k in ("derived", "goals")}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


if __name__ == "__main__":
    main()
