"""communication.json / communication_matrix.json → comm_ops / comm_links, odd values included."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa

from traceanalyzer.parse.comm import parse_communication, parse_communication_matrix


class _Sink:
    def __init__(self) -> None:
        self.tables: dict[str, pl.DataFrame] = {}

    def arrow(self, table: str, data: pa.Table) -> int:
        self.tables[table] = pl.from_arrow(data)  # type: ignore[assignment]
        return data.num_rows


def _links(tmp_path: Path, links: dict[str, object]) -> pl.DataFrame:
    path = tmp_path / "communication_matrix.json"
    entry = {"allreduce-top1@175": links, "Total Op Info": {"0-1": {"Transit Size(MB)": 9}}}
    path.write_text(json.dumps({"step1": {"collective": entry, "p2p": {}}}))
    sink = _Sink()
    parse_communication_matrix(path, sink)
    return sink.tables["comm_links"]


def test_links_are_typed_per_column_whatever_the_values(tmp_path: Path) -> None:
    links = _links(
        tmp_path,
        {
            "0-1": {"Transport Type": "HCCS", "Transit Size(MB)": 0.5, "Transit Time(ms)": 0.1,
                    "Bandwidth(GB/s)": 5, "Op Name": "hcom_allReduce__1"},
            " 2 - 3 ": {"Transport Type": 7, "Transit Size(MB)": "1.5", "Transit Time(ms)": "0.25",
                        "Bandwidth(GB/s)": True, "Op Name": None},
            "²-x": {"Transit Size(MB)": {"nested": 1}, "Transit Time(ms)": "n/a",
                    "Bandwidth(GB/s)": [1]},
            "4": {},
            "bad": "not an object",
        },
    )  # fmt: skip
    assert links["src_rank"].to_list() == [0, 2, None, 4]
    assert links["dst_rank"].to_list() == [1, 3, None, None]
    assert links["transport_type"].to_list() == ["HCCS", "7", None, None]
    assert links["transit_size_mb"].to_list() == [0.5, 1.5, None, None]
    assert links["transit_ns"].to_list() == [100_000, 250_000, None, None]
    assert links["bandwidth_gbps"].to_list() == [5.0, None, None, None]
    assert links["op_name"].to_list() == ["hcom_allReduce__1", None, None, None]
    assert set(links["op_key"]) == {"allreduce-top1"} and set(links["group"]) == {"175"}


def test_ops_keep_exact_start_times_and_odd_figures_as_nulls(tmp_path: Path) -> None:
    path = tmp_path / "communication.json"
    ops = {
        "hcom_allReduce__1@9": {
            "Communication Time Info": {"Start Timestamp(us)": 1736408883732241.5,
                                        "Elapse Time(ms)": 79.0895, "Wait Time Ratio": "0.5"},
            "Communication Bandwidth Info": {"HCCS": {"Transit Size(MB)": 0.5}},
        },
        "hcom_send__2": {"Communication Time Info": {"Elapse Time(ms)": "x",
                                                     "Wait Time Ratio": False}},
        "Total Op Info": {"Communication Time Info": {"Elapse Time(ms)": 79.0895}},
    }  # fmt: skip
    path.write_text(json.dumps({"step1": {"collective": ops}}))
    sink = _Sink()
    parse_communication(path, sink)
    table = sink.tables["comm_ops"]
    assert table["start_ns"].to_list() == [1736408883732241500, None]
    assert table["elapse_ns"].to_list() == [79_089_500, None]
    assert table["wait_ratio"].to_list() == [0.5, None]
    assert table["group"].to_list() == ["9", None]
    assert table["bandwidth"][0] == '{"HCCS": {"Transit Size(MB)": 0.5}}'
