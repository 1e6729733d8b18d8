"""Parse raw ``*_ascend_pt`` dirs offline with torch_npu (rendered by traceanalyzer).

The hooks collect with ``tensorboard_trace_handler(..., analyse_flag=False)`` so stopping the
profiler stays cheap inside the workload; this step produces ``ASCEND_PROFILER_OUTPUT/`` for
every dir that lacks it. It needs torch_npu and ``msprof`` (a CANN toolkit), i.e. it runs on
the Ascend host, never inside ``traceanalyzer run``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def pending(root: Path) -> list[Path]:
    """Raw ``*_ascend_pt`` dirs under ``root`` that were not parsed yet."""
    return sorted(
        p
        for p in root.rglob("*_ascend_pt")
        if p.is_dir() and not (p / "ASCEND_PROFILER_OUTPUT").is_dir()
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: analyse_profiles.py PROFILING_DIR", file=sys.stderr)
        return 2
    todo = pending(Path(argv[0]))
    if not todo:
        print("[traceanalyzer] nothing to parse (no raw *_ascend_pt dirs)")
        return 0
    from torch_npu.profiler.profiler import analyse

    workers = int(os.environ.get("TA_ANALYSE_PROCESSES", "4"))
    for path in todo:
        print(f"[traceanalyzer] parsing {path}", flush=True)
        analyse(str(path), max_process_number=workers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
