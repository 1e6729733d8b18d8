"""A cold `traceanalyzer run` on every bundled sample, against the cost of starting Python with
the libraries any run needs, measured in the same run.

    python benchmarks/bench_startup.py [--repeat 5] [--out docs/benchmarks/startup.md]

Each case is a fresh child process timed from outside (interpreter start-up included), its
output directory new, so nothing is cached. Floors: ``python -c pass`` (the interpreter) and
``python -c "import polars, pyarrow.parquet"`` (the interpreter and the two libraries every run
uses to read and write the store). The goal (issue #20): a cold run on a bundled sample takes
at most 1.5 s, and imports nothing heavy it does not use: one more run per sample under
``python -X importtime`` lists which of the heavy optional libraries were imported.

Time is the best of ``--repeat`` rounds (noise only ever adds; a round runs every case once),
peak RSS the worst.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_compare import best, commit, machine, run_timed

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GOAL_SECONDS = 1.5
INTERPRETER = "python -c pass"
LIBRARIES = "python -c 'import polars, pyarrow.parquet'"
FLOORS = {INTERPRETER: "pass", LIBRARIES: "import polars, pyarrow.parquet"}
# Libraries a run must import only when it uses them (figures, --executor ray, the DuckDB reader).
HEAVY = ("matplotlib", "ray", "pandas", "duckdb", "scipy", "torch")


def samples() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if p.is_dir())


def run_sample(sample: Path, tmp: Path) -> dict:
    out = Path(tempfile.mkdtemp(dir=tmp, prefix="out-"))
    argv = [sys.executable, "-m", "traceanalyzer.cli", "run", str(sample), "--out", str(out)]
    result = run_timed(argv, tmp, tmp / "run.log")
    # a run that raised findings exits 1 (0 when clean); anything else failed
    return result if result["exit_code"] in (0, 1) else {"error": f"exit {result['exit_code']}"}


def heavy_imports(sample: Path, tmp: Path) -> list[str]:
    """The heavy libraries a cold run on ``sample`` imports (``-X importtime``'s top levels)."""
    out = Path(tempfile.mkdtemp(dir=tmp, prefix="out-"))
    argv = [sys.executable, "-X", "importtime", "-m", "traceanalyzer.cli", "run", str(sample)]
    done = subprocess.run([*argv, "--out", str(out)], cwd=tmp, capture_output=True, text=True)
    names = {m.group(1).split(".")[0] for m in re.finditer(r"\|\s+(\S+)$", done.stderr, re.M)}
    return [name for name in HEAVY if name in names]


def render(results: dict[str, dict], imports: dict[str, list[str]], meta: dict) -> str:
    floor = results[LIBRARIES]
    lines = [
        "# Cold start: a first run on each bundled sample",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Goal: a cold `traceanalyzer run` on a bundled sample takes at most {GOAL_SECONDS} s, and "
        "imports no heavy library it does not use.",
        "",
        "| case | seconds | / libraries floor | peak RSS (MB) | heavy libraries imported |",
        "|---|---:|---:|---:|---|",
    ]
    for name, result in results.items():
        if "seconds" not in result:
            lines.append(f"| {name} | {result.get('error', 'failed')} |  |  |  |")
            continue
        ratio = f"{result['seconds'] / floor['seconds']:.1f}x" if "seconds" in floor else ""
        heavy = ", ".join(imports.get(name, [])) or ("none" if name in imports else "")
        lines.append(
            f"| {name} | {result['seconds']:.2f} | {ratio} | {result['peak_rss_mb']:.0f} | {heavy} |"
        )
    runs = [r for n, r in results.items() if n not in FLOORS]
    timed = [r["seconds"] for r in runs if "seconds" in r]
    if timed:
        failed = len(runs) - len(timed)
        met = max(timed) <= GOAL_SECONDS and not failed
        verdict = ("met" if met else "not met") + (f"; {failed} sample(s) failed" if failed else "")
        lines += [
            "",
            f"Slowest sample: **{max(timed):.2f} s** (goal <= {GOAL_SECONDS} s: {verdict}).",
        ]
    m = meta["machine"]
    lines += [
        "",
        "## Machine",
        "",
        f"- {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB, {m['os']}, Python {m['python']}.",
        f"- Load average at the start: {', '.join(f'{x:.2f}' for x in m['load_average'])}; at the "
        f"end: {', '.join(f'{x:.2f}' for x in meta['load_after'])}.",
        f"- traceanalyzer at commit {meta['commit']}.",
        "",
        "Each case is a fresh process timed from outside; `sample_traces/NAME` cases are "
        "`traceanalyzer run sample_traces/NAME --out FRESH` with default options. The floors "
        f"are `{INTERPRETER}` and `{LIBRARIES}`. Seconds are the best of the rounds, peak RSS "
        "the worst. Heavy libraries: which of "
        f"{', '.join(HEAVY)} the run imported (one more run under `python -X importtime`).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the Markdown page here")
    args = parser.parse_args()
    cases = {name: [sys.executable, "-c", code] for name, code in FLOORS.items()}
    start_machine = machine()
    runs: dict[str, list[dict]] = {name: [] for name in [*FLOORS, *map(_label, samples())]}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp_name:
        tmp = Path(tmp_name)
        for _ in range(args.repeat):
            for name, argv in cases.items():
                runs[name].append(run_timed(argv, tmp, tmp / "floor.log"))
            for sample in samples():
                runs[_label(sample)].append(run_sample(sample, tmp))
        imports = {_label(s): heavy_imports(s, tmp) for s in samples()}
    results = {name: best(r) for name, r in runs.items()}
    argv = " ".join(["python", "benchmarks/bench_startup.py", *sys.argv[1:]])
    meta = {
        "command": argv,
        "machine": start_machine,
        "load_after": os.getloadavg(),
        "commit": commit(),
    }
    page = render(results, imports, meta)
    if args.out:
        args.out.write_text(page, encoding="utf-8")
    print(page)


def _label(sample: Path) -> str:
    return f"sample_traces/{sample.name}"


if __name__ == "__main__":
    main()
