"""process_env: the library settings the CLI applies before the libraries load."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from traceanalyzer import process_env


def test_each_setting_is_applied_unless_the_user_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in process_env.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")  # the user's choice wins
    process_env.configure()
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(1 << 20)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["POLARS_ENGINE_AFFINITY"] == "in-memory"


def test_polars_own_allocator_default_inherited_from_a_parent_is_no_user_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = process_env.SETTINGS["_RJEM_MALLOC_CONF"]
    # a parent that imported polars (before or after configuring) passes on its default
    for inherited, expected in [
        (process_env.POLARS_IMPORT_JEMALLOC_CONF, ours),
        (f"{process_env.POLARS_IMPORT_JEMALLOC_CONF},{ours}", ours),
        (f"{process_env.POLARS_IMPORT_JEMALLOC_CONF},narenas:4", f"{ours},narenas:4"),
        ("narenas:4", "narenas:4"),  # the user's own, untouched
    ]:
        monkeypatch.setenv("_RJEM_MALLOC_CONF", inherited)
        process_env.configure()
        assert os.environ["_RJEM_MALLOC_CONF"] == expected


def test_a_threshold_that_is_no_number_is_left_to_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "lots")
    process_env.configure()  # no raise: glibc ignores it too


def test_the_cli_runs_pyarrow_on_the_system_allocator() -> None:
    program = (
        "import traceanalyzer.cli, pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "system"


def test_the_cli_runs_polars_queries_in_memory() -> None:
    program = "import traceanalyzer.cli, polars._plr as plr; print(plr.get_engine_affinity())"
    env = {k: v for k, v in os.environ.items() if k != "POLARS_ENGINE_AFFINITY"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "in-memory"
