"""An output folder someone sent you is data too (issue [untrusted-input-2]): `annotate`,
`query`, `diff` and a warm `run` validate what they read of an OUT they did not necessarily
write. Session ids and groups in its tables, manifest and ingest.json are names, never paths;
nothing walks or writes outside the input and OUT; a FIFO is refused, never waited on; a
damaged document is exit 2 with the reason. And two rank directories never become one
session."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result
from test_untrusted_input import _within

from traceanalyzer.cli import main
from traceanalyzer.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


def _cli(*args: object) -> Result:
    with _within():
        result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def _run(root: Path, out: Path, *args: str) -> Result:
    return _cli("run", root, "--out", out, "--executor", "local", *args)


# --------------------------------------------------------------------------- one id per rank dir


def test_two_rank_dirs_whose_names_clean_alike_stay_two_sessions(tmp_path: Path) -> None:
    """`job 1_ascend_pt` and `job_1_ascend_pt` once cleaned to one id: the store kept one of
    them, and a warm run called both cached."""
    root = tmp_path / "in"
    sick = next((SAMPLES / "store_stall_session").iterdir())
    healthy = next((SAMPLES / "inference_baseline").iterdir())
    shutil.copytree(sick, root / "job 1_ascend_pt")
    shutil.copytree(healthy, root / "job_1_ascend_pt")
    out = tmp_path / "out"
    cold = _run(root, out)
    assert cold.exit_code in (0, 3), cold.output
    sessions = Store.open(out).sessions()
    ids = sessions["session"].to_list()
    assert len(ids) == 2 and len(set(ids)) == 2, ids
    assert "job_1_ascend_pt" in ids  # a safe name that no other directory shares is kept
    paths = {Path(p).name for p in sessions["path"]}
    assert paths == {"job 1_ascend_pt", "job_1_ascend_pt"}
    slices = Store.open(out).table("slices").group_by("session").len().collect()
    assert slices.height == 2
    warm = _run(root, out)
    assert "2 cached" in warm.output, warm.output
    assert sorted(Store.open(out).sessions()["session"]) == sorted(ids)
    assert Store.open(out).table("slices").group_by("session").len().collect().height == 2


# --------------------------------------------------------------------------- a received OUT


@pytest.fixture(scope="module")
def sent_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-rank run's output, as a colleague would send it (tests copy it to craft it)."""
    out = tmp_path_factory.mktemp("sent") / "out"
    result = _run(SAMPLES / "capture_growth_2rank", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def received(sent_out: Path, tmp_path: Path) -> Path:
    out = tmp_path / "received"
    shutil.copytree(sent_out, out)
    return out


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder``: its size and mtime (what a write or a removal changes)."""
    return {
        str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
    }


def _victim(tmp_path: Path) -> Path:
    """Another collection beside OUT, the crafted OUT's target."""
    victim = tmp_path / "victim" / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    victim.mkdir(parents=True)
    (victim / "trace_view.json").write_text('[{"ph": "M", "name": "keep me"}]')
    return tmp_path / "victim"


def _craft_sessions(out: Path, **values: object) -> None:
    """Replace the store's sessions table by a rank group's file (where rank and session are
    columns, not folder names) whose rows say ``values``."""
    frame = Store.open(out).table("sessions").collect()
    frame = frame.with_columns(pl.lit(v).alias(k) for k, v in values.items())
    table = out / "tables" / "sessions"
    shutil.rmtree(table)
    (table / "group=0-1").mkdir(parents=True)
    frame.write_parquet(table / "group=0-1" / "part-0.parquet")


@pytest.mark.parametrize("session", ["../../../victim/x_ascend_pt/ASCEND_PROFILER_OUTPUT", "ABS"])
def test_annotate_refuses_a_session_id_that_is_a_path(received, tmp_path, session) -> None:
    """A crafted session `../../x` or an absolute path made annotate overwrite another
    collection's trace_view.json."""
    victim = _victim(tmp_path)
    if session == "ABS":
        session = str(victim / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT")
    _craft_sessions(received, session=session)
    before = _snapshot(victim)
    result = _cli("annotate", received)
    assert result.exit_code == 2, result.output
    assert "session id (a name, never a path)" in result.output
    assert _snapshot(victim) == before
    assert not (received / "annotated").exists()


def test_annotate_walks_nothing_a_session_path_names(received, monkeypatch) -> None:
    """A session path of `/x_ascend_pt` made annotate look for bench results under `/`."""
    import traceanalyzer.recipes.bench as bench

    walked: list[Path] = []
    monkeypatch.setattr(bench, "find_bench_results", lambda root: walked.append(root) or [])
    _craft_sessions(received, path="/x_ascend_pt")
    result = _cli("annotate", received)
    assert result.exit_code == 0, result.output
    assert walked == []
    assert len(list((received / "annotated").rglob("trace_view.json"))) == 2


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("findings.json", b"", "not valid JSON"),
        ("findings.json", b'{"findings": [{"rule": "TA001"}]}', "findings[0].fingerprint: missing"),
        ("findings.json", b'{"findings": [], "x": NaN}', "NaN is not a JSON number"),
        ("ingest.json", b"{", "not valid JSON"),
        ("ingest.json", b"[]", "top level: expected an object"),
        ("ingest.json", b'{"sessions": [{"rank": 0, "session": "/etc"}]}', "session id (a name, never a path)"),
        ("ingest.json", b'{"sessions": [{"rank": "x", "session": "a"}]}', "expected an integer"),
        ("ingest.json", b'{"problems": [{"message": 5}]}', "expected a string"),
        ("ingest.json", b'{"sessions": [], "x": "\\xff"}'.decode("unicode_escape").encode("latin-1"),
         "not UTF-8"),
    ],
)  # fmt: skip
def test_annotate_refuses_a_damaged_document(received, name, damage, reason) -> None:
    (received / name).write_bytes(damage)
    result = _cli("annotate", received)
    assert result.exit_code == 2, result.output
    assert f"error: {received / name}: " in result.output and reason in result.output


def test_annotate_refuses_a_fifo_in_out_at_once(received) -> None:
    (received / "ingest.json").unlink()
    os.mkfifo(received / "ingest.json")
    with _within(20):
        result = _cli("annotate", received)
    assert result.exit_code == 2 and "a FIFO" in result.output, result.output


def test_annotate_says_which_marks_failed_on_crafted_evidence(received) -> None:
    doc = json.loads((received / "findings.json").read_text())
    doc["findings"][0]["evidence"] = [{"rank": "zero", "start_ns": "soon"}]
    (received / "findings.json").write_text(json.dumps(doc))
    result = _cli("annotate", received)
    assert result.exit_code == 3, result.output
    assert "a finding's marks failed" in result.output


@pytest.mark.parametrize("where", ["rank=0/session=*", "group"])
def test_query_refuses_a_fifo_among_the_partitions_at_once(received, where) -> None:
    """A FIFO named as a partition hung `query` (DuckDB waited on it forever)."""
    if where == "group":
        part = received / "tables" / "slices" / "group=0-1" / "part-0.parquet"
        part.parent.mkdir()
    else:
        part = next((received / "tables" / "slices").glob(f"{where}/part-0.parquet"))
        part.unlink()
    os.mkfifo(part)
    with _within(20):
        result = _cli("query", received, "SELECT count(*) FROM slices")
    assert result.exit_code == 2, result.output
    assert f"{part}, a FIFO" in result.output


def test_query_of_a_damaged_partition_is_exit_2(received) -> None:
    part = next((received / "tables" / "slices").glob("rank=0/session=*/part-0.parquet"))
    part.write_bytes(b"PAR1 not parquet")
    for args in (["SELECT count(*) FROM slices"], ["--list"]):
        result = _cli("query", received, *args)
        assert result.exit_code == 2 and "unreadable partitions" in result.output, result.output


def test_query_is_offline_and_installs_nothing(received, tmp_path, monkeypatch) -> None:
    """`read_json('https://...')` made DuckDB create ~/.duckdb/extensions and try to download
    httpfs; a query reads the store's tables and nothing else."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "secret.csv").write_text("a\n1\n")
    for sql in (
        "SELECT * FROM read_json('https://example.invalid/x.json')",
        "SELECT * FROM 'https://example.invalid/x.parquet'",
        f"SELECT * FROM read_csv('{tmp_path / 'secret.csv'}')",
        f"SELECT * FROM read_json('{received / 'findings.json'}')",
        "SELECT * FROM slices, read_csv('/etc/passwd')",
    ):
        result = _cli("query", received, sql)
        assert result.exit_code == 2, (sql, result.output)
        assert "disabled by configuration" in result.output, result.output
    assert list(home.iterdir()) == []
    ok = _cli("query", received, "SELECT count(*) AS n FROM slices", "--format", "csv")
    assert ok.exit_code == 0 and ok.output.splitlines()[0] == "n", ok.output
    written = tmp_path / "result.parquet"
    ok = _cli("query", received, "SELECT 1 AS a", "--format", "parquet", "-o", written)
    assert ok.exit_code == 0 and written.stat().st_size > 0, ok.output


def test_a_killed_querys_spill_folder_is_removed_by_the_next(received, tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"traceanalyzer-query-{gone.stdout.strip()}-0a1b2c3d"
    alive = tmp_path / f"traceanalyzer-query-{os.getpid()}-0a1b2c3d"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "duckdb_temp_storage-0.tmp").write_bytes(b"x" * 100)
    result = _cli("query", received, "SELECT count(*) FROM slices")
    assert result.exit_code == 0, result.output
    assert not dead.exists() and alive.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "received"])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_query_is_exit_130_and_leaves_nothing(sent_out, tmp_path, signum) -> None:
    import subprocess
    import sys
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    endless = "SELECT count(*) FROM slices a, slices b, slices c WHERE a.start_ns + b.start_ns > c.start_ns"
    query = subprocess.Popen(
        [sys.executable, "-m", "traceanalyzer.cli", "query", str(sent_out), endless],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    time.sleep(4)  # started, the query running
    assert query.poll() is None, query.communicate()
    stopped = time.monotonic()
    query.send_signal(signum)
    _, err = query.communicate(timeout=30)
    assert query.returncode == 130, err
    assert time.monotonic() - stopped < 5
    assert "Traceback" not in err and "interrupted" in err
    assert list(scratch.iterdir()) == []


# --------------------------------------------------------------------------- a warm run of it


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_a_manifest_group_that_is_a_path_removes_nothing_outside_out(received, tmp_path) -> None:
    """A recorded group names the folders the upkeep removes: `x/../../../../victim` (with a
    planted `group=x`) made a warm run delete a folder beside OUT."""
    victim = _victim(tmp_path)
    before = _snapshot(victim)
    doc = _manifest(received)
    entry = next(iter(doc["sessions"].values()))
    doc["sessions"]["0/gone"] = {**entry, "group": "x/../../../../victim"}
    (received / "manifest.json").write_text(json.dumps(doc))
    (received / "tables" / "slices" / "group=x").mkdir()
    result = _run(SAMPLES / "capture_growth_2rank", received)
    assert result.exit_code == 0, result.output
    assert _snapshot(victim) == before


def test_a_crafted_cached_outcome_is_not_reported(received) -> None:
    """A manifest entry whose outcome has values of the wrong type, or names another session,
    is no record: the session is ingested again, and the summary prints its own."""
    doc = _manifest(received)
    key, entry = next(iter(doc["sessions"].items()))
    entry["outcome"].update(rows="many", session="../../x", warnings=[5])
    (received / "manifest.json").write_text(json.dumps(doc))
    result = _run(SAMPLES / "capture_growth_2rank", received)
    assert result.exit_code == 0, result.output
    assert "1 cached" in result.output and "../../x" not in result.output
    assert key.split("/", 1)[1] in result.output
