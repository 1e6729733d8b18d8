"""The two CSV readers agree: Arrow's (every well-formed file) and DuckDB's (the files Arrow's
refuses, whose malformed rows it skips and reports by line) give the same tables and headers."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.ingest.sink import PartitionSink
from traceanalyzer.parse import csv_tables
from traceanalyzer.parse.csv_tables import SPECS, CsvDatabase

SPEC = {spec.file: spec for spec in SPECS}

KERNEL_HEADER = (
    "Step Id,Model ID,Task ID,Stream ID,Name,Type,Accelerator Core,Start Time(us),"
    "Duration(us),Wait Time(us),Block Dim,Input Shapes,Output Shapes,PMU Metric,"
)

WELL_FORMED = {
    "g1 quoted times, triple-quoted shapes, trailing commas": (
        "kernel_details.csv",
        KERNEL_HEADER + "\n"
        '1,4294967295,7,2,MatMul,MatMul,AI_CORE,"1700000000000.123\t",12.5,0,8,'
        '"""1,2;3,4""","""1,4""",0.5,\n'
        '1,N/A,8,2,Add,Add,AI_VECTOR_CORE,1700000000013.001\t,1.25,,,"""""",,x,\n',
    ),
    "CRLF, a byte-order mark, an empty field": (
        "api_statistic.csv",
        "\ufeffLevel,API Name,Count,Time(us),Avg(us),Min(us),Max(us),Variance\r\n"
        "acl,aclrtMemcpy,3,30.5,10.1,1,20,0.5\r\n"
        "acl,aclrtSynchronizeStream,,1,1,1,1,\r\n",
    ),
    "multi-line call stacks, quoted empty text": (
        "operator_details.csv",
        "Name,Input Shapes,Call Stack,Host Self Duration(us),Host Total Duration(us),"
        "Device Self Duration(us),Device Total Duration(us),"
        "Device Self Duration With AICore(us),Device Total Duration With AICore(us)\n"
        'aten::mm,"[[2, 3], [3, 4]]","a.py(1): f;\r\nb.py(2): g;\nc.py(3): h",1.5,2.5,3,4,5,6\n'
        'aten::add,"",,0.001,0,0,0,0,0\n',
    ),
    "header only": ("step_trace_time.csv", "Step,Computing,Free,Stage\n"),
    "another tool's CSV": ("op_statistic.csv", "a,b\n1,2\n"),
}


def _read(path: Path, tmp: Path, reader: str) -> tuple[list[str], list[str], pl.DataFrame | None]:
    spec = SPEC[path.name]
    sink = PartitionSink(tmp / reader, 0, "s")
    if reader == "arrow":
        result = csv_tables._parse_plain(path, spec, sink)
    else:
        db = CsvDatabase()
        try:
            result = csv_tables._parse_salvaging(path, spec, sink, db)
        finally:
            db.close()
    files = list((tmp / reader).rglob("*.parquet"))
    return result.header, result.warnings, pl.read_parquet(files[0]) if files else None


@pytest.mark.parametrize("case", sorted(WELL_FORMED))
def test_arrow_and_duckdb_read_a_well_formed_file_alike(case: str, tmp_path: Path) -> None:
    name, text = WELL_FORMED[case]
    path = tmp_path / name
    path.write_bytes(text.encode())
    header, warnings, table = _read(path, tmp_path, "arrow")
    assert (header, warnings) == _read(path, tmp_path, "duckdb")[:2]
    expected = _read(path, tmp_path, "duckdb")[2]
    assert (table is None) == (expected is None)
    if table is not None:
        assert table.equals(expected), (table, expected)


@pytest.mark.parametrize(
    "content",
    [
        KERNEL_HEADER + "\n1,2,3\n",  # too few fields
        "Level,API Name,Count\nacl,a,1,2,3\n",  # too many
        "Level,API Name,Count\nacl,\xff\xfe,1\n",  # not UTF-8
    ],
    ids=["too few", "too many", "not utf-8"],
)
def test_a_malformed_file_goes_to_the_salvaging_reader(content: str, tmp_path: Path) -> None:
    path = tmp_path / ("kernel_details.csv" if content.startswith("Step") else "api_statistic.csv")
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(csv_tables._NotPlain):
        csv_tables._parse_plain(path, SPEC[path.name], PartitionSink(tmp_path / "a", 0, "s"))
    assert not list((tmp_path / "a").rglob("*.parquet")), "nothing is left of the refused read"
    result = csv_tables.parse_csv(path, SPEC[path.name], PartitionSink(tmp_path / "b", 0, "s"))
    assert any("malformed row" in w or "UTF-8" in w for w in result.warnings), result.warnings


def test_a_session_of_well_formed_files_opens_no_database(tmp_path: Path) -> None:
    name, text = WELL_FORMED["CRLF, a byte-order mark, an empty field"]
    (tmp_path / name).write_text(text)
    db = CsvDatabase()
    csv_tables.parse_csv(tmp_path / name, SPEC[name], PartitionSink(tmp_path / "o", 0, "s"), db)
    assert db._con is None
