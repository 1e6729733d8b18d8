"""A real two-node Ray cluster: ``run --executor ray --ray-address`` gives what ``local`` gives.

The cluster is started as docs/scale.md tells a user to: ``ray start --head`` and ``ray start
--address=HEAD:PORT``, each node its own raylet, object store and worker processes (here on one
machine, one CPU each, the input and OUT on a filesystem both see). The worker that ingests
rank :data:`KILLED` is SIGKILLed once (the ingest fault hook, armed in the nodes' environment,
which their workers inherit): Ray must retry it, and the run must still equal the local one, in
findings.json, ingest statuses, every table's rows, the reports and the files left in OUT. The
nodes start without the CLI's library settings (:mod:`traceanalyzer.process_env`): the job's
workers must get them from the driver.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ingest_faults
import pytest

from traceanalyzer.process_env import SETTINGS

if importlib.util.find_spec("ray") is None:  # found, not imported: the test never imports Ray
    pytest.skip("Ray is not installed: pip install 'traceanalyzer[ray]'", allow_module_level=True)
psutil = pytest.importorskip("psutil", reason="finds the cluster's processes (the dev extra)")

RANKS = 4
KILLED = 2  # the worker ingesting this rank is SIGKILLed, once
START_TIMEOUT = 120.0  # seconds for a node to come up on a loaded 2-core machine
RUN_TIMEOUT = 180.0
STOP_TIMEOUT = 40.0  # ray start drains its node for up to 30 s on SIGTERM
CLUSTER_TAG = "TRACEANALYZER_TEST_RAY_CLUSTER"  # inherited by every process of our nodes only


# `ray start`, asking the kernel first for SIGTERM when pytest dies (Linux; kept across exec): a
# killed test run (a CI timeout) still stops its nodes, which `ray start --block` does on SIGTERM.
_DIE_WITH_PYTEST = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):  # gone before the signal was asked for
    sys.exit("pytest is gone")
os.execv(sys.executable, [sys.executable, "-m", "ray.scripts.scripts", *sys.argv[2:]])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _clean_env() -> dict[str, str]:
    """This environment without the caller's fault hooks and Ray settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_", "TRACEANALYZER_FAULT_")) and k != CLUSTER_TAG
    }


def _ray_env(token: str) -> dict[str, str]:
    """A clean environment with the cluster's token: recent Ray turns token authentication on
    at ``ray start --head`` when ~/.ray/auth_token exists, and a node or driver without the
    token cannot join, so the test sets it everywhere and never depends on that file."""
    env = _clean_env()
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return env


@dataclass
class Run:
    """``traceanalyzer run``, as a user runs it, in its own process; with ``watch``, the
    workers each node of that cluster starts meanwhile are noted."""

    out: Path
    args: tuple[str, ...]
    watch: Cluster | None = None
    proc: subprocess.Popen[bytes] = field(init=False)
    before: list[set[int]] = field(init=False)

    @property
    def log(self) -> Path:
        return self.out.with_name(f"{self.out.name}.log")

    def start(self, collection: Path, env: dict[str, str]) -> Run:
        self.before = [_workers(node) for node in self.watch.nodes] if self.watch else []
        cli = [sys.executable, "-m", "traceanalyzer.cli", "run", str(collection)]
        with self.log.open("wb") as said:
            self.proc = subprocess.Popen(
                [*cli, "--out", str(self.out), "-q", *self.args],
                env=env,
                stdout=said,
                stderr=subprocess.STDOUT,
            )
        return self

    def finish(self) -> list[dict[int, dict[str, str]]]:
        """Wait for the run to succeed; return the workers each watched node started, each
        with the library settings (:data:`SETTINGS`) in its environment."""
        nodes = self.watch.nodes if self.watch else []
        started: list[dict[int, dict[str, str]]] = [{} for _ in nodes]
        deadline = time.monotonic() + RUN_TIMEOUT
        while self.proc.poll() is None and time.monotonic() < deadline:
            for seen, node, old in zip(started, nodes, self.before, strict=True):
                for pid in _workers(node) - old - seen.keys():
                    seen[pid] = _settings(pid)
            time.sleep(0.2)
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        said = self.log.read_text(errors="replace")[-4000:]
        assert code == 0, f"run {' '.join(self.args)}: exit {code}\n{said}"
        return started


@dataclass
class Cluster:
    address: str  # HEAD:PORT, what --ray-address takes
    env: dict[str, str]  # what a driver needs to join it (the cluster's token)
    killed_marker: Path  # exists once the fault hook has killed a worker
    nodes: list[subprocess.Popen[bytes]]


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


def _workers(node: subprocess.Popen[bytes]) -> set[int]:
    """The node's Ray workers: its raylet's children titled ``ray::IDLE`` or ``ray::<task>``
    (its agents are titled ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent``)."""
    found = set()
    try:
        for proc in psutil.Process(node.pid).children(recursive=True):
            try:
                title = proc.cmdline()
            except psutil.Error:
                continue
            if title and title[0].startswith("ray::") and not title[0].endswith("Agent"):
                found.add(proc.pid)
    except psutil.Error:  # the node is gone: the run's assertions say so
        pass
    return found


def _settings(pid: int) -> dict[str, str]:
    """The library settings in a process's environment (none if it is gone already)."""
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        return {}
    return {name: environ[name] for name in SETTINGS if name in environ}


def _wait_for(node: subprocess.Popen[bytes], log: Path, pattern: str) -> re.Match[str]:
    """The first match of ``pattern`` in what ``ray start`` said, once it says it."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        text = log.read_text(errors="replace")
        if found := re.search(pattern, text):
            return found
        if node.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"ray start did not start a node (exit {node.poll()}):\n{text[-4000:]}")
        time.sleep(0.1)


def _stop(nodes: list[subprocess.Popen[bytes]], tag: str) -> list[str]:
    """Stop the nodes (the second first, then the head) and anything of theirs still alive;
    return what had to be killed by hand."""
    for node in reversed(nodes):
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)  # ray start --block then stops its node
            try:
                node.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
    # the workers and agents see their raylet gone and exit within seconds
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
def collection(tmp_path: Path) -> Path:
    from traceanalyzer.synth import generate

    root = tmp_path / "in"
    # four tensor-parallel ranks, rank 1 late at every all-reduce: rank rules on the workers,
    # cross-rank ones in the driver
    generate("late-rank-decode", root, ranks=RANKS, steps=2, layers=1)
    return root


@pytest.fixture
def local_run(collection: Path, tmp_path: Path) -> Iterator[Run]:
    """The reference, started before the cluster (the test asks for it first): it needs no Ray,
    and the nodes spend much of their start-up waiting."""
    run = Run(tmp_path / "local", ("--executor", "local")).start(collection, _clean_env())
    yield run
    if run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # Ray's socket paths must stay short (AF_UNIX, 107 bytes): a directory of its own in /tmp,
    # not pytest's deep tmp_path.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ta-ray-", dir="/tmp"))
    tag = ray_tmp.name
    token = secrets.token_hex(32)
    marker = tmp_path / "killed-once"
    node_env = {
        # the nodes start without the CLI's library settings: the job must bring them
        **{k: v for k, v in _ray_env(token).items() if k not in SETTINGS},
        CLUSTER_TAG: tag,
        # A node's workers inherit its raylet's environment: the fault reaches rank KILLED
        # wherever Ray runs it, and the marker (on the filesystem both nodes see) makes it
        # happen once, so the retry succeeds.
        **ingest_faults.environment(kill_rank=KILLED, once=marker),
    }
    ray_start = [sys.executable, "-c", _DIE_WITH_PYTEST, str(os.getpid()), "start", "--block"]
    # docs/scale.md's commands, small for a 2-core machine: one CPU and 80 MB of object store
    # per node, no dashboard, log monitor or autoscaler, and a free port wherever Ray would
    # take a fixed one (another Ray on this machine may hold it).
    small = [
        "--num-cpus=1",
        "--object-store-memory=80000000",
        f"--temp-dir={ray_tmp}",
        "--include-log-monitor=false",
        "--disable-usage-stats",
        "--log-style=record",
        "--log-color=false",
    ]
    head = [
        "--head",
        f"--port={_free_port()}",
        "--include-dashboard=false",
        "--no-monitor",
        f"--ray-client-server-port={_free_port()}",
    ]
    nodes: list[subprocess.Popen[bytes]] = []
    logs = [ray_tmp / "head.log", ray_tmp / "second.log"]

    def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as said:
            nodes.append(
                subprocess.Popen(
                    [*ray_start, *args, f"--dashboard-agent-listen-port={_free_port()}", *small],
                    env=node_env,
                    cwd=ray_tmp,
                    stdout=said,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C of pytest stops it through _stop only
                )
            )
        return nodes[-1]

    try:
        start(head, logs[0])
        # The second node joins while the head still starts its agents: it waits for the
        # head's GCS, which is up once the head knows its address.
        ip = _wait_for(nodes[0], logs[0], r"Local node IP: (\S+)").group(1)
        address = f"{ip}:{head[1].split('=')[1]}"
        start([f"--address={address}"], logs[1])
        said = _wait_for(nodes[0], logs[0], r"ray start --address='([^']+)'").group(1)
        assert said == address
        _wait_for(nodes[1], logs[1], "Ray runtime started")
        yield Cluster(address, _ray_env(token), marker, nodes)
    finally:
        stray = _stop(nodes, tag)
        shutil.rmtree(ray_tmp, ignore_errors=True)
        assert not stray, f"Ray processes outlived their node: {stray}"


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


def _tables(out: Path) -> dict[str, Any]:
    """Every partition's schema and rows, sorted: the tables as data, in any writer's order."""
    import polars as pl

    tables: dict[str, Any] = {}
    for part in sorted((out / "tables").rglob("*.parquet")):
        frame = pl.read_parquet(part, hive_partitioning=False)
        tables[str(part.relative_to(out))] = (
            list(frame.schema.items()),
            sorted(frame.rows(), key=repr),
        )
    return tables


def _report_html(out: Path) -> str:
    html = (out / "report.html").read_text().replace(str(out), "OUT")
    return re.sub(r"generated \d{4}-\d\d-\d\d \d\d:\d\d UTC", "generated <time>", html)


def _entries(out: Path) -> list[str]:
    """OUT's files and folders: a killed worker must leave no scratch or staging folder."""
    return sorted(str(p.relative_to(out)) + "/" * p.is_dir() for p in out.rglob("*"))


def test_a_two_node_cluster_gives_the_local_results_despite_a_killed_worker(
    local_run: Run, cluster: Cluster, collection: Path, tmp_path: Path
) -> None:
    args = ("--executor", "ray", "--ray-address", cluster.address)
    ray_run = Run(tmp_path / "ray", args, watch=cluster)
    started = ray_run.start(collection, cluster.env).finish()
    local_run.finish()
    local, ray = local_run.out, ray_run.out

    assert cluster.killed_marker.exists(), "the fault hook did not fire: no worker was killed"
    assert all(node.poll() is None for node in cluster.nodes), "a node went down during the run"
    # A node starts workers for the tasks it is given (the head one more when the driver
    # joins): the second node's show that the work was spread over both. Those of the job
    # carry the driver's library settings, which their nodes lack.
    assert all(started), f"workers started per node: {started}"
    for node_workers in started:
        assert any(got.keys() == SETTINGS.keys() for got in node_workers.values()), started
    executor = json.loads((ray / "ingest.json").read_text())["executor"]
    assert executor.startswith(f"ray ({cluster.address})"), executor

    expected = json.loads((local / "findings.json").read_text())
    assert json.loads((ray / "findings.json").read_text()) == expected
    straggler = next(f for f in expected["findings"] if f["name"] == "collective-straggler")
    assert straggler["ranks_label"] == "rank 1 (1/4)"  # the scenario's late rank, found
    got = _ingest_record(ray)
    assert {s["status"] for s in got["sessions"]} == {"ingested"}
    assert got == _ingest_record(local)
    assert _tables(ray) == _tables(local)
    for name in ("report.md", "findings.sarif", "annotations.json"):
        assert (ray / name).read_text() == (local / name).read_text(), name
    assert _report_html(ray) == _report_html(local)
    plots = sorted(p.name for p in (local / "plots").iterdir())
    assert plots
    for name in plots:
        assert (ray / "plots" / name).read_bytes() == (local / "plots" / name).read_bytes(), name
    assert _entries(ray) == _entries(local)
