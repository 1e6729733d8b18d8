"""docs/schema.md is generated from traceanalyzer.schema and must stay current."""

from __future__ import annotations

from pathlib import Path

from traceanalyzer.schema import TABLES, render_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "schema.md"


def test_schema_doc_is_current() -> None:
    assert DOC.read_text("utf-8") == render_markdown(), (
        "regenerate: python -m traceanalyzer.schema > docs/schema.md"
    )


def test_schema_names_are_snake_case_and_times_are_int64_ns() -> None:
    import re

    import pyarrow as pa

    for table in TABLES.values():
        for column in table.columns:
            assert re.fullmatch(r"[a-z][a-z0-9_]*", column.name), column.name
            if column.name.endswith("_ns"):
                assert column.type == pa.int64(), f"{table.name}.{column.name}"


def test_every_column_says_where_it_comes_from_in_a_db_export() -> None:
    from traceanalyzer.schema import DB_SOURCES

    assert set(DB_SOURCES) <= set(TABLES)
    for name, sources in DB_SOURCES.items():
        columns = {c.name for c in TABLES[name].columns} - {"rank", "session"}
        assert set(sources) - {""} == columns, name
        assert sources.get(""), f"{name}: no table-level Db source"
