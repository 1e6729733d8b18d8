"""Discovery: find every rank session under a root and say what cannot be analysed, and why.

A *rank session* is one profiler start/stop of one process: a ``*_ascend_pt`` directory, or any
directory holding ``ASCEND_PROFILER_OUTPUT/``, exported as Text (trace_view.json and CSVs), as Db
(``ascend_pytorch_profiler_{rank}.db`` + ``analysis.db``) or both: one session whatever its
formats (:attr:`RankSession.formats`). Nothing is skipped silently: raw-only, unreadable and
duplicate directories become :class:`Problem` records with the fix.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from traceanalyzer import json_shape, sqlite_ro
from traceanalyzer.printable import valid_text

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TRACE_FILE = "trace_view.json"  # in OUTPUT_DIR
_RANK_DIR_SUFFIX = "_ascend_pt"
_DIR_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)_(?P<ts>\d{14,17})_ascend_pt$")
_INFO_NAME = re.compile(r"^profiler_info(?:_(?P<rank>\d+))?\.json$")
DB_NAME = re.compile(r"^ascend_pytorch_profiler(?:_(?P<rank>\d+))?\.db$")
ANALYSIS_DB = "analysis.db"
_RAW_MARKERS = ("FRAMEWORK",)
_LINE_CAP = 1 << 20  # characters of a CSV line read to find the device id
_PROBE_SECONDS = 10.0  # the RANK_DEVICE_MAP probe: one row of a small table
_NO_DESCEND = {"FRAMEWORK", "logs", OUTPUT_DIR}
ANALYSE_HINT = (
    'parse it on a CANN host with: python -c "from torch_npu.profiler.profiler import analyse; '
    "analyse('{path}', export_type='text')\""
)


@dataclass(frozen=True)
class Problem:
    """Something in the input that limits the analysis. Shown in the summary; never dropped."""

    severity: str  # "error" | "warning" | "info"
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "path": self.path, "message": self.message}


@dataclass
class RankSession:
    """One rank's profiler session on disk, with what its info files say about it."""

    path: Path
    rank: int
    rank_source: str  # profiler_info | file_name | rank_device_map | device_id | dir_name | unknown
    session: str = ""
    info_file: Path | None = None
    profiler_level: str | None = None
    export_type: list[str] = field(default_factory=list)
    torch_npu_version: str | None = None
    cann_version: str | None = None
    device_id: int | None = None
    hostname: str | None = None
    os_pid: int | None = None
    order_ns: int | None = None  # for ordering sessions of a rank before parsing
    end_ns: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Export formats present in ASCEND_PROFILER_OUTPUT/: "text" (trace_view.json or CSVs) and/or
    # "db" (ascend_pytorch_profiler*.db); ingest picks the source (ingest.json `source_format`).
    formats: list[str] = field(default_factory=list)
    db_file: Path | None = None  # ascend_pytorch_profiler_{rank}.db
    analysis_db: Path | None = None  # analysis.db (communication and step summaries)
    # Entries never read: links out of the input, FIFOs, devices (:func:`foreign_entries`)
    refused: set[Path] = field(default_factory=set)

    @property
    def output_dir(self) -> Path:
        return self.path / OUTPUT_DIR

    def readable(self, path: Path) -> bool:
        """Whether ``path`` (a file of this session) is a regular file it may read."""
        return path not in self.refused and path.is_file()

    @property
    def key(self) -> str:
        return f"{self.rank}/{self.session}"


@dataclass
class Discovery:
    sessions: list[RankSession]
    problems: list[Problem]


def _not_followed(path: str, target: str) -> Problem:
    return Problem(
        "warning",
        path,
        f"a link to {target}, outside the input: not followed (--follow-links follows it)",
    )


def _read_shaped(path: Path, shape: json_shape.Obj, problems: list[Problem]) -> dict[str, Any]:
    """``path`` conformed to ``shape``; what does not fit is a warning naming the file and field
    (that field, or the whole file, is then ignored: the rank is still analysed)."""
    try:
        doc, dropped = json_shape.read_shaped(path, shape)
    except json_shape.InputFileError as exc:
        problems.append(Problem("warning", str(path), f"{path.name} ignored: {exc}"))
        return {}
    problems += [Problem("warning", str(path), f"{path.name}: {d}; ignored") for d in dropped]
    return doc


def _inside(path: str, container: str) -> bool:
    return path == container or path.startswith(container.rstrip(os.sep) + os.sep)


def _leaves(entry: os.DirEntry[str], real_root: str) -> str | None:
    """Where a link that leaves the input root points (None: not a link, or inside the root)."""
    if not entry.is_symlink():
        return None
    target = os.path.realpath(entry.path)
    return None if _inside(target, real_root) else target


def walk_input(
    root: Path,
    enter: Callable[[Path, list[os.DirEntry[str]]], list[os.DirEntry[str]]],
    problems: list[Problem] | None = None,
    follow_links: bool = False,
) -> Iterator[tuple[Path, list[os.DirEntry[str]]]]:
    """Every directory under ``root`` (itself first) with its entries, depth first by name;
    ``enter(directory, entries)`` says which of its subdirectories to walk.

    A link inside the input is followed (collected rank dirs are often links), each directory
    entered once, so a link back to an ancestor cannot loop; a link that leaves the input root
    is named in ``problems`` and not followed unless ``follow_links``. The walk keeps its own
    stack: no depth is too deep for it."""
    real_root = os.path.realpath(root)
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        here = stack.pop()
        try:
            info = here.stat()
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            with os.scandir(here) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue
        yield here, entries
        below = []
        for entry in enter(here, [e for e in entries if _is_directory(e)]):
            target = None if follow_links else _leaves(entry, real_root)
            if target is not None:
                if problems is not None:
                    problems.append(_not_followed(entry.path, target))
                continue
            below.append(Path(entry.path))
        stack += reversed(below)  # the first name is walked first


def _walk(
    root: Path,
    limit: int | None = None,
    problems: list[Problem] | None = None,
    follow_links: bool = False,
) -> list[Path]:
    """The candidate rank directories under ``root``, in walk order (:func:`walk_input`); the
    walk stops at ``limit`` of them."""
    found: list[Path] = []

    def enter(here: Path, subdirs: list[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
        if here.name.endswith(_RANK_DIR_SUFFIX) or any(e.name == OUTPUT_DIR for e in subdirs):
            found.append(here)
            return []  # a rank dir never contains another rank dir
        return [
            e
            for e in subdirs
            if e.name not in _NO_DESCEND and not e.name.startswith(("PROF_", "."))
        ]

    for _ in walk_input(root, enter, problems, follow_links):
        if limit is not None and len(found) >= limit:
            break
    return found[:limit] if limit is not None else found


def _is_directory(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # a link to a directory too
    except OSError:
        return False


def foreign_entries(
    path: Path, real_root: str, follow_links: bool, problems: list[Problem]
) -> set[Path]:
    """The entries of a rank dir and of its ASCEND_PROFILER_OUTPUT/ that are never read, each
    named in ``problems``: links that leave the input root (unless ``follow_links``) and what is
    neither a regular file nor a directory (a FIFO, a device, a socket: opening one can block
    the run, or read without end)."""
    refused: set[Path] = set()
    for folder in (path, path / OUTPUT_DIR):
        if folder in refused:
            continue
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            target = None if follow_links else _leaves(entry, real_root)
            if target is not None:
                problems.append(_not_followed(entry.path, target))
            elif not _is_directory(entry) and not _is_regular(entry):
                problems.append(
                    Problem(
                        "warning",
                        entry.path,
                        "not a regular file (a FIFO, device or socket, or a broken link): not read",
                    )
                )
            else:
                continue
            refused.add(Path(entry.path))
    return refused


def _is_regular(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # a stat: never blocks on a FIFO
    except OSError:
        return False


def _device_id_from_outputs(out_dir: Path, refused: set[Path]) -> int | None:
    """Device id from the first data row of a CSV that carries it (G3+ files, memory files)."""
    probes = (
        ("kernel_details.csv", "Device_id"),
        ("step_trace_time.csv", "Device_id"),
        ("npu_module_mem.csv", "Device"),
        ("memory_record.csv", "Device Type"),
    )
    for name, column in probes:
        path = out_dir / name
        if path in refused or not path.is_file():
            continue
        try:
            with open(path, encoding="utf-8", errors="replace", newline="") as fh:
                # capped: a damaged file may have no line end for gigabytes
                header = fh.readline(_LINE_CAP).strip().split(",")
                row = fh.readline(_LINE_CAP).strip().split(",")
        except OSError:
            continue
        if column in header and len(row) > header.index(column):
            digits = re.search(r"(\d+)", row[header.index(column)])
            device = bounded_int(digits.group(1)) if digits else None
            if device is not None:
                return device
    return None


def bounded_int(digits: str, high: int = 1 << 31) -> int | None:
    """``digits`` (ASCII digits from a file or folder name, a CSV cell) as an int below
    ``high``, else None: a 5,000-digit id is no id (``int`` of it raises past 4,300 digits,
    and a rank of 2**40 has no room in the store's int32)."""
    if len(digits) > len(str(high)) or not digits.isascii() or not digits.isdigit():
        return None
    value = int(digits)
    return value if value < high else None


def _dir_ts_ns(name: str) -> int | None:
    match = _DIR_NAME.match(name)
    if not match:
        return None
    ts = match.group("ts").ljust(17, "0")
    try:
        when = datetime.strptime(ts[:14], "%Y%m%d%H%M%S")
    except ValueError:
        return None
    return int(when.timestamp()) * 1_000_000_000 + int(ts[14:17]) * 1_000_000


def _load_session(path: Path, problems: list[Problem], refused: set[Path]) -> RankSession:
    infos = sorted(p for p in path.iterdir() if _INFO_NAME.match(p.name) and p not in refused)
    info_file = infos[0] if infos else None
    info: dict[str, Any] = {}
    if info_file is not None:
        info = _read_shaped(info_file, json_shape.PROFILER_INFO, problems)
    else:
        problems.append(
            Problem("warning", str(path), "no profiler_info*.json; rank taken from other sources")
        )

    formats, db_file, analysis_db = _formats(path / OUTPUT_DIR, refused)
    rank, source = None, "unknown"
    if isinstance(info.get("rank_id"), int):  # conformed: an int, or dropped
        rank, source = info["rank_id"], "profiler_info"
    elif (
        info_file is not None
        and (m := _INFO_NAME.match(info_file.name))
        and m.group("rank")
        or db_file is not None
        and (m := DB_NAME.match(db_file.name))
        and m.group("rank")
    ):
        rank, source = bounded_int(m.group("rank")), "file_name"
    device_id = _device_id_from_outputs(path / OUTPUT_DIR, refused)
    if db_file is not None and (rank is None or device_id is None):
        db_rank, db_device = _rank_device_map(db_file)
        if rank is None and db_rank is not None:
            rank, source = db_rank, "rank_device_map"
        device_id = device_id if device_id is not None else db_device
    if rank is None and device_id is not None:
        rank, source = device_id, "device_id"
    if rank is None and (m := re.search(r"rank[_-]?(\d+)", path.name)):
        rank, source = bounded_int(m.group(1)), "dir_name"
    if rank is None:
        rank, source = -1, "unknown"  # (a source whose digits were no rank gave none)
        problems.append(
            Problem(
                "warning",
                str(path),
                "rank unknown (no rank_id, info file suffix or device id); stored as rank -1",
            )
        )

    # Conformed: each declared object is a dict, or absent.
    config = info.get("config") or {}
    experimental = config.get("experimental_config") or {}
    export_types = experimental.get("_export_type") or []

    metadata: dict[str, Any] = {}
    meta_file = path / "profiler_metadata.json"
    if meta_file.exists() and meta_file not in refused:
        metadata = _read_shaped(meta_file, json_shape.PROFILER_METADATA, problems)

    name_match = _DIR_NAME.match(path.name)
    end_ns = (info.get("end_info") or {}).get("collectionTimeEnd")
    return RankSession(
        path=path,
        rank=rank,
        rank_source=source,
        info_file=info_file,
        profiler_level=experimental.get("_profiler_level"),
        export_type=[e.lower() for e in export_types],
        torch_npu_version=info.get("torch_npu_version"),
        cann_version=info.get("cann_version"),
        device_id=device_id,
        hostname=name_match.group("host") if name_match else None,
        os_pid=bounded_int(name_match.group("pid"), 1 << 63) if name_match else None,
        order_ns=end_ns or _dir_ts_ns(path.name),
        end_ns=end_ns,
        config=config,
        metadata=metadata,
        formats=formats,
        db_file=db_file,
        analysis_db=analysis_db,
        refused=refused,
    )


def _rank_device_map(db_file: Path) -> tuple[int | None, int | None]:
    """(rank, device) from the database's RANK_DEVICE_MAP; (None, None) when it cannot tell.

    Opened as the reader opens it (read-only, immutable: no lock, nothing written beside it;
    a table, not a view, within a deadline); an unreadable file is the reader's to report.
    """
    try:
        con = sqlite_ro.connect(db_file, _PROBE_SECONDS)
        try:
            if "RANK_DEVICE_MAP" not in sqlite_ro.tables_of(con).columns:
                return None, None
            rows = con.execute("SELECT rankId, deviceId FROM RANK_DEVICE_MAP LIMIT 1")
        finally:
            con.close()
    except sqlite3.Error:
        return None, None
    rank, device = rows[0] if rows else (None, None)
    return _id_or_none(rank), _id_or_none(device)


def _id_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and 0 <= value < 1 << 31 else None


def _formats(out: Path, refused: set[Path]) -> tuple[list[str], Path | None, Path | None]:
    """The export formats in ``out`` (text, db), its profiler database and its analysis.db."""
    files = sorted(p for p in out.iterdir() if p not in refused) if out.is_dir() else []
    names = [p.name for p in files if p.is_file()]
    formats = ["text"] if any(n.endswith((".csv", ".json")) for n in names) else []
    dbs = [n for n in names if DB_NAME.match(n)]
    if dbs:
        formats.append("db")
    analysis = out / ANALYSIS_DB if ANALYSIS_DB in names else None
    return formats, out / dbs[0] if dbs else None, analysis


# A session id names a store partition (`session=<id>`) and an annotated trace's folder: a file
# name of these characters, never a path, within any file system's name limit.
SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_SESSION_ID_CUT = 180  # a longer directory name keeps this much, then its suffix


def is_session_id(text: object) -> bool:
    """Whether ``text`` is a session id discovery could have made: a name, never a path."""
    return isinstance(text, str) and bool(SESSION_ID.fullmatch(text)) and text.strip(".") != ""


def _session_ids(sessions: list[RankSession], root: Path) -> None:
    """Session id = directory name, when that is a safe id and no other rank directory has it.

    Otherwise (characters a Hive path or a file name cannot hold, a name too long, a name
    two directories share) the cleaned name gets a suffix derived from the directory's path
    relative to ``root``, so ids are deterministic; any id still taken (two cleaned names that
    meet) gets a counter as well, in path order: unique by construction."""
    counts = Counter(s.path.name for s in sessions)
    wanted: dict[int, str] = {}
    for index, s in enumerate(sessions):
        name = s.path.name
        if is_session_id(name) and counts[name] == 1:
            wanted[index] = name
            continue
        rel = os.path.relpath(s.path, root).encode("utf-8", "surrogateescape")
        suffix = hashlib.blake2b(rel, digest_size=4).hexdigest()
        wanted[index] = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:_SESSION_ID_CUT]}-{suffix}"
    repeats = defaultdict(list)
    for index, session_id in wanted.items():
        repeats[session_id].append(index)
    taken = set(wanted.values())
    for session_id, indices in repeats.items():
        # the first in path order keeps the id; the others count from 2
        in_order = sorted(indices, key=lambda i: str(sessions[i].path))
        for count, index in enumerate(in_order[1:], start=2):
            while f"{session_id}-{count}" in taken:
                count += 1
            wanted[index] = f"{session_id}-{count}"
            taken.add(wanted[index])
    for index, s in enumerate(sessions):
        s.session = wanted[index]


def _unusable(path: Path, refused: set[Path]) -> str | None:
    """Why the candidate rank dir ``path`` cannot be analysed (None: it can)."""
    out = path / OUTPUT_DIR
    if out in refused:
        return f"{OUTPUT_DIR}/ is not read (see the warning above)"
    if out.is_dir():
        names = {p.name for p in out.iterdir() if p not in refused and p.is_file()}
        if any(n.endswith((".csv", ".json")) or DB_NAME.match(n) for n in names):
            return None
        if ANALYSIS_DB in names:
            return (
                f"only {ANALYSIS_DB} is present (communication and step summaries), no "
                "ascend_pytorch_profiler_{rank}.db: copy the whole ASCEND_PROFILER_OUTPUT/, or "
                + ANALYSE_HINT.format(path=path)
            )
        return f"{OUTPUT_DIR}/ holds no trace_view.json, CSV files or ascend_pytorch_profiler_*.db"
    has_raw = any(p.name.startswith("PROF_") or p.name in _RAW_MARKERS for p in path.iterdir())
    if has_raw:
        return "raw data only (PROF_*/FRAMEWORK, never parsed); " + ANALYSE_HINT.format(path=path)
    return f"no {OUTPUT_DIR}/ and no raw PROF_* data: not a profiler output"


def _rank_problems(sessions: list[RankSession], problems: list[Problem]) -> None:
    by_rank: dict[int, list[RankSession]] = defaultdict(list)
    for s in sessions:
        by_rank[s.rank].append(s)
    for rank, group in sorted(by_rank.items()):
        stamps = [s.order_ns for s in group if s.order_ns is not None]
        if len(stamps) != len(set(stamps)):
            paths = ", ".join(str(s.path) for s in group)
            problems.append(
                Problem(
                    "warning",
                    paths,
                    f"rank {rank}: duplicate sessions with the same timestamp (two jobs mixed in one folder?)",
                )
            )
        elif len(group) > 1:
            problems.append(
                Problem(
                    "info",
                    str(group[0].path.parent),
                    f"rank {rank}: {len(group)} sessions, analysed in time order",
                )
            )
    known = {r for r in by_rank if r >= 0}
    listed: set[int] = set()
    for s in sessions:
        for group in (s.metadata.get("parallel_group_info") or {}).values():
            if isinstance(group, dict):  # global_ranks: conformed to ints by discovery
                listed.update(r for r in group.get("global_ranks") or [] if r >= 0)
    missing, expected, shown = _missing_ranks(known, listed)
    if missing:
        more = " ..." if missing > len(shown) else ""
        problems.append(
            Problem(
                "warning",
                "",
                f"missing ranks: {', '.join(map(str, shown))}{more} "
                f"({missing} of {expected} expected)",
            )
        )


def _missing_ranks(known: set[int], listed: set[int], show: int = 20) -> tuple[int, int, list[int]]:
    """How many ranks are missing, of how many expected (0 up to the highest rank found, and
    every rank a parallel group lists), and the first ``show`` of them: counted, never listed
    whole (a rank_id of 2**31 - 1 expects two billion ranks; their set took 4.6 GB)."""
    top = max(known, default=-1)
    beyond = sorted(r for r in listed if r > top)  # every rank found is at most top
    missing = top + 1 - len(known) + len(beyond)
    shown: list[int] = []
    rank = 0
    while len(shown) < show and rank <= top:  # at most len(known) + show steps
        if rank not in known:
            shown.append(rank)
        rank += 1
    return missing, top + 1 + len(beyond), (shown + beyond)[:show]


def input_root(path: str | os.PathLike[str]) -> Path:
    """What the user pointed at, widened to the rank directory when they named a file inside it.

    `run .../ASCEND_PROFILER_OUTPUT` or `run .../ASCEND_PROFILER_OUTPUT/trace_view.json` mean the
    rank session that holds them: its profiler_info and sibling files belong to the analysis.
    """
    resolved = Path(path).resolve()
    if resolved.is_file() and resolved.parent.name == OUTPUT_DIR:
        return resolved.parent.parent
    if resolved.name == OUTPUT_DIR and resolved.is_dir():
        return resolved.parent
    return resolved


def default_out_dir(root: str | os.PathLike[str]) -> Path:
    """Outside the input tree: ./traceanalyzer-out/<name>, or a sibling when cwd is inside root."""
    root = input_root(root)
    cwd = Path.cwd().resolve()
    name = valid_text(root.name)  # a name in GBK, say, as \\xNN: the store's need UTF-8
    if cwd == root or root in cwd.parents:
        return root.parent / f"{name}-traceanalyzer"
    return cwd / "traceanalyzer-out" / name


def only_session(root: str | os.PathLike[str]) -> RankSession | None:
    """The rank session under ``root`` when it holds exactly one usable one, else None (and
    None for anything :func:`discover` would report). Stops walking at a second rank
    directory: cheap whatever the tree holds."""
    try:
        root_path = input_root(root)
        found = _walk(root_path, limit=2) if root_path.is_dir() else []
        if len(found) != 1:
            return None
        problems: list[Problem] = []
        refused = foreign_entries(found[0], os.path.realpath(root_path), False, problems)
        if problems or _unusable(found[0], refused) is not None:
            return None
        return _load_session(found[0], [], refused)
    except OSError:
        return None


def discover(root: str | os.PathLike[str], follow_links: bool = False) -> Discovery:
    """Find every rank session under ``root`` (which may itself be a rank directory, or a file
    or ``ASCEND_PROFILER_OUTPUT/`` inside one). Links that leave ``root`` are reported, and
    followed only with ``follow_links``."""
    root_path = input_root(root)
    if not root_path.exists():
        raise FileNotFoundError(f"{root}: no such file or directory")
    if not root_path.is_dir():
        raise NotADirectoryError(
            f"{root}: not a directory (expected a profiling_data folder or a *_ascend_pt dir)"
        )
    problems: list[Problem] = []
    sessions: list[RankSession] = []
    real_root = os.path.realpath(root_path)
    for path in _walk(root_path, problems=problems, follow_links=follow_links):
        try:
            refused = foreign_entries(path, real_root, follow_links, problems)
            unusable = _unusable(path, refused)
        except OSError as exc:
            unusable = f"unreadable directory ({exc})"
        if unusable is not None:
            problems.append(Problem("error", str(path), unusable))
            continue
        sessions.append(_load_session(path, problems, refused))
    if not sessions and not problems:
        problems.append(
            Problem("error", str(root_path), f"no *_ascend_pt or {OUTPUT_DIR}/ directory found")
        )
    _session_ids(sessions, root_path)
    sessions.sort(key=lambda s: (s.rank, s.order_ns or 0, s.session))
    _rank_problems(sessions, problems)
    return Discovery(sessions=sessions, problems=problems)
