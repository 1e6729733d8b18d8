"""One open profiler database: a read-only connection, typed scans, and the text of its ids.

The database is opened strictly read-only (``mode=ro&immutable=1``): SQLite takes no lock and
writes no journal, WAL or shared-memory file next to it. Each table is one plain scan of the
columns needed, read through the ADBC SQLite driver as Arrow columns (no Python object per
value) that polars adopts; ids become names through ``STRING_IDS`` and the ``ENUM_*`` tables as
vectorised replacements.

The file is data (:mod:`traceanalyzer.sqlite_ro`): only its real tables are read (a view, a
virtual table or a generated column is listed as not read), the listing and the small queries
run under a progress handler with a deadline, text that is not UTF-8 is read with replacement
characters, and only the ``STRING_IDS`` rows the tables use are read, each text cut at
:data:`~traceanalyzer.parse.trace_shared.MAX_NAME` characters (:class:`Repairs` says what
was changed, in the rank's warnings).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sqlite3
import struct
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import adbc_driver_manager
import adbc_driver_sqlite
import polars as pl
import pyarrow as pa

from traceanalyzer import sqlite_ro
from traceanalyzer.parse.sink import body_columns
from traceanalyzer.parse.trace_shared import CUT_KEEP, MAX_NAME, SENTINELS, cut_end, cut_name

I32, I64, F64, STR, CAT = pl.Int32(), pl.Int64(), pl.Float64(), pl.String(), pl.Categorical()
_SQL_TYPES = {I64: "INTEGER", F64: "REAL", STR: "TEXT"}
_POLARS = {"int32": I32, "int64": I64, "double": F64}
MB = float(1 << 20)


def schema_of(table: str, **work: pl.DataType) -> dict[str, pl.DataType]:
    """The polars types of a canonical table's body columns, plus working columns."""
    return {n: _POLARS.get(str(t), STR) for n, t in body_columns(table)} | work


class DbUnreadable(Exception):
    """The database cannot be read: not SQLite, damaged, being written, or an unknown schema."""


@dataclass
class Repairs:
    """What reading a database changed of its values, shared by every connection to it (the
    readers run side by side) and said once, in the rank's warnings."""

    not_utf8: int = 0  # text values whose invalid bytes were replaced (U+FFFD)
    cut: set[int] = field(default_factory=set)  # STRING_IDS ids whose text was cut
    duplicates: set[int] = field(default_factory=set)  # STRING_IDS ids listed more than once
    refused: str | None = None  # views, virtual tables, generated columns: not read
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(
        self, not_utf8: int = 0, cut: Iterable[int] = (), duplicates: Iterable[int] = ()
    ) -> None:
        with self._lock:
            self.not_utf8 += not_utf8
            self.cut.update(cut)
            self.duplicates.update(duplicates)

    def warnings(self, path: Path) -> list[str]:
        said = [self.refused] if self.refused else []
        if self.not_utf8:
            said.append(
                f"{path.name}: {self.not_utf8:,} text value(s) are not UTF-8; read with their "
                "invalid bytes replaced (U+FFFD)"
            )
        if self.cut:
            said.append(
                f"{path.name}: {len(self.cut):,} STRING_IDS text(s) over {MAX_NAME:,} characters "
                "cut to that length (the cut ends with a hash of the whole text)"
            )
        if self.duplicates:
            said.append(
                f"{path.name}: {len(self.duplicates):,} STRING_IDS id(s) listed more than once; "
                "the first text of each is used"
            )
        return said


class Connection:
    """A read-only ADBC connection to one SQLite file: queries come back as Arrow tables, built
    in C without a Python object per value (Python's sqlite3 builds one per value: 2-5x the
    time of a whole scan here)."""

    def __init__(self, path: Path, shown: Path | None = None, repairs: Repairs | None = None):
        self.path = shown or path  # what messages name
        self.repairs = repairs or Repairs()
        # Immutable: no lock, no side file, nothing written (a private copy is settled first,
        # see readable_source).
        uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
        self._database = adbc_driver_sqlite.connect(uri)
        try:
            self._connection = adbc_driver_manager.AdbcConnection(self._database)
        except adbc_driver_manager.Error:
            self._database.close()
            raise

    def arrow(self, sql: str, rows: int | None = None) -> pa.Table:
        """The result of ``sql``, its text valid UTF-8. The driver types each column from the
        first batch it reads; ``rows`` (at least the result's row count) makes that batch the
        whole result, so a column null in its first rows and a number later is still typed by
        its values."""
        statement = adbc_driver_manager.AdbcStatement(self._connection)
        try:
            if rows is not None:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": str(max(rows, 1))})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            data = pa.RecordBatchReader._import_from_c(stream.address).read_all()
        except (adbc_driver_manager.Error, pa.ArrowException, OSError) as exc:
            # A page that fails mid-scan surfaces from the stream: as the driver's error or
            # Arrow's (its I/O error is an OSError).
            raise DbUnreadable(f"{self.path}: {_what(exc)} ({_reason(exc)})") from exc
        finally:
            statement.close()
        return self._valid_text(data)

    def _valid_text(self, data: pa.Table) -> pa.Table:
        """``data`` with the invalid UTF-8 of its text columns replaced (the driver passes
        SQLite's bytes on as they are: unchecked, they make Parquet files no reader accepts)."""
        try:
            data.validate(full=True)  # checks every string's UTF-8, in C
            return data
        except pa.ArrowInvalid:
            pass
        for index, column in enumerate(data.columns):
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                repaired, bad = _decoded(column)
                if bad:
                    self.repairs.add(not_utf8=bad)
                    data = data.set_column(index, data.field(index).name, repaired)
        return data

    def close(self) -> None:
        self._connection.close()
        self._database.close()


def _decoded(column: pa.ChunkedArray) -> tuple[pa.Array, int]:
    """A text column's values decoded as UTF-8, invalid bytes replaced (U+FFFD), and how many
    values had some (the bytes are viewed, not cast: no pyarrow.compute for a damaged file)."""
    binary = pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()
    raw = [value for chunk in column.chunks for value in chunk.view(binary).to_pylist()]
    text = [None if value is None else value.decode("utf-8", errors="replace") for value in raw]
    bad = sum(t is not None and t.encode() != r for t, r in zip(text, raw, strict=True))
    return pl.Series(text, dtype=STR).to_arrow(), bad


def _reason(exc: Exception) -> str:
    """The driver's message without its status prefix and the query it appends."""
    text = str(exc).split("\nquery:")[0]
    return text.split("[SQLite] ", 1)[-1]


def _what(exc: Exception) -> str:
    """What an error says of the file: SQLite's own pages "malformed" are damaged (a truncated
    or torn copy); anything else ("file is not a database") is not SQLite at all."""
    return "damaged database" if "malformed" in str(exc) else "not a readable SQLite database"


_SIDE_FILES = ("-wal", "-journal")
# SQLite's POSIX lock bytes (os_unix.c): a writer holds RESERVED in the database file (rollback
# journal mode) or the WAL write lock in the -shm file (WAL mode); readers hold neither.
_RESERVED_BYTE = 0x40000001
_WAL_WRITE_LOCK_BYTE = 120


def readable_source(path: Path, scratch: Path) -> tuple[Path, str | None]:
    """The file to read ``path``'s committed data from, and a note when it is not ``path``.

    A ``-wal`` or ``-journal`` beside the database is left by other SQLite clients: an empty
    one by any reader (the sqlite3 shell leaves an empty ``-wal`` and a ``-shm``), a non-empty
    WAL holds committed transactions not yet copied into the file, a non-empty journal the
    undo of a transaction that never committed. Empty side files are ignored. Otherwise the
    database and its side file are copied into ``scratch``, where SQLite applies the WAL's
    committed frames (or rolls the journal back) in the copy; the input is never written to.
    Only a writer that holds its lock now (a live profiler export) makes the file unreadable.

    The copy is settled by one connection before any reader opens it: its WAL checkpointed
    into it (or its journal rolled back) and the side file gone. So readers open it immutable,
    like the input; several connections opening a WAL at once race for its recovery lock and
    lose with "database is locked" under load.
    """
    sides = [path.with_name(path.name + s) for s in _SIDE_FILES]
    present = [s for s in sides if s.is_file() and s.stat().st_size > 0]
    if not present:
        return path, None
    if _writer_holds_lock(path):
        raise DbUnreadable(
            f"{path}: being written: another process holds its write lock (a profiler export "
            "still running?); re-run once it has finished"
        )
    copy = Path(tempfile.mkdtemp(prefix="db.", dir=scratch)) / path.name
    shutil.copyfile(path, copy)
    for side in present:
        shutil.copyfile(side, copy.with_name(copy.name + side.name[len(path.name) :]))
    _settle(path, copy)
    what = (
        "committed transactions in its -wal"
        if present[0].name.endswith("-wal")
        else ("an unfinished transaction in its -journal (rolled back)")
    )
    return copy, f"{path.name}: read with {what}, applied in a private copy"


def _settle(path: Path, copy: Path) -> None:
    """Apply ``copy``'s side file to it and remove the side file: a read rolls a hot journal
    back, leaving WAL mode checkpoints the WAL (raise DbUnreadable naming ``path``)."""
    try:
        con = sqlite3.connect(copy, timeout=sqlite_ro.QUERY_SECONDS, isolation_level=None)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            con.execute("PRAGMA journal_mode=DELETE").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        raise DbUnreadable(f"{path}: {_what(exc)} ({exc})") from exc


def _writer_holds_lock(path: Path) -> bool:
    """Whether another process holds SQLite's write lock on ``path`` now (asked with F_GETLK,
    which takes no lock; False where the platform cannot tell)."""
    probes = ((path, _RESERVED_BYTE), (path.with_name(path.name + "-shm"), _WAL_WRITE_LOCK_BYTE))
    for file, offset in probes:
        try:
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue
        try:
            query = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
            if struct.unpack("hh4xqqi4x", answer)[0] != fcntl.F_UNLCK:
                return True
        except (OSError, struct.error):
            continue  # not POSIX locks as Linux lays them out: cannot tell
        finally:
            os.close(fd)
    return False


def connect_readonly(
    path: Path, source: Path | None = None, repairs: Repairs | None = None
) -> Connection:
    """Open ``path`` read-only, without locks or side files (or ``source``, a private copy of
    it, as SQLite needs to apply its side file); raise DbUnreadable naming ``path``."""
    try:
        sqlite_ro.regular_file(path)
    except sqlite_ro.NotRegularFile as exc:
        raise DbUnreadable(f"{path}: {exc}") from exc
    try:
        con = Connection(source or path, path, repairs)
    except adbc_driver_manager.Error as exc:
        raise DbUnreadable(f"{path}: {_what(exc)} ({_reason(exc)})") from exc
    try:
        con.arrow("PRAGMA query_only = 1")
        con.arrow("SELECT count(*) FROM sqlite_master")
    except DbUnreadable:
        con.close()
        raise
    return con


# STRING_IDS ids looked up per query: an IN list this long parses in milliseconds
_IDS_PER_QUERY = 50_000
# More bytes than a text of MAX_NAME characters can have (UTF-8: 4 bytes at most each): a text
# this long is cut for sure, and read a chunk at a time
_LONG_BYTES = 4 * MAX_NAME


class Db:
    """One open database: its tables and columns, typed scans, and the names of its ids.
    ``path`` is what messages name; ``source`` what is read (a private copy, see
    :func:`readable_source`); ``repairs`` collects what reading changed, for every connection
    to the same file."""

    def __init__(self, path: Path, source: Path | None = None, repairs: Repairs | None = None):
        self.path = path
        self.repairs = repairs or Repairs()
        self.con = connect_readonly(path, source, self.repairs)
        try:
            self.small = sqlite_ro.connect(source or path)
            tables = sqlite_ro.tables_of(self.small)
        except sqlite3.Error as exc:
            self.con.close()
            raise DbUnreadable(f"{path}: {_what(exc)} ({exc})") from exc
        self.columns, self._refused = tables.columns, tables.refused
        self.repairs.refused = sqlite_ro.refused_note(path, tables)
        # the STRING_IDS rows looked up so far; the readers' threads (polars runs a map on its
        # own) look up one at a time
        self._strings = pl.DataFrame(schema={"id": I64, "value": STR, "json": STR})
        self._lookup_lock = threading.Lock()

    def has(self, table: str) -> bool:
        return table in self.columns

    def refused(self, table: str) -> bool:
        """Whether ``table`` is there but not read (a view or a virtual table)."""
        return table in self._refused

    def has_column(self, table: str, column: str) -> bool:
        return column in self.columns.get(table, ())

    def scan(self, table: str, **columns: tuple[str, pl.DataType]) -> pl.DataFrame:
        """``alias=(column, type)`` of every row of ``table``, in rowid order. A column the
        table lacks (another release) is null; values are cast in SQLite (PYTORCH_API keeps
        its times as text), so a column always has its type. A table that is not there (or
        not a table) has no rows."""
        if not self.has(table):
            return pl.DataFrame(schema={alias: dtype for alias, (_, dtype) in columns.items()})
        exprs = []
        for alias, (column, dtype) in columns.items():
            if column != "rowid" and not self.has_column(table, column):
                exprs.append(f'NULL AS "{alias}"')
                continue
            source = "rowid" if column == "rowid" else f'"{column}"'
            exprs.append(f'CAST({source} AS {_SQL_TYPES[dtype]}) AS "{alias}"')
        rows = self.value(f'SELECT count(*) FROM "{table}"')
        data = self.con.arrow(f'SELECT {", ".join(exprs)} FROM "{table}" ORDER BY rowid', rows)
        return pl.DataFrame(data).cast({alias: dtype for alias, (_, dtype) in columns.items()})

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of a small query (a few rows: probes, META_DATA), as Python values."""
        replaced = self.small.text.replaced
        try:
            found = self.small.execute(sql)
        except sqlite3.Error as exc:
            raise DbUnreadable(f"{self.path}: {_what(exc)} ({exc})") from exc
        self.repairs.add(not_utf8=self.small.text.replaced - replaced)
        return found

    def value(self, sql: str) -> Any:
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    def first_row(self, table: str) -> dict[str, Any]:
        """The first row of ``table`` by column name, a blob as text ({} for an empty table)."""
        try:
            row = self.small.first(f'SELECT * FROM "{table}" LIMIT 1')
        except sqlite3.Error as exc:
            raise DbUnreadable(f"{self.path}: {_what(exc)} ({exc})") from exc
        return {
            name: value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
            for name, value in row.items()
        }

    def _named(self, column: str, ids: pl.Series) -> pl.Series:
        """``column`` (value or json) of the STRING_IDS rows of ``ids``, the ids not read yet
        read now: the rows no table uses are never read."""
        with self._lookup_lock:
            wanted = ids.drop_nulls().unique()
            new = wanted.filter(~wanted.is_in(self._strings["id"].implode()))
            if len(new) and self.has_column("STRING_IDS", "value"):
                self._strings = pl.concat([self._strings, self._read_strings(new)])
            strings = self._strings
        return ids.replace_strict(strings["id"], strings[column], default=None, return_dtype=STR)

    def _read_strings(self, ids: pl.Series) -> pl.DataFrame:
        """The texts of ``ids``, each cut at MAX_NAME characters with a hash of the whole text
        (an absurd name would otherwise be copied into every row that uses it), the first of
        an id listed twice. A text of more bytes than a MAX_NAME-character one can have is
        never read whole (:meth:`_cut_text`)."""
        parts = []
        for start in range(0, len(ids), _IDS_PER_QUERY):
            listed = ",".join(map(str, ids.slice(start, _IDS_PER_QUERY).to_list()))
            parts.append(
                self.con.arrow(
                    # octet_length: SQLite tells the size without loading the value
                    f"SELECT CAST(id AS INTEGER) AS id, CASE WHEN octet_length(value) > "
                    f"{_LONG_BYTES} THEN NULL ELSE CAST(value AS TEXT) END AS value, "
                    f"octet_length(value) > {_LONG_BYTES} AS long, rowid AS row "
                    f"FROM STRING_IDS WHERE id IN ({listed}) ORDER BY rowid",
                    rows=_IDS_PER_QUERY,
                )
            )
        schema = {"id": I64, "value": STR, "long": I64, "row": I64}
        found = pl.concat(
            [pl.DataFrame(schema=schema), *(pl.DataFrame(p).cast(schema) for p in parts)]
        )
        repeated = set(found.filter(found["id"].is_duplicated())["id"].to_list())
        found = found.unique("id", keep="first", maintain_order=True)
        long = (pl.col("long") == 1) | (pl.col("value").str.len_chars() > MAX_NAME)
        cut = {
            string_id: self._cut_text(string_id, row, value)
            for string_id, row, value in found.filter(long).select("id", "row", "value").rows()
        }
        if cut:
            found = found.with_columns(
                pl.when(long)
                .then(pl.col("id").replace_strict(cut, default=None, return_dtype=STR))
                .otherwise(pl.col("value"))
                .alias("value")
            )
        self.repairs.add(cut=cut, duplicates=repeated)
        return found.select("id", "value", json_text(pl.col("value")).alias("json"))

    def _cut_text(self, string_id: int, row: int, value: str | None) -> str:
        """A long STRING_IDS text cut as :func:`~traceanalyzer.parse.trace_shared.cut_name`
        cuts a name: ``value`` when it was read (a few KB), else its first bytes and a hash of
        all of them, read a chunk at a time (a 500 MB name costs a chunk, not 500 MB)."""
        if value is not None:
            return cut_name(value)
        digest, head = hashlib.md5(), b""
        try:
            for chunk in self.small.chunks("STRING_IDS", "value", row):
                digest.update(chunk)
                head = head or chunk[:_LONG_BYTES]
        except sqlite3.Error:  # not a rowid table: read whole, once
            whole = self.value(f"SELECT CAST(value AS BLOB) FROM STRING_IDS WHERE id = {string_id}")
            digest, head = hashlib.md5(whole or b""), (whole or b"")[:_LONG_BYTES]
        text = head.decode("utf-8", errors="replace")[:CUT_KEEP]
        return text + cut_end(digest.hexdigest())

    def text(self, ids: pl.Expr) -> pl.Expr:
        """The STRING_IDS text of an id column."""
        return ids.map_batches(partial(self._named, "value"), STR, is_elementwise=True)

    def quoted(self, ids: pl.Expr) -> pl.Expr:
        """The STRING_IDS text of an id column as a JSON string literal."""
        return ids.map_batches(partial(self._named, "json"), STR, is_elementwise=True)

    def enum(self, table: str, codes: pl.Expr) -> pl.Expr:
        """The name an ``ENUM_*`` table gives a code column (the code as text without one)."""
        if not self.has(table):
            return codes.cast(STR)
        names = self.scan(table, id=("id", I64), name=("name", STR))
        names = names.unique("id", keep="first", maintain_order=True)
        return codes.replace_strict(names["id"], names["name"], default=None, return_dtype=STR)

    @cached_property
    def task_rows(self) -> pl.DataFrame:
        """TASK, read once for the device slices, the communication planes and the kernels."""
        return self.scan(
            "TASK",
            global_task_id=("globalTaskId", I64),
            start_ns=("startNs", I64),
            end_ns=("endNs", I64),
            device_id=("deviceId", I64),
            raw_connection_id=("connectionId", I64),
            stream_id=("streamId", I64),
            task_id=("taskId", I64),
            raw_model_id=("modelId", I64),
            context_id=("contextId", I64),
            runtime_type_id=("taskType", I64),
        )

    @cached_property
    def compute(self) -> pl.DataFrame | None:
        """COMPUTE_TASK_INFO (None when the table is absent)."""
        if not self.has("COMPUTE_TASK_INFO"):
            return None
        return self.scan("COMPUTE_TASK_INFO", **_COMPUTE_COLUMNS)

    @cached_property
    def tasks(self) -> pl.DataFrame:
        """TASK with its COMPUTE_TASK_INFO (null for the tasks without)."""
        if self.compute is None:
            return self.task_rows
        return self.task_rows.join(
            self.compute, on="global_task_id", how="left", maintain_order="left"
        )

    @cached_property
    def comm_ops(self) -> pl.DataFrame:
        """COMMUNICATION_OP, read once for the op slices, their kernel rows and their tasks."""
        return self.scan(
            "COMMUNICATION_OP",
            start_ns=("startNs", I64),
            end_ns=("endNs", I64),
            group_id=("groupName", I64),
            name_id=("opName", I64),
            op_type_id=("opType", I64),
            raw_connection_id=("connectionId", I64),
            data_type_id=("dataType", I64),
            alg_type_id=("algType", I64),
            count=("count", I64),
            wait_ns=("waitNs", I64),
        )

    @cached_property
    def _envelopes(self) -> tuple[pl.Series, pl.Series]:
        """(the TASK rows that only envelop other rows, the described subtasks of a parent).

        msprof writes, beside the tasks it describes (a COMPUTE_TASK_INFO or a
        COMMUNICATION_TASK_INFO each), undescribed TASK rows that span them:
        - a communication op's own record, over all its steps on its stream, with the op's
          connection id (the Text export's is the op's `Group <i> Communication` slice);
        - a MIX kernel's parent task, over its described subtask of the same stream and task
          id (the Text export draws the subtask alone, as a MIX_AIV task).
        They carry whatever runtime task type the launch had (`AI_CORE`, `KERNEL_AICORE` in real
        G2 exports), so counted as device tasks they are compute as long as the communication
        or a second copy of the kernel."""
        rows = self.task_rows.select(
            "global_task_id", "raw_connection_id", "stream_id", "task_id", "start_ns", "end_ns"
        )
        kernels, steps = (
            self.scan(table, global_task_id=("globalTaskId", I64))
            if self.has(table)
            else pl.DataFrame(schema={"global_task_id": I64})
            for table in ("COMPUTE_TASK_INFO", "COMMUNICATION_TASK_INFO")
        )
        bare = rows.join(pl.concat([kernels, steps]), on="global_task_id", how="anti")
        inner = rows.join(kernels.unique(), on="global_task_id", how="semi").select(
            "stream_id",
            "task_id",
            pl.col("global_task_id").alias("inner_id"),
            pl.col("start_ns").alias("in_start"),
            pl.col("end_ns").alias("in_end"),
        )
        ops = self.comm_ops.select(
            "raw_connection_id",
            pl.col("start_ns").alias("in_start"),
            pl.col("end_ns").alias("in_end"),
        )
        overlaps = (pl.col("start_ns") < pl.col("in_end")) & (pl.col("end_ns") > pl.col("in_start"))
        parents = bare.join(inner, on=["stream_id", "task_id"]).filter(overlaps)
        op_records = bare.join(ops, on="raw_connection_id").filter(overlaps)
        envelopes = pl.concat([parents["global_task_id"], op_records["global_task_id"]])
        return envelopes.unique(), parents["inner_id"].unique()

    @property
    def envelope_task_ids(self) -> pl.Series:
        return self._envelopes[0]

    @property
    def mix_subtask_ids(self) -> pl.Series:
        return self._envelopes[1]

    @cached_property
    def comm_groups(self) -> pl.DataFrame:
        """The communication groups (:func:`comm_groups_of`), made once for the op and plane
        slices."""
        return comm_groups_of(self)

    def close(self) -> None:
        self.con.close()
        self.small.close()


# COMPUTE_TASK_INFO columns (ids of STRING_IDS unless a number), under the kernels names.
_COMPUTE_COLUMNS: dict[str, tuple[str, pl.DataType]] = {
    "global_task_id": ("globalTaskId", I64),
    "name_id": ("name", I64),
    "type_id": ("opType", I64),
    "compute_type_id": ("taskType", I64),
    "block_dim": ("blockDim", I64),
    "block_num": ("blockNum", I64),
    "mix_block_dim": ("mixBlockDim", I64),
    "mix_block_num": ("mixBlockNum", I64),
    "wait_ns": ("waitNs", I64),
    "op_state_id": ("opState", I64),
    "hf32_eligible_id": ("hf32Eligible", I64),
    "input_shapes_id": ("inputShapes", I64),
    "input_data_types_id": ("inputDataTypes", I64),
    "input_formats_id": ("inputFormats", I64),
    "output_shapes_id": ("outputShapes", I64),
    "output_data_types_id": ("outputDataTypes", I64),
    "output_formats_id": ("outputFormats", I64),
}


def comm_groups_of(db: Db) -> pl.DataFrame:
    """Group id → its index and the tid of its op thread: one `Group <i> Communication` thread
    per group, in order of first op, followed by its `Plane <n>` threads (op thread + 1 + n)."""
    schema = {"group_id": I64, "group_index": I64, "group_tid": I64}
    if not db.has("COMMUNICATION_OP"):
        return pl.DataFrame(schema=schema)
    groups = (
        db.comm_ops.group_by("group_id").agg(pl.col("start_ns").min()).sort("start_ns", "group_id")
    )
    planes = pl.DataFrame(schema={"group_id": I64, "planes": I64})
    if db.has("COMMUNICATION_TASK_INFO"):
        info = db.scan(
            "COMMUNICATION_TASK_INFO", group_id=("groupName", I64), plane=("planeId", I64)
        )
        planes = info.group_by("group_id").agg((pl.col("plane").max() + 1).alias("planes"))
    groups = groups.join(planes, on="group_id", how="left", maintain_order="left")
    width = 1 + groups["planes"].fill_null(0)  # the op thread and its planes
    return groups.select(
        "group_id",
        pl.int_range(pl.len(), dtype=I64).alias("group_index"),
        (width.cum_sum() - width).alias("group_tid"),
    )


_INT64_SENTINELS = [v for v in SENTINELS if v < 1 << 63]


def no_sentinel(value: pl.Expr) -> pl.Expr:
    """msprof's "none" (4294967295) as null."""
    return pl.when(value.is_in(_INT64_SENTINELS)).then(None).otherwise(value)


def conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return frame.select(
        pl.col(n).cast(t) if n in frame.columns else pl.lit(None, dtype=t).alias(n)
        for n, t in schema.items()
    )


def json_text(value: pl.Expr) -> pl.Expr:
    """``value`` as a JSON string literal (quoted and escaped)."""
    return pl.struct(value.alias("v")).struct.json_encode().str.slice(5).str.head(-1)


def json_args(*pairs: tuple[str, pl.Expr, bool | None]) -> pl.Expr:
    """The args object of each row, as trace_view.json spells it: (key, value, is_text) in the
    Text export's key order, null values left out, null when none is left. ``is_text`` None:
    the value is JSON already (STRING_IDS texts are escaped once, :meth:`Db.quoted`)."""
    parts = []
    for key, value, is_text in pairs:
        if is_text:
            value = pl.when(value.is_not_null()).then(json_text(value))
        elif is_text is not None:
            value = value.cast(STR)
        parts.append(pl.lit(f'"{key}": ') + value)  # a null value leaves its pair out
    body = pl.concat_str(parts, separator=", ", ignore_nulls=True)
    return pl.when(body != "").then(pl.lit("{") + body + pl.lit("}"))
