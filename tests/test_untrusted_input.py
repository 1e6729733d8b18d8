"""A received collection is data (issue [untrusted-input]): it cannot run code, hang the run,
exhaust memory, or make the run write where it should not; a damaged value costs that value,
never the rank or the process. One test per hazard; the fuzzer (tests/fuzz) tries them at
random."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner, Result
from fuzz import db_hazards

from traceanalyzer import sqlite_ro
from traceanalyzer.cli import main
from traceanalyzer.discover import discover
from traceanalyzer.parse.db.database import Db
from traceanalyzer.parse.trace_shared import MAX_NAME
from traceanalyzer.store import Store
from traceanalyzer.synth.generate import generate

OUT = "ASCEND_PROFILER_OUTPUT"
SECONDS = 60  # a case that takes longer hangs


@pytest.fixture(scope="module")
def db_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-rank Db export (synthetic: the same bytes on every machine)."""
    root = tmp_path_factory.mktemp("db_export") / "in"
    generate("inference-baseline", root, ranks=2, export="db")
    return root


@pytest.fixture
def collection(db_export: Path, tmp_path: Path) -> Path:
    root = tmp_path / "in"
    shutil.copytree(db_export, root)
    return root


def _db(root: Path, rank: int = 0) -> Path:
    return next(root.glob(f"*/{OUT}/ascend_pytorch_profiler_{rank}.db"))


@contextlib.contextmanager
def _within(seconds: float = SECONDS) -> Iterator[None]:
    """Fail, rather than hang the suite, when the block takes longer than ``seconds``."""

    def over(signum: int, frame: object) -> None:
        raise TimeoutError(f"over {seconds} s: the run hangs")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run(root: Path, out: Path, *args: str) -> Result:
    with _within():
        result = CliRunner().invoke(
            main, ["run", str(root), "--out", str(out), "--executor", "local", *args]
        )
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def _ingested(result: Result, ranks: int = 2) -> None:
    assert result.exit_code in (0, 3), result.output
    assert result.output.count(": ingested (") == ranks, result.output


# --------------------------------------------------------------------------- SQLite is data


@pytest.mark.parametrize("table", ["TASK", "STRING_IDS", "META_DATA", "CANN_API"])
def test_a_table_that_is_a_view_over_an_endless_query_is_not_read(
    collection: Path, tmp_path: Path, table: str
) -> None:
    db_hazards.table_as_view(_db(collection), table)
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert f"not read: {table} (a view)" in result.output


def test_virtual_tables_and_generated_columns_are_not_read(collection: Path, tmp_path) -> None:
    db_hazards.table_as_virtual(_db(collection), "META_DATA")
    db_hazards.generated_column(_db(collection))
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert "META_DATA (a virtual table)" in result.output
    assert "TASK.huge (a generated column)" in result.output


def test_a_probe_that_runs_too_long_is_interrupted(collection: Path) -> None:
    """The progress handler's deadline: without it this query runs for days."""
    con = sqlite_ro.connect(_db(collection), seconds=0.5)
    started = time.monotonic()
    with _within(30), pytest.raises(sqlite_ro.sqlite3.OperationalError, match="interrupted"):
        con.execute(
            "SELECT sum(a.id + b.id + c.id + d.id + e.id)"
            " FROM STRING_IDS a, STRING_IDS b, STRING_IDS c, STRING_IDS d, STRING_IDS e"
        )
    assert time.monotonic() - started < 5


def test_a_query_through_a_view_is_refused_before_it_runs(collection: Path) -> None:
    db_hazards.table_as_view(_db(collection), "TASK")
    con = sqlite_ro.connect(_db(collection))
    with _within(10), pytest.raises(sqlite_ro.sqlite3.DatabaseError, match="not authorized"):
        con.execute("SELECT count(*) FROM TASK")


@pytest.mark.parametrize("name", ["ascend_pytorch_profiler_0.db", "analysis.db"])
def test_a_fifo_named_as_a_database_is_never_opened(collection: Path, tmp_path, name) -> None:
    db_hazards.as_fifo(_db(collection).with_name(name))
    result = _run(collection, tmp_path / "out")
    assert result.exit_code in (0, 3), result.output
    assert f"{name}: not a regular file" in result.output
    assert "rank 1 " in result.output and ": ingested (" in result.output


# --------------------------------------------------------------------------- names interned


def _peak_mb(root: Path, out: Path) -> float:
    """Peak RSS of a fresh `run` process, in MB."""
    probe = (
        "import re, sys\nfrom traceanalyzer.cli import main\ntry:\n"
        "    main(sys.argv[1:], prog_name='traceanalyzer')\nfinally:\n"
        "    status = open('/proc/self/status').read()\n"
        "    print('VmHWM', re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "run", str(root), "--out", str(out), "-q",
         "--executor", "local"],
        capture_output=True, text=True, timeout=SECONDS,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return int(re.search(r"VmHWM (\d+)", done.stderr).group(1)) / 1024


def test_a_50mb_name_costs_what_the_file_grew_by(collection: Path, tmp_path: Path) -> None:
    clean = _peak_mb(collection, tmp_path / "clean")
    said = db_hazards.huge_name(_db(collection), 50 << 20)
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert "STRING_IDS text(s) over 4,096 characters cut" in result.output, said
    names = Store.open(tmp_path / "out").table("slices").select(pl.col("name").str.len_chars())
    assert names.max().collect().item() <= MAX_NAME + len("AscendCL@")  # a CANN API's name
    # never read whole (its size from SQLite, its head and hash a chunk at a time): the run
    # holds less than the name once, and never once per row
    assert _peak_mb(collection, tmp_path / "again") < clean + 50


def test_unused_string_ids_are_never_read(collection: Path) -> None:
    db_hazards.unused_strings(_db(collection), 200_000)
    db = Db(_db(collection))
    try:
        apis = db.scan("CANN_API", name_id=("name", pl.Int64()))
        names = apis.select(db.text(pl.col("name_id")))
    finally:
        db.close()
    assert names.null_count().item() == 0
    assert db._strings.height == apis["name_id"].n_unique()


def test_duplicate_ids_and_invalid_utf8_cost_values_not_the_rank(collection, tmp_path) -> None:
    db_hazards.duplicate_ids(_db(collection))
    db_hazards.invalid_utf8(_db(collection, 1))
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert "STRING_IDS id(s) listed more than once" in result.output
    assert "not UTF-8; read with their invalid bytes replaced" in result.output
    store = Store.open(tmp_path / "out")
    for table in ("slices", "kernels", "threads"):  # every stored text reads back
        assert store.table(table).collect().height > 0
    assert "rule failed" not in result.output


@pytest.mark.parametrize(
    "damage",
    [
        lambda db: db_hazards.invalid_utf8(db, "HOST_INFO", "hostName"),
        lambda db: db_hazards.invalid_utf8(db, "META_DATA", "value"),
        lambda db: db_hazards.meta_value(db, "ENV_VARIABLES", None),
        lambda db: db_hazards.meta_value(db, "ENV_VARIABLES", b"\x00\xff{"),
        lambda db: db_hazards.meta_value(db, "parallel_group_info", db_hazards.deep_json(100_000)),
        lambda db: db_hazards.meta_value(db, "parallel_group_info", '{"g": {"global_ranks": "x"}}'),
        lambda db: db_hazards.meta_value(db, "SCHEMA_VERSION", b"\xff1.\x00"),
        lambda db: db_hazards.host_name(db, b"\xff" * 10),
    ],
    ids=["host-utf8", "meta-utf8", "env-null", "env-blob", "meta-deep", "meta-type",
         "version-blob", "host-blob"],
)  # fmt: skip
def test_a_bad_session_value_costs_that_value(collection: Path, tmp_path: Path, damage) -> None:
    damage(_db(collection))
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert Store.open(tmp_path / "out").table("sessions").collect().height == 2


@pytest.mark.parametrize("value", ["x" * 5000, ["a"], 7, {"activities": "CPU"}])
def test_profiler_settings_of_another_type_say_nothing(collection, tmp_path, value) -> None:
    """A profiler_info ``config.common_config`` that is no object (or its ``activities`` no
    list) is a setting the export does not state: every rule runs, none fails reading it."""
    info = next(collection.glob("*/profiler_info_1.json"))
    doc = json.loads(info.read_text())
    doc["config"]["common_config"] = value
    info.write_text(json.dumps(doc))
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert "rule failed" not in result.output


@pytest.mark.parametrize("damage", [db_hazards.pending_wal, db_hazards.garbage_wal])
def test_side_files_are_read_in_a_private_copy(collection: Path, tmp_path: Path, damage) -> None:
    damage(_db(collection))
    before = sorted(p.name for p in _db(collection).parent.iterdir())
    result = _run(collection, tmp_path / "out")
    assert result.exit_code in (0, 3), result.output
    assert sorted(p.name for p in _db(collection).parent.iterdir()) == before


# --------------------------------------------------------------------------- the input tree


def test_links_out_of_the_input_are_reported_not_followed(collection: Path, tmp_path) -> None:
    sibling = tmp_path / "sibling"
    shutil.copytree(collection, sibling)
    (collection / "slash").symlink_to("/", target_is_directory=True)
    (collection / "sibling").symlink_to(sibling, target_is_directory=True)
    (collection / "loop").symlink_to(collection, target_is_directory=True)
    result = _run(collection, tmp_path / "out")
    _ingested(result)  # the two ranks of the input, not the sibling's, not the machine's
    assert "slash: a link to /, outside the input: not followed" in result.output
    assert f"a link to {sibling}, outside the input: not followed" in result.output


def test_a_thousand_nested_folders_are_walked_without_recursion(collection: Path) -> None:
    chain = [collection / "d"]
    for _ in range(999):  # one level at a time: mkdir(parents=True) recurses too
        chain.append(chain[-1] / "d")
    for folder in chain:
        folder.mkdir()
    shutil.copytree(next(collection.glob("*_ascend_pt")), chain[-1] / "deep_ascend_pt")
    try:
        found = discover(collection)
        assert len(found.sessions) == 3
    finally:  # shutil.rmtree (and pytest's cleanup) recurse: undone level by level
        shutil.rmtree(chain[-1] / "deep_ascend_pt")
        for folder in reversed(chain):
            folder.rmdir()


# --------------------------------------------------------------------------- OUT is ours


@pytest.fixture
def clean_out(db_export: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    _ingested(_run(db_export, out))
    return out


def _refused(result: Result, what: str) -> None:
    assert result.exit_code == 2, result.output
    assert what in result.output and "choose another --out" in result.output, result.output


@pytest.mark.parametrize("name", ["tables", ".lock", "manifest.json", "plots", ".cache"])
def test_a_link_inside_out_is_refused_never_followed(db_export, clean_out, tmp_path, name) -> None:
    target = tmp_path / "elsewhere"
    shutil.copytree(clean_out / "tables", target / "tables")  # another store's tables, say
    (target / "file").write_text("keep me")
    victim = target / ("file" if name in (".lock", "manifest.json") else "tables")
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    entry = clean_out / name
    if entry.is_dir():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
    entry.symlink_to(victim)
    _refused(_run(db_export, clean_out, "--force"), f"{entry}, a symbolic link to {victim}")
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before
    assert (target / "file").read_text() == "keep me"


def test_a_link_deep_in_the_store_is_refused(db_export, clean_out, tmp_path) -> None:
    rank_dir = next((clean_out / "tables" / "slices").glob("rank=*"))
    shutil.move(rank_dir, tmp_path / "moved")
    rank_dir.symlink_to(tmp_path / "moved")
    _refused(_run(db_export, clean_out), "a symbolic link to")
    assert (tmp_path / "moved").is_dir()


@pytest.mark.parametrize(
    "name", [".lock", "manifest.json", "manifest.journal", ".cache/rules/rank=0.json",
             ".cache/overview/rank=0.key", "findings.json"],
)  # fmt: skip
def test_a_fifo_inside_out_is_refused_never_opened(db_export, clean_out, name) -> None:
    entry = clean_out / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.unlink(missing_ok=True)
    os.mkfifo(entry)
    _refused(_run(db_export, clean_out), f"{entry}, a FIFO")


def test_a_partition_damaged_mid_file_is_found_by_its_content_hash(db_export, clean_out) -> None:
    part = max((clean_out / "tables" / "slices").glob("rank=*/session=*/part-0.parquet"),
               key=lambda p: p.stat().st_size)  # fmt: skip
    size = part.stat().st_size
    with open(part, "r+b") as fh:  # the middle, in place: size and footer as they were
        fh.seek(size // 3)
        fh.write(bytes(b ^ 0xFF for b in fh.read(64))[:64])
    result = _run(db_export, clean_out)
    assert result.exit_code == 0, result.output
    assert "tables/slices: content differs from the one recorded; ingested again" in result.output
    assert "rule failed" not in result.output
    again = _run(db_export, clean_out)  # re-recorded: trusted, and not hashed again
    assert "ingested again" not in again.output and "(0 cached)" not in again.output


# --------------------------------------------------------------------------- no code from data

_PLANTED_RULE = """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the collection's code ran")
raise SystemExit(0)
"""


@pytest.mark.parametrize("form", ["traceanalyzer.toml", "pyproject.toml", "--config"])
def test_a_config_inside_the_input_sets_parameters_never_loads_code(
    collection: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    (collection / "rules").mkdir()
    (collection / "rules" / "evil.py").write_text(_PLANTED_RULE)
    settings = 'rule_dirs = ["rules"]\n[rules.slow-rank]\nmin_ranks = 2\n'
    if form == "pyproject.toml":
        settings = settings.replace("[rules.", "[tool.traceanalyzer.rules.")
        settings = "[tool.traceanalyzer]\n" + settings
    config = collection / ("pyproject.toml" if form == "pyproject.toml" else "traceanalyzer.toml")
    config.write_text(settings)
    monkeypatch.chdir(collection / "rules")  # a cwd inside the input: its config is found
    args = ["--config", str(config)] if form == "--config" else []
    if form != "--config":
        (collection / "rules" / config.name).write_text(settings.replace('"rules"', '"."'))
        config = collection / "rules" / config.name
    result = _run(collection, tmp_path / "out", *args)
    _ingested(result)
    assert not (collection / "rules" / "RAN").exists()
    assert f"config: {config} (inside the input {collection}: rule settings only; its " \
        "rule_dirs are not loaded" in result.output  # fmt: skip
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert doc["summary"]["config_files"] == [str(config)]
    slow_rank = next(r for r in doc["rules"] if r["name"] == "slow-rank")
    assert slow_rank["params"]["min_ranks"] == 2  # its parameters do apply


def test_a_config_outside_the_input_still_loads_its_rule_dirs(collection, tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    (mine / "rules").mkdir(parents=True)
    (mine / "rules" / "evil.py").write_text(_PLANTED_RULE.replace("raise SystemExit(0)", ""))
    (mine / "traceanalyzer.toml").write_text('rule_dirs = ["rules"]\n')
    monkeypatch.chdir(mine)
    result = _run(collection, tmp_path / "out")
    _ingested(result)
    assert (mine / "rules" / "RAN").exists()  # the user's own config: the user's own code
    assert f"config: {mine / 'traceanalyzer.toml'}\n" in result.output


def test_a_run_without_config_says_so(collection: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "config: none" in _run(collection, tmp_path / "out", "-q").output


# --------------------------------------------------------------------------- rules cannot end it


class _Escape(BaseException):
    """A BaseException of a rule's own."""


_ENDINGS = {
    "exit-0": "raise SystemExit(0)",
    "exit-1": "raise SystemExit(1)",
    "keyboard": "raise KeyboardInterrupt",
    "base": "raise type('Escape', (BaseException,), {})()",
}


def _ending_rule(folder: Path, ending: str, where: str = "p = ctx.params") -> Path:
    from traceanalyzer.authoring.scaffold import RULE_TEMPLATE

    folder.mkdir(exist_ok=True)
    source = RULE_TEMPLATE.format(rule_id="TA199", name="ender", summary="Ends.", func="ender")
    assert where in source
    (folder / "ender.py").write_text(source.replace(where, _ENDINGS[ending], 1))
    return folder


@pytest.mark.parametrize("executor", ["local", "processes"])
@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_a_rule_that_raises_systemexit_or_keyboardinterrupt_is_a_rule_error(
    db_export: Path, tmp_path: Path, ending: str, executor: str
) -> None:
    if executor == "processes" and ending not in ("exit-0", "keyboard"):
        pytest.skip("one of each kind in a pool is enough: the workers are slow to start")
    rules = _ending_rule(tmp_path / "rules", ending)
    out = tmp_path / "out"
    with _within():
        result = CliRunner().invoke(
            main,
            ["run", str(db_export), "--out", str(out), "--rules", str(rules), "--fail-on", "info",
             "--executor", executor, "-j", "2"],
        )  # fmt: skip
    assert "Traceback" not in result.output
    assert result.exit_code == 3, result.output  # partial: a rule failed
    assert "ender" in result.output and "rule failed" in result.output
    for report in ("findings.json", "report.html", "report.md", "findings.sarif"):
        assert (out / report).is_file(), report
    doc = json.loads((out / "findings.json").read_text())
    assert any(e["name"] == "ender" for e in doc["errors"])


def test_a_rule_file_that_exits_at_import_is_a_load_error(db_export, tmp_path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "ender.py").write_text("raise SystemExit(0)\n")
    result = _run(db_export, tmp_path / "out", "--rules", str(rules))
    assert result.exit_code == 2 and "ender.py: line 1: SystemExit: 0" in result.output, (
        result.output
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("ending", list(_ENDINGS))
def test_a_fixture_that_raises_systemexit_fails_rules_test(tmp_path, monkeypatch, ending) -> None:
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(main, ["rules", "new", "ender"]).exit_code == 0
    fixtures = tmp_path / "traceanalyzer-rules" / "fixtures" / "ender.py"
    source = fixtures.read_text()
    marker = '    """'
    assert marker in source
    fixtures.write_text(source.replace(marker, f"    {_ENDINGS[ending]}\n{marker}", 1))
    with _within():
        result = CliRunner().invoke(main, ["rules", "test"])
    assert "Traceback" not in result.output
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "fixture raised" in result.output, result.output


# --------------------------------------------------------------------------- workers die with it


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited, its parent just has not reaped it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_exit_when_the_run_is_killed(db_export: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    marks = tmp_path / "workers"
    marks.mkdir()
    from traceanalyzer.authoring.scaffold import RULE_TEMPLATE

    rules.mkdir()
    stall = (
        f"import os, time; open(os.path.join({str(marks)!r}, str(os.getpid())), 'w').close(); "
        "time.sleep(120)"
    )
    source = RULE_TEMPLATE.format(rule_id="TA199", name="stall", summary="Stalls.", func="stall")
    (rules / "stall.py").write_text(source.replace("p = ctx.params", stall, 1))
    run = subprocess.Popen(
        [sys.executable, "-c", "from traceanalyzer.cli import entry; entry()", "run",
         str(db_export), "--out", str(tmp_path / "out"), "--rules", str(rules),
         "--executor", "processes", "-j", "2", "-q"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + SECONDS
        while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [int(p.name) for p in marks.iterdir()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        run.kill()  # SIGKILL: the driver cannot stop its workers itself
        run.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers)
    finally:
        run.kill()


# --------------------------------------------------------------------------- printable output

AICPU = Path(__file__).resolve().parents[1] / "sample_traces" / "aicpu_ops"
# clear the screen, an OSC 8 hyperlink, a bell, a right-to-left override
HOSTILE = "\x1b[2J\x1b]8;;https://evil.example\x07NonZero\x1b]8;;\x07\x07\u202e"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    """The AI CPU sample with an op type, a rank dir and a profiler_info field that hold
    escape sequences (the op type is in the finding's title)."""
    root = tmp_path / "in"
    shutil.copytree(AICPU, root)
    for csv in root.glob(f"*/{OUT}/*.csv"):
        csv.write_bytes(csv.read_bytes().replace(b"NonZero", HOSTILE.encode()))
    trace = next(root.glob(f"*/{OUT}/trace_view.json"))
    escaped = json.dumps("x\r\n" + HOSTILE)[1:-1].replace("x\\r\\n", "\\r\\n")
    trace.write_text(trace.read_text().replace("NonZero", escaped))
    rank = next(root.glob("*_ascend_pt"))
    info = next(rank.glob("profiler_info*.json"))
    doc = json.loads(info.read_text())
    doc["torch_npu_version"] = "2.1.0\x1b[31m\r"
    info.write_text(json.dumps(doc))
    rank.rename(rank.with_name("\x1b[5m" + rank.name))
    return root


def test_no_control_character_reaches_the_terminal_or_report_md(hostile, tmp_path) -> None:
    out = tmp_path / "out"
    for args in ((), ("-q",), ("-v",)):
        result = _run(hostile, out, *args)
        assert "aicpu-ops" in result.output and "NonZero" in result.output, result.output
        assert not CONTROL.findall(result.output), repr(result.output)
    report = (out / "report.md").read_text()
    assert "NonZero" in report and not CONTROL.findall(report)
    html = (out / "report.html").read_text()  # escaped as HTML, its figures' text too
    assert "NonZero" in html and not CONTROL.findall(html)


def test_diff_of_runs_with_hostile_names_prints_none_of_their_controls(hostile, tmp_path) -> None:
    _run(hostile, tmp_path / "a")
    with _within():
        result = CliRunner().invoke(
            main, ["diff", str(tmp_path / "a"), str(tmp_path / "a"), "--out", str(tmp_path / "d")]
        )
    assert result.exit_code == 0, result.output
    assert "NonZero" in result.output and not CONTROL.findall(result.output), repr(result.output)


def test_query_tables_print_no_controls(hostile, tmp_path) -> None:
    _run(hostile, tmp_path / "out")
    result = CliRunner().invoke(
        main, ["query", str(tmp_path / "out"), "SELECT DISTINCT type FROM kernels"]
    )
    assert result.exit_code == 0, result.output
    assert "NonZero" in result.output and not CONTROL.findall(result.output), repr(result.output)


# --------------------------------------------------------------------------- diff checks both


@pytest.fixture(scope="module")
def two_runs(db_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two_runs")
    _ingested(_run(db_export, root / "base"))
    return root


def _set(doc: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    doc[int(last) if isinstance(doc, list) else last] = value


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (b"", "not valid JSON"),
        (b'{"findings": [', "not valid JSON"),
        (b'{"findings": [], "x": "\xff\xfe"}', "not UTF-8"),
        (b'{"findings": [], "summary": {"ranks": [0], "x": NaN}}', "NaN is not a JSON number"),
        (b"[]", "top level: expected an object"),
        (("findings", "x"), "findings: expected a list"),
        (("findings", [{"rule": "TA001"}]), "findings[0].fingerprint: missing"),
        (("findings", [{"fingerprint": 5, "rule": "r", "name": "n"}]), "expected a string"),
        (("summary.ranks", ["a"]), "summary.ranks: expected an integer"),
        (("key_figures", [{"name": "n", "figure": "f", "label": "l", "values": [{"rank": "x"}]}]),
         "key_figures[0].values[0].rank: expected an integer"),
        (("summary.overview", {"mean": {"step_ns": "fast"}}), "expected a number"),
        (("summary.overview.ranks", "x"), "summary.overview.ranks: expected a list, got a string"),
        (("summary.overview.phases.rows.0.steps", "many"),
         "summary.overview.phases.rows[0].steps: expected an integer, got a string"),
        (("summary.overview.top_kernels.0", 5), "top_kernels[0]: expected an object"),
    ],
)  # fmt: skip
def test_diff_refuses_a_damaged_findings_json(two_runs: Path, tmp_path, damage, reason) -> None:
    target = tmp_path / "target"
    shutil.copytree(two_runs / "base", target)
    findings = target / "findings.json"
    if isinstance(damage, bytes):
        findings.write_bytes(damage)
    else:
        doc = json.loads(findings.read_text())
        _set(doc, *damage)
        findings.write_text(json.dumps(doc))
    for args in ((two_runs / "base", target), (target, two_runs / "base")):
        result = CliRunner().invoke(main, ["diff", *map(str, args), "--fail-on-new",
                                           "--out", str(tmp_path / "d")])  # fmt: skip
        assert "Traceback" not in result.output
        assert result.exit_code == 2, result.output
        assert f"error: {findings}: " in result.output and reason in result.output, result.output


def test_diff_refuses_a_findings_json_that_is_a_fifo(two_runs: Path, tmp_path) -> None:
    target = tmp_path / "target"
    shutil.copytree(two_runs / "base", target)
    (target / "findings.json").unlink()
    os.mkfifo(target / "findings.json")
    with _within(30):
        result = CliRunner().invoke(main, ["diff", str(two_runs / "base"), str(target)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output


# --------------------------------------------------------------------------- Text values

HEALTHY = AICPU.parent / "capture_growth_level2"


@pytest.mark.parametrize(
    "row", [b"1,\xff\xfe", b"\xff\xfe,\xc3", "{row},x,\xff,y"], ids=["few", "first", "extra"]
)
def test_a_malformed_csv_row_of_invalid_utf8_costs_that_row(tmp_path, row, capfd) -> None:
    root = tmp_path / "in"
    shutil.copytree(HEALTHY, root)
    kernels = next(root.glob(f"*/{OUT}/kernel_details.csv"))
    lines = kernels.read_bytes().split(b"\n")
    header, body = lines[0], lines[1:]
    lines = [header, *body * 20]  # past Arrow's first block: it has written rows already
    bad = row if isinstance(row, bytes) else row.encode("latin-1").replace(b"{row}", lines[2])
    lines.insert(len(lines) - 3, bad)
    kernels.write_bytes(b"\n".join(lines))
    result = _run(root, tmp_path / "out")
    assert result.exit_code in (0, 3), result.output
    assert "kernel_details.csv: line " in result.output and "malformed row" in result.output
    assert "Exception ignored" not in capfd.readouterr().err
    kept = Store.open(tmp_path / "out").table("kernels").collect().height
    rows = sum(bool(line.strip()) for line in lines) - 2  # neither the header nor the bad row
    assert kept >= rows - 1  # the bad row (and at most one beside it), never the file


def test_a_bad_test_only_fault_variable_fails_no_rank(db_export, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRACEANALYZER_FAULT_KILL_RANK", "zero")
    _ingested(_run(db_export, tmp_path / "out"))


# --------------------------------------------------------------------------- a deadline per rank


@pytest.mark.parametrize("executor", ["local", "processes"])
def test_a_read_that_never_ends_fails_its_rank_not_the_run(
    db_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, executor: str
) -> None:
    """Without the deadline this run never ends: rank 0's read blocks for good."""
    monkeypatch.setenv("TRACEANALYZER_FAULT_HANG_RANK", "0")
    started = time.monotonic()
    with _within():
        result = CliRunner().invoke(
            main,
            ["run", str(db_export), "--out", str(tmp_path / "out"), "--rank-timeout", "3",
             "--executor", executor, "-j", "2"],
        )  # fmt: skip
    assert time.monotonic() - started < SECONDS
    assert result.exit_code == 3, result.output  # partial
    assert "did not finish within 3 s (run --rank-timeout SECONDS gives it longer)" in result.output
    assert "rank 1 " in result.output and ": ingested (" in result.output
    assert (tmp_path / "out" / "report.html").is_file()
    monkeypatch.delenv("TRACEANALYZER_FAULT_HANG_RANK")
    again = _run(db_export, tmp_path / "out", "-q", "--lock-wait", "0")  # nothing holds OUT
    assert again.exit_code == 0, again.output
