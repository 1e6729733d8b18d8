"""Shared test fixtures: the real G2 export (read-only) and a session-wide store of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from synth_support import real_traces_dir, skip_reason

# pytest-xdist's workers get COLUMNS=80, which `run` fits its lines to: the tests see whole
# lines, as from a pipe, unless they set a width (tests/test_terminal_width.py)
os.environ.pop("COLUMNS", None)

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = real_traces_dir()
REAL_G2 = REAL_TRACES / "g2_level1"
REAL_G2_DB = REAL_TRACES / "g2_db_level1"  # a Db export (another session, same job)


@pytest.fixture(scope="session")
def real_g2() -> Path:
    if not REAL_G2.is_dir():
        pytest.skip(skip_reason("g2_level1"))
    return REAL_G2


@pytest.fixture(scope="session")
def real_g2_store(real_g2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from traceanalyzer.ingest import ingest

    out = tmp_path_factory.mktemp("real_g2_out")
    result = ingest(real_g2, out, jobs=1)
    assert not result.partial, result.to_dict()
    return out


@pytest.fixture(scope="session")
def real_g2_db() -> Path:
    if not REAL_G2_DB.is_dir():
        pytest.skip(f"real Db export not available at {REAL_G2_DB}")
    return REAL_G2_DB


@pytest.fixture(scope="session")
def real_g2_db_store(real_g2_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from traceanalyzer.ingest import ingest

    out = tmp_path_factory.mktemp("real_g2_db_out")
    result = ingest(real_g2_db, out, jobs=1)
    assert not result.partial, result.to_dict()
    return out


STALLED_RANKS, SICK_RANKS = 8, "2,5"


@pytest.fixture(scope="session")
def stalled_collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight small store-stall ranks; ranks 2 and 5 stall (read-only: tests copy it to change
    it)."""
    from traceanalyzer.synth import generate

    root = tmp_path_factory.mktemp("stalled") / "in"
    generate(
        "store-stall", root, ranks=STALLED_RANKS, sick=SICK_RANKS, steps_before=1, steps_after=1
    )
    return root
