"""What a rank session may take: its deadline, the memory its worker needs (so that no more
sessions run side by side than fit), and what a worker hands back after a large one."""

from __future__ import annotations

from pathlib import Path

from traceanalyzer.discover import TRACE_FILE, RankSession
from traceanalyzer.ingest.source import source_of
from traceanalyzer.parse import trace_native
from traceanalyzer.parse.csv_tables import CSV_MEMORY_MB
from traceanalyzer.parse.trace_view import DEFAULT_PARSE_MEMORY, ParseMemory

# A session's deadline: this much, plus this much per MB of its files (a 200 MB rank takes
# seconds; a 2 GB one salvaged by DuckDB, minutes), or run --rank-timeout. Past it the session
# fails, said so: a read that never ends (a file on a mount that hangs) costs that rank.
RANK_SECONDS = 300.0
RANK_SECONDS_PER_MB = 2.0


# for the session to fail by itself, before its worker is stopped: a quarter of its deadline,
# 30 s at most
_STOP_GRACE = 0.25
_STOP_GRACE_SECONDS = 30.0


def session_seconds(session: RankSession) -> float:
    """The session's deadline, in seconds (see :data:`RANK_SECONDS`)."""
    return RANK_SECONDS + RANK_SECONDS_PER_MB * input_bytes(session) / (1 << 20)


def stop_after(seconds: float) -> float:
    """When to stop a session's task that its own deadline (``seconds``) did not end."""
    return seconds + min(_STOP_GRACE * seconds, _STOP_GRACE_SECONDS)


# What a worker holds: the interpreter and libraries (about 100 MB, with room), and the decoded
# events with the row group being written: on the 200 MB benchmark the native reader peaks at
# 1.0x the trace above its imports (it reads the slices' args again per row group), DuckDB's
# at 1.2x above imports and buffers; room is kept for DuckDB, which reads any damaged file.
_WORKER_BASE_MB = 150
_WORKER_PER_TRACE_MB = 1.4
# A Db holds its events as ids, about 7x denser than the trace's JSON, so the tables it fills
# take many times its size: the 200 MB benchmark's Db twin peaks at the base plus 9x the
# database (docs/benchmarks/ingest.md); 10x leaves a margin.
_WORKER_PER_DB_MB = 10


def input_bytes(session: RankSession) -> int:
    """The size of the session's exported files (what parsing and the rules work through)."""
    try:
        return sum(p.stat().st_size for p in session.output_dir.iterdir() if session.readable(p))
    except OSError:  # unreadable: its parse reports why; it weighs nothing here
        return 0


def session_memory_mb(session: RankSession, memory: ParseMemory = DEFAULT_PARSE_MEMORY) -> int:
    """Peak RSS to expect from the worker that ingests ``session``, in MB: the larger of the
    trace parse (or the Db read) and the CSV parse (which streams in a fixed budget)."""
    csv_peak = _WORKER_BASE_MB + CSV_MEMORY_MB
    if source_of(session) == "db" and session.db_file is not None:
        size_mb = session.db_file.stat().st_size / (1 << 20)
        return round(max(_WORKER_BASE_MB + _WORKER_PER_DB_MB * size_mb, csv_peak))
    trace = session.output_dir / TRACE_FILE
    if not session.readable(trace):
        return csv_peak
    size_mb = trace.stat().st_size / (1 << 20)
    # Both readers hold the decoded events; DuckDB's buffers come on top, counted when no
    # scanner is built (a damaged file, which DuckDB reads too, is found out only by reading).
    trace_peak = _WORKER_BASE_MB + _WORKER_PER_TRACE_MB * size_mb
    if not trace_native.available():
        trace_peak += memory.limit_mb(trace)
    return round(max(trace_peak, csv_peak))


def sessions_that_fit(needs_mb: list[int], jobs: int, available_mb: int | None) -> int:
    """How many sessions may run side by side (at most ``jobs``, at least one) so that the
    largest of them fit in 80% of ``available_mb`` together. ``needs_mb``: largest first."""
    if available_mb is None:
        return jobs
    budget, width = 0.8 * available_mb, 0
    for need in needs_mb[:jobs]:
        budget -= need
        if budget < 0:
            break
        width += 1
    return max(1, width)


def fit_in_memory(
    sessions: list[RankSession], width: int, memory: ParseMemory
) -> tuple[int, str | None]:
    """How many of ``sessions`` to ingest side by side on this machine (at most ``width``), and
    a note when that is fewer. Fewer at a time is slower; the OOM killer is worse (a killed
    worker's session is retried alone, but its time is lost)."""
    available = available_memory_mb()
    needs = sorted((session_memory_mb(s, memory) for s in sessions), reverse=True)
    fitting = sessions_that_fit(needs, width, available)
    if fitting >= width or available is None:
        return width, None
    return fitting, (
        f"memory: {fitting} rank session(s) at a time, not {width}: the largest need about "
        f"{needs[0] / 1024:.1f} GB each (--parse-memory {memory}), {available / 1024:.1f} GB "
        "is available"
    )


def available_memory_mb(
    proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Memory this process may still use, in MB: the smaller of the machine's ``MemAvailable``
    and what its cgroup (a container's limit) leaves. None where neither can be read."""
    found: list[float] = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) / 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text().strip())
            # The page cache (the traces just read, say) counts as used but is reclaimable.
            for line in (cgroup / "memory.stat").read_text().splitlines():
                if line.startswith("inactive_file "):
                    used -= int(line.split()[1])
            found.append((int(limit) - used) / (1 << 20))
    except (OSError, ValueError):
        pass
    return round(min(found)) if found else None


def peak_rss_mb() -> float | None:
    """Peak resident set size of this process so far, in MB (None where unsupported)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    # ru_maxrss is in KiB on Linux (bytes on macOS, where this overstates by 1024x; fine for a hint)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# After a session this large, what its parse freed is handed back to the system, so the rules
# (or the worker's next session) start from the libraries, not from the parse's high-water mark.
RELEASE_AFTER_BYTES = 32 << 20


def release_memory() -> None:
    """Free the parse's reference cycles and hand the Arrow pool's unused pages back (the
    system allocator's ``malloc_trim``; mimalloc's arenas where a user chose that pool): the
    rules then start from the libraries, not from the parse's high-water mark."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
