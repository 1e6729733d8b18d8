"""The steps of a profile: engine iterations, each with the phase it served.

Derived once per rank after the ingest, before the rules and the overview, into the store's
``steps`` table, which rules (through the kit), the overview and ``diff`` share; see
``docs/serving.md``.
"""

# The stage's declaration, and every derived table's reader (store.DERIVED_READERS): whoever
# reads a table of it knows how it is derived and keyed, whichever module it imported first.
from traceanalyzer.steps import stage as stage  # noqa: E402
from traceanalyzer.steps import tables as tables  # noqa: E402
