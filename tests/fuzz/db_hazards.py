"""What a received Db export can hold, one function per hazard, each editing a copy in place.

Used by the fuzzer (``damage.db_damage`` picks one at random) and by
``tests/test_untrusted_input.py`` (each hazard on its own). Stdlib only: the databases are
edited with Python's sqlite3, as any other SQLite client would edit them.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

# A query that never ends: as a view, it runs whenever the "table" is read.
ENDLESS = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n"


@contextlib.contextmanager
def edit(db: Path) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(db)
    try:
        yield con
        con.commit()
    finally:
        con.close()


def table_as_view(db: Path, table: str) -> str:
    """``table`` replaced by a view over an endless recursive query, with its columns."""
    with edit(db) as con:
        columns = [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]
        con.execute(f'DROP TABLE "{table}"')
        picked = ", ".join(f'x AS "{c}"' for c in columns) or "x"
        con.execute(f'CREATE VIEW "{table}" AS SELECT {picked} FROM ({ENDLESS})')
    return f"{table} is a view over an endless recursive query"


def table_as_virtual(db: Path, table: str) -> str:
    """``table`` replaced by an FTS5 virtual table of the same columns."""
    with edit(db) as con:
        columns = [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]
        con.execute(f'DROP TABLE "{table}"')
        con.execute(f'CREATE VIRTUAL TABLE "{table}" USING fts5({", ".join(columns)})')
    return f"{table} is a virtual table"


def generated_column(db: Path, table: str = "TASK") -> str:
    """A virtual generated column that allocates a large blob on every read."""
    with edit(db) as con:
        con.execute(
            f'ALTER TABLE "{table}" ADD COLUMN huge BLOB GENERATED ALWAYS AS (zeroblob(100000000))'
        )
    return f"{table} has a generated column of 100 MB per row"


def names_used(con: sqlite3.Connection, table: str = "CANN_API", column: str = "name") -> list[int]:
    return [row[0] for row in con.execute(f'SELECT DISTINCT "{column}" FROM "{table}"')]


def huge_name(db: Path, size: int, table: str = "CANN_API", column: str = "name") -> str:
    """The most used name of ``table`` grown to ``size`` characters."""
    with edit(db) as con:
        (string_id, uses) = con.execute(
            f'SELECT "{column}", count(*) FROM "{table}" GROUP BY 1 ORDER BY 2 DESC LIMIT 1'
        ).fetchone()
        con.execute("UPDATE STRING_IDS SET value = ? WHERE id = ?", ("N" * size, string_id))
    return f"a {size:,}-character name used by {uses} {table} rows"


def huge_frame(db: Path, size: int) -> str:
    """A call-stack frame of ``size`` characters."""
    with edit(db) as con:
        row = con.execute("SELECT stack FROM PYTORCH_CALLCHAINS LIMIT 1").fetchone()
        if row is None:
            return "no call stacks"
        con.execute("UPDATE STRING_IDS SET value = ? WHERE id = ?", ("F" * size, row[0]))
    return f"a {size:,}-character call-stack frame"


def unused_strings(db: Path, rows: int) -> str:
    """``rows`` STRING_IDS rows no table uses."""
    with edit(db) as con:
        start = con.execute("SELECT max(id) FROM STRING_IDS").fetchone()[0] + 1
        con.execute(
            "INSERT INTO STRING_IDS (id, value) WITH RECURSIVE n(i) AS (SELECT ? UNION ALL "
            "SELECT i + 1 FROM n WHERE i < ?) SELECT i, 'unused name ' || i FROM n",
            (start, start + rows - 1),
        )
    return f"{rows:,} unused STRING_IDS rows"


def invalid_utf8(db: Path, table: str = "STRING_IDS", column: str = "value") -> str:
    """One text value of ``table`` made invalid UTF-8 (a lone continuation byte, 0xFF)."""
    with edit(db) as con:
        con.execute(
            f'UPDATE "{table}" SET "{column}" = CAST(X\'61FF62C3\' AS TEXT) '
            f'WHERE rowid = (SELECT min(rowid) FROM "{table}")'
        )
    return f"{table}.{column} holds invalid UTF-8"


def duplicate_ids(db: Path) -> str:
    """STRING_IDS rebuilt without its key, each used id listed twice, one copy invalid UTF-8."""
    with edit(db) as con:
        con.executescript(
            "CREATE TABLE s AS SELECT * FROM STRING_IDS; DROP TABLE STRING_IDS; "
            "CREATE TABLE STRING_IDS (id INTEGER, value TEXT); "
            "INSERT INTO STRING_IDS SELECT * FROM s; "
            "INSERT INTO STRING_IDS SELECT id, CAST(X'80' || CAST(value AS BLOB) AS TEXT) FROM s; "
            "DROP TABLE s;"
        )
    return "every STRING_IDS id twice, the second copy invalid UTF-8"


def meta_value(db: Path, name: str, value: object) -> str:
    """The META_DATA value of ``name`` set to ``value`` (NULL, bytes, deep JSON...)."""
    with edit(db) as con:
        con.execute("DELETE FROM META_DATA WHERE name = ?", (name,))
        con.execute("INSERT INTO META_DATA (name, value) VALUES (?, ?)", (name, value))
    shown = repr(value)[:40]
    return f"META_DATA {name} = {shown}"


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def host_name(db: Path, value: object) -> str:
    with edit(db) as con:
        con.execute("UPDATE HOST_INFO SET hostName = ?", (value,))
    return f"HOST_INFO.hostName = {repr(value)[:40]}"


def pending_wal(db: Path) -> str:
    """A committed transaction left in a ``-wal`` beside the database (a copy taken while a
    writer had it open): the file alone does not hold it."""
    wal = db.with_name(db.name + "-wal")
    with edit(db) as con:
        con.execute("PRAGMA journal_mode = WAL")
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_autocheckpoint = 0")
    con.execute("INSERT INTO STRING_IDS (id, value) VALUES (-1, 'from the wal')")
    con.commit()
    kept = {path: path.read_bytes() for path in (db, wal)}  # before close checkpoints them
    con.close()
    for path, data in kept.items():
        path.write_bytes(data)
    return "a committed transaction in a -wal"


def garbage_wal(db: Path, size: int = 1 << 20) -> str:
    """A ``-wal`` of random bytes beside the database."""
    db.with_name(db.name + "-wal").write_bytes(os.urandom(size))
    return f"a {size:,}-byte -wal of random bytes"


def as_fifo(path: Path) -> str:
    """The file replaced by a FIFO (an open for reading waits for a writer, forever)."""
    path.unlink()
    os.mkfifo(path)
    return f"{path.name} is a FIFO"
