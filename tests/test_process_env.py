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
