"""Synthetic export generation speed and memory, against a write floor measured in the same run.

    python benchmarks/bench_synth.py [--mb 200] [--out docs/benchmarks/synth.md]

Each case runs `traceanalyzer.synth.generate(..., target_mb=MB)` for one rank in a fresh child
process (own peak RSS). The floor writes the same number of bytes to the same disk in 1 MB
blocks: generation can never beat it, so `time / floor` is the generator's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = ("inference-baseline", "capture-growth", "store-stall")

PROGRAM = """
import json, resource, time
from pathlib import Path
from traceanalyzer.synth import generate
t0 = time.perf_counter()
{body}
print("RESULT", json.dumps({{"seconds": time.perf_counter() - t0, "bytes": size,
      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
GENERATE = """
dirs = generate({scenario!r}, Path({out!r}), target_mb={mb}, seed=1)
size = sum(p.stat().st_size for d in dirs for p in d.rglob("*") if p.is_file())
"""
FLOOR = """
block = b"x" * (1 << 20)
with open(Path({out!r}) / "floor.bin", "wb") as fh:
    for _ in range({mb}):
        fh.write(block)
    fh.flush()
size = {mb} << 20
"""


def run(body: str) -> dict:
    code = PROGRAM.format(body=textwrap.dedent(body))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "synth.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        floor = run(FLOOR.format(out=tmp, mb=args.mb))
        rows.append(("write floor (same bytes, 1 MB blocks)", floor))
        for scenario in SCENARIOS:
            out = Path(tmp) / scenario
            rows.append(
                (scenario, run(GENERATE.format(scenario=scenario, out=str(out), mb=args.mb)))
            )
            shutil.rmtree(out, ignore_errors=True)
            print(scenario, rows[-1][1], flush=True)
    lines = [
        "# Synthetic export generation: one rank",
        "",
        f"Command: `python benchmarks/bench_synth.py --mb {args.mb}`",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}.",
        "Target: `--target-mb 200` for one rank in well under a minute, in little memory.",
        "",
        "| case | seconds | MB written | MB/s | peak RSS (MB) | time / write floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} | | | | |")
            continue
        mb = r["bytes"] / (1 << 20)
        ratio = r["seconds"] / floor["seconds"] if "seconds" in floor else float("nan")
        lines.append(
            f"| {name} | {r['seconds']:.1f} | {mb:.0f} | {mb / r['seconds']:.0f} | {r['peak_rss_mb']:.0f} | {ratio:.0f} |"
        )
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
