"""Db exports (``ascend_pytorch_profiler_{rank}.db``, ``analysis.db``) → the canonical tables.

torch_npu's ``export_type=Db`` writes the data of a Text export as SQLite: events as rows with
int64 ns times, names as ids into ``STRING_IDS``, codes named by ``ENUM_*`` tables, flows as
connection ids. This reader fills the tables the Text readers fill, with the process, thread
and stream naming a Text export of the same session has (``Python``, ``CANN``, ``Ascend
Hardware``, ``HCCL``/``Communication``; ``Thread <tid>``, ``Stream <id>``, ``Plane <n>``; msprof's
pids ``(os_pid << 10) | (sort_index << 5) | device``) and the args keys its events carry, so
rules, reports and ``diff`` cannot tell which format a rank came from. ``docs/schema.md`` says,
for every column, where it comes from in both formats.

The database is opened strictly read-only (``mode=ro&immutable=1``): SQLite takes no lock and
writes no journal, WAL or shared-memory file next to it. Side files other SQLite clients leave
(``-wal``, ``-journal``) are read, not refused: empty ones are ignored; a WAL's committed frames
are applied (a journal's transaction rolled back) in a private copy; only a writer that holds
its lock now makes the file unreadable (``database.readable_source``).

Modules: ``database`` (the connection, typed scans, ids to text), ``layout`` (generation,
pids), ``slices``, ``counters``, ``flows`` (and threads), ``device`` (kernels and statistics),
``memory``, ``analysis`` (analysis.db), ``text_only`` (what a Text twin holds and the Db cannot),
``reader`` (the orchestration, :func:`parse_db`).

Speed: each table is one plain scan of the columns needed, read through the ADBC SQLite driver
as Arrow columns (no Python object per value) that polars adopts; ids become names through
``STRING_IDS`` and the ``ENUM_*`` tables as vectorised replacements, and joins (task infos,
call stacks, flows) are polars hash joins.

Tolerance: an absent table is "not collected" (its canonical table stays empty), an absent
column becomes nulls, unknown columns are ignored; a file that is not SQLite, is damaged, or
whose ``META_DATA`` schema major version is newer than the ones known here is refused with the
reason (:class:`DbUnreadable`).
"""

from traceanalyzer.parse.db.database import DbUnreadable, connect_readonly
from traceanalyzer.parse.db.layout import KNOWN_SCHEMA_MAJORS
from traceanalyzer.parse.db.reader import parse_db
from traceanalyzer.parse.db.result import DbResult

__all__ = ["KNOWN_SCHEMA_MAJORS", "DbResult", "DbUnreadable", "connect_readonly", "parse_db"]
