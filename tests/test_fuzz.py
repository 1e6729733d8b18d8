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


# The hazards of round 3 (tests/fuzz/limits.py): times at the limits in Db and Text exports
# (both trace readers compared on every damaged trace), pattern parameters set by a config
# file inside the input, a folder named in GBK; and bad environment values, in fresh processes.
ROUND_3 = ["db_times", "text_times", "user_patterns", "gbk_folder"]


def test_fuzz_sample_of_round_3(tmp_path: Path) -> None:
    exports = [SAMPLES / "inference_baseline", SAMPLES / "store_stall_session",
               synthetic_db(tmp_path)]  # fmt: skip
    summary = run_campaign(16, seed=20261202, subprocess_every=0, exports=exports, kinds=ROUND_3)
    assert not summary.failed, [(c.index, c.damages, c.failures) for c in summary.failed]
    assert set(summary.to_dict()["damage_kinds"]) >= set(ROUND_3)
    with_env = run_campaign(2, seed=20261203, exports=exports, kinds=["environment", "text_times"])
    assert with_env.to_dict()["subprocess_cases"] == 2
    assert not with_env.failed, [(c.index, c.damages, c.failures) for c in with_env.failed]
