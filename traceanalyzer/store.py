"""The columnar store: Hive-partitioned Parquet tables plus a manifest, read as polars LazyFrames.

Layout of an output directory ``OUT``::

    OUT/manifest.json                                  # per-session input fingerprints and row counts
    OUT/manifest.journal                               # sessions finished since (one JSON line each)
    OUT/tables/<table>/rank=<r>/session=<s>/part-0.parquet    # a rank stored on its own
    OUT/tables/<table>/group=<lo>-<hi>/part-0.parquet          # small ranks stored together

A rank group holds many small ranks in one file per table, ``rank`` and ``session`` as columns
(its ranks are listed in the manifest): thousands of ranks of a few hundred KB each would
otherwise make tens of thousands of files, most of their bytes Parquet footers and directories.
Every partition is written to a temporary name and renamed into place, so a killed writer never
leaves a half-written partition behind; the manifest entry of a session is only updated after all
its partitions are in place, which is what makes re-runs resumable.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import (
    Callable,
    Collection,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import polars as pl

from traceanalyzer import outdir
from traceanalyzer.discover import is_session_id
from traceanalyzer.schema import DERIVED_TABLES, PART_FILE, TABLES, TABLES_DIR, Table

_T = TypeVar("_T")

MANIFEST = "manifest.json"
DERIVED_KEYS_DIR = ".cache"  # OUT/.cache/<derived table>/rank=R.key
MANIFEST_VERSION = 1
JOURNAL = "manifest.journal"
_RANK = re.compile(r"-?[0-9]{1,10}")


class StoreError(Exception):
    """The output directory is not a traceanalyzer store, or is unreadable."""


def partition_dir(root: Path, table: str, rank: int, session: str) -> Path:
    return root / TABLES_DIR / table / f"rank={rank}" / f"session={session}"


GROUP_PREFIX = "group="


def group_name(ranks: Iterable[int]) -> str:
    """The name of the group of ``ranks`` (``<lowest>-<highest>``): groups are runs of ranks in
    rank order, so two groups of one plan never share a name."""
    ordered = sorted(ranks)
    return f"{ordered[0]}-{ordered[-1]}"


def group_dir(root: Path, table: str, group: str) -> Path:
    return root / TABLES_DIR / table / f"{GROUP_PREFIX}{group}"


_GROUP_NAME = re.compile(r"group=(-?[0-9]{1,10})-(-?[0-9]{1,10})")
_RANK_LABEL = re.compile(r"rank=(-?[0-9]{1,10})")


def _group_span(directory: Path) -> tuple[int, int] | None:
    """The lowest and highest rank a group directory's name says it holds, or None when the
    name is not a group's."""
    match = _GROUP_NAME.fullmatch(directory.name)
    return (int(match[1]), int(match[2])) if match else None


@functools.cache
def _umask() -> int:
    # os.umask can only be read by setting it; do it once, before any worker thread writes.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shareable(path: Path, *, directory: bool = False) -> None:
    """Give a file or directory made by ``tempfile`` (always 0600/0700) the modes the user's umask
    gives any other file, so outputs can be shared like the rest of the user's files."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def write_atomic_stream(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Let ``write(fh)`` fill a temporary file in ``path``'s directory, then rename it to ``path``
    (readers never see a half-written file, however large)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        shareable(Path(tmp))
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, then rename."""
    write_atomic_stream(path, lambda fh: fh.write(data))


def write_atomic_text(path: Path, text: str) -> None:
    write_atomic_bytes(path, text.encode("utf-8"))


def commit_partition(
    root: Path, table: str, rank: int, session: str, write: Callable[[Path], None]
) -> None:
    """Replace one (table, rank, session) partition atomically.

    ``write(path)`` writes ``part-0.parquet`` at ``path`` inside a hidden staging directory; the
    staging directory is then renamed into place, so readers never see a half-written partition.
    Partition columns are not in the file (Hive style); they come back from the path.
    """
    _commit_dir(partition_dir(root, table, rank, session), write)


def commit_group(root: Path, table: str, group: str, write: Callable[[Path], None]) -> None:
    """Replace a rank group's file of ``table`` atomically, as :func:`commit_partition` does;
    ``rank`` and ``session`` are columns of the file."""
    _commit_dir(group_dir(root, table, group), write)


def _commit_dir(target: Path, write: Callable[[Path], None]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        shareable(staging, directory=True)
        write(staging / PART_FILE)
        if target.exists():
            trash = Path(tempfile.mkdtemp(dir=target.parent, prefix=".trash."))
            os.replace(target, trash / "old")
            os.replace(staging, target)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def shard_label(shard: Sequence[int]) -> str:
    """The directory name of a shard's partitions in a table: ``rank=R`` for a rank stored on
    its own, ``group=<lo>-<hi>`` for a group of several (:func:`rank_shards`)."""
    return f"rank={shard[0]}" if len(shard) == 1 else GROUP_PREFIX + group_name(shard)


def shard_words(shard: Sequence[int]) -> str:
    """A shard as a message names it: ``rank 3``, ``ranks 0-49``."""
    return f"rank {shard[0]}" if len(shard) == 1 else f"ranks {group_name(shard)}"


def write_derived_table(root: Path, table: str, shard: Sequence[int], frame: Any) -> None:
    """Replace the derived ``table``'s partitions of ``shard`` (its ranks, :func:`rank_shards`)
    with ``frame`` (a polars frame with ``session``, and ``rank`` when the shard has several):
    a rank on its own gets one partition per session, a group one file."""
    shutil.rmtree(root / TABLES_DIR / table / shard_label(shard), ignore_errors=True)
    # the table's folder even for no rows: keys count only beside it (derived_ranks)
    (root / TABLES_DIR / table).mkdir(parents=True, exist_ok=True)
    spec = DERIVED_TABLES[table]
    schema = spec.polars_schema
    if len(shard) > 1:
        data = frame.select(pl.col(c.name).cast(schema[c.name]) for c in spec.columns)
        commit_group(root, table, group_name(shard), data.write_parquet)
        return
    # the shard's folder even for no rows: a derivation to no rows is cached as one with rows
    # (a shard without its folder counts as removed by hand, stages._cached)
    (root / TABLES_DIR / table / shard_label(shard)).mkdir(exist_ok=True)
    columns = [c.name for c in spec.columns if c.name not in ("rank", "session")]
    for (session,), part in frame.partition_by("session", as_dict=True).items():
        data = part.select(pl.col(c).cast(schema[c]) for c in columns)
        commit_partition(root, table, shard[0], str(session), data.write_parquet)


def remove_stale_shards(root: Path, table: str, shards: Iterable[Sequence[int]]) -> None:
    """Remove ``table``'s partitions of every rank or group that is not one of ``shards``."""
    keep = {shard_label(shard) for shard in shards}
    base = root / TABLES_DIR / table
    for stale in [*base.glob("rank=*"), *base.glob(f"{GROUP_PREFIX}*")]:
        if stale.name not in keep:
            _remove(stale)


def derived_key_path(root: Path, table: str, shard: Sequence[int]) -> Path:
    """Where the key of ``shard``'s derived ``table`` is kept: what it was derived from."""
    return root / DERIVED_KEYS_DIR / table / f"{shard_label(shard)}.key"


def derived_key(root: Path, table: str, shard: Sequence[int]) -> str | None:
    """The key ``shard``'s derived ``table`` was last written with, or None (not derived, or
    derived by a reader, not stored)."""
    try:
        return derived_key_path(root, table, shard).read_text("utf-8")
    except OSError:
        return None


def derived_ranks(root: Path | None, table: str, ranks: Iterable[int]) -> set[int]:
    """Of ``ranks``, those whose shard's derived ``table`` is stored (its key written after it
    was derived): a rank there without rows has none, and need not be derived again. Keys
    without the table's folder (removed by hand, or an OUT copied without it) count for none."""
    if root is None or not (root / TABLES_DIR / table).is_dir():
        return set()
    spans = []
    for key in (root / DERIVED_KEYS_DIR / table).glob("*.key"):
        label = Path(key.name.removesuffix(".key"))
        if alone := _RANK_LABEL.fullmatch(label.name):
            spans.append((int(alone[1]), int(alone[1])))
        elif span := _group_span(label):
            spans.append(span)
    return {rank for rank in ranks if any(lo <= rank <= hi for lo, hi in spans)}


def rank_shards(
    root: Path, ranks: Iterable[int], sessions: Mapping[str, Any] | None = None
) -> list[tuple[int, ...]]:
    """``ranks`` as the shards every map after ingest runs on, in rank order: each group the
    manifest records (its ranks), and every other rank on its own. ``sessions``: the
    manifest's, when the caller has read it already."""
    wanted = set(ranks)
    groups: dict[str, set[int]] = {}
    recorded = load_manifest(root).sessions if sessions is None else sessions
    for key, entry in recorded.items():
        group = entry.get("group")
        rank = int(key.partition("/")[0])
        if isinstance(group, str) and rank in wanted:
            groups.setdefault(group, set()).add(rank)
    grouped = {rank for members in groups.values() for rank in members}
    shards = [tuple(sorted(members)) for members in groups.values()]
    shards += [(rank,) for rank in wanted - grouped]
    return sorted(shards)


def shard_fingerprints(sessions: Mapping[str, Any], shard: Sequence[int]) -> dict[str, Any]:
    """The input fingerprint of each session of ``shard``'s ranks, by session key, from the
    manifest's ``sessions``: what a table derived for the shard is derived from."""
    return {
        key: entry.get("fingerprint")
        for key, entry in sessions.items()
        if int(key.partition("/")[0]) in shard
    }


def shard_input_bytes(sessions: Mapping[str, Any], shard: Sequence[int]) -> int:
    """The size of the files ``shard``'s sessions were ingested from, by their fingerprints."""
    total = 0
    for fingerprint in shard_fingerprints(sessions, shard).values():
        files = fingerprint.get("files") if isinstance(fingerprint, Mapping) else None
        for entry in (files or {}).values():
            total += int(entry.get("size") or 0) if isinstance(entry, Mapping) else 0
    return total


def remove_session(root: Path, rank: int, session: str) -> None:
    for table in TABLES:
        shutil.rmtree(partition_dir(root, table, rank, session), ignore_errors=True)


def remove_group(root: Path, group: str) -> None:
    for table in TABLES:
        shutil.rmtree(group_dir(root, table, group), ignore_errors=True)


def _stored_file(root: Path, table: str, rank: int, session: str, group: str | None) -> Path:
    """Where a session's rows of ``table`` are: its own partition, or its group's file."""
    where = group_dir(root, table, group) if group else partition_dir(root, table, rank, session)
    return where / PART_FILE


# --------------------------------------------------------------------------- verification

_TAIL = 64 << 10  # the Parquet footer (schema, row groups, statistics) lives at the end


def _digest(path: Path, tail: bool) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with os.fdopen(outdir.open_own(path), "rb") as fh:
        if tail:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - _TAIL))
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _identity(path: Path) -> dict[str, int]:
    """The file's inode and status-change time: any write to it changes the second (the kernel
    keeps it; no tool can set it back), a copy the first."""
    info = os.stat(path, follow_symlinks=False)
    return {"ino": info.st_ino, "ctime_ns": info.st_ctime_ns}


def describe_partitions(
    root: Path, rank: int, session: str, group: str | None = None
) -> dict[str, dict[str, Any]]:
    """Per table of a session (stored on its own, or in ``group``): its file's size, content
    hash, footer hash and identity (inode, status-change time), for the manifest."""
    described = {}
    for table in TABLES:
        path = _stored_file(root, table, rank, session, group)
        described[table] = {
            "size": path.stat().st_size,
            "blake2b": _digest(path, tail=False),
            "tail": _digest(path, tail=True),
            **_identity(path),
        }
    return described


def verify_partitions(
    root: Path,
    rank: int,
    session: str,
    recorded: MutableMapping[str, Any] | None,
    group: str | None = None,
) -> str | None:
    """None when every table of the session is the file the manifest recorded, else why not.

    Cheap enough for every warm run: the size, the hash of the last 64 KB (a truncated file, or
    a valid one from another rank, has another footer), a footer that parses, and the file's
    identity. A file written since it was recorded (its status-change time moved: damaged in
    the middle, say, its size and footer intact), or copied, is hashed whole and compared with
    the recorded hash; a file that passes is recorded with its identity again (in
    ``recorded``), so it is hashed once.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not recorded or not isinstance(recorded, MutableMapping):
        return "no record of its stored tables"
    for table in TABLES:
        path = _stored_file(root, table, rank, session, group)
        expected = recorded.get(table)
        expected = expected if isinstance(expected, dict) else {}
        try:
            if path.stat().st_size != expected.get("size"):
                return f"tables/{table}: size differs from the one recorded"
            if _digest(path, tail=True) != expected.get("tail"):
                return f"tables/{table}: content differs from the one recorded"
            pq.read_metadata(path)
            identity = _identity(path)
            if any(expected.get(k) != v for k, v in identity.items()):
                if _digest(path, tail=False) != expected.get("blake2b"):
                    return f"tables/{table}: content differs from the one recorded"
                recorded[table] = {**expected, **identity}
        except (OSError, pa.ArrowException) as exc:
            return f"tables/{table}: unreadable ({exc})"
    return None


def remove_unlisted(root: Path, listed: Iterable[str], groups: Iterable[str] = ()) -> list[str]:
    """Remove every partition whose "<rank>/<session>" is not in ``listed`` and every group
    not in ``groups`` (left by another collection written to the same directory, or by a
    killed run), leftover staging directories and any link (the store never makes one: a link
    is someone else's data); returns the keys (and ``group=`` names) removed."""
    keep, keep_groups, removed = set(listed), set(groups), set()
    for table_dir in sorted(root / TABLES_DIR / table for table in TABLES):
        if table_dir.is_symlink() or table_dir.exists() and not table_dir.is_dir():
            _remove(table_dir)
            continue
        for leftover in [*table_dir.glob(f".{GROUP_PREFIX}*"), *table_dir.glob(".trash.*")]:
            _remove(leftover)  # a group's staging or trash, of an interrupted write
        for group in sorted(table_dir.glob(f"{GROUP_PREFIX}*")):
            name = group.name.removeprefix(GROUP_PREFIX)
            if group.is_symlink() or not group.is_dir() or name not in keep_groups:
                removed.add(group.name)
                _remove(group)
        for rank_dir in sorted(table_dir.glob("rank=*")):
            if rank_dir.is_symlink() or not rank_dir.is_dir():
                removed.add(rank_dir.name)
                _remove(rank_dir)
                continue
            for part in sorted(rank_dir.iterdir()):
                key = f"{rank_dir.name[5:]}/{part.name.removeprefix('session=')}"
                ours = part.name.startswith("session=") and not part.is_symlink()
                if part.name.startswith(".") or not ours or key not in keep:
                    if not part.name.startswith("."):  # staging or trash of an interrupted write
                        removed.add(key)
                    _remove(part)
    return sorted(removed)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Manifest:
    """Which sessions are in the store, from which inputs, with what row counts."""

    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # key: "<rank>/<session>"

    @classmethod
    def load(cls, root: Path) -> Manifest:
        path = root / MANIFEST
        if not path.exists():
            return cls()
        try:
            raw = json.loads(outdir.read_own(path).decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or UTF-8
            raise StoreError(f"{path}: unreadable manifest ({exc})") from exc
        if not isinstance(raw, dict) or raw.get("version") != MANIFEST_VERSION:
            return cls()  # older layout: everything is re-ingested
        sessions = raw.get("sessions")
        return cls(sessions=sessions if isinstance(sessions, dict) else {})

    def save(self, root: Path) -> None:
        from traceanalyzer.version import __version__

        # which code wrote the store (what is trusted of it is decided by the code keys)
        doc = {
            "version": MANIFEST_VERSION,
            "written_by": f"traceanalyzer {__version__}",
            "sessions": self.sessions,
        }
        write_atomic_text(root / MANIFEST, json.dumps(doc, indent=1, sort_keys=True))


def load_manifest(out: Path) -> Manifest:
    """The manifest plus the journal of sessions finished since it was last written.

    A run appends one JSON line per finished session to ``manifest.journal`` (cheap: rewriting a
    1,024-session manifest after every session would write gigabytes); a run that was killed
    leaves its journal behind, and this folds it in. A torn last line (killed mid-write) is
    ignored: that session is simply ingested again.
    """
    try:
        manifest = Manifest.load(out)
    except StoreError:  # damaged: trusted for nothing, so everything is ingested again
        manifest = Manifest()
    journal = out / JOURNAL
    if journal.is_file():
        for line in outdir.read_own(journal).decode("utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
                manifest.sessions[entry["key"]] = entry["value"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    # An entry of another shape (hand-edited, another tool's) is no record of anything; its key
    # and its group name paths the store reads and removes, so they must be names discovery
    # and the ingest could have made, never paths (a group of "x/../../.." would leave OUT).
    manifest.sessions = {
        key: value
        for key, value in manifest.sessions.items()
        if _is_session_key(key)
        and isinstance(value, dict)
        and isinstance(value.get("outcome"), dict)
        and (value.get("group") is None or _is_group_name(value.get("group")))
    }
    return manifest


def _is_session_key(key: object) -> bool:
    """Whether ``key`` is a ``"<rank>/<session>"`` discovery could have made (it names paths
    in the store: never one outside it)."""
    if not isinstance(key, str):
        return False
    rank, _, session = key.partition("/")
    return bool(_RANK.fullmatch(rank)) and is_session_id(session)


def _is_group_name(name: object) -> bool:
    """Whether ``name`` is a rank group's name (:func:`group_name`): ``<lowest>-<highest>``."""
    return isinstance(name, str) and _GROUP_NAME.fullmatch(GROUP_PREFIX + name) is not None


def fold_journal(out: Path, manifest: Manifest) -> None:
    """Write the manifest with every journal line in it, then drop the journal."""
    manifest.save(out)
    (out / JOURNAL).unlink(missing_ok=True)


def journal_append(out: Path, key: str, value: dict[str, Any]) -> None:
    """Record one finished session (a run that is killed keeps it for the next run)."""
    line = json.dumps({"key": key, "value": value}, sort_keys=True) + "\n"
    # one write() of one line on an O_APPEND fd: a kill leaves at most a torn last line
    fd = outdir.open_own(out / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def _known(table: str) -> Table:
    """The schema of an ingested or a derived table."""
    try:
        return TABLES.get(table) or DERIVED_TABLES[table]
    except KeyError:
        known = ", ".join([*TABLES, *DERIVED_TABLES])
        raise KeyError(f"unknown table {table!r}; known: {known}") from None


def _scan_files(name: str, files: Sequence[Path]) -> pl.LazyFrame:
    """Table ``name`` of the partition files ``files``, in the canonical schema."""
    schema = _known(name).polars_schema
    if not files:
        return pl.LazyFrame(schema=schema)
    keys = {"rank": pl.Int32, "session": pl.String}
    body = {c: t for c, t in schema.items() if c not in keys}
    frames = []
    for grouped in (False, True):  # the keys are columns of a group's file
        part = [f for f in files if _in_group(f) == grouped]
        if part:
            scan = pl.scan_parquet(
                part,
                hive_partitioning=not grouped,
                hive_schema=None if grouped else keys,
                # a column the schema gained since a partition was written reads as nulls
                schema=schema if grouped else body,
                missing_columns="insert",
                extra_columns="ignore",
            )
            frames.append(scan.select([pl.col(c).cast(t) for c, t in schema.items()]))
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical")


def stored_or_derived(
    store: Store,
    table: str,
    ranks: Collection[int] | None,
    derive: Callable[[int], pl.DataFrame],
    schema: Mapping[str, Any] | None = None,
) -> pl.DataFrame:
    """The one reader of a derived table: the rows of ``ranks`` (every rank: None) the store
    holds, and for a rank it holds no derivation of (a fixture's store, or one written before
    the table existed; a rank derived to no rows is derived) ``derive(rank)``, once per store.
    In ``schema``'s columns and types when given, else the stored table's."""
    wanted = sorted(ranks) if ranks is not None else sorted(set(store.sessions()["rank"]))
    stored = store.table(table).filter(pl.col("rank").is_in(wanted)).collect()
    if schema is not None:
        stored = stored.select(list(schema)).cast(schema)  # type: ignore[arg-type]
    have = derived_ranks(store.root, table, wanted) | set(stored["rank"].unique().to_list())
    derived = [
        store.memo((table, rank), lambda rank=rank: derive(rank))
        for rank in wanted
        if rank not in have
    ]
    frames = [stored, *(d.select(stored.columns) for d in derived if d.height)]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")


def store_ranks(store: Store) -> list[int]:
    """Ranks present in the store (from ``sessions``, else from the event tables)."""
    for table in ("sessions", "slices", "api_stats"):
        ranks = store.table(table).select(pl.col("rank").unique()).collect()["rank"].to_list()
        if ranks:
            return sorted(int(r) for r in ranks if r is not None)
    return []


class _Memo:
    """Values by key, each computed once however many threads ask for it at once (rules run
    side by side: the second asker waits for the first's value, not computing it again)."""

    def __init__(self) -> None:
        self._values: dict[Hashable, Any] = {}
        self._locks: dict[Hashable, threading.RLock] = {}
        self._guard = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        if key in self._values:
            return self._values[key]
        with self._guard:
            lock = self._locks.setdefault(key, threading.RLock())
        with lock:  # re-entrant: a computation that asks for its own key computes it, as before
            if key not in self._values:
                self._values[key] = compute()
        return self._values[key]


# By store root, while a run declares the store unchanged (:func:`run_memo`).
_RUN_MEMOS: dict[Path, _Memo] = {}


@contextmanager
def run_memo(root: str | os.PathLike[str]) -> Iterator[None]:
    """While open, the tables of the store at ``root`` do not change (the rules and the overview
    after them read it; only their own tables are written): what :meth:`Store.memo_for_run`
    computes of it is computed once in this process, whichever snapshot asks (the rules' task
    and the overview's, on an in-process executor)."""
    key = Path(root).resolve()
    _RUN_MEMOS[key] = _Memo()
    try:
        yield
    finally:
        _RUN_MEMOS.pop(key, None)


# The readers of derived tables, registered by the layer that derives them (above this one):
# a derived table's stored rows, or its rows derived in-process where the store has none (a
# fixture's store, or one written before the table existed). ``(store, ranks or None: every
# rank) -> rows``.
DERIVED_READERS: dict[str, Callable[[Store, Collection[int] | None], pl.DataFrame]] = {}


class Store:
    """Read access to a store. ``table(name)`` returns a lazy, canonical-schema frame.

    A table that no session produced is an empty frame with the canonical columns, so rules can
    run their queries unconditionally; use :meth:`rows` / :meth:`has_rows` to check presence.
    """

    def __init__(self, root: Path | None, frames: Mapping[str, pl.DataFrame] | None = None):
        self.root = root
        self._frames = dict(frames or {})

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> Store:
        path = Path(root)
        if not (path / TABLES_DIR).is_dir() and not (path / MANIFEST).exists():
            raise StoreError(f"{path}: not a traceanalyzer output directory (no {TABLES_DIR}/)")
        return cls(path)

    @classmethod
    def from_frames(cls, frames: Mapping[str, pl.DataFrame | Iterable[dict]]) -> Store:
        """An in-memory store, for tests and notebooks. Missing columns become nulls."""
        conformed = {}
        for name, frame in frames.items():
            df = (
                frame
                if isinstance(frame, pl.DataFrame)
                else pl.DataFrame(list(frame), infer_schema_length=None)
            )
            schema = _known(name).polars_schema
            missing = [c for c in schema if c not in df.columns]
            df = df.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in missing)
            conformed[name] = df.select(pl.col(c).cast(dtype) for c, dtype in schema.items())
        return cls(None, conformed)

    @property
    def table_names(self) -> list[str]:
        return [*TABLES, *DERIVED_TABLES]

    def table(self, name: str) -> pl.LazyFrame:
        _known(name)
        if name in self._frames:
            return self._frames[name].lazy()
        return _scan_files(name, self._files(name))

    def _files(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        base = self.root / TABLES_DIR / name
        return [
            *sorted(base.glob(f"rank=*/session=*/{PART_FILE}")),
            *sorted(base.glob(f"{GROUP_PREFIX}*/{PART_FILE}")),
        ]

    def derived(self, name: str, ranks: Collection[int] | None = None) -> pl.LazyFrame:
        """A derived table of ``ranks`` (every rank: None) through its registered reader (see
        :data:`DERIVED_READERS`), else as stored."""
        reader = DERIVED_READERS.get(name)
        if reader is not None:
            return reader(self, ranks).lazy()
        frame = self.table(name)
        return frame if ranks is None else frame.filter(pl.col("rank").is_in(sorted(ranks)))

    def to_pandas(self, name: str, ranks: Collection[int] | None = None) -> Any:
        """Table ``name`` of ``ranks`` (every rank: None) as a pandas DataFrame, a derived table
        through its reader: for the scripts and notebooks that speak pandas. Times stay exact
        int64 ns; text columns are Arrow-backed. pandas is loaded here only, never by a run."""
        return self.derived(name, ranks).collect().to_pandas(use_pyarrow_extension_array=True)

    def scan(self, name: str) -> pl.LazyFrame:
        """The table, as :meth:`table`, but never decoded whole to be held in memory: for a
        derivation's one query of a few of its columns."""
        return Store.table(self, name)

    def rows(self, name: str) -> int:
        return int(self.table(name).select(pl.len()).collect().item())

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """``compute()``; a snapshot store (:class:`RankStore`) keeps it under ``key``, so what
        several rules ask of the same data is computed once."""
        return compute()

    def memo_for_run(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """:meth:`memo`, kept for the run while it holds the store unchanged (:func:`run_memo`):
        for a derivation the rules and the overview both read (the memory stage, the host-bound
        gaps), keyed with the ranks the snapshot sees."""
        run = _RUN_MEMOS.get(self.root.resolve()) if self.root is not None else None
        if run is None:
            return self.memo(key, compute)
        return run.get((self._scope(), key), compute)

    def _scope(self) -> tuple[int, ...] | None:
        """The ranks this store sees (None: every rank)."""
        return None

    def has_rows(self, name: str) -> bool:
        return self.rows(name) > 0

    def sessions(self) -> pl.DataFrame:
        """One row per rank session, ordered by rank then start time."""
        return self.table("sessions").collect().sort(["rank", "start_ns"], nulls_last=True)

    def manifest(self) -> Manifest:
        return Manifest.load(self.root) if self.root else Manifest()


# A shard's table of up to this many rows is held in memory for the task; larger ones are scanned
# per query. Rows, not bytes: a footer gives no decoded size (a dictionary-encoded file of a
# trace whose events repeat is a few MB on disk and ~130 MB in memory).
IN_MEMORY_TABLE_ROWS = 32_000
IN_MEMORY_SHARD_ROWS = 100_000  # all of a shard's tables held in memory


def _in_group(path: Path) -> bool:
    """Whether a partition file is a rank group's (its keys are columns, not its path)."""
    return path.parent.name.startswith(GROUP_PREFIX)


def _rows_in(files: Iterable[Path]) -> int:
    """The rows of the files, from their footers."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(path).num_rows for path in files)


class RankStore(Store):
    """A store that only sees the partitions of some ranks (a worker's shard).

    Listing and scanning only ``rank=R`` directories keeps the worker's reads (and the Parquet
    footers it parses) proportional to its shard, not to the collection.

    It is a snapshot for one task: each table's files are listed once, a small table is decoded
    once, and the sessions are read once, however many rules ask (a rank's rules ask a few
    hundred times).
    """

    def __init__(self, root: Path, ranks: Iterable[int]):
        super().__init__(root)
        self.shard = sorted(set(ranks))
        self._tables: dict[str, pl.LazyFrame] = {}
        self._sessions: pl.DataFrame | None = None
        self._memo = _Memo()
        self._held = 0  # rows of the tables held in memory

    def memo(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        return self._memo.get(key, compute)

    def _scope(self) -> tuple[int, ...] | None:
        return tuple(self.shard)

    def table(self, name: str) -> pl.LazyFrame:
        if name not in self._tables:
            frame, files = self._scan_shard(name)
            size = _rows_in(files)
            if size <= IN_MEMORY_TABLE_ROWS and self._held + size <= IN_MEMORY_SHARD_ROWS:
                # Opening and decoding Parquet costs ~1.5 ms a query, most of a small
                # rank's rule time: a small table is decoded once and queried in memory.
                frame = frame.collect().lazy()
                self._held += size
            self._tables[name] = frame
        return self._tables[name]

    def scan(self, name: str) -> pl.LazyFrame:
        if name in self._tables:  # held already (or scanned, when large)
            return self._tables[name]
        return self._scan_shard(name)[0]

    def _scan_shard(self, name: str) -> tuple[pl.LazyFrame, list[Path]]:
        """The shard's rows of table ``name``, and the files they are read from."""
        files = self._files(name)
        frame = _scan_files(name, files)
        if any(map(_in_group, files)):  # a group holds other ranks too
            frame = frame.filter(pl.col("rank").is_in(self.shard))
        return frame, files

    def sessions(self) -> pl.DataFrame:
        if self._sessions is None:
            self._sessions = super().sessions()
        return self._sessions

    def _files(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        base = self.root / TABLES_DIR / name
        alone = sorted(
            path for rank in self.shard for path in base.glob(f"rank={rank}/session=*/{PART_FILE}")
        )
        return alone + [group / PART_FILE for group in self._groups(base)]

    def _groups(self, base: Path) -> list[Path]:
        """The group directories of a table that may hold a rank of the shard."""
        found = []
        for group in sorted(base.glob(f"{GROUP_PREFIX}*")):
            span = _group_span(group)
            holds = span and any(span[0] <= rank <= span[1] for rank in self.shard)
            if holds and (group / PART_FILE).is_file():
                found.append(group)
        return found
