"""The README's two quick-start commands stay true: CI runs the test one, the sample exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _quick_start_commands() -> list[str]:
    text = (REPO / "README.md").read_text("utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_quick_start_has_exactly_two_commands() -> None:
    assert len(_quick_start_commands()) == 2


def test_ci_runs_the_readme_test_command() -> None:
    test_command = _quick_start_commands()[1]
    assert "pytest" in test_command
    assert test_command in (REPO / ".ci" / "run").read_text("utf-8")


def test_quick_start_sample_exists() -> None:
    run_command = _quick_start_commands()[0]
    sample = re.search(r"traceanalyzer run (\S+)", run_command).group(1)
    assert list((REPO / sample).glob("*_ascend_pt")), sample


def test_readme_says_what_the_tests_skip_and_how_long_they_take() -> None:
    from synth_support import REAL_TRACES_ENV

    text = " ".join((REPO / "README.md").read_text("utf-8").split())
    for said in (REAL_TRACES_ENV, "chromium", "Ray", "msprof-analyze", '-m "not slow"', "minutes"):
        assert said in text, said
