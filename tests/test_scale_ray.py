"""The Ray backend on a local Ray instance (``ray.init(num_cpus=2)``): same findings as processes.

Skipped when Ray is not installed (``pip install 'traceanalyzer[ray]'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import ingest_faults
import pytest
from click.testing import CliRunner

from traceanalyzer.cli import main
from traceanalyzer.executor import RayExecutor
from traceanalyzer.ingest import ingest
from traceanalyzer.synth import generate

ray = pytest.importorskip("ray")

RANKS = 6
KILLED = 4  # its Ray worker is SIGKILLed on the first attempt


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    marker = tmp_path_factory.mktemp("fault") / "killed-once"
    if ray.is_initialized():
        ray.shutdown()
    # Fault injection reaches Ray's workers through the runtime environment, not os.environ.
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": ingest_faults.environment(kill_rank=KILLED, once=marker)},
    )
    yield marker
    ray.shutdown()


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-collection") / "in"
    generate("store-stall", root, ranks=RANKS, sick="1,3", steps_before=1, steps_after=1)
    return root


def _run(root: Path, out: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["run", str(root), "--out", str(out), "-q", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads((out / "findings.json").read_text())


def test_ray_findings_equal_processes_despite_a_killed_worker(
    ray_instance: Path, collection: Path, tmp_path: Path
) -> None:
    code, expected = _run(collection, tmp_path / "processes", "--executor", "processes", "-j", "2")
    assert code == 0
    # the CLI joins the Ray instance this test started (ray.is_initialized) and leaves it up
    code, got = _run(collection, tmp_path / "ray", "--executor", "ray", "-j", "2")
    assert code == 0
    assert ray_instance.exists(), "the fault hook did not fire: the retry path was not tested"
    assert got == expected
    stall = next(f for f in got["findings"] if f["name"] == "store-transfer-stall")
    assert stall["ranks_label"] == "ranks 1, 3 (2/6)"
    statuses = json.loads((tmp_path / "ray" / "ingest.json").read_text())["sessions"]
    assert {s["status"] for s in statuses} == {"ingested"}


def test_ray_warm_rerun_is_all_cached(ray_instance: Path, collection: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    executor = RayExecutor(jobs=2)
    first = ingest(collection, out, executor=executor)
    second = ingest(collection, out, executor=executor)
    executor.close()
    assert ray.is_initialized()  # close() never shuts down an instance it did not start
    assert not first.failed
    assert {o.status for o in second.outcomes} == {"cached"}
