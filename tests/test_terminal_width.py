"""`run` fits the terminal: COLUMNS, else the tty's width, no limit for a pipe; tables give up
columns, other lines wrap under a hanging indent, -q is short, long names are shortened in the
middle (in report.html too, whole in a title)."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from report_support import SAMPLES

from traceanalyzer.cli import main
from traceanalyzer.overview.model import read_overview
from traceanalyzer.report.htmlkit import HTML_NAME, table
from traceanalyzer.report.overview_html import overview_section
from traceanalyzer.report.overview_text import overview_table
from traceanalyzer.report.width import fit, shorten_middle, terminal_width, wrap

SAMPLE = SAMPLES / "capture_growth_2rank"  # skipped rules, long session names, two tables
KERNEL = "aclnnMaxPool2dWithMaskBackward_MaxPoolGradWithArgmaxV1AiCore_" + "X" * 60 + "_GradV1"


def _run(path: Path, where: Path, *args: str, columns: str | None = "80") -> Result:
    """`run` into ``where``/out, from ``where``: a path is never cut, so the test's OUT is
    short."""
    env = {"COLUMNS": columns} if columns else {}
    with contextlib.chdir(where):
        result = CliRunner().invoke(
            main, ["run", str(path), "--out", "out", "-j", "1", *args], env=env
        )
    assert result.exit_code in (0, 3), result.output
    return result


def _too_long(result: Result, width: int = 80) -> list[str]:
    return [line for line in result.output.splitlines() if len(line) > width]


@pytest.fixture(scope="module")
def sample_80(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    where = tmp_path_factory.mktemp("width")
    return _run(SAMPLE, where), where / "out"


def test_width_is_columns_else_the_tty_else_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert terminal_width() == 100
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    assert terminal_width() is None  # a pipe: grep sees whole lines
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setattr(
        "shutil.get_terminal_size", lambda: __import__("os").terminal_size((72, 24))
    )
    assert terminal_width() == 72


def test_shorten_middle_keeps_both_ends() -> None:
    assert shorten_middle("short", 10) == "short"
    name = shorten_middle(KERNEL, 20)
    assert len(name) == 20 and name.startswith(KERNEL[:10]) and name.endswith(KERNEL[-9:])
    assert "…" in name


def test_wrap_hangs_and_keeps_quantities_whole() -> None:
    line = "skipped    some-rule                not evaluated: " + "word " * 12 + "took 12 ms there"
    lines = wrap(line, 50, 11)
    assert len(lines) > 1 and all(len(part) <= 50 for part in lines)
    assert all(part.startswith(" " * 11) and part[11] != " " for part in lines[1:])
    assert "12 ms" in " ".join(lines)  # never "12" at a line's end and "ms" on the next
    assert wrap(line, None, 11) == [line]


def test_fit_gives_up_blank_columns_then_the_name_then_columns() -> None:
    headers = ["rank", "steps", "step", "empty", "more", "kernel"]
    rows = [["0", "2", "22.2 ms", "", "10.7%", KERNEL], ["1", "2", "22.3 ms", "", "10.5%", "mm"]]
    table_ = fit(headers, rows, 60, free_last=True)
    assert table_.blank == ["empty"] and not table_.dropped
    assert all(len(line) <= 60 for line in table_.lines())
    assert KERNEL[:8] in table_.lines()[1] and KERNEL[-6:] in table_.lines()[1]
    narrow = fit(headers, rows, 24, free_last=True)
    assert narrow.dropped == ["more", "kernel"] and narrow.headers == ["rank", "steps", "step"]
    assert fit(headers, rows, None).lines()[1].endswith(KERNEL)  # no width: as is


def test_run_fits_80_columns_on_a_sample(sample_80: tuple[Result, Path]) -> None:
    result, out = sample_80
    assert not _too_long(result), _too_long(result)
    lines = result.output.splitlines()
    # the session table shortened the sessions' names in the middle and says what it left out
    assert any("npu-node0_3096…" in line for line in lines)
    assert any("no room for" in line and "report.md has every column" in line for line in lines)
    # a skipped rule's reason wraps under a hanging indent
    skipped = next(i for i, line in enumerate(lines) if line.startswith("skipped    kv-transfer"))
    assert lines[skipped + 1].startswith(" " * 11) and not lines[skipped + 1].startswith(" " * 12)
    # the top kernel is shortened in the middle (aclnnMm_MatMulCommon_MatMulV2)
    top = [line for line in lines if line.startswith("  0 ") and "aclnnMm_" in line]
    assert top and "…" in top[0] and top[0].endswith("_MatMulV2")


def test_a_pipe_gets_whole_lines(tmp_path: Path, sample_80: tuple[Result, Path]) -> None:
    result = _run(SAMPLE, tmp_path, columns=None)
    assert _too_long(result)  # unwrapped, unshortened
    skipped = [line for line in result.output.splitlines() if line.startswith("skipped")]
    assert len(skipped) == len(
        [line for line in sample_80[0].output.splitlines() if line.startswith("skipped")]
    )
    assert all(line.rstrip().endswith(")") for line in skipped)  # each reason on its line
    assert "npu-node0_3096504_20250109074803000_ascend_pt" in result.output


def test_quiet_is_short(tmp_path: Path, sample_80: tuple[Result, Path]) -> None:
    result = _run(SAMPLE, tmp_path, "-q")
    assert not _too_long(result), _too_long(result)
    lines = result.stdout.splitlines()
    assert not any(line.startswith(("skipped", "inconclusive", "store:")) for line in lines)
    assert any("rule(s) not evaluated: findings.json says why" in line for line in lines)
    assert any(line.startswith("where the time goes: ") for line in lines)
    assert len(lines) <= 12 < len(sample_80[0].stdout.splitlines())


def test_long_kernel_names_shortened_in_the_middle(sample_80: tuple[Result, Path]) -> None:
    doc = json.loads((sample_80[1] / "findings.json").read_text())
    overview = copy.deepcopy(doc["summary"]["overview"])
    overview["top_kernels"][0]["name"] = KERNEL
    for rank in overview["cluster"]:
        rank["top_kernel"] = KERNEL
    for rank in overview["ranks"]:
        rank["top_kernel"] = KERNEL
    text = overview_table(read_overview(overview), width=120)
    assert KERNEL not in text and KERNEL[:12] in text and KERNEL[-12:] in text
    html = overview_section(read_overview(overview), {})
    shown = shorten_middle(KERNEL, HTML_NAME)
    assert f'<span title="{KERNEL}">{shown}</span>' in html
    assert f">{KERNEL}<" not in html  # whole only in the title
    assert table(["kernel"], [["mm"]], names=(0,)) == table(["kernel"], [["mm"]])  # short: as is


def test_run_fits_80_columns_on_the_real_export(real_g2: Path, tmp_path: Path) -> None:
    result = _run(real_g2, tmp_path, "-v")
    assert not _too_long(result), _too_long(result)
    assert "device memory" in result.output  # its tables fit too
    html = (tmp_path / "out" / "report.html").read_text()
    long_name = (
        "aclnnMaxPool2dWithMaskBackward_MaxPoolGradWithArgmaxV1AiCore_MaxPoolGradWithArgmaxV1"
    )
    assert f'<span title="{long_name}">' in html


def test_progress_fits_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    from traceanalyzer.cli import _Progress
    from traceanalyzer.ingest import SessionOutcome

    session = "npu-node0_3096504_20250109074803000_ascend_pt_" + "x" * 60
    progress = _Progress(quiet=False, width=80)
    progress("session", 1, 2, SessionOutcome(rank=0, session=session, path="p", status="ingested"))
    progress("executor: local (" + "a long reason, " * 10 + ")", 1, 2, None)
    lines = capsys.readouterr().err.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("[1/2] rank 0 npu-node0_") and "…" in lines[0]
    assert lines[0].endswith(": ingested (0.0 s)") and lines[2].startswith("    ")
