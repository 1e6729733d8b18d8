"""Ingest: discover → parse → store, one rank session per task, cached and resumable
(:mod:`~traceanalyzer.ingest.run`).

A module per idea: ``run`` (the orchestration: what to ingest again, on which executor, the
manifest kept), ``session`` (one rank session, or a rank group's small ones, into the store: the
worker's task), ``source`` (which export of a session is read, and the Db read), ``side_files``
(the CSV and communication files, and files of another session left out), ``sink`` (the tables
conformed, checked and written), ``budget`` (a session's deadline and memory, how many run side
by side), ``groups`` (rank groups), ``cached`` (what a warm run trusts of the store:
fingerprints and stored outcomes) and ``outcome`` (what ingest says of a session and of a run).
"""

from __future__ import annotations

from traceanalyzer.ingest.outcome import IngestResult, InputError, ProgressFn, SessionOutcome
from traceanalyzer.ingest.run import ingest

__all__ = ["IngestResult", "InputError", "ProgressFn", "SessionOutcome", "ingest"]
