"""``python -m tests.fuzz --cases 5000 [--seed S] [--report fuzz.json]``: the long campaign."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from .campaign import Case, Summary, bases, remove_tree, run_campaign, write_report


def _shown(text: str) -> str:
    """``text`` printable on any terminal: a lone surrogate (a name's byte that is not UTF-8)
    as ``\\udcca``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, nargs="+", help="replay these case numbers")
    parser.add_argument(
        "--subprocess-every", type=int, default=10, help="every Nth case in a fresh process"
    )
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    parser.add_argument("--jobs", type=int, default=1, help="cases run side by side")
    parser.add_argument(
        "--exports", nargs="+", help="only these exports (names of bases: synthetic_db, ...)"
    )
    parser.add_argument("--damages", nargs="+", help="only these damages (db_damage, out_link...)")
    args = parser.parse_args(argv)

    seen: list[Case] = []
    started = time.perf_counter()

    def show(case: Case) -> None:
        seen.append(case)
        if args.report and len(seen) % 100 == 0:  # figures so far, should the campaign be cut
            write_report(Summary(args.seed, seen, time.perf_counter() - started), args.report)
        if case.failures or case.index % 100 == 0:
            mark = "FAIL" if case.failures else "ok"
            print(_shown(f"[{case.index}] {mark} exit {case.exit_code} {case.seconds:.1f} s "
                  f"{case.base}: {'; '.join(case.damages)[:160]}"), flush=True)  # fmt: skip
            for failure in case.failures:
                print(_shown(f"    {failure[:400]}"), flush=True)

    work = Path(tempfile.mkdtemp(prefix="traceanalyzer-fuzz-"))
    exports = [p for p in bases(work) if not args.exports or p.name in args.exports]
    try:
        summary = run_campaign(
            args.cases,
            args.seed,
            args.subprocess_every,
            args.only,
            work=work,
            on_case=show,
            exports=exports,
            jobs=args.jobs,
            kinds=args.damages,
        )
    finally:
        remove_tree(work)
    figures = summary.to_dict()
    if args.report:
        write_report(summary, args.report)
    shown = {k: v for k, v in figures.items() if k != "failures"}
    print(json.dumps(shown, indent=1))
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
