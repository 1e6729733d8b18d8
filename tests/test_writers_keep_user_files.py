"""Every command that writes or deletes leaves what is not its own alone (issue [polish-3]: `recipe
render --force` deleted a checkout's `.git`). A folder holding a user's file, a subfolder and a
git-like `.git` is given to each command; afterwards they are as they were. `recipe render`
and `synth` have theirs beside their other tests (tests/test_recipes_render.py,
tests/test_synth_cli.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import writer_support
from click.testing import CliRunner, Result

from traceanalyzer.cli import main

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
# plots/: a run prunes its own old figures there, never a file of the user's
USER_FILES = {**writer_support.USER_FILES, "plots/mychart.png": "not a run's figure"}


def _plant(folder: Path) -> dict[str, tuple[str, int]]:
    return writer_support.plant(folder, USER_FILES)


def _user_state(folder: Path) -> dict[str, tuple[str, int]]:
    return writer_support.user_state(folder, USER_FILES)


def _cli(*args: object) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def run_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("writers") / "out"
    assert _cli("run", SAMPLE, "--out", out, "-q").exit_code == 0
    return out


@pytest.mark.parametrize("force", [False, True])
def test_run_into_a_folder_of_the_users(tmp_path: Path, force: bool) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = _plant(out)
    for _ in range(2):  # cold, then warm (the store's upkeep removes what it does not list)
        result = _cli("run", SAMPLE, "--out", out, "-q", *(["--force"] if force else []))
        assert result.exit_code == 0, result.output
    assert (out / "findings.json").is_file()
    assert _user_state(out) == before


def test_annotate_of_an_out_holding_the_users_files(run_out: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(run_out, out)
    before = _plant(out)
    result = _cli("annotate", out)
    assert result.exit_code == 0, result.output
    assert len(list((out / "annotated").rglob("trace_view.json"))) == 2
    assert _user_state(out) == before


def test_diff_into_a_folder_of_the_users(run_out: Path, tmp_path: Path) -> None:
    target = tmp_path / "diff"
    target.mkdir()
    before = _plant(target)
    result = _cli("diff", run_out, run_out, "--out", target, "-q")
    assert result.exit_code == 0, result.output
    assert (target / "diff.json").is_file() and (target / "diff.html").is_file()
    assert _user_state(target) == before


@pytest.mark.parametrize("where", ["inside", "file"])
def test_diff_out_inside_a_trace_folder_or_on_a_file_is_refused(run_out, tmp_path, where) -> None:
    """`diff TRACES OUT --out TRACES/x` wrote diff.json into the input."""
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLE, traces)
    listing = sorted(p.relative_to(traces) for p in traces.rglob("*"))
    out = traces / "diff" if where == "inside" else tmp_path / "a-file"
    if where == "file":
        out.write_text("mine")
    result = _cli("diff", traces, run_out, "--out", out, "-q")
    assert result.exit_code == 2, result.output
    reason = "traceanalyzer never writes into its input" if where == "inside" else "not a directory"
    assert reason in result.output
    assert sorted(p.relative_to(traces) for p in traces.rglob("*")) == listing
    assert where == "inside" or out.read_text() == "mine"


def test_rules_new_beside_the_users_files_and_never_through_a_link(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    before = _plant(rules)
    result = _cli("rules", "new", "slow-thing", "--rules", rules)
    assert result.exit_code == 0, result.output
    assert (rules / "slow_thing.py").is_file() and _user_state(rules) == before
    elsewhere = tmp_path / "elsewhere.py"  # a dangling link, named as the next rule's file
    (rules / "other_thing.py").symlink_to(elsewhere)
    result = _cli("rules", "new", "other-thing", "--rules", rules)
    assert result.exit_code == 2 and "other_thing.py already exists" in result.output
    assert not elsewhere.exists()
