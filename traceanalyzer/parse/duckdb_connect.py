"""DuckDB connections for the parsers that decode with it (the CSV summaries, and the DuckDB
trace reader): imported only by them, so a run that reads neither never imports DuckDB."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import duckdb


def connect_duckdb(config: dict[str, object]) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection for parsing, with ``config`` and without a progress bar."""
    return quiet(duckdb.connect(config=config))


def quiet(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Turn off the progress bar of ``con`` (a setting of each connection and cursor).

    DuckDB draws one on stdout for any query over two seconds, even without a terminal, which
    would corrupt `run --format json` and the progress lines on a large trace.
    """
    # In a Jupyter kernel without ipywidgets DuckDB refuses to touch the setting (its bar would
    # be a widget there, not text on stdout): nothing to turn off.
    with contextlib.suppress(duckdb.Error):
        con.execute("SET enable_progress_bar = false")
    return con


def duckdb_reason(exc: BaseException | str, limit: int) -> str:
    """The first line of a DuckDB error (or its message), at most ``limit`` characters: its message goes on to
    quote the offending input whole (megabytes of a damaged file's line)."""
    return str(exc).partition("\n")[0][:limit]


@contextlib.contextmanager
def duckdb_name(path: Path) -> Iterator[str]:
    """``path`` as DuckDB opens it. DuckDB takes a file's name as UTF-8 text, and a folder's
    name need not be (数据 in GBK, which Python holds as surrogates: every rank under it failed
    with UnicodeEncodeError): such a file is opened here and handed over as ``/dev/fd/N``."""
    name = str(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            yield f"/dev/fd/{fd}"
        finally:
            os.close(fd)
        return
    yield name
