"""Round 3 of the hazards (issue [untrusted-input-2]): values at the limits, and what a run
reads besides the files.

- ``db_times``, ``text_times``: times no profile holds, in a Db export's tables (a startNs of
  1e300, an end before its start, inf, text) and in a Text export's trace and CSVs (a ts of
  1e20, ``NaN``, an exponent, a dur that is no number);
- ``user_patterns``: a config file inside the input setting pattern parameters that backtrack
  in Python's ``re`` or that no engine takes, against a 41-character group name;
- ``gbk_folder``: the collection moved under a folder whose name is not UTF-8;
- :func:`environment`: bad values of the environment variables the CLI reads or sets (a case
  with them runs in a fresh process, where they take effect);
- :func:`readers_disagree`: both trace readers on the same damaged trace, which must give the
  same tables and notes whenever the native scanner reads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

# Times at the limits, as a Db column holds them (SQLite's types) ...
DB_TIMES: tuple[Any, ...] = (
    1e300, -1e300, float("inf"), float("-inf"), 2**63 - 1, -(2**63), 0, -1, None, "abc",
    "1736408883000125700", b"\x00\xff", 1.7364088830001257e18,
)  # fmt: skip
# ... and as a trace writes them: the text that goes in the file as it is (a number, a
# literal, a string).
TEXT_TIMES = (
    "1e20", "1e300", "-1e300", '"NaN"', "NaN", "Infinity", '"1.736408883704643e15"',
    "1.736408883704643e15", '"0x1e5"', '"1_000"', "-5", '"-5.000"', '"5.000"', "0", "true",
    "null", '{"a": 1}', "[]", '"abc"', '"\\u0031\\u0037"', "9223372036854775807",
    "18446744073709551615", "1e12", '"7258118400000000.000"', '" 2.5\\t"',
)  # fmt: skip
CSV_TIMES = ("1e20", "NaN", "-5.000", "1.736408883704643e15", "0x10", "abc", "inf", "9" * 30)
DB_TIME_COLUMNS = {
    "TASK": ("startNs", "endNs"), "CANN_API": ("startNs", "endNs"),
    "PYTORCH_API": ("startNs", "endNs"), "COMMUNICATION_OP": ("startNs", "endNs"),
    "NPU_MEM": ("timestampNs",), "AICORE_FREQ": ("timestampNs",), "HBM": ("timestampNs",),
    "MEMORY_RECORD": ("timestamp",), "OP_MEMORY": ("allocationTime", "releaseTime", "duration"),
    "SESSION_TIME_INFO": ("startTimeNs", "endTimeNs"), "STEP_TIME": ("startNs", "endNs"),
}  # fmt: skip
ANALYSIS_TIME_COLUMNS = {
    "StepTraceTime": ("computing", "free", "stage", "bubble"),
    "CommAnalyzerTime": ("start_timestamp", "elapse_time", "wait_time"),
}
# Patterns that backtrack in Python's re (exponential on the names they are tried on), and
# patterns no engine of the rules takes.
PATTERNS = (
    "^(a|a)*$", "(a*)*b", "^(a+)+$", "(x+x+)+y", "(", "(?=a)", "(a{1000}){1000}", "", ".*",
    "\\", "[", "(?i)^HCOM_", "a" * 5000,
)  # fmt: skip
GROUP_NAME = "a" * 41  # what ^(a|a)*$ never finished matching in Python's re
GBK = os.fsdecode(b"\xca\xfd\xbe\xdd")  # 数据 in GBK


def _files(root: Path, glob: str) -> list[Path]:
    return sorted(p for p in root.glob(glob) if p.is_file() and not p.is_symlink())


# --------------------------------------------------------------------------- Db times


def db_times(rng: random.Random, root: Path) -> str | None:
    """Times at the limits in a Db export: a few rows of a table's time column set to one,
    or a task that ends before it starts."""
    dbs = _files(root, "*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler*.db")
    analysis = _files(root, "*/ASCEND_PROFILER_OUTPUT/analysis.db")
    if not dbs:
        return None
    if analysis and rng.random() < 0.25:
        db, columns = rng.choice(analysis), ANALYSIS_TIME_COLUMNS
    else:
        db, columns = rng.choice(dbs), DB_TIME_COLUMNS
    table = rng.choice(sorted(columns))
    column = rng.choice(columns[table])
    value = rng.choice(DB_TIMES)
    try:
        with contextlib.closing(sqlite3.connect(db)) as con:
            rows = con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            every = rng.choice([1, 3, max(1, rows)])  # every row, a third, one
            if table == "TASK" and rng.random() < 0.3:
                con.execute(f"UPDATE TASK SET endNs = startNs - 1000000 WHERE rowid % {every} = 0")
                what = f"TASK: every {every} row(s) end before they start"
            else:
                con.execute(
                    f'UPDATE "{table}" SET "{column}" = ? WHERE rowid % {every} = 0', [value]
                )
                what = f"{table}.{column} = {str(value)[:24]} on every {every} row(s)"
            con.commit()
    except sqlite3.Error as exc:  # a table or column this export lacks
        return f"(could not apply db_times: {exc})"
    return f"{db.relative_to(root).as_posix()}: {what}"


# --------------------------------------------------------------------------- Text times


def text_times(rng: random.Random, root: Path) -> str | None:
    """Times at the limits in a Text export: some events' ts or dur in trace_view.json (the
    file stays well-formed JSON unless the value is ``NaN`` or ``Infinity``), or a CSV's time
    column."""
    traces = _files(root, "*/ASCEND_PROFILER_OUTPUT/trace_view.json")
    csvs = _files(root, "*/ASCEND_PROFILER_OUTPUT/*.csv")
    if csvs and (not traces or rng.random() < 0.25):
        return _csv_times(rng, root, rng.choice(csvs))
    if not traces:
        return None
    trace = rng.choice(traces)
    try:
        events = json.loads(trace.read_bytes())
    except ValueError:
        return None
    timed = [e for e in events if isinstance(e, dict) and e.get("ph") in ("X", "i", "C", "s", "f")]
    if not isinstance(events, list) or not timed:
        return None
    field = rng.choice(["ts", "dur"])
    value = rng.choice(TEXT_TIMES)
    picked = rng.sample(timed, min(len(timed), rng.choice([1, 10, len(timed)])))
    marker = "\x00time\x00"
    for event in picked:
        event["dur" if field == "dur" and event.get("ph") == "X" else "ts"] = marker
    trace.write_text(json.dumps(events).replace(json.dumps(marker), value))
    return f"{trace.relative_to(root).as_posix()}: {field} = {value} in {len(picked)} event(s)"


def _csv_times(rng: random.Random, root: Path, path: Path) -> str | None:
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    header = lines[0].split(",") if lines else []
    timed = [i for i, name in enumerate(header) if "(us)" in name or "Time" in name]
    if not timed or len(lines) < 2:
        return None
    column, value = rng.choice(timed), rng.choice(CSV_TIMES)
    for i in range(1, len(lines)):
        fields = lines[i].split(",")
        if len(fields) > column and rng.random() < 0.5:
            fields[column] = value
            lines[i] = ",".join(fields)
    path.write_text("\n".join(lines), encoding="utf-8")
    return f"{path.relative_to(root).as_posix()}: {header[column].strip()} = {value}"


# --------------------------------------------------------------------------- user patterns


def pattern_parameters() -> list[str]:
    """Every pattern parameter a config file may set, as ``section.PARAM``."""
    from traceanalyzer.derived.parameters import STEP_PARAMS
    from traceanalyzer.engine.loader import load_rules

    found = [f"steps.{name}" for name, p in STEP_PARAMS.items() if p.is_pattern]
    for rule in load_rules(entry_points=False).rules:
        found += [f"rules.{rule.name}.{n}" for n, p in rule.params.items() if p.is_pattern]
    return sorted(found)


def user_patterns(rng: random.Random, root: Path) -> str | None:
    """A config file inside the input (run with ``--config``) setting pattern parameters to
    ones that backtrack or that no engine takes, and a group name they are tried on."""
    chosen = rng.sample(pattern_parameters(), rng.choice([1, 3]))
    tables: dict[str, dict[str, str]] = {}
    for setting in chosen:
        section, name = setting.rsplit(".", 1)
        tables.setdefault(section, {})[name] = rng.choice(PATTERNS)
    text = "".join(
        f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
        for section, values in tables.items()
    )
    (root / CONFIG).write_text(text)
    for metadata in _files(root, "*/profiler_metadata.json"):
        with contextlib.suppress(ValueError, OSError):
            doc = json.loads(metadata.read_bytes())
            if isinstance(doc, dict):
                doc["parallel_group_info"] = {
                    "x": {"group_name": GROUP_NAME, "global_ranks": [0, 1]}
                }
                metadata.write_text(json.dumps(doc))
    return "config: " + "; ".join(
        f"{s} = {tables[s.rsplit('.', 1)[0]][s.rsplit('.', 1)[1]]!r}"[:80] for s in chosen
    )


CONFIG = "traceanalyzer.toml"  # run_case runs with --config IN/traceanalyzer.toml when present


# --------------------------------------------------------------------------- names and paths


def gbk_folder(rng: random.Random, root: Path) -> str | None:
    """The collection's rank folders moved under a folder whose name is not UTF-8."""
    ranks = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    if not ranks:
        return None
    folder = root / GBK
    folder.mkdir()
    for rank in ranks:
        shutil.move(rank, folder / rank.name)
    return f"ranks moved under a folder named {os.fsencode(GBK)!r} (GBK, no UTF-8)"


# --------------------------------------------------------------------------- environment

ENVIRONMENT = {
    "POLARS_MAX_THREADS": ("0", "-1", "abc", "1024", "99999999999", "²"),
    "POLARS_ENGINE_AFFINITY": ("bogus", "", "streaming"),
    "ARROW_DEFAULT_MEMORY_POOL": ("bogus", "jemalloc", ""),
    "MALLOC_MMAP_THRESHOLD_": ("abc", "-5", str(1 << 40)),
    "OPENBLAS_NUM_THREADS": ("0", "abc", "4096"),
    "_RJEM_MALLOC_CONF": ("garbage:1", "narenas:0"),
    "TRACEANALYZER_NATIVE": ("0", "abc"),
    "TRACEANALYZER_PREFER_FORMAT": ("text", "garbage"),
    "TMPDIR": ("/nonexistent", "/dev/null"),
}


def environment(rng: random.Random) -> dict[str, str]:
    """One to three variables the CLI reads or sets, at bad values."""
    names = rng.sample(sorted(ENVIRONMENT), rng.choice([1, 1, 2, 3]))
    return {name: rng.choice(ENVIRONMENT[name]) for name in names}


# --------------------------------------------------------------------------- both readers

TRACE_TABLES = ("slices", "counters", "flows", "threads")


def readers_disagree(root: Path, traces: list[Path]) -> list[str]:
    """For each of ``traces`` (under ``root``) the native scanner reads: where its tables and
    notes differ from the DuckDB reader's (nothing when they agree, or the scanner is not
    built); and a trace only one of them could read."""

    from traceanalyzer.parse import trace_native

    if not trace_native.available():
        return []
    found = []
    for trace in traces:
        if trace.is_symlink() or not trace.is_file() or trace.stat().st_size > 64 << 20:
            continue
        where = trace.relative_to(root)
        with tempfile.TemporaryDirectory(prefix="readers-") as scratch:
            native, duck = (_read(trace, Path(scratch) / n, native=n == "1") for n in "10")
        if isinstance(native, str) or isinstance(duck, str):  # an unreadable trace
            if isinstance(native, str) != isinstance(duck, str):
                found.append(
                    f"{where}: only one reader raised: {native if isinstance(native, str) else duck}"
                )
            continue
        if native[0].reader != "native":
            continue  # the scanner refused it: DuckDB alone reads (and salvages) it
        for table in TRACE_TABLES:
            a, b = native[1][table], duck[1][table]
            if a.schema != b.schema or not same_rows(a, b):
                found.append(f"{where}: the readers' {table} differ")
        for field in ("rows", "start_ns", "end_ns", "incomplete"):
            if getattr(native[0], field) != getattr(duck[0], field):
                found.append(f"{where}: the readers' {field} differ")
        if sorted(native[0].warnings) != sorted(duck[0].warnings):
            found.append(f"{where}: the readers' notes differ")
    return found


def same_rows(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """The same rows (their order aside), an ``args`` text compared as the JSON value it holds:
    the scanner keeps a number as written (``1e-05``), DuckDB writes it its own way
    (``0.00001``)."""
    import polars as pl

    def canonical(frame: pl.DataFrame) -> pl.DataFrame:
        if "args" not in frame.columns:
            return frame
        return frame.with_columns(
            pl.col("args").map_elements(
                lambda text: json.dumps(json.loads(text), sort_keys=True), return_dtype=pl.String
            )
        )

    a, b = canonical(a), canonical(b)
    return a.sort(pl.all(), nulls_last=True).equals(b.sort(pl.all(), nulls_last=True))


def _read(trace: Path, out: Path, native: bool) -> tuple[Any, dict[str, Any]] | str:
    """The trace read by one reader: its result and tables, or why it could not be read."""
    import polars as pl

    from traceanalyzer.ingest.sink import PartitionSink
    from traceanalyzer.parse import trace_view

    previous = os.environ.get("TRACEANALYZER_NATIVE")
    os.environ["TRACEANALYZER_NATIVE"] = "1" if native else "0"
    try:
        result = trace_view.parse_trace_view(
            trace, PartitionSink(out, 0, "s"), out / "scratch", threads=2
        )
    except Exception as exc:  # noqa: BLE001 - an unreadable trace fails its rank, said in words
        return f"{type(exc).__name__}: {str(exc)[-200:]}"
    finally:
        if previous is None:
            os.environ.pop("TRACEANALYZER_NATIVE", None)
        else:
            os.environ["TRACEANALYZER_NATIVE"] = previous
    parts = out / "tables"
    return result, {
        t: pl.read_parquet(parts / t / "rank=0" / "session=s" / "part-0.parquet")
        for t in TRACE_TABLES
    }
