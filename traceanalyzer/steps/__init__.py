"""The steps of a profile: engine iterations, each with the phase it served.

Derived once per rank after the ingest, before the rules and the overview, into the store's
``steps`` table, which rules (through the kit), the overview and ``diff`` share; see
``docs/serving.md``.
"""

# Importing the package registers every derived table's reader (store.DERIVED_READERS), so
# that Store.derived answers for each whichever of these modules a caller imported first.
from traceanalyzer.steps import (  # noqa: E402, F401
    collectives,
    exchanges,
    launches,
    layers,
    moe_layers,
    tables,
)
