"""Ingest: discover → parse → store, one rank session per task, cached and resumable.

The driver never holds table data: each worker parses one session and writes its partitions
itself (atomically); the driver only records outcomes, appending one line per finished session
to ``OUT/manifest.journal`` (folded into ``manifest.json`` at the end of the run), so an
interrupted run -- Ctrl-C, a killed driver or worker, a lost Ray node -- resumes with the sessions
that are missing or stale. Where the sessions run is the executor's business
(:mod:`traceanalyzer.executor`: in-process, a spawn process pool, or Ray).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceanalyzer import outdir
from traceanalyzer.discover import Discovery, RankSession, discover, input_root
from traceanalyzer.hints import path_did_you_mean
from traceanalyzer.ingest.budget import fit_in_memory, input_bytes, session_seconds, stop_after
from traceanalyzer.ingest.cached import session_fingerprint, stored_unit
from traceanalyzer.ingest.groups import drop_group, plan_groups, plan_units, recorded_groups
from traceanalyzer.ingest.outcome import (
    IngestResult,
    InputError,
    ProgressFn,
    SessionOutcome,
    crashed,
    too_long,
)
from traceanalyzer.ingest.session import SCRATCH, ingest_unit
from traceanalyzer.ingest.source import source_of
from traceanalyzer.parse import native_scan, trace_native
from traceanalyzer.parse.trace_view import DEFAULT_PARSE_MEMORY, ParseMemory
from traceanalyzer.store import (
    describe_partitions,
    fold_journal,
    journal_append,
    load_manifest,
    remove_group,
    remove_session,
    remove_unlisted,
)

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor


def ingest(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str],
    jobs: int = 1,
    progress: ProgressFn | None = None,
    force: bool = False,
    executor: Executor | None = None,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    lock_wait: float = outdir.LOCK_WAIT_SECONDS,
    follow_links: bool = False,
    rank_timeout: float | None = None,
) -> IngestResult:
    """Discover every rank session under ``root`` and bring the store at ``out`` up to date.

    ``executor`` runs the per-session work (:func:`traceanalyzer.executor.make_executor`); by
    default ``auto``: in this process when the work is small, else in a spawn process pool.
    ``memory`` is each trace's parse budget (DuckDB's buffers, per worker).
    The output is checked (never inside the input or a rank directory) and locked for the
    ingest (:mod:`traceanalyzer.outdir`), waiting up to ``lock_wait`` seconds for another run
    that holds it (said to ``progress``). Without a rank session, nothing is written.
    Links that leave ``root`` are followed only with ``follow_links``. A session that takes
    longer than ``rank_timeout`` seconds (default: :func:`session_seconds`) fails, said so.
    """
    try:
        if not Path(root).exists():
            raise InputError(f"{root}: no such file or directory{path_did_you_mean(root)}")
        root_path, out_path = input_root(root), Path(out)
        outdir.check_out(out_path, root_path)
        try:
            found = discover(root_path, follow_links)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise InputError(str(exc)) from exc
        if not found.sessions:  # nothing to analyse: `out` is left exactly as it was found
            return IngestResult(out_path, found, [])
        outdir.check_out(out_path, root_path, [s.path for s in found.sessions])
        total = len(found.sessions)
        say = (lambda note: progress(note, 0, total, None)) if progress else None
        with outdir.locked(out_path, lock_wait, on_wait=say):
            return _ingest(found, out_path, jobs, progress, force, executor, memory, rank_timeout)
    finally:
        native_scan.drop_ahead()  # a scan started ahead (read_ahead) and not taken: not held


def _remove_scratch(out_path: Path) -> None:
    for scratch in out_path.glob(f"{SCRATCH}*"):
        shutil.rmtree(scratch, ignore_errors=True)


def _ingest(
    found: Discovery,
    out_path: Path,
    jobs: int,
    progress: ProgressFn | None,
    force: bool,
    executor: Executor | None,
    memory: ParseMemory,
    rank_timeout: float | None,
) -> IngestResult:
    from traceanalyzer.executor import TaskCrashed, make_executor

    manifest = load_manifest(out_path)
    _remove_scratch(out_path)  # a killed run's: nothing reads it now

    # Sessions no longer in the input leave the store, so it always mirrors the input (a group
    # with them: its other sessions are ingested again, in the groups planned now).
    current = {s.key for s in found.sessions}
    for key in [k for k in manifest.sessions if k not in current]:
        if key not in manifest.sessions:
            continue  # its group's, dropped with it
        group = manifest.sessions[key].get("group")
        if isinstance(group, str):
            drop_group(out_path, manifest, group)
        else:
            rank, _, session = key.partition("/")
            remove_session(out_path, int(rank), session)
            del manifest.sessions[key]
    with outdir.writes(out_path):
        fold_journal(out_path, manifest)
        # What the manifest does not list is not ours to read (another collection written
        # here, a killed run's leftovers): the rules would analyse it as if it were this input.
        unlisted = remove_unlisted(out_path, manifest.sessions, recorded_groups(manifest))

    sizes = {session.key: input_bytes(session) for session in found.sessions}
    units = plan_units(found.sessions, plan_groups(found.sessions, sizes))
    fingerprints = {session.key: session_fingerprint(session) for session in found.sessions}
    outcomes: list[SessionOutcome] = []
    todo: list[tuple[str | None, list[RankSession]]] = []
    notes = []  # why stored sessions are ingested again, for the progress
    recorded = recorded_groups(manifest)
    for group, members in units:
        if force:
            todo.append((group, members))
            continue
        cached, why = stored_unit(out_path, manifest, group, members, fingerprints, recorded)
        if cached is not None:
            outcomes += cached
            continue
        if why:
            where = f"ranks {group}" if group else f"rank {members[0].rank} {members[0].session}"
            notes.append(f"{where}: {why}; ingested again")
        todo.append((group, members))
    # what the sessions ingested again were stored in goes first: a group they left, or their
    # own partitions when they now join a group
    for group, members in todo:
        for session in members:
            old = manifest.sessions.get(session.key, {}).get("group")
            if isinstance(old, str):
                drop_group(out_path, manifest, old)
            elif group is not None:
                remove_session(out_path, session.rank, session.session)
    total = len(found.sessions)
    done = len(outcomes)

    def say(event: str, outcome: SessionOutcome | None = None) -> None:
        if progress:
            progress(event, done, total, outcome)

    for event in ("start", *notes):
        say(event)

    described: dict[str, dict[str, Any]] = {}  # a group's files, described once for its sessions

    def record(outcome: SessionOutcome, group: str | None) -> None:
        nonlocal done
        if outcome.output_error:  # disk full or the like: no later session would fare better
            raise outdir.OutputError(outcome.error)
        done += 1
        outcomes.append(outcome)
        if outcome.status == "failed":
            # a failed (or killed) session may have left some partitions: drop them all, so the
            # rules never analyse half a rank, and the next run ingests it again (a group's
            # files never hold a failed session)
            if group is None:
                remove_session(out_path, outcome.rank, outcome.session)
            manifest.sessions.pop(outcome.key, None)
        else:
            with outdir.writes(out_path):
                if group is None:
                    partitions = describe_partitions(out_path, outcome.rank, outcome.session)
                else:
                    if group not in described:
                        described[group] = describe_partitions(
                            out_path, outcome.rank, outcome.session, group
                        )
                    partitions = described[group]
            value = {
                "fingerprint": fingerprints[outcome.key],
                "outcome": asdict(outcome),
                "partitions": partitions,
            }
            if group is not None:
                value["group"] = group
            manifest.sessions[outcome.key] = value
            with outdir.writes(out_path):
                journal_append(out_path, outcome.key, value)
        say("session", outcome)

    reads_traces = any(source_of(s) == "text" for _, members in todo for s in members)
    if reads_traces and progress and (note := trace_native.unavailable_note()):
        say(note)
    owned = executor is None
    if executor is None:
        executor = make_executor("auto", jobs=jobs)
    # all sessions, cached ones too: the rules map over every rank with the same executor
    executor_note = executor.plan(len(found.sessions), sum(sizes.values()))
    say(f"executor: {executor_note}")
    side_by_side = min(executor.jobs, len(todo)) if executor.parallel else 1
    if executor.shares_memory and side_by_side > 1:
        largest = [max(members, key=lambda s: sizes[s.key]) for _, members in todo]
        side_by_side, note = fit_in_memory(largest, side_by_side, memory)
        if note:
            say(note)
    # e.g. a single 2 GB rank scans on every core
    threads = executor.threads_per_task(side_by_side)
    try:
        seconds = [[rank_timeout or session_seconds(s) for s in members] for _, members in todo]
        results = executor.map(
            ingest_unit,
            [
                (members, out_path, group, threads, memory, limits)
                for (group, members), limits in zip(todo, seconds, strict=True)
            ],
            width=side_by_side,
            # past its own deadline (above), a session is stopped: a read stuck in a library
            # never saw it
            timeouts=[sum(stop_after(t) for t in limits) for limits in seconds],
        )
        left_running = False
        for index, result in results:
            group, members = todo[index]
            if isinstance(result, TaskCrashed):
                left_running |= result.timed_out
                why = (
                    too_long(sum(seconds[index])) if result.timed_out else f"worker died: {result}"
                )
                if group is not None:  # what the dead worker wrote of the group is not kept
                    remove_group(out_path, group)
                result = [crashed(session, why) for session in members]
            for outcome in result:
                record(outcome, group)
        # Every task has returned, so a scratch folder still here is a dead worker's (one the
        # OOM killer took, its task retried and done): it may hold a trace's spill, and this
        # run is its last user. Not when a task was stopped past its deadline: `local` leaves
        # that task's thread running in it (the next run removes it).
        if not left_running:
            _remove_scratch(out_path)
    finally:
        # also on Ctrl-C: everything finished so far is in the manifest for the next run
        with outdir.writes(out_path):
            fold_journal(out_path, manifest)
        if owned:
            executor.close()
    outcomes.sort(key=lambda o: (o.rank, o.session))
    say("done")
    return IngestResult(
        out_path, found, outcomes, executor=executor_note, removed_unlisted=unlisted
    )
