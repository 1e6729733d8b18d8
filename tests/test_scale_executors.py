"""Executors: the same findings on every backend; killed workers, killed drivers, corrupt ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ingest_faults
import pytest
from click.testing import CliRunner
from conftest import STALLED_RANKS as RANKS

from traceanalyzer.cli import EXIT_PARTIAL, main
from traceanalyzer.executor import (
    ExecutorError,
    LocalExecutor,
    ProcessExecutor,
    TaskCrashed,
    make_executor,
)
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store


@pytest.fixture(scope="module")
def collection(stalled_collection: Path) -> Path:
    """Eight small store-stall ranks; ranks 2 and 5 stall."""
    return stalled_collection


@pytest.fixture(scope="module")
def reference(collection: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """findings.json of an uninterrupted run with the processes backend."""
    out = tmp_path_factory.mktemp("reference") / "out"
    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == 0
    return doc


def _run(root: Path, out: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(out), "-q", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads((out / "findings.json").read_text())


def _statuses(out: Path) -> dict[int, str]:
    doc = json.loads((out / "ingest.json").read_text())
    return {s["rank"]: s["status"] for s in doc["sessions"]}


def test_reference_groups_the_stalled_ranks(reference: dict) -> None:
    stalls = [f for f in reference["findings"] if f["name"] == "store-transfer-stall"]
    assert len(stalls) == 1
    assert stalls[0]["ranks"] == [2, 5]
    assert stalls[0]["ranks_label"] == "ranks 2, 5 (2/8)"


def test_local_backend_equals_processes(collection: Path, reference: dict, tmp_path: Path) -> None:
    code, doc = _run(collection, tmp_path / "out", "--executor", "local")
    assert code == 0
    assert doc == reference


def test_killed_worker_fails_only_its_rank_then_resumes(
    collection: Path, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 3's worker is SIGKILLed on every attempt (an OOM kill): the pool breaks, the other
    ranks finish, rank 3 is reported failed with the signal, and the exit code says partial.
    The next run re-ingests rank 3 only and equals an uninterrupted run."""
    out = tmp_path / "out"
    ingest_faults.arm(monkeypatch, kill_rank=3)
    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == EXIT_PARTIAL
    ingest_doc = json.loads((out / "ingest.json").read_text())
    failed = [s for s in ingest_doc["sessions"] if s["status"] == "failed"]
    assert [s["rank"] for s in failed] == [3]
    assert "SIGKILL" in failed[0]["error"]
    assert doc["summary"]["ranks"] == [0, 1, 2, 4, 5, 6, 7]  # rank 3 is not analysed half-written
    assert not list((out / "tables" / "slices").glob("rank=3"))

    monkeypatch.delenv(ingest_faults.KILL_RANK)
    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == 0
    statuses = _statuses(out)
    assert statuses.pop(3) == "ingested"
    assert set(statuses.values()) == {"cached"}
    assert doc == reference


def test_worker_killed_once_is_retried_in_the_same_run(
    collection: Path, reference: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that dies once (a transient OOM kill) costs a retry, not the rank."""
    ingest_faults.arm(monkeypatch, kill_rank=6, once=tmp_path / "killed-once")
    out = tmp_path / "out"
    with ProcessExecutor(jobs=2) as executor:
        result = ingest(collection, out, executor=executor)
        assert executor.restarts == 1
    assert (tmp_path / "killed-once").exists()
    assert not result.failed
    assert {o.status for o in result.outcomes} == {"ingested"}
    assert not list(out.glob(".scratch.*")), "the killed worker's scratch folder is left in OUT"
    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == 0
    assert set(_statuses(out).values()) == {"cached"}
    assert doc == reference


def test_killed_driver_resumes_with_the_missing_ranks(
    collection: Path, reference: dict, tmp_path: Path
) -> None:
    """The whole run dies at rank 3 (local backend: the rank runs in the driver, like Ctrl-C or
    a lost machine). Ranks 0-2 stay in the store; the next run ingests only 3-7."""
    out = tmp_path / "out"
    env = {**os.environ, **ingest_faults.environment(kill_rank=3)}
    cmd = [sys.executable, "-m", "traceanalyzer.cli", "run", str(collection), "--out", str(out)]
    proc = subprocess.run([*cmd, "--executor", "local", "-q"], env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not (out / "findings.json").exists()

    code, doc = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == 0
    statuses = _statuses(out)
    assert {r: statuses[r] for r in (0, 1, 2)} == dict.fromkeys((0, 1, 2), "cached")
    assert {statuses[r] for r in range(3, RANKS)} == {"ingested"}
    assert doc == reference


def test_the_product_has_no_fault_path(tmp_path: Path) -> None:
    """The faults are the tests' own (tests/ingest_faults.py): a run whose environment names a
    rank to kill, and which they are not armed in, ingests that rank like any other."""
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "store_healthy"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[ingest_faults.KILL_RANK] = "0"
    cmd = [sys.executable, "-m", "traceanalyzer.cli", "run", str(sample), "--out", str(tmp_path)]
    proc = subprocess.run([*cmd, "--executor", "local", "-q"], env=env, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_corrupt_trace_among_eight_good_ranks(collection: Path, tmp_path: Path) -> None:
    """A ninth rank whose trace_view.json is binary garbage: 8 ranks analysed, 1 failed, exit 3.
    A truncated trace, by contrast, is recovered with a warning (tests/test_ingest_variants)."""
    root = tmp_path / "in"
    shutil.copytree(collection, root)
    good = sorted(root.glob("*_ascend_pt"))[0]
    bad = root / good.name.replace("_ascend_pt", "9_ascend_pt")
    shutil.copytree(good, bad)
    for info in bad.glob("profiler_info_*.json"):
        doc = json.loads(info.read_text())
        _set_rank(doc, 8)
        info.unlink()
        (bad / "profiler_info_8.json").write_text(json.dumps(doc))
    (bad / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_bytes(os.urandom(4096))

    out = tmp_path / "out"
    code, doc = _run(root, out, "--executor", "processes", "-j", "2")
    assert code == EXIT_PARTIAL
    ingest_doc = json.loads((out / "ingest.json").read_text())
    failed = [s for s in ingest_doc["sessions"] if s["status"] == "failed"]
    assert [s["rank"] for s in failed] == [8]
    assert "trace_view.json: unreadable" in failed[0]["error"]
    assert doc["summary"]["ranks"] == list(range(RANKS))
    assert Store.open(out).sessions().height == RANKS


def _set_rank(doc: dict, rank: int) -> None:
    """profiler_info keeps the rank in config.common_config / rank_id, depending on version."""
    for key, value in doc.items():
        if key in ("rank_id", "rank") and isinstance(value, int):
            doc[key] = rank
        elif isinstance(value, dict):
            _set_rank(value, rank)


def test_executor_map_reports_exceptions_without_stopping() -> None:
    results = dict(LocalExecutor().map(_maybe_fail, [(1,), (0,), (2,)]))
    assert results[0] == 1.0 and results[2] == 0.5
    assert isinstance(results[1], TaskCrashed) and "ZeroDivisionError" in str(results[1])


def _maybe_fail(x: int) -> float:
    return 1 / x


def test_unknown_executor_and_missing_ray_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ExecutorError, match="unknown executor"):
        make_executor("dask")
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ExecutorError, match=r"pip install 'traceanalyzer\[ray\]'"):
        make_executor("ray")


def test_warm_rerun_reuses_rank_outcomes_and_starts_no_workers(
    collection: Path, reference: dict, tmp_path: Path
) -> None:
    """Everything cached: no rank is ingested or evaluated again, so no worker starts; a changed
    parameter re-evaluates (the cache key holds inputs, rule code and parameters)."""
    from traceanalyzer.engine.runner import findings_document
    from traceanalyzer.engine.shards import evaluate_store

    out = tmp_path / "out"
    code, _ = _run(collection, out, "--executor", "processes", "-j", "2")
    assert code == 0
    with ProcessExecutor(jobs=2) as executor:
        again = ingest(collection, out, executor=executor)
        result = evaluate_store(out, executor, config_path=False)
        assert executor._pool is None  # nothing to map: no process was spawned
    assert {o.status for o in again.outcomes} == {"cached"}
    assert json.loads(findings_document(result))["findings"] == reference["findings"]

    with ProcessExecutor(jobs=2) as executor:
        changed = evaluate_store(
            out, executor, config_path=False, overrides=["store-transfer-stall.min_fraction=0.999"]
        )
        assert executor._pool is not None
    assert not any(f.name == "store-transfer-stall" for f in changed.findings)


def test_sessions_that_fit_in_memory() -> None:
    from traceanalyzer.ingest.budget import sessions_that_fit

    assert sessions_that_fit([3000, 3000, 3000, 3000], 4, 10_000) == 2  # 80% of 10 GB: two
    assert sessions_that_fit([3000] * 4, 4, None) == 4  # unknown memory: as asked
    assert sessions_that_fit([50_000], 4, 1000) == 1  # never fewer than one
    assert sessions_that_fit([100] * 8, 4, 10_000) == 4  # never more than asked


def test_workers_are_fewer_when_memory_is_short(
    collection: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A laptop with 64 large ranks: fewer workers at a time, said once, and the same findings."""
    from traceanalyzer.ingest import budget

    lines: list[str] = []
    monkeypatch.setattr(budget, "available_memory_mb", lambda: 400)  # one worker fits
    executor = make_executor("processes", jobs=2)
    try:
        result = ingest(
            collection,
            tmp_path / "out",
            executor=executor,
            progress=lambda event, *_: lines.append(event),
        )
        assert executor._pool_size == 1  # the ingest ran one worker at a time
    finally:
        executor.close()
    assert not result.failed
    (note,) = [line for line in lines if line.startswith("memory:")]
    assert note.startswith("memory: 1 rank session(s) at a time, not 2: the largest need about")


def test_available_memory_reads_meminfo_and_a_container_limit(tmp_path: Path) -> None:
    from traceanalyzer.ingest.budget import available_memory_mb

    proc, cgroup = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cgroup.mkdir()
    (proc / "meminfo").write_text("MemTotal: 33554432 kB\nMemAvailable: 16777216 kB\n")
    assert available_memory_mb(proc, cgroup) == 16384  # no cgroup files: the machine's figure
    (cgroup / "memory.max").write_text("max\n")
    assert available_memory_mb(proc, cgroup) == 16384  # no container limit
    (cgroup / "memory.max").write_text(f"{4 << 30}\n")
    (cgroup / "memory.current").write_text(f"{3 << 30}\n")
    (cgroup / "memory.stat").write_text(f"anon 1\ninactive_file {1 << 30}\n")
    assert available_memory_mb(proc, cgroup) == 2048  # 4 GB limit, 3 GB used of which 1 GB cache
    assert available_memory_mb(tmp_path / "none", tmp_path / "none") is None


def test_auto_picks_local_for_small_work_and_a_pool_for_large() -> None:
    small = make_executor("auto", jobs=2)
    assert "below 256 MB" in small.plan(tasks=8, work_bytes=2 << 20)
    assert not small.parallel and small.describe() == "auto: local"
    assert "chosen earlier" in small.plan(tasks=8, work_bytes=1 << 40)  # kept for the run
    assert make_executor("auto", jobs=2).plan(tasks=1, work_bytes=1 << 40).startswith("local")
    large = make_executor("auto", jobs=2)
    try:
        assert large.plan(tasks=8, work_bytes=1 << 30).startswith("processes (2 jobs)")
        assert large.parallel and large.shares_memory
    finally:
        large.close()
    many = make_executor("auto", jobs=2)  # many small ranks: their fixed costs add up
    try:
        assert "at least 32 tasks" in many.plan(tasks=2000, work_bytes=60 << 20)
        assert many.parallel
    finally:
        many.close()


def test_run_says_which_executor_it_used_and_why(collection: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(collection), "--out", str(out), "-j", "2"])
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("executor: ")]
    assert line.startswith("executor: local (8 task(s), ")
    assert "a process pool would cost more than it saves" in line
    assert json.loads((out / "ingest.json").read_text())["executor"] == line.removeprefix(
        "executor: "
    )


def test_ray_own_warnings_stay_out_of_the_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever Ray warns while it starts (logger or warnings module) is not printed."""
    import logging
    import types
    import warnings

    from traceanalyzer import executor as executor_module

    calls: list[dict] = []

    def init(**kwargs: object) -> None:
        calls.append(kwargs)
        warnings.warn("ray: deprecated option", FutureWarning, stacklevel=1)
        logging.getLogger("ray").warning("object store is using /tmp instead of /dev/shm")

    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)
    monkeypatch.setattr(executor_module, "_import_ray", lambda: fake)
    executor = executor_module.RayExecutor(jobs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executor._ensure()
    assert not caught
    assert calls[0]["logging_level"] == logging.ERROR and calls[0]["log_to_driver"] is False
    captured = capsys.readouterr()
    assert "dev/shm" not in captured.err + captured.out


def test_a_real_ray_run_prints_only_progress(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "capture_growth_2rank"
    cmd = [sys.executable, "-m", "traceanalyzer.cli", "run", str(sample)]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path / "o"), "--executor", "ray", "-j", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    ours = (
        "ingesting",
        "executor:",
        "[",
        "evaluating",
        "steps and launches of",
        "evaluated",
        "overview of",
        "\r",
    )
    assert [line for line in proc.stderr.splitlines() if not line.startswith(ours)] == []
