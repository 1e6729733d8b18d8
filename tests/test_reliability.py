"""Hazards in the input or the output directory: none crashes the run, runs code, blows up memory
or gives silently wrong findings (issue [reliability]). The fuzzer (tests/fuzz) tries them at
random; these are the known cases, one test each."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer import json_shape
from traceanalyzer.cli import main
from traceanalyzer.discover import discover

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


def test_a_5000_digit_number_costs_its_field_not_the_file(collection) -> None:
    info = _info(_rank_dirs(collection)[1])
    text = info.read_text()
    info.write_text(text.replace('"rank_id": 1', '"rank_id": ' + "9" * 5000))
    found = discover(collection)
    assert [s.rank for s in found.sessions] == [0, 1]  # from the file name
    assert any("rank_id: expected an integer" in p.message for p in found.problems)
    assert found.sessions[1].profiler_level == "Level1"  # the rest of the file is kept


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
    assert any("/dev/urandom, outside the input: not followed" in p.message for p in found.problems)
    found = discover(collection, follow_links=True)  # followed, it is still never read
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
    from traceanalyzer.authoring.scaffold import RULE_TEMPLATE

    rules = tmp_path / "rules"
    rules.mkdir()
    source = RULE_TEMPLATE.format(rule_id="TA199", name="boom", summary="Boom.", func="boom")
    (rules / "boom.py").write_text(source.replace("p = ctx.params", 'raise RuntimeError("boom")'))
    result = _run(collection, tmp_path / "out", "--rules", str(rules))
    assert result.exit_code == 3, result.output
    assert "boom" in result.output


# --------------------------------------------------------------------------- the output


def _no_traceback(result) -> None:  # noqa: ANN001 - click Result
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output


def test_out_inside_a_symlinked_rank_dir_is_refused(tmp_path) -> None:
    elsewhere = tmp_path / "shared"
    shutil.copytree(SAMPLE, elsewhere)
    rank_dir = _rank_dirs(elsewhere)[0]
    root = tmp_path / "in"
    root.mkdir()
    (root / rank_dir.name).symlink_to(rank_dir, target_is_directory=True)
    before = sorted(p.name for p in rank_dir.iterdir())
    result = _run(root, rank_dir / "out", "--follow-links")
    _no_traceback(result)
    assert result.exit_code == 2 and "never writes into its input" in result.output
    assert sorted(p.name for p in rank_dir.iterdir()) == before
    # not followed, the link's rank is no input: said, and nothing is analysed
    result = _run(root, tmp_path / "out")
    assert result.exit_code == 2 and "outside the input: not followed" in result.output


def test_out_under_a_regular_file(collection, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = _run(collection, blocker / "out")
    _no_traceback(result)
    assert result.exit_code == 2 and "--out" in result.output


def test_out_that_cannot_be_created_or_written(collection, tmp_path, monkeypatch) -> None:
    # (as root, chmod does not stop a write: the refusals are simulated)
    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN202
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    result = _run(collection, tmp_path / "ro" / "out")
    _no_traceback(result)
    assert result.exit_code == 2 and "cannot be created: Permission denied" in result.output
    monkeypatch.undo()
    existing = tmp_path / "existing"
    existing.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode, **kw: not mode & os.W_OK and real_access(p, mode, **kw)
    )
    result = _run(collection, existing)
    _no_traceback(result)
    assert result.exit_code == 2 and "not writable" in result.output


def test_a_full_disk_blames_the_output_not_the_input(collection, tmp_path, monkeypatch) -> None:
    import errno

    from traceanalyzer.ingest import sink

    def full(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sink, "commit_partition", full)
    result = _run(collection, tmp_path / "out")
    _no_traceback(result)
    assert result.exit_code == 4, result.output
    assert "cannot write the output" in result.output and "unreadable" not in result.output


def test_a_report_that_cannot_be_written_fails_the_run(collection, tmp_path, monkeypatch) -> None:
    from traceanalyzer.report import writer

    real = writer.write_atomic_text

    def flaky(path: Path, text: str) -> None:
        if path.name == "findings.sarif":
            raise OSError(28, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(writer, "write_atomic_text", flaky)
    result = _run(collection, tmp_path / "out")
    _no_traceback(result)
    assert result.exit_code == 4, result.output
    assert "findings.sarif" in result.output


# --------------------------------------------------------------------------- long names

_PEAK_RSS = """
import resource, sys
from traceanalyzer.ingest import ingest
result = ingest(sys.argv[1], sys.argv[2])
assert not result.failed, result.to_dict()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _ingest_peak_kb(root: Path, out: Path, native: bool) -> int:
    import subprocess
    import sys

    env = {**os.environ, "TRACEANALYZER_NATIVE": "1" if native else "0"}
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(root), str(out)],
        capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1])


@pytest.mark.parametrize("native", [True, False], ids=["native", "duckdb"])
def test_a_2mb_process_name_is_cut_once_not_repeated_per_row(tmp_path, native) -> None:
    import polars as pl

    from traceanalyzer.parse.trace_shared import MAX_NAME
    from traceanalyzer.store import Store

    clean = tmp_path / "clean"
    shutil.copytree(REPO / "sample_traces" / "capture_growth_level2", clean)
    long = tmp_path / "long"
    shutil.copytree(clean, long)
    trace = next(long.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"))
    events = json.loads(trace.read_text())
    device = next(e for e in events if e.get("ph") == "M" and e["name"] == "process_name"
                  and e["args"]["name"] == "Ascend Hardware")  # fmt: skip
    device["args"]["name"] += "X" * (2 << 20)
    trace.write_text(json.dumps(events))

    baseline = _ingest_peak_kb(clean, tmp_path / "out-clean", native)
    peak = _ingest_peak_kb(long, tmp_path / "out-long", native)
    assert peak < baseline + 64 * 1024, (baseline, peak)  # the file grew by 2 MB, no more
    store = Store.open(tmp_path / "out-long")
    longest = store.table("slices").select(pl.col("process").str.len_chars().max()).collect()
    assert longest.item() <= MAX_NAME
    ingest_doc = (tmp_path / "out-long" / "manifest.json").read_text()
    assert "cut to that length" in ingest_doc


# --------------------------------------------------------------------------- the store


def _ingest(root: Path, out: Path, **kwargs):  # noqa: ANN003, ANN202 - IngestResult
    from traceanalyzer.ingest import ingest

    return ingest(root, out, **kwargs)


def _parts(out: Path, table: str = "slices") -> list[Path]:
    return sorted((out / "tables" / table).glob("rank=*/session=*/part-0.parquet"))


def test_a_concurrent_cli_run_is_refused_with_a_clear_message(collection, tmp_path) -> None:
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time; os.makedirs(sys.argv[1], exist_ok=True);"
         "fd = os.open(sys.argv[1] + '/.lock', os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX);"
         "print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        result = _run(collection, out)
    finally:
        holder.kill()
        holder.wait()
    _no_traceback(result)
    assert result.exit_code == 2 and "in use by another traceanalyzer run" in result.output


def test_partitions_the_manifest_does_not_list_are_removed(collection, tmp_path) -> None:
    from traceanalyzer.store import Store

    out = tmp_path / "out"
    _ingest(collection, out)
    planted = out / "tables" / "slices" / "rank=7" / "session=other-collection"
    planted.mkdir(parents=True)
    shutil.copy(_parts(out)[0], planted / "part-0.parquet")  # as another run would leave it
    notes: list[str] = []
    result = _ingest(collection, out, progress=lambda event, *_: notes.append(event))
    assert [o.status for o in result.outcomes] == ["cached", "cached"]
    assert not planted.exists()
    # store upkeep: recorded in ingest.json, not said while ingesting
    assert result.removed_unlisted == ["7/other-collection"]
    assert not any("other-collection" in n for n in notes), notes
    assert Store.open(out).table("slices").select("rank").unique().collect().height == 2


def test_a_truncated_or_swapped_partition_is_ingested_again(collection, tmp_path) -> None:
    import polars as pl

    from traceanalyzer.store import Store

    out = tmp_path / "out"
    _ingest(collection, out)
    before = Store.open(out).table("slices").collect().sort("rank", "start_ns", "name")
    first, second = _parts(out)
    kept = first.read_bytes()
    first.write_bytes(second.read_bytes())  # a valid Parquet of another rank
    second.write_bytes(kept[: len(kept) // 2])  # truncated
    notes: list[str] = []
    result = _ingest(collection, out, progress=lambda event, *_: notes.append(event))
    assert all(o.status == "ingested" for o in result.outcomes), notes
    assert sum("ingested again" in n for n in notes) == 2, notes
    after = Store.open(out).table("slices").collect().sort("rank", "start_ns", "name")
    assert after.equals(before)
    assert pl.Series(after["rank"]).unique().len() == 2


def test_a_damaged_manifest_is_trusted_for_nothing(collection, tmp_path) -> None:
    out = tmp_path / "out"
    _ingest(collection, out)
    (out / "manifest.json").write_text('{"version": 1, "sessions": {"../x/y": 5, "0/s": {}}}')
    result = _ingest(collection, out)
    assert [o.status for o in result.outcomes] == ["ingested", "ingested"]
    for garbage in (b"[", b"\xe4\xff{", b"[" * 100_000):  # bad JSON, bad UTF-8, too deep
        (out / "manifest.json").write_bytes(garbage)
        assert [o.status for o in _ingest(collection, out).outcomes] == ["ingested", "ingested"]


# --------------------------------------------------------------------------- markdown

INJECTION = (
    "op` x\n# Injected heading\n![img](https://evil.example/p.png) "
    "[click](javascript:alert(1)) <b>html</b> `"
)


def test_trace_names_cannot_inject_markdown(tmp_path: Path) -> None:
    from traceanalyzer.engine import RuleContext, evaluate, rule, write_findings_json
    from traceanalyzer.engine.registry import RuleSet
    from traceanalyzer.kit.testing import us
    from traceanalyzer.kit.testing.rank_builder import RankBuilder, build_store
    from traceanalyzer.report.writer import write_reports
    from traceanalyzer.store import Store

    b = RankBuilder(rank=0)
    b.span(INJECTION, start_ns=us(100), dur_ns=us(50))
    out = build_store(tmp_path, b)

    @rule(id="TX902", name="echo-name", severity="warning", summary="Echoes op names.", fix="x")
    def echo(ctx: RuleContext):  # noqa: ANN202
        """
        ## What it detects
        x
        ## Why it matters
        x
        ## How to fix
        x
        ## Example
        x
        ## References
        x
        """
        import polars as pl

        rows = ctx.table("slices").filter(pl.col("name").str.starts_with("op`")).collect()
        for row in rows.iter_rows(named=True):
            yield ctx.finding(
                rank=row["rank"],
                title=f"op `{row['name']}` is odd",
                message=f"Op `{row['name']}`\nsecond line {row['name']}",
                location={"name": row["name"]},
            )

    result = evaluate(Store.open(out), rules=RuleSet([echo]), config_path=False)
    assert len(result.findings) == 1
    write_findings_json(result, out)
    assert not write_reports(out, result=result, rules=[echo]).errors
    md = (out / "report.md").read_text("utf-8")
    assert not any(line.lstrip().startswith("# Injected") for line in md.splitlines())
    assert "](https://evil" not in md.replace("\\](https://evil", "")
    assert "](javascript:" not in md.replace("\\](javascript:", "")
    assert not re.search(r"(?<!\\)<b>", md)  # only escaped (\<b>: shown as text)
    sarif = json.loads((out / "findings.sarif").read_text("utf-8"))
    markdown = sarif["runs"][0]["results"][0]["message"]["markdown"]
    assert not re.search(r"(?<!\\)<b>", markdown) and "\n# Injected" not in markdown
    assert "](javascript:" not in markdown.replace("\\](javascript:", "")


def test_sarif_uris_are_percent_encoded(tmp_path: Path) -> None:
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    first = _rank_dirs(root)[0]
    first.rename(first.with_name("npu node#0" + first.name.removeprefix("npu-node0")))
    result = _run(root, tmp_path / "out")
    assert result.exit_code == 0, result.output
    sarif = json.loads((tmp_path / "out" / "findings.sarif").read_text("utf-8"))
    uris = [
        loc["physicalLocation"]["artifactLocation"]["uri"]
        for res in sarif["runs"][0]["results"]
        for loc in res["locations"]
    ]
    assert any("npu%20node%230_" in u for u in uris), uris
    assert not any(" " in u or "#" in u for u in uris)


# --------------------------------------------------------------------------- code in OUT


def test_a_planted_pickle_in_an_empty_out_never_runs(collection, tmp_path) -> None:
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (os.system, (f"touch {marker}",))

    out = tmp_path / "out"
    for rank in (0, 1):  # where the old outcome cache kept its pickles, and next to the new one
        for place in (out / ".cache" / "rules", out / ".cache" / "rules" / f"rank={rank}"):
            place.mkdir(parents=True, exist_ok=True)
            (place / f"rank={rank}.pkl").write_bytes(pickle.dumps(Payload()))
    for _ in range(2):  # cold, then warm
        result = _run(collection, out)
        _no_traceback(result)
        assert result.exit_code == 0, result.output
    assert not marker.exists()


def test_a_trace_padded_with_nuls_is_cut_within_its_events(tmp_path) -> None:
    """A crash can leave a file of NULs after the array: shares are of the events, not the file."""
    from traceanalyzer.parse import native_scan

    trace = tmp_path / "trace_view.json"
    shutil.copy(next(SAMPLE.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json")), trace)
    events_end = trace.stat().st_size
    with open(trace, "r+b") as fh:
        fh.truncate(64 << 20)
    ranges = native_scan.ranges(trace, 2)
    assert all(end <= events_end for _, end, _ in ranges), ranges
