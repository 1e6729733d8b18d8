"""traceanalyzer: evidence-based findings for Ascend NPU (torch_npu) profiler traces.

Data flows one way: discover -> parse -> store -> rules -> report.
The Python API mirrors the CLI; notebooks and tests use it directly.
"""

from __future__ import annotations

from traceanalyzer.version import __version__

__all__ = ["__version__", "open_store"]


def open_store(path):  # noqa: ANN001, ANN201 - re-exported lazily to keep import light
    """Open an output directory written by ``traceanalyzer run`` (see :mod:`traceanalyzer.store`)."""
    import traceanalyzer.derived  # noqa: F401 - registers the derived tables' readers
    from traceanalyzer.store import Store

    return Store.open(path)
