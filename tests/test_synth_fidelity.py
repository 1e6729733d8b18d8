"""Generated G2 Level1 exports look like the real G2 Level1 export, file by file and quirk by quirk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from synth_support import key_layouts, load_trace, process_names, real_g2_level1, skip_reason

from traceanalyzer.synth import generate

REAL = real_g2_level1()
pytestmark = pytest.mark.skipif(REAL is None, reason=skip_reason("g2_level1"))

# Documented additions (format reference §3.4): memcpy tasks carry direction and size.
MEMCPY_ARGS = ("data size(Byte)", "memcpy direction")
TS_RE = re.compile(r'"ts": "(\d+\.\d{3})"')


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("gen")
    dirs = []
    for scenario in ("store-stall", "capture-growth", "store-healthy"):
        dirs += generate(scenario, root / scenario, ranks=2, generation="g2", level=1)
    dirs += generate(
        "inference-baseline", root / "baseline", ranks=2, generation="g2", level=1, tp_comm=1
    )
    return dirs


def _real_rank() -> Path:
    assert REAL is not None
    return REAL / "rank0_ascend_pt"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_same_files_and_csv_headers(generated: list[Path]) -> None:
    real_out = _real_rank() / "ASCEND_PROFILER_OUTPUT"
    for rank_dir in generated:
        out = rank_dir / "ASCEND_PROFILER_OUTPUT"
        for name in (
            "kernel_details.csv",
            "api_statistic.csv",
            "op_statistic.csv",
            "step_trace_time.csv",
            "operator_details.csv",
            "npu_module_mem.csv",
        ):
            ours, real = _lines(out / name)[0], _lines(real_out / name)[0]
            assert ours == real, f"{name} header differs in {rank_dir.name}"
        assert (rank_dir / f"profiler_info_{_rank_of(rank_dir)}.json").is_file()


def _rank_of(rank_dir: Path) -> int:
    return int(next(rank_dir.glob("profiler_info_*.json")).stem.rsplit("_", 1)[1])


@pytest.mark.parametrize(
    "name",
    [
        "kernel_details.csv",
        "api_statistic.csv",
        "op_statistic.csv",
        "step_trace_time.csv",
        "operator_details.csv",
        "npu_module_mem.csv",
    ],
)
def test_line_endings_match_real(generated: list[Path], name: str) -> None:
    real_crlf = _lines(_real_rank() / "ASCEND_PROFILER_OUTPUT" / name)[0].endswith(b"\r\n")
    for rank_dir in generated:
        for line in _lines(rank_dir / "ASCEND_PROFILER_OUTPUT" / name):
            assert line.endswith(b"\r\n") == real_crlf, (
                f"{name}: line ending differs from the real export"
            )


def test_absolute_times_have_trailing_tab(generated: list[Path]) -> None:
    import csv

    for rank_dir in generated:
        with open(
            rank_dir / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="", encoding="utf-8"
        ) as fh:
            rows = list(csv.DictReader(fh))
        assert rows
        for row in rows:
            assert re.fullmatch(r"\d{16}\.\d{3}\t", row["Start Time(us)"]), row["Start Time(us)"]


def test_profiler_info_and_metadata_keys(generated: list[Path]) -> None:
    real_info = json.loads((_real_rank() / "profiler_info_0.json").read_text())
    real_meta = json.loads((_real_rank() / "profiler_metadata.json").read_text())
    for rank_dir in generated:
        info = json.loads(next(rank_dir.glob("profiler_info_*.json")).read_text())
        assert set(info) == set(real_info)
        assert set(info["config"]["experimental_config"]) == set(
            real_info["config"]["experimental_config"]
        )
        assert isinstance(info["rank_id"], int)
        assert isinstance(info["config"]["experimental_config"]["_export_type"], str)
        meta = json.loads((rank_dir / "profiler_metadata.json").read_text())
        assert set(meta["ENV_VARIABLES"]) == set(real_meta["ENV_VARIABLES"])


def _key_tree(obj: object, depth: int = 0) -> set[tuple]:
    """Key paths with op names and step names abstracted, to compare JSON structure."""
    out: set[tuple] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            label = k
            if re.match(r"step\d*$", k):
                label = "<step>"
            elif "@" in k:
                label = (
                    "<op>"
                    if k.startswith("hcom_")
                    else re.sub(r"^[a-z]+-(\w+)@.*", r"<type>-\1", k)
                )
            elif re.fullmatch(r"\d+-\d+", k):
                label = "<link>"
            elif re.fullmatch(r"[\d.]+", k):
                label = "<size>"
            out.add((depth, label))
            out |= {(depth, label, *p) for p in _key_tree(v, depth + 1)}
    return out


@pytest.mark.parametrize("name", ["communication.json", "communication_matrix.json"])
def test_communication_json_structure(generated: list[Path], name: str) -> None:
    real = _key_tree(json.loads((_real_rank() / "ASCEND_PROFILER_OUTPUT" / name).read_text()))
    seen = False
    for rank_dir in generated:
        path = rank_dir / "ASCEND_PROFILER_OUTPUT" / name
        if path.exists():
            seen = True
            ours = _key_tree(json.loads(path.read_text()))
            assert ours <= real, sorted(ours - real)[:5]
    assert seen


def test_trace_framing(generated: list[Path]) -> None:
    real = (_real_rank() / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_bytes()
    for rank_dir in generated:
        data = (rank_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_bytes()
        assert data[:22] == real[:22] == b'[{"ph": "X", "name": "'
        assert b"\n" not in data
        # framework part and msprof part joined by a bare comma, exactly once
        assert data.count(b"},{") == real.count(b"},{") == 1
        assert data.endswith(b"}]")
        text = data.decode()
        assert json.loads(text)
        all_ts = re.findall(r'"ts": "([^"]*)"', text)
        # Every ts has 3 decimals, except the closing `AI Core Freq` sample: whole µs, as in real files.
        odd = [t for t in all_ts if not TS_RE.fullmatch(f'"ts": "{t}"')]
        real_odd = [
            t
            for t in re.findall(r'"ts": "([^"]*)"', real.decode())
            if not TS_RE.fullmatch(f'"ts": "{t}"')
        ]
        assert len(odd) == len(real_odd) == 1 and odd[0].isdigit() and real_odd[0].isdigit()


def test_event_key_layouts_match_real(generated: list[Path]) -> None:
    real = key_layouts(load_trace(_real_rank()))
    for rank_dir in generated:
        ours = key_layouts(load_trace(rank_dir))
        for kind, layouts in ours.items():
            assert kind in real, f"event kind {kind} does not occur in the real export"
            for top, args in layouts:
                if kind[0] == "Ascend Hardware" and args and args[-2:] == MEMCPY_ARGS:
                    args = args[:-2]
                assert (top, args) in real[kind], (
                    f"{kind}: layout {top} {args} not in the real export"
                )


def test_every_thread_has_metadata(generated: list[Path]) -> None:
    for rank_dir in generated:
        events = load_trace(rank_dir)
        procs = process_names(events)
        named = {
            (e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
        }
        for e in events:
            if e["ph"] in ("X", "s", "f"):
                assert e["pid"] in procs
                proc = procs[e["pid"]]
                if proc != "Overlap Analysis" or e["tid"] < 4:
                    assert (e["pid"], e["tid"]) in named, (proc, e["tid"], e["name"])


def test_pid_composition(generated: list[Path]) -> None:
    for rank_dir in generated:
        procs = process_names(load_trace(rank_dir))
        python = [p for p, n in procs.items() if n == "Python"]
        assert len(python) == 1
        ospid = python[0]
        for pid, name in procs.items():
            if name != "Python":
                assert pid >> 10 == ospid, name
                assert pid & 31 == _rank_of(rank_dir)  # device id = rank in our scenarios
