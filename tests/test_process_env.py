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


@pytest.mark.parametrize(
    ("name", "value", "instead"),
    [
        ("MALLOC_MMAP_THRESHOLD_", "lots", str(1 << 20)),
        ("MALLOC_MMAP_THRESHOLD_", str(1 << 30), str(1 << 20)),  # past glibc's largest
        ("POLARS_ENGINE_AFFINITY", "bogus", "in-memory"),
        ("ARROW_DEFAULT_MEMORY_POOL", "tcmalloc", "system"),
        ("OPENBLAS_NUM_THREADS", "-1", "1"),
        ("POLARS_MAX_THREADS", "0", None),  # not ours to set: polars chooses
        ("POLARS_MAX_THREADS", "1024", None),  # 155 s instead of 0.8 on 2 cores
        ("POLARS_MAX_THREADS", "²", None),
    ],
)
def test_a_value_the_library_would_not_take_is_replaced_with_a_note(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, instead: str | None
) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(process_env, "_cores", lambda: 2)
    (note,) = process_env.configure()
    assert note.startswith(f"{name}={value!r} is not ") and ": ignored, using " in note
    assert os.environ.get(name) == instead


def test_a_value_the_library_takes_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("POLARS_MAX_THREADS", "2"), ("MALLOC_MMAP_THRESHOLD_", "0")]:
        monkeypatch.setenv(name, value)
        assert process_env.configure() == []
        assert os.environ[name] == value


def test_polars_max_threads_zero_is_no_panic() -> None:
    """Before, polars panicked at the first query (PanicException: a Traceback, exit 1)."""
    program = "import traceanalyzer.cli, polars as pl; print(pl.select(pl.lit(7)).item())"
    env = {**os.environ, "POLARS_MAX_THREADS": "0"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr
    assert done.stderr.startswith("warning: POLARS_MAX_THREADS='0' is not a thread count")


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
