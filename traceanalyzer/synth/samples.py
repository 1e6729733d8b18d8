"""The committed ``sample_traces/``: which scenarios, with which knobs, and how to rebuild them.

``python -m traceanalyzer.synth.samples [DEST]`` rewrites the samples; a test
regenerates them into a temp dir and fails on any byte of drift, so a change to
the generator that alters output must come with refreshed samples.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer.synth.generate import generate


@dataclass(frozen=True)
class Sample:
    name: str
    scenario: str
    ranks: int = 1
    generation: str = "g2"
    level: int = 1
    knobs: dict[str, Any] = field(default_factory=dict)


SAMPLES: tuple[Sample, ...] = (
    Sample("capture_growth_2rank", "capture-growth", ranks=2, knobs={"rounds": 2, "layers": 1}),
    Sample("capture_growth_level2", "capture-growth", level=2, knobs={"rounds": 1, "layers": 1}),
    Sample(
        "capture_growth_rounds",
        "capture-growth",
        knobs={"profiled_rounds": "1,45,100", "captures": 4, "layers": 1, "growth": 0.25},
    ),
    Sample("capture_healthy", "capture-healthy", knobs={"rounds": 2, "layers": 1}),
    Sample(
        "store_stall_2rank_rank1_sick", "store-stall", ranks=2, knobs={"sick": "1", "layers": 1}
    ),
    Sample("store_stall_session", "store-stall", knobs={"profile_style": "session"}),
    Sample(
        "store_stall_session_marked",
        "store-stall",
        knobs={"profile_style": "session", "mark_transfer": 1},
    ),
    Sample("store_healthy", "store-healthy", knobs={"layers": 1}),
    Sample("inference_baseline", "inference-baseline", knobs={"steps": 4, "layers": 2}),
    Sample(
        "inference_baseline_g3_level0",
        "inference-baseline",
        generation="g3",
        level=0,
        knobs={"steps": 2, "layers": 1},
    ),
    Sample(
        "inference_baseline_current_level2",
        "inference-baseline",
        generation="current",
        level=2,
        ranks=2,
        knobs={"steps": 2, "layers": 1, "tp_comm": 1},
    ),
    Sample("straggler_2rank", "late-rank-decode", ranks=2, knobs={"steps": 2, "layers": 1}),
    Sample("aicpu_ops", "aicpu-fallback", knobs={"steps": 2, "layers": 1}),
)


def write(sample: Sample, target: Path, export: str = "text") -> list[Path]:
    """Write ``sample``'s rank dirs under ``target`` (the committed copy is its Text export)."""
    return generate(
        sample.scenario,
        target,
        ranks=sample.ranks,
        seed=0,
        generation=sample.generation,
        level=sample.level,
        export=export,
        **sample.knobs,
    )


def regenerate(dest: Path) -> list[Path]:
    """Write every sample under ``dest/<sample name>/`` (replacing old ones); returns the sample dirs."""
    dest = Path(dest)
    out = []
    for s in SAMPLES:
        target = dest / s.name
        if target.exists():
            shutil.rmtree(target)
        write(s, target)
        out.append(target)
    return out


def default_dest() -> Path:
    return Path(__file__).resolve().parents[2] / "sample_traces"


if __name__ == "__main__":
    for path in regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else default_dest()):
        print(path)
