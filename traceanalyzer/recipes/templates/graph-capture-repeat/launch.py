"""Offline launcher for ``graph-capture-repeat`` (rendered by traceanalyzer; run through run.sh).

Builds ``LLM(**config["llm"])`` (FULL graph mode, the chosen capture sizes, dummy weights,
``worker_extension_cls`` pointing at ``ta_capture_hooks``), then asks every worker to clear and
re-capture its graphs ``rounds`` times via ``collective_rpc``. run.sh exports the environment
(seed env vars, HCCL_OP_EXPANSION_MODE per arm, PYTHONPATH with the hooks) before this starts,
so the spawned workers inherit it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)

    cfg = json.loads(args.config.read_text(encoding="utf-8"))
    args.out.mkdir(parents=True, exist_ok=True)

    from vllm import LLM, SamplingParams  # after run.sh set the environment

    t0 = time.perf_counter()
    llm = LLM(**cfg["llm"])
    init_s = time.perf_counter() - t0
    print(
        f"[traceanalyzer] engine ready in {init_s:.1f} s (includes the first capture)", flush=True
    )

    plan = dict(cfg["plan"])
    plan.update(
        out_dir=str(args.out.resolve()),
        arm=args.arm,
        hook_variant=os.environ.get("TA_HOOK_VARIANT", plan.get("hook_variant", "auto")),
    )
    per_rank = llm.collective_rpc("ta_recapture", args=(plan,))

    generated = None
    if cfg.get("generate", True):
        out = llm.generate("How are you?", SamplingParams(temperature=0, max_tokens=10))
        generated = out[0].outputs[0].text
        print(f"[traceanalyzer] replay check output: {generated!r}", flush=True)

    summary = []
    for r in range(plan["rounds"]):
        secs = [rank["rounds"][r]["capture_s"] for rank in per_rank]
        summary.append(
            {
                "round": r + 1,
                "max_capture_s": max(secs),
                "median_capture_s": statistics.median(secs),
            }
        )
    timings = {
        "recipe": "graph-capture-repeat",
        "arm": args.arm,
        "hccl_op_expansion_mode": os.environ.get("HCCL_OP_EXPANSION_MODE", ""),
        "engine_init_s": init_s,
        "plan": plan,
        "generated": generated,
        "summary": summary,
        "ranks": per_rank,
    }
    path = args.out / "capture_timings.json"
    path.write_text(json.dumps(timings, indent=1), encoding="utf-8")
    if summary:
        first, last = summary[0]["max_capture_s"], summary[-1]["max_capture_s"]
        print(
            f"[traceanalyzer] {args.arm}: capture round 1 {first:.2f} s, round {len(summary)} "
            f"{last:.2f} s (x{last / first if first else float('nan'):.2f}); timings in {path}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
