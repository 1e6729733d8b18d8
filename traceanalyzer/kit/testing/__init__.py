"""What a rule's fixtures import, from one place: the stores a rule must fire on, stay silent
on, or say it cannot decide.

::

    from traceanalyzer.kit.testing import Store, StoreBuilder, fixture, us

- :func:`fixture` marks a function that returns such a store (``rules test`` runs them);
- :class:`StoreBuilder` writes canonical rows in memory, a few lines per slice, call or task;
- :class:`RankBuilder` writes a rank directory as torch_npu would (through the synthetic
  generator's writer) and :func:`ingested` reads it back through the real parsers;
  :func:`scenario_store` does that for a generated scenario (``traceanalyzer synth``);
- both builders speak one set of verbs, defined once in :mod:`traceanalyzer.kit.testing.verbs`
  (times as int ns, :func:`us` to write microseconds, :class:`Launch` for a task's host launch).

Rules never import this: it stands above the synthetic generator, which the rules' own surface
(:mod:`traceanalyzer.kit`) knows nothing of. See docs/writing-rules.md.
"""

from __future__ import annotations

from traceanalyzer.authoring.ruletest import fixture
from traceanalyzer.kit.testing.rank_builder import (
    RankBuilder,
    build_store,
    ingested,
    scenario_store,
)
from traceanalyzer.kit.testing.store_builder import StoreBuilder
from traceanalyzer.kit.testing.verbs import Launch, us
from traceanalyzer.store import Store

__all__ = [
    "Launch",
    "RankBuilder",
    "Store",
    "StoreBuilder",
    "build_store",
    "fixture",
    "ingested",
    "scenario_store",
    "us",
]
