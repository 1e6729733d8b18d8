"""Hazards in the input or the output directory: none crashes the run, runs code, blows up memory
or gives silently wrong findings (issue [reliability]). The fuzzer (tests/fuzz) tries them at
random; these are the known cases, one test each."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.discover import discover
from traceanalyzer.parse import json_shape

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "capture_growth_2rank"


@pytest.fixture
def collection(tmp_path: Path) -> Path:
    """A writable copy of a two-rank sample."""
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    return root


def _rank_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("*_ascend_pt"))


def _info(rank_dir: Path) -> Path:
    return next(rank_dir.glob("profiler_info*.json"))


def _edit_json(path: Path, edit) -> None:  # noqa: ANN001 - a dict -> None callable
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _run(root: Path, out: Path, *args: str):  # noqa: ANN202 - click Result
    return CliRunner().invoke(
        main, ["run", str(root), "--out", str(out), "--executor", "local", "-q", *args]
    )


# --------------------------------------------------------------------------- JSON shapes


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d.update(rank_id="²"), "rank_id"),
        (lambda d: d.update(rank_id="9" * 5000), "rank_id"),
        (lambda d: d["config"].update(experimental_config="Level1"), "experimental_config"),
        (lambda d: d["config"].update(experimental_config=["x"]), "experimental_config"),
        (lambda d: d["config"]["experimental_config"].update(_export_type=5), "_export_type"),
        (lambda d: d["config"]["experimental_config"].update(_profiler_level={"a": 1}), "_profiler_level"),
        (lambda d: d.update(end_info="y"), "end_info"),
    ],
)  # fmt: skip
def test_wrong_types_in_profiler_info_are_named_and_isolated(collection, edit, field) -> None:
    bad = _rank_dirs(collection)[1]
    _edit_json(_info(bad), edit)
    found = discover(collection)
    assert len(found.sessions) == 2  # the rank is still analysed, without that field
    named = [p for p in found.problems if p.path == str(_info(bad))]
    assert named and field in named[0].message, found.problems


def test_profiler_level_as_a_dict_does_not_crash_the_summary(collection, tmp_path) -> None:
    bad = _rank_dirs(collection)[0]
    _edit_json(_info(bad), lambda d: d["config"]["experimental_config"].update(_profiler_level={}))
    result = CliRunner().invoke(
        main, ["run", str(collection), "--out", str(tmp_path / "out"), "--executor", "local"]
    )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 1, 3), result.output
    assert "_profiler_level" in result.output


def test_parallel_group_info_of_the_wrong_type(collection) -> None:
    meta = _rank_dirs(collection)[0] / "profiler_metadata.json"
    _edit_json(meta, lambda d: d.update(parallel_group_info="y"))
    found = discover(collection)
    assert len(found.sessions) == 2
    assert any("parallel_group_info" in p.message for p in found.problems)


def test_deep_nesting_is_refused_before_it_recurses(collection) -> None:
    info = _info(_rank_dirs(collection)[0])
    info.write_text("[" * 100_000 + "]" * 100_000)
    found = discover(collection)
    assert len(found.sessions) == 2
    assert any("nested deeper" in p.message for p in found.problems), found.problems


def test_shape_keeps_undeclared_fields_and_drops_only_the_bad_one() -> None:
    doc = {"rank_id": "3", "cann_version": 8, "extra": {"k": [1]}}
    kept, problems = json_shape.conform(doc, json_shape.PROFILER_INFO)
    assert kept == {"rank_id": 3, "extra": {"k": [1]}}
    assert problems == ["cann_version: expected a string, got a number"]


# --------------------------------------------------------------------------- regular files


def test_info_file_linked_to_a_device_is_refused_at_once(collection) -> None:
    info = _info(_rank_dirs(collection)[0])
    info.unlink()
    info.symlink_to("/dev/urandom")
    found = discover(collection)
    assert len(found.sessions) == 2
    assert any("not a regular file" in p.message for p in found.problems)


def test_info_file_that_is_a_fifo_or_too_large(collection) -> None:
    first, second = (_info(d) for d in _rank_dirs(collection))
    first.unlink()
    os.mkfifo(first)  # opening it for reading would block forever
    with open(second, "r+b") as fh:
        fh.truncate(json_shape.MAX_BYTES + 1)
    found = discover(collection)
    messages = " ".join(p.message for p in found.problems)
    assert "not a regular file" in messages and "cap" in messages


# --------------------------------------------------------------------------- rule errors


def test_a_rule_that_fails_makes_the_run_partial(collection, tmp_path) -> None:
    from traceanalyzer.engine.scaffold import RULE_TEMPLATE

    rules = tmp_path / "rules"
    rules.mkdir()
    source = RULE_TEMPLATE.format(rule_id="TA199", name="boom", summary="Boom.", func="boom")
    (rules / "boom.py").write_text(source.replace("p = ctx.params", 'raise RuntimeError("boom")'))
    result = _run(collection, tmp_path / "out", "--rules", str(rules))
    assert result.exit_code == 3, result.output
    assert "boom" in result.output
