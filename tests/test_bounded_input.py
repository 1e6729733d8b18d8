"""Round 3 of the hazards of a received collection (issue [untrusted-input-2]): nothing in it
takes unbounded time or memory, garbage times never become findings, and no name or
environment value that can be wrong ends in a Traceback. One test per hazard; the fuzzer
(tests/fuzz) tries them at random."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_untrusted_input import _within

from traceanalyzer.cli import main
from traceanalyzer.discover import discover
from traceanalyzer.store import Store

OUT = "ASCEND_PROFILER_OUTPUT"


def _rank_dir(root: Path, name: str, info: dict | None = None, files: dict | None = None) -> Path:
    """A rank directory with an empty trace and the given info and output files."""
    rank = root / name
    (rank / OUT).mkdir(parents=True)
    (rank / OUT / "trace_view.json").write_text("[]")
    if info is not None:
        (rank / "profiler_info_0.json").write_text(json.dumps(info))
    for file, text in (files or {}).items():
        (rank / OUT / file).write_text(text)
    return rank


# --------------------------------------------------------------------------- discovery


def test_an_absurd_rank_id_costs_no_memory(tmp_path: Path) -> None:
    """Before, missing-rank detection built the set of 2**31 expected ranks: 4.6 GB, then a
    MemoryError that lost every rank."""
    _rank_dir(tmp_path, "a_ascend_pt", {"rank_id": 2147483647})
    started = time.monotonic()
    found = discover(tmp_path)
    assert time.monotonic() - started < 5
    assert [s.rank for s in found.sessions] == [2147483647]
    (missing,) = [p.message for p in found.problems if "missing ranks" in p.message]
    assert missing.startswith("missing ranks: 0, 1, 2,") and missing.endswith(
        " ... (2147483647 of 2147483648 expected)"
    )


def test_missing_ranks_count_the_parallel_groups_too(tmp_path: Path) -> None:
    groups = {"tp": {"group_name": "tp", "global_ranks": [0, 1, 2, 5]}}
    rank = _rank_dir(tmp_path, "a_ascend_pt", {"rank_id": 2})
    (rank / "profiler_metadata.json").write_text(json.dumps({"parallel_group_info": groups}))
    (missing,) = [p.message for p in discover(tmp_path).problems if "missing" in p.message]
    assert missing == "missing ranks: 0, 1, 5 (3 of 4 expected)"


@pytest.mark.parametrize(
    "digits",
    ["9" * 5000, "99999999999", "٣"],  # 5,000 digits; past int32; an Arabic-Indic digit
    ids=["5000-digits", "past-int32", "not-ascii"],
)
def test_a_device_id_that_is_no_id_is_ignored(tmp_path: Path, digits: str) -> None:
    """Before, a 5,000-digit Device_id raised ValueError from int(): a Traceback, every rank
    lost."""
    csv = f"Device_id,Name\n{digits},kernel\n"
    _rank_dir(tmp_path, "a_ascend_pt", files={"kernel_details.csv": csv})
    (session,) = discover(tmp_path).sessions
    assert session.device_id is None and session.rank == -1


def test_digits_in_names_that_are_no_rank_or_pid_are_ignored(tmp_path: Path) -> None:
    rank = _rank_dir(tmp_path, f"host_{'9' * 200}_20250109074803000_ascend_pt")
    (rank / f"profiler_info_{'7' * 200}.json").write_text("{}")
    (session,) = discover(tmp_path).sessions
    assert session.os_pid is None and session.rank == -1 and session.rank_source == "unknown"


# --------------------------------------------------------------------------- names


def test_rules_new_refuses_a_name_too_long_for_a_file(tmp_path: Path) -> None:
    """Before, 300 characters gave OSError (File name too long) as a Traceback."""
    result = CliRunner().invoke(main, ["rules", "new", "a" * 300, "--rules", str(tmp_path / "r")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "300 characters: use at most 64" in result.output
    assert not (tmp_path / "r").exists()


def test_rules_new_says_why_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(
        main, ["rules", "new", "slow-x", "--rules", str(tmp_path / "file" / "r")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"error: cannot write the rule into {tmp_path / 'file' / 'r'}: " in result.output


# --------------------------------------------------------------------------- patterns


def test_a_backtracking_pattern_parameter_ends_at_once() -> None:
    """A config file inside the collection set ``ep_groups = "^(a|a)*$"``: against a group name
    of 41 characters, Python's ``re`` never ended, and neither did the run."""
    from traceanalyzer.analyses.moe import _ep_groups
    from traceanalyzer.engine.loader import load_rules
    from traceanalyzer.engine.params import Params
    from traceanalyzer.engine.rule import RuleContext
    from traceanalyzer.kit.testing import StoreBuilder

    groups = {"x": {"group_name": "a" * 40 + "b", "global_ranks": [0, 1]}}
    store = StoreBuilder()
    for rank in (0, 1):
        store.session(
            rank, f"s{rank}", start_ns=0, end_ns=10, metadata={"parallel_group_info": groups}
        )
    rule = load_rules(entry_points=False).rules.get("moe-load-imbalance")
    values = {name: param.default for name, param in rule.params.items()}
    ctx = RuleContext(rule, store.store(), Params({**values, "ep_groups": "^(a|a)*$"}))
    with _within(10):
        found = _ep_groups(ctx, [0, 1])
    assert all(group.source != "metadata" for group in found)
    ctx = RuleContext(rule, store.store(), Params({**values, "ep_groups": "^a+b$"}))
    assert [(g.name, g.source) for g in _ep_groups(ctx, [0, 1])] == [("a" * 40 + "b", "metadata")]


def test_first_match_is_a_search() -> None:
    from traceanalyzer.kit import first_match

    assert first_match("b(c)", "abcd") == "bc"
    assert first_match("^x", "abc") is None
    with _within(10):
        assert first_match("^(a|a)*$", "a" * 10_000 + "b") is None


# --------------------------------------------------------------------------- shares


def test_no_finding_states_a_share_outside_0_to_100_percent() -> None:
    from traceanalyzer.engine.findings import Finding
    from traceanalyzer.kit import window_share

    metrics = {"cost_share": 621333.0, "stream_share": -0.5, "phase_share": float("nan"),
               "cost_ns": -5, "shares": 7}  # fmt: skip
    finding = Finding(rule="TA100", name="r", severity="error", ranks=[0], sessions=["s"],
                      title="t", message="m", fix="f", metrics=metrics)  # fmt: skip
    written = finding.to_dict()["metrics"]
    assert written == {"cost_share": 1.0, "stream_share": 0.0, "phase_share": None,
                       "cost_ns": -5, "shares": 7}  # fmt: skip
    assert window_share(5.0, -10) is None and window_share(-5.0, 10) == 0.0
    assert window_share(50.0, 10) == 1.0 and window_share(5.0, 10) == 0.5


# --------------------------------------------------------------------------- CSV width

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "inference_baseline"


class _CountingSink:
    def arrow(self, table: str, data: object) -> int:
        return data.num_rows  # type: ignore[attr-defined]

    def batches(self, table: str, tables: Iterable) -> int:
        return sum(part.num_rows for part in tables)


def _kernels(tmp_path: Path, edit: Callable[[list[str]], list[str]]) -> Path:
    source = next(SAMPLE.glob(f"*/{OUT}/kernel_details.csv"))
    path = tmp_path / "kernel_details.csv"
    path.write_text("\n".join(edit(source.read_text().split("\n"))))
    return path


def test_a_csv_of_100001_columns_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Before, DuckDB's reader aborted the process (std::bad_alloc, exit 134) and Arrow's took
    1.4 GB for a 2 MB file."""
    from traceanalyzer.parse.csv_tables import SPECS, CsvRefused, parse_csv

    path = _kernels(tmp_path, lambda lines: [lines[0] + ",c" * 100_001, *lines[1:]])
    spec = next(s for s in SPECS if s.file == "kernel_details.csv")
    with pytest.raises(CsvRefused, match=r"100,04\d columns in its header, more than the 2,048"):
        parse_csv(path, spec, _CountingSink())


def test_rows_of_many_extra_fields_cost_those_rows_in_no_time(tmp_path: Path) -> None:
    """Before, DuckDB recorded a reject per extra field, in time growing faster than their
    number: these two rows took about a minute (two of 100,000 extra fields ran past the
    rank's 300 s deadline, at 3 GB)."""
    from traceanalyzer.parse.csv_tables import SPECS, parse_csv

    def widen(lines: list[str]) -> list[str]:
        lines[3] += ",1" * 30_000
        lines[5] = "x," * 30_000
        return lines

    path = _kernels(tmp_path, widen)
    spec = next(s for s in SPECS if s.file == "kernel_details.csv")
    rows = sum(bool(line) for line in path.read_text().split("\n")) - 1
    started = time.monotonic()
    result = parse_csv(path, spec, _CountingSink())
    assert time.monotonic() - started < 10
    assert result.rows == rows - 2
    assert result.warnings == [
        f"{path}: lines 4, 6: malformed rows skipped (wrong number of fields: too many)"
    ]


@pytest.mark.parametrize("tail_mb", [17, 40])
def test_a_tail_of_zeros_costs_that_line_only(tmp_path: Path, tail_mb: int) -> None:
    """A file whose tail was never written (zeros where a crashed writer reserved the space)
    keeps the rows before it. Before, DuckDB took 7 s to reject a 17 MB line, and a line of
    more than its 32 MB buffer failed the whole file, with a message quoting every zero."""
    from traceanalyzer.parse.csv_tables import SPECS, parse_csv

    path = _kernels(tmp_path, lambda lines: lines)
    rows = sum(bool(line) for line in path.read_text().split("\n")) - 1
    lines = path.read_text().count("\n") + 1
    with open(path, "r+b") as fh:  # sparse: no disk or memory spent on the zeros
        fh.truncate(path.stat().st_size + (tail_mb << 20))
    spec = next(s for s in SPECS if s.file == "kernel_details.csv")
    result = parse_csv(path, spec, _CountingSink())
    assert result.rows == rows
    assert result.warnings == [
        f"{path}: line {lines}: malformed row skipped (line longer than 16 MB)"
    ]


def test_a_file_duckdb_fails_is_refused_in_one_short_line(tmp_path: Path) -> None:
    """DuckDB's own message quotes the offending line whole (25 KB of escaped zeros in the
    log): the refusal says what failed in its first line only."""
    from traceanalyzer.parse.csv_tables import SPECS, CsvDatabase, CsvRefused, _read_salvaging

    path = tmp_path / "kernel_details.csv"
    path.write_bytes(b"\0" * (33 << 20))
    spec = next(s for s in SPECS if s.file == "kernel_details.csv")
    db = CsvDatabase()
    try:
        with pytest.raises(CsvRefused) as refused:
            _read_salvaging(path, str(path), spec, _CountingSink(), db, [])
    finally:
        db.close()
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 250


# --------------------------------------------------------------------------- garbage times


@pytest.fixture(scope="module")
def db_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-rank Db export (synthetic: the same bytes on every machine)."""
    from traceanalyzer.synth.generate import generate

    root = tmp_path_factory.mktemp("db_export") / "in"
    generate("inference-baseline", root, ranks=2, export="db")
    return root


def _damaged_db(db_export: Path, tmp_path: Path, sql: str) -> Path:
    root = tmp_path / "in"
    shutil.copytree(db_export, root)
    db = next(root.glob(f"*/{OUT}/ascend_pytorch_profiler_0.db"))
    with contextlib.closing(sqlite3.connect(db)) as con:
        con.execute(sql)
        con.commit()
    return root


@pytest.mark.parametrize(
    ("sql", "dropped"),
    [
        # SQLite hands a REAL of 1e300 in an INTEGER column over as int64's largest
        ("UPDATE TASK SET startNs = 1e300 WHERE rowid = (SELECT min(rowid) FROM TASK)", 1),
        ("UPDATE TASK SET endNs = startNs - 1000000 WHERE rowid % 3 = 0", None),
    ],
    ids=["start-1e300", "end-before-start"],
)
def test_garbage_db_times_never_become_findings(db_export, tmp_path, sql, dropped) -> None:
    """Before: ``error host-launch-bound ... 62133300% of its -7.49e+09 s span idle``, exit 1
    under --fail-on error, and every share of the overview off."""
    root = _damaged_db(db_export, tmp_path, sql)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["run", str(root), "--out", str(out), "--executor", "local", "--fail-on", "error"]
    )
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    note = re.search(
        r"ascend_pytorch_profiler_0\.db: slices: (\d+) row\(s\) with an impossible time dropped "
        r"\(dur_ns not a duration of 0 to 7 days: \d+",
        result.output,
    )
    assert note and (dropped is None or int(note[1]) == dropped), result.output
    assert "ascend_pytorch_profiler_0.db: kernels: " in result.output
    document = json.loads((out / "findings.json").read_text())
    shares = [
        value
        for finding in document["findings"]
        for key, value in finding["metrics"].items()
        if key.endswith("share") and isinstance(value, (int, float))
    ]
    assert all(0 <= share <= 1 for share in shares)
    sessions = Store.open(out).table("sessions").collect()
    assert (sessions["end_ns"] > sessions["start_ns"]).all()
    assert (sessions["end_ns"] - sessions["start_ns"]).max() < 10**12  # not 1.7e18
    for rank in document["summary"]["overview"]["ranks"]:
        assert 0 <= rank["total_ns"] < 10**12


# --------------------------------------------------------------------------- paths

GBK = os.fsdecode(b"\xca\xfd\xbe\xdd")  # 数据 in GBK: no UTF-8


@pytest.mark.parametrize("native", ["1", "0"], ids=["native", "duckdb"])
def test_a_collection_under_a_folder_named_in_gbk_is_analysed(
    tmp_path: Path, db_export: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    """Before, every rank failed with UnicodeEncodeError (the store's path column, Arrow's and
    DuckDB's file names) and report.html and report.md could not be written."""
    monkeypatch.setenv("TRACEANALYZER_NATIVE", native)
    root = tmp_path / "in" / GBK
    shutil.copytree(SAMPLE, root / "text")
    shutil.copytree(db_export, root / "db")
    kernels = next(root.glob(f"text/*/{OUT}/kernel_details.csv"))
    lines = kernels.read_bytes().split(b"\n")
    kernels.write_bytes(b"\n".join([*lines[:3], b"1,2,3", *lines[3:]]))  # read by DuckDB
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(tmp_path / "in"), "--out", str(out)])
    assert result.exit_code in (0, 3) and "Traceback" not in result.output, result.output
    assert result.output.count(": ingested (") == 3, result.output
    assert "kernel_details.csv: line 4: malformed row skipped" in result.output
    shown = str(tmp_path / "in" / "\\xca\\xfd\\xbe\\xdd")
    paths = Store.open(out).table("sessions").collect()["path"].to_list()
    assert paths and all(path.startswith(shown) for path in paths)
    assert "report report" not in result.output  # (report.html failed: UnicodeEncodeError)
    assert (out / "report.html").is_file() and (out / "report.md").is_file()


def test_an_out_named_in_gbk_is_refused_and_the_default_out_is_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceanalyzer.discover import default_out_dir

    root = tmp_path / GBK
    shutil.copytree(SAMPLE, root)
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(tmp_path / f"o{GBK}")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "its name is not UTF-8 text" in result.output and not (tmp_path / f"o{GBK}").exists()
    monkeypatch.chdir(tmp_path)
    assert default_out_dir(root) == tmp_path / "traceanalyzer-out" / "\\xca\\xfd\\xbe\\xdd"


@pytest.mark.parametrize(
    "pattern", ["(", "(?=a)", "(a{1000}){1000}"], ids=["unclosed", "lookaround", "too-big"]
)
def test_a_pattern_the_rules_cannot_match_is_refused_upfront(tmp_path: Path, pattern: str) -> None:
    """Before, a bad step pattern made the steps of every rank "could not be derived" and the
    run went on (exit 0) without them; a bad rule pattern failed the rule on every rank."""
    root = tmp_path / "in"
    shutil.copytree(SAMPLE, root)
    config = root / "traceanalyzer.toml"
    config.write_text(f"[steps]\nstep_pattern = {json.dumps(pattern)}\n")
    result = CliRunner().invoke(
        main, ["run", str(root), "--out", str(tmp_path / "out"), "--config", str(config)]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert (
        f"steps.step_pattern: {pattern!r} is not a pattern the rules can match (" in result.output
    )


def test_the_time_check_drops_events_and_clears_summaries() -> None:
    import polars as pl
    import pyarrow as pa

    from traceanalyzer.parse.times import Tally, checked_arrow

    t0 = 1_736_408_883_000_000_000
    tally = Tally()
    slices = pa.table({
        "name": pa.array(["ok", "1970", "negative", "none", "2200"], pa.string_view()),
        "process": pa.array(["p"] * 5).dictionary_encode(),
        "start_ns": [t0, 5, t0, None, 7_258_118_400 * 10**9],
        "dur_ns": [10, 10, -1, 10, 10],
    })  # fmt: skip
    kept = checked_arrow("slices", slices, tally)
    assert kept.column("name").to_pylist() == ["ok"] and kept.schema == slices.schema
    steps = pa.table(
        {"step": [1, 2], "computing_ns": [5, -(2**63)], "free_ns": [8 * 86_400 * 10**9, 0]}
    )
    cleared = pl.from_arrow(checked_arrow("step_times", steps, tally))
    assert cleared.to_dicts() == [{"step": 1, "computing_ns": 5, "free_ns": None},
                                  {"step": 2, "computing_ns": None, "free_ns": 0}]  # fmt: skip
    assert tally.notes({"slices": "trace_view.json", "step_times": "analysis.db"}) == [
        "trace_view.json: slices: 4 row(s) with an impossible time dropped (dur_ns not a "
        "duration of 0 to 7 days: 1, start_ns not a time in 2000-2100: 3)",
        "analysis.db: step_times: 2 impossible time(s) cleared (computing_ns not a duration of "
        "0 to 7 days: 1, free_ns not a duration of 0 to 7 days: 1)",
    ]
    untouched = pa.table({"start_ns": [t0], "dur_ns": [0]})
    assert checked_arrow("slices", untouched, Tally()) is untouched
