"""Generation detection agrees with the generator for every generation and level."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceanalyzer.ingest import ingest
from traceanalyzer.synth import generate


@pytest.mark.parametrize("generation", ["g1", "g2", "g3", "current"])
@pytest.mark.parametrize("level", [0, 2])
def test_generation_detected(tmp_path: Path, generation: str, level: int) -> None:
    generate("inference-baseline", tmp_path / "in", generation=generation, level=level, steps=2)
    result = ingest(tmp_path / "in", tmp_path / "out")
    assert not result.partial, result.to_dict()
    assert {o.generation for o in result.outcomes} == {generation}
    assert all(o.profiler_level == f"Level{level}" for o in result.outcomes)
