"""The tables derived before the rules: the steps of a profile (engine iterations, each with the
phase it served) and the tables derived beside them, each a stage of its own (``stages.py``).

Derived once per rank after the ingest, before the rules and the overview, into the store's
tables, which rules (through the kit), the overview and ``diff`` share; see
``docs/serving.md``.
"""

# Every stage's declaration, and so every derived table's reader (store.DERIVED_READERS):
# whoever reads a table of them knows how it is derived and keyed, whichever module it imported
# first. In the order they run in a task (a stage after those it reads): each table is written,
# and what no stage after it reads let go, before the next is derived.
# isort: off
from traceanalyzer.derived import launches as launches
from traceanalyzer.derived import stage as stage
from traceanalyzer.derived import exchanges as exchanges
from traceanalyzer.derived import moe_layers as moe_layers
from traceanalyzer.derived import layers as layers
from traceanalyzer.derived import collectives as collectives
# isort: on
