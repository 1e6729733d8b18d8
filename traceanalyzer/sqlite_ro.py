"""A SQLite file of an input, opened as data: nothing in it runs, blocks or takes forever.

- Only a regular file is opened (links followed): a FIFO or a device named like a database is
  refused at once, never handed to SQLite (whose open would wait for a writer).
- Read-only and immutable (``mode=ro&immutable=1``): no lock, no journal, nothing written.
- Every query runs under a progress handler with a deadline: past it, SQLite interrupts the
  query (``sqlite3.OperationalError: interrupted``).
- Only real tables are read (:func:`tables_of`): a view runs the query its creator wrote (an
  endless recursive one, say), a virtual table runs a module's code, and a generated column
  evaluates an expression on every read; their names are listed as refused instead, and an
  authorizer refuses any query that would read through a view or a virtual table all the
  same. Triggers only fire on writes, which never happen here.
- Text that is not UTF-8 is decoded with replacement characters, and counted.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

QUERY_SECONDS = 30.0  # one probe of a profiler database (a count, a few rows): milliseconds
_STEPS = 10_000  # SQLite virtual machine steps between two looks at the clock


class NotRegularFile(sqlite3.DatabaseError):
    """The path is a FIFO, a device, a socket or a directory, not a database file."""


@dataclass
class Tables:
    """The real tables of a database and their readable columns; what is not read, and why."""

    columns: dict[str, set[str]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # name -> what it is


class _Text:
    """Decodes SQLite text as UTF-8, invalid bytes replaced, and counts the values replaced."""

    def __init__(self) -> None:
        self.replaced = 0

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.replaced += 1
            return raw.decode("utf-8", errors="replace")


def regular_file(path: Path) -> None:
    """Raise :class:`NotRegularFile` unless ``path`` is a regular file (a stat: never blocks)."""
    if not path.is_file():
        raise NotRegularFile("not a regular file (a FIFO, device, socket or directory)")


def connect(path: Path, seconds: float = QUERY_SECONDS) -> Connection:
    """``path`` opened read-only and immutable (without locks or side files), each query
    interrupted after ``seconds``."""
    regular_file(path)
    # any thread may query (one at a time: the callers serialise their own use)
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    return Connection(sqlite3.connect(uri, uri=True, check_same_thread=False), seconds)


class Connection:
    """A stdlib connection whose queries each have a deadline (see :func:`connect`)."""

    def __init__(self, con: sqlite3.Connection, seconds: float):
        self._con, self.seconds = con, seconds
        self.text = _Text()
        con.text_factory = self.text
        self._deadline = time.monotonic() + seconds
        self.untrusted: set[str] = set()  # virtual tables, once :func:`tables_of` found them
        con.set_progress_handler(self._past_deadline, _STEPS)
        con.set_authorizer(self._authorize)
        self.execute("PRAGMA query_only = 1")

    def _past_deadline(self) -> bool:
        return time.monotonic() > self._deadline

    def _authorize(
        self, action: int, name: str | None, _: object, __: object, view: str | None
    ) -> int:
        """Deny what a view does (SQLite names the view behind an access) and any read of a
        virtual table: a query that needs either fails before it runs."""
        if view is not None or (action == sqlite3.SQLITE_READ and name in self.untrusted):
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def execute(self, sql: str, parameters: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """Every row of ``sql``, within the deadline (``sqlite3.OperationalError`` past it)."""
        return self._cursor(sql, parameters).fetchall()

    def first(self, sql: str) -> dict[str, object]:
        """The first row of ``sql`` by column name ({} without one)."""
        cursor = self._cursor(sql, ())
        row = cursor.fetchone()
        return dict(zip((d[0] for d in cursor.description), row, strict=True)) if row else {}

    def chunks(self, table: str, column: str, row: int, size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes of one text or blob value, ``size`` at a time (incremental blob I/O: a
        value of hundreds of MB is never held whole)."""
        with self._con.blobopen(table, column, row, readonly=True) as blob:
            while chunk := blob.read(size):
                yield chunk

    def _cursor(self, sql: str, parameters: tuple[object, ...]) -> sqlite3.Cursor:
        self._deadline = time.monotonic() + self.seconds
        return self._con.execute(sql, parameters)

    def close(self) -> None:
        self._con.close()


def tables_of(con: Connection) -> Tables:
    """The database's real tables (not views, virtual tables or SQLite's own) with their
    stored columns (not generated ones); the rest named in ``refused``."""
    found = Tables()
    listed = con.execute(
        "SELECT type, name, sql LIKE 'CREATE VIRTUAL%' FROM sqlite_master "
        "WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite^_%' ESCAPE '^'"
    )
    for kind, name, virtual in listed:
        if kind == "view" or virtual:
            found.refused[str(name)] = "a virtual table" if virtual else "a view"
            if virtual:
                con.untrusted.add(str(name))
            continue
        names = found.columns.setdefault(str(name), set())
        for column, hidden in con.execute(
            "SELECT name, hidden FROM pragma_table_xinfo(?)", (str(name),)
        ):
            if hidden == 2:  # a virtual generated column: computed when read
                found.refused[f"{name}.{column}"] = "a generated column"
            else:
                names.add(str(column))
    return found


def refused_note(path: Path, tables: Tables) -> str | None:
    """What a database held that is not read, as one warning (None when nothing)."""
    if not tables.refused:
        return None
    listed = ", ".join(f"{name} ({what})" for name, what in sorted(tables.refused.items())[:10])
    more = f" and {len(tables.refused) - 10} more" if len(tables.refused) > 10 else ""
    return (
        f"{path.name}: not read: {listed}{more}; only a database's tables are read (a view, a "
        "virtual table or a generated column runs code its author wrote)"
    )
