"""The columnar store: Hive-partitioned Parquet tables plus a manifest, read as polars LazyFrames.

Layout of an output directory ``OUT``::

    OUT/manifest.json                                  # per-session input fingerprints and row counts
    OUT/manifest.journal                               # sessions finished since (one JSON line each)
    OUT/tables/<table>/rank=<r>/session=<s>/part-0.parquet

Every partition is written to a temporary name and renamed into place, so a killed writer never
leaves a half-written partition behind; the manifest entry of a session is only updated after all
its partitions are in place, which is what makes re-runs resumable.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from traceanalyzer.schema import DERIVED_TABLES, TABLES, Table

MANIFEST = "manifest.json"
TABLES_DIR = "tables"
MANIFEST_VERSION = 1
JOURNAL = "manifest.journal"


class StoreError(Exception):
    """The output directory is not a traceanalyzer store, or is unreadable."""


def partition_dir(root: Path, table: str, rank: int, session: str) -> Path:
    return root / TABLES_DIR / table / f"rank={rank}" / f"session={session}"


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
    target = partition_dir(root, table, rank, session)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(dir=target.parent, prefix=f".session={session}.", suffix=".tmp")
    )
    try:
        shareable(staging, directory=True)
        write(staging / "part-0.parquet")
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


def partition_exists(root: Path, table: str, rank: int, session: str) -> bool:
    return (partition_dir(root, table, rank, session) / "part-0.parquet").is_file()


def remove_session(root: Path, rank: int, session: str) -> None:
    for table in TABLES:
        shutil.rmtree(partition_dir(root, table, rank, session), ignore_errors=True)


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
            raw = json.loads(path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: unreadable manifest ({exc})") from exc
        if raw.get("version") != MANIFEST_VERSION:
            return cls()  # older layout: everything is re-ingested
        return cls(sessions=raw.get("sessions", {}))

    def save(self, root: Path) -> None:
        doc = {"version": MANIFEST_VERSION, "sessions": self.sessions}
        write_atomic_text(root / MANIFEST, json.dumps(doc, indent=1, sort_keys=True))


def load_manifest(out: Path) -> Manifest:
    """The manifest plus the journal of sessions finished since it was last written.

    A run appends one JSON line per finished session to ``manifest.journal`` (cheap: rewriting a
    1,024-session manifest after every session would write gigabytes); a run that was killed
    leaves its journal behind, and this folds it in. A torn last line (killed mid-write) is
    ignored: that session is simply ingested again.
    """
    manifest = Manifest.load(out)
    journal = out / JOURNAL
    if journal.is_file():
        for line in journal.read_text("utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
                manifest.sessions[entry["key"]] = entry["value"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return manifest


def fold_journal(out: Path, manifest: Manifest) -> None:
    """Write the manifest with every journal line in it, then drop the journal."""
    manifest.save(out)
    (out / JOURNAL).unlink(missing_ok=True)


def journal_append(out: Path, key: str, value: dict[str, Any]) -> None:
    """Record one finished session (a run that is killed keeps it for the next run)."""
    line = json.dumps({"key": key, "value": value}, sort_keys=True) + "\n"
    # one write() of one line on an O_APPEND fd: a kill leaves at most a torn last line
    fd = os.open(out / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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


def _empty_frame(table: str) -> pl.DataFrame:
    return pl.from_arrow(_known(table).arrow_schema.empty_table())  # type: ignore[return-value]


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
            schema = _empty_frame(name).schema
            df = df.with_columns(
                [
                    pl.lit(None, dtype=dtype).alias(col)
                    for col, dtype in schema.items()
                    if col not in df.columns
                ]
            ).select([pl.col(col).cast(dtype) for col, dtype in schema.items()])
            conformed[name] = df
        return cls(None, conformed)

    @property
    def table_names(self) -> list[str]:
        return [*TABLES, *DERIVED_TABLES]

    def table(self, name: str) -> pl.LazyFrame:
        _known(name)
        if name in self._frames:
            return self._frames[name].lazy()
        files = self._files(name)
        if not files:
            return _empty_frame(name).lazy()
        schema = _empty_frame(name).schema
        lf = pl.scan_parquet(
            files,
            hive_partitioning=True,
            hive_schema={"rank": pl.Int32, "session": pl.String},
            missing_columns="insert",
            extra_columns="ignore",
        )
        return lf.select([pl.col(c).cast(t) for c, t in schema.items()])

    def _files(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        return sorted((self.root / TABLES_DIR / name).glob("rank=*/session=*/part-0.parquet"))

    def rows(self, name: str) -> int:
        return int(self.table(name).select(pl.len()).collect().item())

    def has_rows(self, name: str) -> bool:
        return self.rows(name) > 0

    def sessions(self) -> pl.DataFrame:
        """One row per rank session, ordered by rank then start time."""
        return self.table("sessions").collect().sort(["rank", "start_ns"], nulls_last=True)

    def manifest(self) -> Manifest:
        return Manifest.load(self.root) if self.root else Manifest()


class RankStore(Store):
    """A store that only sees the partitions of some ranks (a worker's shard).

    Listing and scanning only ``rank=R`` directories keeps the worker's reads (and the Parquet
    footers it parses) proportional to its shard, not to the collection.
    """

    def __init__(self, root: Path, ranks: Iterable[int]):
        super().__init__(root)
        self.shard = sorted(set(ranks))

    def _files(self, name: str) -> list[Path]:
        if self.root is None:
            return []
        base = self.root / TABLES_DIR / name
        return sorted(
            path
            for rank in self.shard
            for path in base.glob(f"rank={rank}/session=*/part-0.parquet")
        )
