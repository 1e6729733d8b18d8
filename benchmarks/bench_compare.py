"""Our whole cold `run` against the peers' tools on the same large rank, side by side.

    python benchmarks/bench_compare.py [--mb 200] [--repeat 3] [--out docs/benchmarks/compare.md]
    python benchmarks/bench_compare.py --render docs/benchmarks/compare.json   # text only

The measures are saved beside the page (``compare.json``): ``--render`` writes the page again
from them with this script's text, measuring nothing.

The input is the rank that ``bench_inputs.py`` builds (the real G2 Level1 rank-0 export with
EVERY file tiled by one factor to a ``--mb`` MB trace_view.json, the side files keeping their
real share, cached); a serving rank of the same size (``traceanalyzer synth serving``) is run
against its own floor too. Every case runs in a fresh child process, timed
from outside, with that process's own peak RSS (``wait4``: the largest process of the case,
children included):

- ``traceanalyzer run RANK --out FRESH``: the whole cold run (discovery, ingest into a new
  Parquet store, every rule, every report), default options, interpreter start-up included;
- ``msprof-analyze advisor all -d COPY -o TMP``: the Ascend analyzer's every advisor analyzer,
  on a hard-linked copy of the rank in a temp dir (which is also its cwd), so nothing it writes
  can land in the input; interpreter start-up included;
- HTA's ``TraceAnalysis(trace_dir=...)``: its parse of the same trace, timed alone (imports
  done before the clock starts). HTA reads Kineto JSON only (an object with ``traceEvents``,
  numeric ``ts``, the rank in ``distributedInfo``), and torch_npu writes a bare array with
  ``ts`` as text: an HTA-readable copy is written once, outside any timed region, and cached;
- the serving layer's share of our run, on the serving rank and on a ``synth moe-ep``
  collection: the steps derivation (engine iterations and their phases) as the run's own log
  line times it, and the MoE and PD rules and the overview's expert-exchange figures, timed in
  a fresh process on the run's store right after it, after the other rules, on the stores the
  run evaluates them on (one snapshot of a rank for its rank rules, one of every rank for the
  rules that read every rank: what the other rules read first is shared, as in the run);
- the all-files decode floor of ``bench_ingest.py`` (its case that decodes every file of the rank
  once, ``--floor`` to pick another), imports done before its clock starts.

Time is the best of ``--repeat`` rounds (noise only ever adds; each round runs every case once,
so a busy spell hits every case alike), peak RSS the worst. Ratios: anchor time / our run time
(goals: >= 20x msprof-analyze advisor, >= 4x HTA's load) and our run / floor.

The anchors are optional extras of the benchmark, never of the package::

    pip install -e '.[bench]'   # HolisticTraceAnalysis and msprof-analyze (also in the dev extra)

A missing anchor is reported as "not installed".
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench_ingest import ALL_FILES_FLOOR, CASES, COLUMNS, REAL_RANK, build_input, run_case
from bench_inputs import build_moe_input, build_serving_input
from bench_phases import STEPS_LINE

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OURS = "traceanalyzer run"
ADVISOR = "msprof-analyze advisor all"
HTA = "HTA TraceAnalysis load"
FLOOR_OUTSIDE = "floor, timed from outside"
OURS_SERVING = "traceanalyzer run, serving rank"
FLOOR_SERVING = "floor, serving rank"
OURS_MOE = "traceanalyzer run, MoE EP collection"
MOE_RANKS, MOE_RANK_MB = 4, 50
# The serving layer (the steps table's phases, the MoE and PD rules, the overview's expert
# exchange) may cost at most this share of a whole run.
SERVING_LAYER_GOAL = 0.05
MOE_RULES = ("moe-load-imbalance", "kv-transfer-overlap")
DEFAULT_FLOOR = ALL_FILES_FLOOR

# The goals: anchor time / our run time.
GOALS = {ADVISOR: 20.0, HTA: 4.0}

HTA_PROGRAM = """
import json, sys, time
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
seconds = time.perf_counter() - t0
print('RESULT', json.dumps({'seconds': seconds, 'rows': len(analysis.t.get_trace(0))}))
"""


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_timed(argv: list[str], cwd: Path, log: Path) -> dict:
    """Wall time, CPU time, exit code and peak RSS of one child process (its waited-for
    children included)."""
    with open(log, "wb") as fh:
        started = time.perf_counter()
        # as a user's shell runs it: Python's bytecode cache on (off, each run compiled every
        # module it imports again, 0.3-0.5 s)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        proc = subprocess.Popen(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "seconds": seconds,
        # the CPU it took (user and system, its waited-for children included): what a loaded
        # machine's other work does not add to, as it adds to the wall time
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "exit_code": proc.returncode,
    }


def failure(result: dict, log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return f"exit {result['exit_code']}: {(lines or ['no output'])[-1][:160]}"


def link_copy(src: Path, dst: Path) -> None:
    """A copy of ``src`` whose files are hard links (instant; falls back to copying)."""

    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link)


HTA_COPY_PROGRAM = """
import json, sys
trace, partial = sys.argv[1], sys.argv[2]
events = json.loads(open(trace, 'rb').read())
for event in events:
    if isinstance(event.get('ts'), str):  # torch_npu writes "ts" as text, Kineto as a number
        event['ts'] = float(event['ts'])
with open(partial, 'w') as fh:
    # HTA finds the rank with a regex over the file's lines: keep it on the first line.
    fh.write('{"distributedInfo": {"rank": 0},\\n"traceEvents": ')
    json.dump(events, fh)
    fh.write('}\\n')
"""


def hta_input(rank: Path) -> Path:
    """A folder beside the rank holding an HTA-readable copy of its trace (built once, cached).

    Built in a child process: a child forked later inherits this process's peak RSS (Linux keeps
    ``ru_maxrss`` across fork and exec), so the benchmark itself must stay small.
    """
    trace = rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    folder = rank.parent / "hta"
    copy = folder / "trace.json"
    if copy.is_file() and copy.stat().st_mtime >= trace.stat().st_mtime:
        return folder
    folder.mkdir(exist_ok=True)
    partial = folder / "trace.json.part"
    subprocess.run([sys.executable, "-c", HTA_COPY_PROGRAM, str(trace), str(partial)], check=True)
    partial.replace(copy)
    return folder


MOE_PROGRAM = """
import json, sys, time
from pathlib import Path
from traceanalyzer import process_env
process_env.configure()
from traceanalyzer.engine.config import resolve, run_settings
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.runner import evaluate_rule, store_ranks
from traceanalyzer.overview.compute import device_tasks, ep_exchanges
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.store import RankStore, Store
root = Path(sys.argv[1])
rules = load_rules([]).rules
params = resolve(rules, run_settings((), None)).params
ranks = store_ranks(Store.open(root))
timed = sys.argv[2].split(",")
# the run's snapshots: one per rank (shard) for its rank rules, one of every rank for the rest
shard_stores = {rank: RankStore(root, [rank]) for rank in ranks}
every_rank = RankStore(root, ranks)
def evaluate(rule):
    if rule.scope == "rank":
        for rank in ranks:
            evaluate_rule(rule, shard_stores[rank], params[rule.id], frozenset({rank}))
    else:
        evaluate_rule(rule, every_rank, params[rule.id])
for rule in rules:  # the other rules first, off the clock: the run's process has run them too
    if rule.id not in timed and rule.name not in timed:
        evaluate(rule)
started = time.perf_counter()
for rule in rules.select(timed):
    evaluate(rule)
seconds = time.perf_counter() - started
for rank in ranks:  # the overview's expert exchange, given the device tasks and steps it reads
    store = RankStore(root, [rank])  # anyway (summarize_rank, before its expert exchange)
    tasks, _ = device_tasks(store, [rank]), steps_of(store, [rank])
    started = time.perf_counter()
    ep_exchanges(store, rank, tasks)
    seconds += time.perf_counter() - started
print("RESULT", json.dumps({"seconds": seconds}))
"""


def case_ours(rank: Path, tmp: Path, moe: bool = False) -> dict:
    """Our whole run; with ``moe``, also the MoE and PD parts timed on its store after it."""
    argv = [str(BIN / "traceanalyzer"), "run", str(rank), "--out", str(tmp / "out")]
    log = tmp / "log.txt"
    result = run_timed(argv, tmp, log)
    if result["exit_code"] not in (0, 1):  # 1: a finding at or above --fail-on
        return {"failed": failure(result, log)}
    steps = STEPS_LINE.search(log.read_text())
    if steps:
        result["steps_seconds"] = float(steps.group(1))
    if moe:
        timed = subprocess.run(
            [sys.executable, "-c", MOE_PROGRAM, str(tmp / "out"), ",".join(MOE_RULES)],
            capture_output=True,
            text=True,
        )
        found = re.search(r"^RESULT (.*)$", timed.stdout, re.MULTILINE)
        if found:
            result["moe_seconds"] = json.loads(found.group(1))["seconds"]
    rules = re.search(r"evaluated (\d+) rule", log.read_text())
    outputs = sorted(p.name for p in (tmp / "out").iterdir() if p.is_file() and p.name[0] != ".")
    result["did"] = (
        f"ingest into a new Parquet store, {rules.group(1) if rules else '?'} rules evaluated, "
        f"reports written ({', '.join(outputs)})"
    )
    return result


def case_advisor(rank: Path, tmp: Path) -> dict:
    exe = BIN / "msprof-analyze"
    if not exe.exists():
        return {"skipped": "not installed"}
    link_copy(rank, tmp / rank.name)  # outside the clock
    argv = [str(exe), "advisor", "all", "-d", str(tmp / rank.name), "-o", str(tmp / "advisor")]
    log = tmp / "log.txt"
    result = run_timed(argv, tmp, log)
    text = log.read_text(errors="replace")
    if result["exit_code"] != 0:
        return {"failed": failure(result, log)}
    analyzers = list(dict.fromkeys(re.findall(r"\b([A-Z][A-Za-z]+Analyzer)\b", text)))
    outputs = sorted({p.suffix[1:] for p in (tmp / "advisor").rglob("*") if p.is_file()})
    # The advisor logs a failing analyzer and goes on: say so rather than hide it.
    errors = text.count("[ERROR]")
    result["did"] = (
        f"{len(analyzers)} analyzers ({', '.join(analyzers)}); "
        f"reports written ({', '.join(outputs)})"
        + (f"; {errors} [ERROR] log lines" if errors else "")
    )
    return result


def case_hta(hta_dir: Path | None, tmp: Path) -> dict:
    if hta_dir is None:
        return {"skipped": "not installed"}
    log = tmp / "log.txt"
    proc = run_timed([sys.executable, "-c", HTA_PROGRAM, str(hta_dir)], tmp, log)
    text = log.read_text(errors="replace")
    found = re.search(r"^RESULT (.*)$", text, re.MULTILINE)
    if proc["exit_code"] != 0 or not found:
        return {"failed": failure(proc, log)}
    inner = json.loads(found.group(1))
    backend = re.search(r"backend=ParserBackend\.(\w+)", text)
    return {
        "seconds": inner["seconds"],
        "process_seconds": proc["seconds"],
        "peak_rss_mb": proc["peak_rss_mb"],
        "did": (
            f"parse only ({backend.group(1).lower() if backend else '?'} backend) into one pandas "
            f"DataFrame of {inner['rows']:,} rows; no analysis"
        ),
    }


def case_floor(name: str, rank: Path) -> dict:
    result = run_case(name, CASES[name], rank)
    result.pop("case")
    if "seconds" in result:
        result["did"] = f"bench_ingest.py case `{name}` (imports before the clock)"
    return result


def case_floor_outside(name: str, rank: Path, tmp: Path) -> dict:
    """The floor's decode timed like our run: a fresh process from outside, so its interpreter
    start-up and its imports count too (like for like; the in-process floor is stricter)."""
    trace = rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    program = (
        # with the library settings our run has (one BLAS thread...): like for like
        "from traceanalyzer import process_env\nprocess_env.configure()\n"
        f"import json, os\nTRACE = {str(trace)!r}; COLUMNS = {COLUMNS!r}\n"
        + textwrap.dedent(CASES[name]).strip()
        + "\n"
    )
    log = tmp / "log.txt"
    result = run_timed([sys.executable, "-c", program], tmp, log)
    if result["exit_code"] != 0:
        return {"failed": failure(result, log)}
    result["did"] = "the floor's decode in a fresh process, timed from outside like our run"
    return result


def best(runs: list[dict]) -> dict:
    """Best time (noise only ever adds), worst peak RSS; the first failure if any run failed.
    Our runs' serving-layer shares, one per run (``serving_shares``): a share is a ratio of two
    parts of one run, which a busy spell slows unequally, so the fastest run's share is no
    better an estimate than another's; the page gives their median and range."""
    bad = [r for r in runs if "seconds" not in r]
    if bad:
        return bad[0]
    result = dict(min(runs, key=lambda r: r["seconds"]))
    result["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    shares = [serving_share(r) for r in runs if "steps_seconds" in r]
    if shares:
        result["serving_shares"] = shares
    return result


def serving_share(run: dict) -> float:
    """The serving layer's share of one of our runs: its steps, and its MoE and PD rules where
    they were timed."""
    return (run["steps_seconds"] + (run.get("moe_seconds") or 0.0)) / run["seconds"]


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    mem_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": round(mem_kb / (1 << 20), 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


def commit() -> str:
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def fmt_ratio(num: dict, den: dict) -> str:
    if "seconds" not in num or "seconds" not in den:
        return ""
    return f"{num['seconds'] / den['seconds']:.1f}x"


ANALYSIS = """## Where our run's time goes, and what is left

A cold run on the realistic rank, phase by phase (the run's own `-v` lines, an earlier
session's quiet machine; each phase moves by a fifth with the machine's load):

- **0.37-0.45 s: start-up and the scan beside it.** The interpreter starts and imports polars,
  pyarrow (with numpy), the engine and the rules on one core while the native scanner reads
  the trace on both (`traceanalyzer/read_ahead.py`). The parse takes the scan over when the
  imports are done.
- **1.15-1.35 s: the rest of the ingest.** One stable lexsort of the slices, their row groups
  made by three threads while the Parquet encoder writes the one before (`parse/rows.py`
  `made_ahead`), the counters, flows and threads; then the 60 MB of side files, two at a
  time, the largest first (docs/benchmarks/ingest.md, "The side files").
- **0.2-0.3 s: the launches and the steps** (engine iterations and their phases), **0.3-0.4 s:
  the 13 rules** on two threads, **0.26-0.38 s: the overview**, **0.03 s: the reports**.

The run takes about 3.6 s of CPU on two cores, where the floor decodes on about one.

This page's session, what changed (each timed on the code before and after it, alternated;
every finding, key figure, overview and store table of the 13 samples, 17 synthetic
scenarios, the real G2 Text and Db exports, the tiled rank, the serving rank and the MoE
collection compared with the session's first code: the same, but for the overview's new
`unmeasured` column and keys):

- **The counters are stored by process and counter name**, in time order within them, with
  min/max of both names per row group (Text and Db alike), where they were in time order
  across every counter: a read of one counter decodes only its row groups. AI Core Freq's
  188 samples among the realistic rank's 675k: 8.5 -> 2.5 ms; aicore-freq-throttle 30 -> 16
  ms; the ingest as fast.
- **Parquet dictionaries for text columns only**: times and ids are mostly distinct, so a row
  group's dictionary of them was as large as its values. The realistic rank's store 9.6 -> 7.5
  MB, the ingest as fast (16 alternated runs each).
- Not of this page's cases: a Ray cluster joined with `--ray-address` now gets the CLI's
  library settings (polars' in-memory engine among them) with the job; the overview says
  which components a Level0 export cannot measure instead of printing 0 (docs/overview.md).

Tried and not kept: the exchanges' exposed time through the union's length before each bound
(two as-of joins keyed by session) instead of the overlap join: 50 ms instead of 13 on the MoE
collection's 512 exchange ops against 91k kernels; the sessions as integer codes inside the
steps' derivation (every read re-keyed, the outputs decoded): no faster, the re-keying costs
what the keyed operations save; the overview's host API names as categoricals (the cast alone
10 ms of 50).

The previous pages' sessions: polars' lazy queries in memory instead of its streaming engine
(the realistic rank's run 4.1 -> 3.9 s); a precondition with no rows told in one scan; a table
opened on one listing of its files; the phase rules evaluated once each; the slices stored
grouped by process, with min/max of `process` per row group (a one-process scan reads only its
row groups: the device tasks 22 -> 4 ms, the CANN calls 20 -> 5 ms on the realistic rank); the MoE layers derived once beside the exchanges
(`moe_layers`, `moe_dense`: moe-load-imbalance's verdict 145 -> 24 ms over the 4 MoE ranks);
store-transfer-stall looking for transfer spans first (96 -> 30 ms where there are none);
sync-in-step's call sites derived once (141 -> 76 ms); a met precondition probe stopping at
its first complete row (4.7 -> 1.6 ms); collective-straggler's source fixed run to run; the EP
exchanges derived beside the steps (the overview's expert exchange 80 -> 13 ms over the 4 MoE
ranks); the steps reading a kernel's launch from the launches table (160 -> 135 ms); the steps
of a task's ranks derived in one pass (0.43 -> 0.19 s on the 4 MoE ranks).

Left:

- **The MoE collection's serving layer is at the goal with little room**: 4.6% (4.6-4.7%) on
  this page, 4.5-6.2% run to run over the last three. The steps' task is about 360 polars
  operations and 190 ms over the 4 ranks, none large: reading the slices it needs (29 ms: the
  device tasks 10, the marker regex over 265k host spans 14, the graph calls 5), the attention
  kernels' scan (9), the MoE layers' read (7), the exchanges' overlap partition (7) and
  anti-join (7), 16 small Parquet files (about 1.1 ms each), and polars' fixed cost on the
  rest; keyed by session names, each costs about twice what an integer key would, but
  re-keying costs as much (tried, above).
- **HTA's ratio follows the machine's state** (4.4x, 3.2x, 3.8x, 3.9x, 3.5x, 4.6x, 3.6x, 4.5x
  on the last eight pages): on a slow spell our two-core run slows with the floor, and HTA's
  one-core parse does not.
- **The serving rank's peak is 2.2x its files** (the realistic rank's meets 1.5x): it is set
  while the trace's flows are derived.

Measured and not kept on earlier pages: LZ4 instead of zstd for the store (no less CPU over the
whole run), one polars thread (less CPU, slower), dictionary encoding off for the args (no
faster), the steps' slices read as three narrower queries (1.6x slower than the one scan), the
ranks' speeds grouped on hashed kernel names (no faster).

This machine's speed drifts by a quarter or more within an hour with nothing else running:
builds compare fairly only in alternated runs of one sitting, and the ratio to the floor
(measured seconds apart from our run, `--pairs`) is the figure to compare across pages, not
the seconds.
"""


def serving_layer_lines(results: dict[str, dict]) -> list[str]:
    """The serving layer's share of each of our runs that says it (goal: SERVING_LAYER_GOAL)."""
    rows = []
    for name in (OURS, OURS_SERVING, OURS_MOE):
        r = results.get(name, {})
        if "seconds" not in r or "steps_seconds" not in r:
            continue
        moe = r.get("moe_seconds")
        shares = r.get("serving_shares") or [serving_share(r)]
        share = statistics.median(shares)
        verdict = "met" if share <= SERVING_LAYER_GOAL else "not met"
        spread = f" ({min(shares):.1%}-{max(shares):.1%})" if len(shares) > 1 else ""
        rows.append(
            f"| {name} | {r['seconds']:.2f} | {r['steps_seconds']:.2f} | "
            + (f"{moe:.3f}" if moe is not None else "not timed")
            + f" | {serving_share(r):.1%} | {share:.1%}{spread} | "
            f"<= {SERVING_LAYER_GOAL:.0%}: {verdict} |"
        )
    if not rows:
        return []
    return [
        "",
        "The serving layer's share of the run (the steps and their phases, from the run's own "
        "log line; the MoE and PD rules and the overview's expert exchange, timed on the run's "
        "store right after it), in the fastest run and the median over every run of the case "
        "(with their range): a share is a ratio of two parts of one run, which a busy spell "
        "slows unequally; the goal is judged on the median:",
        "",
        "| run | seconds | steps and phases (s) | MoE and PD (s) | share (fastest run) | share "
        "(median of the runs) | goal |",
        "|---|---:|---:|---:|---:|---:|---|",
        *rows,
        "",
    ]


def render(results: dict[str, dict], meta: dict) -> str:
    """The Markdown page: the table, the ratios against their goals, the machine and the commands."""
    ours, floor = results[OURS], results[meta["floor"]]
    trace_mb, rank_mb = meta["trace_mb"], meta["rank_mb"]
    m = meta["machine"]
    lines = ["# Side by side: our whole run against msprof-analyze advisor and HTA", ""]
    if meta.get("preliminary"):
        lines += [
            f"> **Preliminary**: measured on a busy machine at `--mb {meta['mb']}` (load average "
            f"{m['load_average'][0]:.1f} at the start, {meta['load_after'][0]:.1f} at the end). "
            "At this size the run's fixed cost (interpreter start-up, imports, reports) dominates, "
            "so the ratios do not yet say how the tools compare at 200 MB: those figures will be "
            "measured on a quiet machine.",
            "",
        ]
    lines += [
        f"Command: `{meta['command']}`",
        "",
        f"Input: the real G2 Level1 rank-0 export with every file tiled by one factor: a "
        f"{trace_mb:.1f} MB trace_view.json, {rank_mb:.1f} MB with its CSV/JSON side files "
        f"({(rank_mb - trace_mb) / trace_mb:.0%} of the trace, as in the real rank), built and "
        "cached by `benchmarks/bench_inputs.py`. The serving rows: a `traceanalyzer synth "
        f"serving` rank of {meta.get('serving_mb', 0):.1f} MB; the MoE row: a `traceanalyzer "
        f"synth moe-ep` collection of {MOE_RANKS} ranks, {meta.get('moe_mb', 0):.1f} MB in all.",
        "",
        "| case | seconds | peak RSS (MB) | RSS / trace size | anchor / our run | goal | what it does in that time |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        if "seconds" not in r:
            state = r.get("skipped") or f"failed: {r.get('failed', '?')}"
            lines.append(f"| {name} | {state} | | | | | |")
            continue
        ratio = fmt_ratio(r, ours) if name in GOALS else ""
        goal = f">= {GOALS[name]:.0f}x" if name in GOALS else ""
        lines.append(
            f"| {name} | {r['seconds']:.2f} | {r['peak_rss_mb']:.0f} | "
            f"{r['peak_rss_mb'] / trace_mb:.2f} | {ratio} | {goal} | {r.get('did', '')} |"
        )
    lines += [
        "",
        f"Our run / floor: **{fmt_ratio(ours, floor) or 'n/a'}** (the goal: <= 2.5x of "
        "the all-files decode floor).",
    ]
    serving, serving_floor = results.get(OURS_SERVING, {}), results.get(FLOOR_SERVING, {})
    if "seconds" in serving and "seconds" in serving_floor:
        lines.append(
            f"Serving rank: our run / its floor {fmt_ratio(serving, serving_floor)}, its peak RSS "
            f"{serving['peak_rss_mb'] / meta['serving_mb']:.2f}x its files."
        )
    lines += serving_layer_lines(results)
    outside = results.get(FLOOR_OUTSIDE, {})
    if "seconds" in outside and "seconds" in ours:
        lines.append(
            f"Like for like, both timed from outside (interpreter start-up and imports in both): "
            f"our run / floor {fmt_ratio(ours, outside)}."
        )
    lines.append("")
    for name in GOALS:
        r = results.get(name, {})
        if "seconds" in r and "seconds" in ours:
            ratio = r["seconds"] / ours["seconds"]
            verdict = "met" if ratio >= GOALS[name] else "not met"
            lines.append(
                f"- {name} / our run: {ratio:.1f}x (goal >= {GOALS[name]:.0f}x: {verdict})."
            )
    hta = results.get(HTA, {})
    if "process_seconds" in hta:
        lines.append(
            f"- HTA's whole process (interpreter, imports, parse) took {hta['process_seconds']:.2f} s; "
            "the ratio uses its parse alone."
        )
    v = meta["versions"]
    lines += [
        "",
        "## Machine and versions",
        "",
        f"- {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB, {m['os']}, Python {m['python']}.",
        f"- Load average at the start: {', '.join(f'{x:.2f}' for x in m['load_average'])}; "
        f"at the end: {', '.join(f'{x:.2f}' for x in meta['load_after'])}.",
        "- "
        + ", ".join(
            f"{name} {v.get(name) or 'not installed'}"
            for name in ("traceanalyzer", "msprof-analyze", "HolisticTraceAnalysis", "duckdb")
        )
        + f"; traceanalyzer at commit {meta['commit']}.",
        "",
        "## Exact commands (RANK is the input rank, TMP a fresh temp dir per run, also the cwd)",
        "",
        f"- {OURS}: `traceanalyzer run RANK --out TMP/out` (default options; a fresh store, "
        "so nothing is cached).",
        f"- {ADVISOR}: `msprof-analyze advisor all -d TMP/{meta['rank_name']} -o TMP/advisor`, "
        "where `TMP/"
        f"{meta['rank_name']}` is a hard-linked copy of RANK made before the clock starts "
        "(default options otherwise: `-l cn`, `-pt pytorch`).",
        f"- {HTA}: `TraceAnalysis(trace_dir=HTA_DIR)`, timed alone after `from hta.trace_analysis "
        "import TraceAnalysis`. `HTA_DIR` holds a copy of RANK's trace_view.json that HTA can read, "
        "made once outside any timed region: the same events in Kineto's shape "
        '(`{"distributedInfo": {"rank": 0}, "traceEvents": [...]}`, `ts` as a number instead of '
        "text). HTA parses a single rank in a pool of one worker process; its RSS column is the "
        "larger of the two.",
        f"- floor: `bench_ingest.py`'s case `{meta['floor']}`, imports done before the clock "
        "starts: every file the run reads, decoded once by DuckDB (the trace's events into typed "
        "columns, each CSV as text columns) and the side JSONs by the json module; the side "
        f"files are {meta['rank_mb'] - trace_mb:.1f} MB of this input. `{FLOOR_OUTSIDE}`: "
        "the same decode as a `python -c` program, timed from outside as our run is.",
        "",
        "Each case runs in a fresh child process; seconds are the best of the rounds, peak RSS "
        f"the worst (`wait4`: the largest process of the case). In each round our run and the "
        f"floors run {meta['pairs']} times, one after the other, before the peers: the ratio "
        "to the floor compares runs measured seconds apart. Our run and the advisor are timed "
        "from outside, so their seconds include interpreter start-up and imports; HTA's and the "
        "floor's do not, which only makes their ratios stricter for us. The page cache is warm "
        "for every case alike.",
        "",
        ANALYSIS,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the tiled trace_view.json")
    parser.add_argument("--repeat", type=int, default=3, help="rounds: best time, worst RSS")
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="runs of ours and of the floors per round, one after the other (seconds each, where "
        "a peer takes a minute): the machine's load drifts less between them",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "compare.md")
    parser.add_argument(
        "--floor",
        default=DEFAULT_FLOOR,
        choices=sorted(CASES),
        metavar="CASE",
        help=f"a case of bench_ingest.py (default: {DEFAULT_FLOOR})",
    )
    parser.add_argument(
        "--preliminary", action="store_true", help="mark the page as measured on a busy machine"
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="render the page again from a run's measures (the JSON written beside the page), "
        "with this script's text, measuring nothing",
    )
    args = parser.parse_args()
    measures = args.out.with_suffix(".json")
    if args.render:
        saved = json.loads(args.render.read_text())
        args.out.write_text(render(saved["results"], saved["meta"]))
        return
    if not REAL_RANK.is_dir():
        sys.exit(f"real export not found at {REAL_RANK}")
    rank = build_input(args.mb)
    serving = build_serving_input(args.mb)
    moe = build_moe_input(MOE_RANKS, MOE_RANK_MB)
    hta_dir = hta_input(rank) if version("HolisticTraceAnalysis") else None
    meta = {
        "mb": args.mb,
        "floor": args.floor,
        "preliminary": args.preliminary,
        "machine": machine(),
        "commit": commit(),
        "rank_name": rank.name,
        "trace_mb": (rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").stat().st_size
        / (1 << 20),
        "rank_mb": sum(p.stat().st_size for p in rank.rglob("*") if p.is_file()) / (1 << 20),
        "serving_mb": sum(p.stat().st_size for p in serving.rglob("*") if p.is_file()) / (1 << 20),
        "moe_mb": sum(p.stat().st_size for p in moe.rglob("*") if p.is_file()) / (1 << 20),
        "versions": {
            d: version(d)
            for d in ("traceanalyzer", "msprof-analyze", "HolisticTraceAnalysis", "duckdb")
        },
        "pairs": args.pairs,
        "command": f"python benchmarks/bench_compare.py --mb {args.mb} --repeat {args.repeat}"
        + (f" --pairs {args.pairs}" if args.pairs != 3 else "")
        + (f" --floor '{args.floor}'" if args.floor != DEFAULT_FLOOR else "")
        + (" --preliminary" if args.preliminary else ""),
    }
    cases = {
        OURS: lambda tmp: case_ours(rank, tmp),
        ADVISOR: lambda tmp: case_advisor(rank, tmp),
        HTA: lambda tmp: case_hta(hta_dir, tmp),
        args.floor: lambda tmp: case_floor(args.floor, rank),
        FLOOR_OUTSIDE: lambda tmp: case_floor_outside(args.floor, rank, tmp),
        OURS_SERVING: lambda tmp: case_ours(serving, tmp),
        FLOOR_SERVING: lambda tmp: case_floor(args.floor, serving),
        OURS_MOE: lambda tmp: case_ours(moe, tmp, moe=True),
    }
    runs: dict[str, list[dict]] = {name: [] for name in cases}
    quick = [OURS, args.floor, FLOOR_OUTSIDE, OURS_SERVING, FLOOR_SERVING]
    for round_ in range(args.repeat):
        order = quick * args.pairs + [name for name in cases if name not in quick]
        for name in order:
            with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
                result = cases[name](Path(tmp))
            runs[name].append(result)
            print(f"round {round_ + 1} {name:<32} {json.dumps(result)}", flush=True)
    results = {name: best(r) for name, r in runs.items()}
    meta["load_after"] = os.getloadavg()
    text = render(results, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    measures.write_text(json.dumps({"results": results, "meta": meta}, indent=1) + "\n")
    print(textwrap.indent(text, "  "))


if __name__ == "__main__":
    main()
