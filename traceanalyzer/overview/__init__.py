"""Where the time goes, on every run: per-step breakdown, top-N tables, the cluster view.

Computed per rank from the store (never from files) in the executor's workers (the stages of
``stage.py``), written to the ``summary_*`` store tables (``Store.table("summary_steps")``),
and summarised for the reports in findings.json's ``summary.overview`` (schema:
``docs/overview.md``; typed: ``model.py``, read back with :func:`read_overview`).
"""

from traceanalyzer.overview import stage as stage
from traceanalyzer.overview.document import by_cost, finding_costs, overview_document
from traceanalyzer.overview.model import Overview, TopSizes, read_overview

__all__ = ["Overview", "TopSizes", "by_cost", "finding_costs", "overview_document", "read_overview"]
