"""Errors are spelt one way (`error: ...`, as ruff and uv spell them), say what was expected,
and offer the closest spelling of a mistyped command, option, rule, parameter or path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = "sample_traces/capture_growth_2rank"


def _fails(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, (args, result.output)
    assert "Traceback" not in result.output
    return result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["rnu"], "error: No such command 'rnu'. Did you mean 'run'?"),
        (["rules", "lst"], "Did you mean 'list'?"),
        (["run", SAMPLE, "--fail-onn", "x"], "Did you mean '--fail-on'?"),
        (["run", SAMPLE, "--fail-on", "bad"], "error: Invalid value for '--fail-on'"),
        (["rules", "explain", "slow-rnk"], "error: unknown rule 'slow-rnk'; did you mean 'slow-rank'?"),
        (["rules", "test", "TA0003"], "did you mean 'TA003'?"),  # TA03: TA003 or TA013
        (["run", "sample_traces/capture_growth_2rnk"], f"did you mean '{SAMPLE}'?"),
        (["run", SAMPLE, "--rules", "rulez"], "Directory 'rulez' does not exist; did you mean 'rules'?"),
        (["annotate", "sample_tracez"], "did you mean 'sample_traces'?"),
        (["synth", "store-stal", "--out", "x"], "error: unknown scenario 'store-stal'; did you mean 'store-stall'?"),
        (["recipe", "show", "graph-capture-repet"], "did you mean 'graph-capture-repeat'?"),
    ],
)  # fmt: skip
def test_errors_are_spelt_one_way_and_offer_the_closest(
    args: list[str], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    output = _fails(*args)
    assert said in output, output
    assert "Error:" not in output, output


def test_no_message_spells_it_error_with_a_capital() -> None:
    """click's own reports are re-spelt by the main group; nothing of ours writes `Error:`."""
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "traceanalyzer").rglob("*.py"))
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if re.search(r"""["'](\\n)?Error:""", line)
    ]
    assert not found, found


def test_a_mistyped_path_is_corrected_part_by_part(tmp_path: Path) -> None:
    from traceanalyzer.hints import path_did_you_mean

    (tmp_path / "profiling_data" / "rank0_ascend_pt").mkdir(parents=True)
    assert path_did_you_mean(tmp_path / "profilng_data" / "rank0_ascnd_pt") == (
        f"; did you mean '{tmp_path / 'profiling_data' / 'rank0_ascend_pt'}'?"
    )
    assert path_did_you_mean(tmp_path / "profilng_data" / "zzz") == ""  # nothing close exists
    assert path_did_you_mean(tmp_path / "nothing_like_it") == ""


def test_a_bad_value_says_what_was_expected() -> None:
    from traceanalyzer.hints import expected

    assert expected(4) == "a whole number (default 4)"
    assert expected(0.5) == "a number (default 0.5)"
    assert expected(True) == "true or false (default true)"
    assert expected(("NOTIFY_WAIT", "EVENT_WAIT")) == (
        "a comma-separated list (default 'NOTIFY_WAIT,EVENT_WAIT')"
    )
    output = _fails("synth", "store-stall", "--set", "spans=x", "--out", "x")
    assert "knob spans='x': expected a whole number (default 2)" in output
