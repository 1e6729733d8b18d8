"""A fixed-seed sample of the fuzz campaign (tests/fuzz; the long one: python -m tests.fuzz).

Every case must end with a documented exit code, no Traceback, within 60 s, with its input
byte-identical and (in a fresh process) at most 3x a clean run's peak memory.
"""

from __future__ import annotations

from pathlib import Path

from fuzz.campaign import REAL, SAMPLES, run_campaign, synthetic_db

# The smaller exports keep the sample within CI's budget; the long campaign damages them all.
CI_EXPORTS = [
    *(SAMPLES / name for name in ("capture_growth_level2", "capture_healthy", "inference_baseline",
      "inference_baseline_g3_level0", "store_stall_session", "store_stall_session_marked")),
    *([REAL / "g2_level1"] if (REAL / "g2_level1").is_dir() else []),
]  # fmt: skip


def test_fuzz_sample(tmp_path: Path) -> None:
    exports = [*CI_EXPORTS, synthetic_db(tmp_path)]  # a Db export: the samples are Text
    # 80 cases: CI's share of its 15 minutes (the long campaign runs thousands, docs/reliability.md)
    summary = run_campaign(80, seed=20261201, subprocess_every=16, exports=exports)
    figures = summary.to_dict()
    assert figures["cases"] == 80 and figures["subprocess_cases"] >= 5
    assert not summary.failed, [(c.index, c.damages, c.failures) for c in summary.failed]
