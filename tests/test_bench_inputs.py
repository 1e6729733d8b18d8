"""benchmarks/bench_inputs.py: a real rank tiled k times reads, through our own ingest, as a run
k times as long (steps, kernels, operators, comm ops and flows scale; flows still pair)."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest

from traceanalyzer.derived.tables import steps_of
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COPIES = 3


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("bench_inputs")


def _rank0(root: Path) -> Path:
    return root / "rank0_ascend_pt"


def _figures(rank: Path, out: Path) -> dict[str, object]:
    """What tiling must scale, as our ingest reads ``rank``."""
    result = ingest(rank.parent, out, jobs=1)
    (outcome,) = result.outcomes
    assert outcome.status == "ingested" and not outcome.warnings, outcome
    store = Store.open(out)
    flows = store.table("flows").collect()
    comm = store.table("comm_ops").collect()
    return {
        "steps": steps_of(store, [0]).filter(pl.col("step_source") == "profiler_step").height,
        "step_numbers": sorted(store.table("step_times").collect()["step"].to_list()),
        "kernels": outcome.rows["kernels"],
        "operators": outcome.rows["operators"],
        "slices": outcome.rows["slices"],
        "comm_ops": comm.height,
        "comm_op_keys": comm.select("step", "op_name").unique().height,
        "flows": flows.height,
        "paired": flows.filter(
            pl.col("start_ns").is_not_null() & pl.col("end_ns").is_not_null()
        ).height,
        "threads": outcome.rows["threads"],
    }


def _check_scaled(one: dict, tiled: dict) -> None:
    for key in ("steps", "kernels", "operators", "slices", "comm_ops", "comm_op_keys", "flows"):
        assert tiled[key] == COPIES * one[key], key
    assert tiled["paired"] == COPIES * one["paired"]  # every tile's flows pair within it
    assert tiled["threads"] == one["threads"]  # the same processes and threads, longer
    first = one["step_numbers"][0]
    assert tiled["step_numbers"] == list(range(first, first + COPIES))  # steps follow on


def test_a_tiled_text_rank_reads_as_a_longer_run(
    bench: ModuleType, real_g2: Path, tmp_path: Path
) -> None:
    real = _rank0(real_g2)
    once = bench.tile_text_rank(real, tmp_path / "once" / real.name, 1).rank
    # one tile is the real rank, byte for byte (line ends, quoting, number formats)
    for path in real.rglob("*"):
        if path.is_file():
            assert (once / path.relative_to(real)).read_bytes() == path.read_bytes(), path
    tiled = bench.tile_text_rank(real, tmp_path / "tiled" / real.name, COPIES)
    trace = tiled.rank / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    ratio = (
        trace.stat().st_size / (real / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").stat().st_size
    )
    assert COPIES - 0.1 < ratio <= COPIES  # metadata events are written once
    side = "operator_details.csv"
    assert (tiled.rank / "ASCEND_PROFILER_OUTPUT" / side).stat().st_size > 2.9 * (
        real / "ASCEND_PROFILER_OUTPUT" / side
    ).stat().st_size
    _check_scaled(_figures(once, tmp_path / "out1"), _figures(tiled.rank, tmp_path / "out3"))
    store = Store.open(tmp_path / "out3")
    session = store.sessions().row(0, named=True)
    one = Store.open(tmp_path / "out1").sessions().row(0, named=True)
    # the session spans its tiles: each is shifted by exactly one span (whole µs)
    assert session["end_ns"] - one["end_ns"] == (COPIES - 1) * tiled.span_us * 1000


def test_a_tiled_db_rank_reads_as_a_longer_run(
    bench: ModuleType, real_g2_db: Path, tmp_path: Path
) -> None:
    real = _rank0(real_g2_db)
    once = bench.tile_db_rank(real, tmp_path / "once" / real.name, 1)
    tiled = bench.tile_db_rank(real, tmp_path / "tiled" / real.name, COPIES)
    _check_scaled(_figures(once, tmp_path / "out1"), _figures(tiled, tmp_path / "out3"))


def test_cached_inputs_are_built_once(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = []

    def build(folder: Path) -> Path:
        calls.append(folder)
        (folder / "r").mkdir()
        return folder / "r"

    assert bench._cached(tmp_path / "c", build) == tmp_path / "c" / "r"
    assert bench._cached(tmp_path / "c", build) == tmp_path / "c" / "r"
    assert len(calls) == 1
    shutil.rmtree(tmp_path / "c")  # a half-built folder (no marker) is built again
    (tmp_path / "c").mkdir()
    assert bench._cached(tmp_path / "c", build) == tmp_path / "c" / "r" and len(calls) == 2


def test_a_realistic_collection_is_the_rank_once_per_rank_id(
    bench: ModuleType, real_g2: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Copies of one rank read as that many ranks, their files hard links to the one rank's."""
    source = tmp_path / "source" / "bench_ascend_pt"
    shutil.copytree(_rank0(real_g2), source)
    monkeypatch.setattr(bench, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(bench, "build_input", lambda mb: source)
    root = bench.build_realistic_collection(3, 1)
    result = ingest(root, tmp_path / "out", jobs=1)
    assert sorted(o.rank for o in result.outcomes) == [0, 1, 2]
    assert all(o.status == "ingested" for o in result.outcomes)
    trace = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"
    assert (root / "rank2_ascend_pt" / trace).stat().st_ino == (source / trace).stat().st_ino
