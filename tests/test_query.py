"""`traceanalyzer query OUT "SQL"`: DuckDB SQL over the store's tables as views, in four formats,
and never a change to the store."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from report_support import run_sample

from traceanalyzer.cli import main
from traceanalyzer.schema import DERIVED_TABLES, TABLES
from traceanalyzer.store import Store

SAMPLE = "capture_growth_2rank"


@pytest.fixture(scope="module")
def out() -> Path:
    return run_sample(SAMPLE)


def query(*args: str) -> str:
    result = CliRunner().invoke(main, ["query", *args])
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args: str) -> str:
    result = CliRunner().invoke(main, ["query", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.startswith(("error: ", "Usage"))
    return result.output


def _fingerprint(folder: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(folder)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_every_table_is_a_view_with_rank_and_session(out: Path) -> None:
    store = Store.open(out)
    for name, table in {**TABLES, **DERIVED_TABLES}.items():
        doc = json.loads(query(str(out), f"SELECT * FROM {name} LIMIT 0", "--format", "json"))
        assert doc == []
        described = query(str(out), f"DESCRIBE {name}", "--format", "csv")
        rows = list(csv.DictReader(io.StringIO(described)))
        assert [r["column_name"] for r in rows] == table.column_names, name
        count = json.loads(query(str(out), f"SELECT count(*) AS n FROM {name}", "--format", "json"))
        assert count == [{"n": store.rows(name)}], name


def test_one_question_in_sql_matches_the_store(out: Path) -> None:
    """Host memcpy calls per rank, in SQL and in polars: the same numbers."""
    sql = (
        "SELECT rank, count(*) AS calls, sum(dur_ns) AS total_ns FROM slices "
        "WHERE api_name = 'aclrtMemcpy' GROUP BY rank ORDER BY rank"
    )
    in_sql = json.loads(query(str(out), sql, "--format", "json"))
    expected = (
        Store.open(out)
        .table("slices")
        .filter(pl.col("api_name") == "aclrtMemcpy")
        .group_by("rank")
        .agg(pl.len().alias("calls"), pl.col("dur_ns").sum().alias("total_ns"))
        .sort("rank")
        .collect()
        .to_dicts()
    )
    assert in_sql == expected and len(expected) == 2


def test_formats(out: Path, tmp_path: Path) -> None:
    sql = "SELECT rank, session, name, total_ns FROM summary_kernels ORDER BY total_ns DESC LIMIT 3"
    table = query(str(out), sql)
    assert table.startswith("┌") and "│ rank" in table and "int32" in table
    rows = list(csv.DictReader(io.StringIO(query(str(out), sql, "--format", "csv"))))
    assert len(rows) == 3 and list(rows[0]) == ["rank", "session", "name", "total_ns"]
    records = json.loads(query(str(out), sql, "--format", "json"))
    assert [r["name"] for r in records] == [r["name"] for r in rows]
    assert isinstance(records[0]["total_ns"], int)
    parquet = tmp_path / "top.parquet"
    assert query(str(out), sql, "--format", "parquet", "--output", str(parquet)) == ""
    assert pl.read_parquet(parquet).to_dicts() == records
    written = tmp_path / "top.csv"
    query(str(out), sql, "--format", "csv", "-o", str(written))
    assert list(csv.DictReader(written.open())) == rows
    # the table format shows a long result's first and last rows, and says so
    long = query(str(out), "SELECT * FROM range(1000)")
    assert "1000 rows" in long and "(40 shown)" in long


def test_list_shows_the_schema(out: Path) -> None:
    listed = query(str(out), "--list")
    store = Store.open(out)
    for name, table in {**TABLES, **DERIVED_TABLES}.items():
        assert f"\n{name} ({store.rows(name):,} rows): " in f"\n{listed}", name
        for column in table.columns:
            assert f"  {column.name} " in listed, (name, column.name)
    assert "start_ns           BIGINT" in listed
    assert "\nl2_cache (0 rows): " in listed  # a table the sample's profile did not collect


def test_the_store_never_changes(out: Path, tmp_path: Path) -> None:
    before = _fingerprint(out)
    statements = {
        "COPY (SELECT 1) TO 'x.csv'": "not COPY: the store is read-only",
        "CREATE TABLE t AS SELECT 1": "not CREATE",
        "DROP VIEW slices": "not DROP",
        "INSERT INTO slices SELECT * FROM slices": "not INSERT",
        f"ATTACH '{tmp_path / 'x.db'}'": "not ATTACH",
        "SET threads = 1": "not SET",
        "PRAGMA version": "not PRAGMA",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'": "not EXPLAIN",
        "SELECT 1; DROP VIEW slices": "one query at a time: found 2 statements",
        "SELECT * FROM query('COPY (SELECT 1) TO ''x.csv''')": "Expected a single SELECT",
    }
    for sql, said in statements.items():
        assert said in refused(str(out), sql), sql
    for target in (out / "findings.json", out / "tables" / "slices" / "x.parquet"):
        said = refused(str(out), "SELECT 1", "--format", "parquet", "-o", str(target))
        assert "inside the run output" in said
    query(str(out), "SELECT count(*) FROM slices")  # reading leaves no trace either
    assert _fingerprint(out) == before
    assert not list(Path.cwd().glob("x.*"))


def test_exact_errors(out: Path, tmp_path: Path) -> None:
    assert "did you mean 'slices'?" in refused(str(out), "SELECT * FROM slics")
    assert 'syntax error at or near "SELEC"' in refused(str(out), "SELEC 1")
    assert "Referenced column" in refused(str(out), "SELECT no_such_column FROM slices")
    assert "Could not convert" in refused(str(out), "SELECT 'abc'::INTEGER")  # at run time
    (tmp_path / "not_a_run").mkdir()
    assert "is not a run output (no tables/ folder)" in refused(
        str(tmp_path / "not_a_run"), "SELECT 1"
    )
    assert "parquet writes a file: add --output FILE" in refused(
        str(out), "SELECT 1", "--format", "parquet"
    )
    assert "give the SQL to run" in refused(str(out))
    assert "not both" in refused(str(out), "SELECT 1", "--list")


def test_query_loads_duckdb_and_no_other_command_does(out: Path) -> None:
    """DuckDB is imported on the query's path only (`--help` of the main group and of query
    load neither it nor polars)."""
    probe = (
        "import sys; from click.testing import CliRunner; from traceanalyzer.cli import main; "
        "r = CliRunner().invoke(main, ['query', '--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('duckdb', 'polars') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_readme_query_runs(out: Path) -> None:
    """The README's example, on the quick start's sample (its OUT stands for the sample's run)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text("utf-8")
    (line,) = [x for x in readme.splitlines() if x.startswith("traceanalyzer query ")]
    quoted = line.split(" ", 3)[3]
    assert line.split(" ")[2] == f"out/{SAMPLE}" and quoted[0] == quoted[-1] == '"'
    rows = json.loads(query(str(out), quoted[1:-1], "--format", "json"))
    assert [r["rank"] for r in rows] == [0, 1] and all(r["calls"] > 0 for r in rows)
