"""A real two-node Ray cluster: ``run --executor ray --ray-address`` gives what ``local`` gives.

The cluster is started as docs/scale.md tells a user to: ``ray start --head`` and ``ray start
--address=HEAD:PORT``, each node its own raylet, object store and worker processes (here on one
machine, one CPU each, the input and OUT on a filesystem both see). The worker that ingests
rank :data:`KILLED` is SIGKILLed once (the ingest fault hook, armed in the nodes' environment,
which their workers inherit): Ray must retry it, and the run must still equal the local one, in
findings.json, ingest statuses, every table's rows and the reports.

Skipped when Ray is not installed (``pip install 'traceanalyzer[ray]'``). Nothing here uses the
network beyond this machine's own address, and nothing outlives the test: each node's processes
are found by a variable only they inherit, and killed if ``ray start``'s own shutdown missed
one (never ``ray stop``: it would stop every Ray on the machine, other users' too).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from traceanalyzer.ingest import FAULT_KILL_RANK, FAULT_ONCE

if importlib.util.find_spec("ray") is None:  # found, not imported: the test never imports Ray
    pytest.skip("Ray is not installed: pip install 'traceanalyzer[ray]'", allow_module_level=True)
psutil = pytest.importorskip("psutil", reason="finds the cluster's processes (the dev extra)")

RANKS = 4
KILLED = 2  # the worker ingesting this rank is SIGKILLed, once
START_TIMEOUT = 120.0  # seconds for a node to come up on a loaded 2-core CI machine
RUN_TIMEOUT = 180.0
STOP_TIMEOUT = 40.0  # ray start drains a node for up to 30 s on SIGTERM
CLUSTER_TAG = "TRACEANALYZER_TEST_RAY_CLUSTER"  # inherited by every process of our nodes only


@dataclass
class Cluster:
    address: str  # HEAD:PORT, what --ray-address takes
    env: dict[str, str]  # what a driver needs to join it (the cluster's token)
    killed_marker: Path  # exists once the fault hook has killed a worker
    nodes: list[subprocess.Popen[bytes]]
    logs: list[Path]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ray_env(token: str) -> dict[str, str]:
    """This environment without the fault hooks and Ray settings of the caller, plus a fresh
    token: recent Ray turns token authentication on when ~/.ray/auth_token exists, and a node
    or driver without the token cannot join, so the test never depends on that file."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "TRACEANALYZER_FAULT_")) and k != CLUSTER_TAG
    }
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


def _tagged(tag: str) -> list[Any]:
    """Every live process that inherited ``CLUSTER_TAG=tag``: the nodes' daemons and workers
    (a worker's command line is renamed ``ray::...``, its environment is not)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(CLUSTER_TAG) == tag:
                found.append(proc)
        except (psutil.Error, OSError):  # gone, a zombie, or not ours to read
            continue
    return found


def _wait_started(node: subprocess.Popen[bytes], log: Path) -> str:
    """``ray start``'s output once the node is up (it then blocks, owning the node)."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        text = log.read_text(errors="replace")
        if "Ray runtime started" in text:
            return text
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"ray start did not start a node (exit {node.poll()}):\n{text[-4000:]}")
        time.sleep(0.2)


def _stop(cluster_nodes: list[subprocess.Popen[bytes]], tag: str) -> list[str]:
    """Stop the nodes (worker first, then the head) and anything of theirs still alive; return
    what had to be killed by hand."""
    for node in reversed(cluster_nodes):
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)  # ray start --block stops its node's processes
            try:
                node.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
    # the workers and agents notice their raylet is gone and exit within a few seconds
    deadline = time.monotonic() + 15
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    stray = []
    for proc in left:
        try:
            stray.append(" ".join(proc.cmdline())[:200])
            proc.kill()
        except psutil.Error:
            continue
    return stray


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # Ray's socket paths must stay short (AF_UNIX, 107 bytes): its own directory under /tmp,
    # not pytest's deep tmp_path.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ta-ray-", dir="/tmp"))
    tag = ray_tmp.name
    token = secrets.token_hex(32)
    marker = tmp_path / "killed-once"
    node_env = {
        **_ray_env(token),
        CLUSTER_TAG: tag,
        # The nodes' workers inherit the raylet's environment: the fault reaches them wherever
        # Ray schedules rank KILLED, and the marker (on the filesystem both nodes see) makes it
        # happen once, so the retry succeeds.
        FAULT_KILL_RANK: str(KILLED),
        FAULT_ONCE: str(marker),
    }
    ray_start = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
    # docs/scale.md's commands, kept small and quiet for a 2-core machine: one CPU and 80 MB of
    # object store per node, no dashboard, log monitor or autoscaler, and ports of their own
    # where Ray would take a fixed one (another Ray on this machine may hold it).
    small = [
        "--num-cpus=1",
        "--object-store-memory=80000000",
        f"--temp-dir={ray_tmp}",
        f"--dashboard-agent-listen-port={_free_port()}",
        "--include-log-monitor=false",
        "--disable-usage-stats",
        "--log-style=record",
        "--log-color=false",
    ]
    nodes: list[subprocess.Popen[bytes]] = []
    logs = [ray_tmp / "head.log", ray_tmp / "node2.log"]
    try:
        head = [
            "--head",
            "--port=0",
            "--include-dashboard=false",
            "--no-monitor",
            f"--ray-client-server-port={_free_port()}",
        ]
        with logs[0].open("wb") as out:
            nodes.append(
                subprocess.Popen(
                    [*ray_start, *head, *small],
                    env=node_env,
                    cwd=ray_tmp,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C of pytest reaches it through _stop only
                )
            )
        said = _wait_started(nodes[0], logs[0])
        found = re.search(r"ray start --address='([^']+)'", said)
        assert found, said[-4000:]
        address = found.group(1)
        second = [f"--address={address}", f"--dashboard-agent-listen-port={_free_port()}"]
        with logs[1].open("wb") as out:
            nodes.append(
                subprocess.Popen(
                    [*ray_start, *second, *[a for a in small if "agent-listen" not in a]],
                    env=node_env,
                    cwd=ray_tmp,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        _wait_started(nodes[1], logs[1])
        yield Cluster(address, _ray_env(token), marker, nodes, logs)
    finally:
        stray = _stop(nodes, tag)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not stray, f"Ray processes outlived their node: {stray}"


def _workers(node: subprocess.Popen[bytes]) -> set[int]:
    """The node's Ray workers (children of its raylet, titled ``ray::IDLE`` or ``ray::<task>``)."""
    found = set()
    try:
        for proc in psutil.Process(node.pid).children(recursive=True):
            try:
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::"):
                    found.add(proc.pid)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return found


def _run(
    input_dir: Path, out: Path, env: dict[str, str], *args: str, watch: Cluster | None = None
) -> list[set[int]]:
    """``traceanalyzer run``, as a user runs it; with ``watch``, the workers each node of that
    cluster started during the run."""
    cli = [sys.executable, "-m", "traceanalyzer.cli", "run", str(input_dir), "--out", str(out)]
    nodes = watch.nodes if watch else []
    before = [_workers(node) for node in nodes]
    started: list[set[int]] = [set() for _ in nodes]
    log = out.with_name(f"{out.name}.log")
    with log.open("wb") as said:
        run = subprocess.Popen([*cli, "-q", *args], env=env, stdout=said, stderr=said)
        deadline = time.monotonic() + RUN_TIMEOUT
        while run.poll() is None:
            if time.monotonic() > deadline:
                run.kill()
                break
            for seen, node, old in zip(started, nodes, before, strict=True):
                seen |= _workers(node) - old
            time.sleep(0.2)
    code = run.wait()
    assert code == 0, f"{args}: exit {code}\n{log.read_text(errors='replace')[-4000:]}"
    return started


# What legitimately differs between two runs of one input: how long each rank took, the peak
# memory of whichever process ingested it, which executor ran it and where OUT is.
_RUN_FIELDS = {"seconds", "peak_rss_mb"}
_RUN_KEYS = {"out", "executor"}


def _ingest_record(out: Path) -> dict[str, Any]:
    record = json.loads((out / "ingest.json").read_text())
    for key in _RUN_KEYS:
        record.pop(key)
    for session in record["sessions"]:
        for key in _RUN_FIELDS:
            session.pop(key)
    return record


def _tables(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every partition's rows, sorted: the tables as data, whatever order a writer chose."""
    import polars as pl

    tables = {}
    for part in sorted((out / "tables").rglob("*.parquet")):
        frame = pl.read_parquet(part, hive_partitioning=False)
        rows = frame.rows()
        tables[str(part.relative_to(out))] = sorted(rows, key=repr)
        tables[f"{part.relative_to(out)} columns"] = [tuple(frame.schema.items())]
    return tables


def _report_html(out: Path) -> str:
    html = (out / "report.html").read_text()
    html = html.replace(str(out), "OUT")
    return re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "generated <time>", html)


def _entries(out: Path) -> list[str]:
    """OUT's files and folders: a killed worker must leave no scratch or staging folder."""
    return sorted(str(p.relative_to(out)) + "/" * p.is_dir() for p in out.rglob("*"))


def test_a_two_node_cluster_gives_the_local_results_despite_a_killed_worker(
    cluster: Cluster, tmp_path: Path
) -> None:
    from traceanalyzer.synth import generate

    collection = tmp_path / "in"
    generate("late-rank-decode", collection, ranks=RANKS, steps=2, layers=1)
    local, ray = tmp_path / "local", tmp_path / "ray"
    _run(collection, local, cluster.env, "--executor", "local")  # no fault armed here
    started = _run(
        collection, ray, cluster.env, "--executor", "ray", "--ray-address", cluster.address,
        watch=cluster,
    )  # fmt: skip

    assert cluster.killed_marker.exists(), "the fault hook did not fire: no worker was killed"
    # Ray starts a worker on the driver's node (the head) for the job, and on the second node
    # only when it hands it tasks: the work was spread over both.
    assert all(started), f"workers started per node: {started}"
    assert all(node.poll() is None for node in cluster.nodes), "a node went down during the run"
    executor = json.loads((ray / "ingest.json").read_text())["executor"]
    assert executor.startswith(f"ray ({cluster.address})"), executor

    expected = json.loads((local / "findings.json").read_text())
    assert json.loads((ray / "findings.json").read_text()) == expected
    straggler = next(f for f in expected["findings"] if f["name"] == "collective-straggler")
    assert straggler["ranks_label"] == "rank 1 (1/4)"  # the scenario's late rank, seen
    got = _ingest_record(ray)
    assert {s["status"] for s in got["sessions"]} == {"ingested"}
    assert got == _ingest_record(local)
    assert _tables(ray) == _tables(local)
    for name in ("report.md", "findings.sarif", "annotations.json"):
        assert (ray / name).read_text() == (local / name).read_text(), name
    assert _report_html(ray) == _report_html(local)
    plots = sorted(p.name for p in (local / "plots").iterdir())
    assert plots and sorted(p.name for p in (ray / "plots").iterdir()) == plots
    for name in plots:
        assert (ray / "plots" / name).read_bytes() == (local / "plots" / name).read_bytes(), name
    assert _entries(ray) == _entries(local)
