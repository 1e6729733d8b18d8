"""The wheel ships the built-in rules and the recipe templates (what `pip install` users get)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {proc.stderr.strip().splitlines()[-1:]}")
    return zipfile.ZipFile(next(out.glob("traceanalyzer-*.whl")))


def test_wheel_ships_builtin_rules(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for rule in (REPO / "rules").glob("*.py"):
        assert f"traceanalyzer/builtin_rules/{rule.name}" in names


def test_wheel_ships_recipe_templates_and_entry_point(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert any(n.startswith("traceanalyzer/recipes/templates/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "traceanalyzer = traceanalyzer.cli:entry" in wheel.read(entry_points).decode()


def test_wheel_ships_the_native_scanner(wheel: zipfile.ZipFile) -> None:
    from traceanalyzer.parse import trace_native

    if not trace_native.available():
        pytest.skip("native scanner not built here (no C compiler)")
    names = wheel.namelist()
    assert any(n.startswith("traceanalyzer/parse/_trace_scan.") for n in names), names
    assert "traceanalyzer/parse/_trace_scan.c" in names  # an sdist-like rebuild stays possible
