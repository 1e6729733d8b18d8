"""Faithful synthetic torch_npu exports: scenarios and a streaming writer.

``generate(scenario, out, ...)`` writes ``*_ascend_pt`` directories exactly as
torch_npu would (see ``docs/architecture.md`` and the format reference);
:mod:`traceanalyzer.kit.testing` builds tiny rank dirs for rule tests with its writer.
"""

from __future__ import annotations

from traceanalyzer.synth.generate import generate
from traceanalyzer.synth.profiles import GENERATIONS
from traceanalyzer.synth.scenarios import SCENARIOS

__all__ = ["GENERATIONS", "SCENARIOS", "generate"]
