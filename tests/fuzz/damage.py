"""Ways to damage a copy of an export (and of an output directory), each a small function.

Every damage takes a seeded ``random.Random`` and the case's input root and returns a one-line
description of what it did (or None when the tree offers nothing it applies to). They are the
hazards a collection gathered from many hosts really holds: truncations, flipped bytes, JSON of
the wrong shape, deep nesting, long strings, bad encodings, damaged CSV, empty files, files
turned into directories, FIFOs and links to devices; and what a collection sent by someone else
may hold: databases whose tables are views over endless queries, absurd and invalid names,
side files (``db_damage``), links out of the input and folders nested past any recursion limit
(``link_hazard``). ``OUTPUT_DAMAGES`` damage a store written by a first, clean run: links,
FIFOs, a partition damaged in its middle.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import db_hazards, limits

Damage = Callable[[random.Random, Path], "str | None"]

INFO_GLOBS = ("*/profiler_info*.json", "*/profiler_metadata.json")
JSON_GLOBS = (*INFO_GLOBS, "*/ASCEND_PROFILER_OUTPUT/*.json")
CSV_GLOB = "*/ASCEND_PROFILER_OUTPUT/*.csv"
INJECTION = (
    "op` x\n# Injected\n![i](https://evil.example/p.png) [c](javascript:alert(1)) <b>x</b> |\u2028"
)
WEIRD_VALUES: tuple[Any, ...] = (
    "", "²", "9" * 5000, "Level1\x00", -1, 0, 2**63, 2**64 + 1, 1e308, -0.0, True, None,
    [], {}, ["x"], {"a": {"b": []}}, "\ud800", INJECTION,
)  # fmt: skip


def _files(root: Path, *globs: str) -> list[Path]:
    found = {p for g in globs for p in root.glob(g) if p.is_file() and not p.is_symlink()}
    return sorted(found)


def _pick(rng: random.Random, root: Path, *globs: str) -> Path | None:
    files = _files(root, *globs)
    return rng.choice(files) if files else None


def _any_file(rng: random.Random, root: Path) -> Path | None:
    # info and metadata files are small, and the hazards: weigh them up
    globs = rng.choice([INFO_GLOBS, JSON_GLOBS, (CSV_GLOB,), ("**/*",)])
    return _pick(rng, root, *globs) or _pick(rng, root, "**/*")


def _rel(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


# --------------------------------------------------------------------------- bytes


def truncate(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    size = path.stat().st_size
    keep = rng.choice([0, 1, size // 2, max(0, size - 1), rng.randrange(size + 1)])
    with open(path, "r+b") as fh:
        fh.truncate(keep)
    return f"truncate {_rel(root, path)} to {keep} of {size} bytes"


def flip_bytes(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None or not (size := path.stat().st_size):
        return None
    data = bytearray(path.read_bytes())
    count = rng.choice([1, 4, 64])
    for _ in range(count):
        data[rng.randrange(size)] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"flip {count} bit(s) in {_rel(root, path)}"


def insert_bytes(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    data = path.read_bytes()
    at = rng.randrange(len(data) + 1)
    junk = rng.choice(
        [b"\x00" * 16, b"\xff\xfe\xfd", b"\xed\xa0\x80", b"\xc3", os.urandom(64), b"\r\n" * 8,
         b'"', b"}", b"]", b",", b"\\"]
    )  # fmt: skip
    path.write_bytes(data[:at] + junk + data[at:])
    return f"insert {junk[:8]!r}... at byte {at} of {_rel(root, path)}"


def bad_encoding(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    data = path.read_bytes()
    how = rng.choice(["utf-16", "bom", "latin-1 name", "cp1252"])
    if how == "utf-16":
        data = data.decode("utf-8", "replace").encode("utf-16")
    elif how == "bom":
        data = b"\xef\xbb\xbf" + data
    else:
        data = data.replace(b"a", "é".encode("latin-1"), rng.randrange(1, 50))
    path.write_bytes(data)
    return f"re-encode {_rel(root, path)} ({how})"


def empty(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    path.write_bytes(rng.choice([b"", b" \n", b"\x00", b"[", b"{}", b"[]", b"null"]))
    return f"empty {_rel(root, path)}"


def grow_sparse(rng: random.Random, root: Path) -> str | None:
    """A file far larger than any real one, at no disk cost (a hole of zeros at its end)."""
    if (path := _pick(rng, root, *rng.choice([INFO_GLOBS, JSON_GLOBS, (CSV_GLOB,)]))) is None:
        return None
    size = rng.choice([17 << 20, 64 << 20])
    with open(path, "r+b") as fh:
        fh.truncate(size)
    return f"grow {_rel(root, path)} to {size >> 20} MB (sparse zeros)"


# --------------------------------------------------------------------------- file kinds


def to_directory(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    path.unlink()
    path.mkdir()
    (path / "inside.json").write_text("[]")
    return f"replace {_rel(root, path)} by a directory"


def to_fifo(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    path.unlink()
    os.mkfifo(path)
    return f"replace {_rel(root, path)} by a FIFO"


def to_symlink(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    target = rng.choice(["/dev/urandom", "/dev/zero", "/dev/null", "/", "missing", path.name])
    path.unlink()
    path.symlink_to(target)
    return f"replace {_rel(root, path)} by a link to {target}"


def remove(rng: random.Random, root: Path) -> str | None:
    if (path := _any_file(rng, root)) is None:
        return None
    path.unlink()
    return f"remove {_rel(root, path)}"


def directory_hazard(rng: random.Random, root: Path) -> str | None:
    ranks = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    if not ranks:
        return None
    rank = rng.choice(ranks)
    how = rng.choice(["duplicate", "link loop", "output as file", "output to urandom",
                      "no output", "link rank", "empty rank"])  # fmt: skip
    output = rank / "ASCEND_PROFILER_OUTPUT"
    if how == "duplicate":
        shutil.copytree(rank, root / f"{rank.name}-copy_ascend_pt", symlinks=True)
    elif how == "link loop":
        (rank / "loop").symlink_to(root, target_is_directory=True)
    elif how == "link rank":
        (root / f"linked_{rank.name}").symlink_to(rank, target_is_directory=True)
    elif how == "empty rank":
        (root / "empty_ascend_pt").mkdir()
    elif output.is_dir():
        shutil.rmtree(output)
        if how == "output as file":
            output.write_text("not a directory")
        elif how == "output to urandom":
            output.symlink_to("/dev/urandom")
    return f"{how}: {rank.name}"


# --------------------------------------------------------------------------- JSON


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None


def _paths(doc: Any, limit: int = 4000) -> list[list[Any]]:
    """Paths to values of ``doc`` (keys and indices), breadth first, at most ``limit``."""
    found: list[list[Any]] = []
    queue: list[tuple[list[Any], Any]] = [([], doc)]
    while queue and len(found) < limit:
        path, value = queue.pop(0)
        items = (
            value.items() if isinstance(value, dict) else enumerate(value[:50])
            if isinstance(value, list) else ()
        )  # fmt: skip
        for key, child in items:
            found.append([*path, key])
            queue.append(([*path, key], child))
    return found


def _set(doc: Any, path: list[Any], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


def _json_target(rng: random.Random, root: Path) -> tuple[Path, Any] | None:
    path = _pick(rng, root, *rng.choice([INFO_GLOBS, JSON_GLOBS]))
    if path is None or path.stat().st_size > 64 << 20:
        return None
    doc = _load(path)
    return (path, doc) if isinstance(doc, (dict, list)) and doc else None


def _write_with(path: Path, doc: Any, placeholder: str, text: str) -> None:
    raw = json.dumps(doc, ensure_ascii=False)
    path.write_bytes(raw.replace(json.dumps(placeholder), text, 1).encode("utf-8", "surrogatepass"))


def wrong_type(rng: random.Random, root: Path) -> str | None:
    if (target := _json_target(rng, root)) is None:
        return None
    path, doc = target
    where = rng.choice(_paths(doc))
    value = rng.choice(WEIRD_VALUES)
    _set(doc, where, value)
    placeholder = "\x00placeholder\x00"
    if isinstance(value, int) and abs(value) > 2**60:  # a number token, not a string
        _set(doc, where, placeholder)
        _write_with(path, doc, placeholder, str(value))
    else:
        path.write_bytes(json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return f"set {_rel(root, path)}:{'.'.join(map(str, where))} to {str(value)[:20]!r}"


def deep_nesting(rng: random.Random, root: Path) -> str | None:
    if (target := _json_target(rng, root)) is None:
        return None
    path, doc = target
    where = rng.choice(_paths(doc))
    depth = rng.choice([100, 1000, 100_000])
    placeholder = "\x00deep\x00"
    _set(doc, where, placeholder)
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    _write_with(path, doc, placeholder, opener * depth + "1" + closer * depth)
    return f"nest {_rel(root, path)}:{'.'.join(map(str, where))} {depth} deep"


def long_string(rng: random.Random, root: Path) -> str | None:
    """A huge string, often a process or thread name (repeated per row when it is stored)."""
    trace = _pick(rng, root, "*/ASCEND_PROFILER_OUTPUT/trace_view.json")
    size = rng.choice([5000, 1 << 20, 2 << 20, 10 << 20])
    if trace is not None and rng.random() < 0.6:
        events = _load(trace)
        named = [
            e for e in events or []
            if isinstance(e, dict) and e.get("ph") == "M" and isinstance(e.get("args"), dict)
        ]  # fmt: skip
        if named:
            event = rng.choice(named)
            event["args"]["name"] = str(event["args"].get("name")) + "N" * size
            trace.write_text(json.dumps(events))
            return f"{event.get('name')} of pid {event.get('pid')} in {_rel(root, trace)} +{size:,} chars"
    if (target := _json_target(rng, root)) is None:
        return None
    path, doc = target
    where = rng.choice(_paths(doc))
    _set(doc, where, "L" * size)
    path.write_text(json.dumps(doc))
    return f"set {_rel(root, path)}:{'.'.join(map(str, where))} to {size:,} chars"


def odd_names(rng: random.Random, root: Path) -> str | None:
    """Event names that try to break out of Markdown, HTML or a path."""
    if (trace := _pick(rng, root, "*/ASCEND_PROFILER_OUTPUT/trace_view.json")) is None:
        return None
    events = _load(trace)
    if not isinstance(events, list):
        return None
    named = [e for e in events if isinstance(e, dict) and "name" in e]
    for event in rng.sample(named, min(len(named), 20)):
        event["name"] = rng.choice([INJECTION, "../../etc/passwd", "", "\u202e", "a" * 300])
    trace.write_text(json.dumps(events, ensure_ascii=False))
    return f"odd event names in {_rel(root, trace)}"


def top_level(rng: random.Random, root: Path) -> str | None:
    if (path := _pick(rng, root, *JSON_GLOBS)) is None:
        return None
    value = rng.choice(["[]", "{}", '"x"', "5", "null", "[[1]]", '{"traceEvents": []}'])
    path.write_text(value)
    return f"replace {_rel(root, path)} by {value}"


# --------------------------------------------------------------------------- CSV


def csv_damage(rng: random.Random, root: Path) -> str | None:
    if (path := _pick(rng, root, CSV_GLOB)) is None:
        return None
    lines = path.read_bytes().split(b"\n")
    if not lines:
        return None
    how = rng.choice(["drop header column", "extra fields", "open quote", "text in numbers",
                      "header only", "no header", "long field", "blank lines", "crlf",
                      "duplicate header"])  # fmt: skip
    row = rng.randrange(len(lines))
    if how == "drop header column":
        lines[0] = b",".join(lines[0].split(b",")[1:])
    elif how == "extra fields":
        lines[row] += b",x,y,z"
    elif how == "open quote":
        lines[row] = b'"' + lines[row]
    elif how == "text in numbers":
        lines = [lines[0]] + [b",".join(b"NaN" if rng.random() < 0.3 else c for c in line.split(b","))
                              for line in lines[1:]]  # fmt: skip
    elif how == "header only":
        lines = lines[:1]
    elif how == "no header":
        lines = lines[1:]
    elif how == "long field":
        lines[row] += b"," + b"F" * (1 << 20)
    elif how == "blank lines":
        lines.insert(row, b"")
        lines.insert(row, b",,,,")
    elif how == "crlf":
        lines = [line + b"\r" for line in lines]
    else:
        lines.insert(1, lines[0])
    path.write_bytes(b"\n".join(lines))
    return f"csv {how} in {_rel(root, path)}"


# --------------------------------------------------------------------------- Db exports

DB_GLOB = "*/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler*.db"


def db_damage(rng: random.Random, root: Path) -> str | None:
    """One hazard of a received Db export (tests/fuzz/db_hazards.py), on a random database."""
    dbs = _files(root, DB_GLOB)
    if not dbs:
        return None
    db = rng.choice(dbs)
    analysis = db.with_name("analysis.db")
    table = rng.choice(["TASK", "STRING_IDS", "META_DATA", "CANN_API", "PYTORCH_API"])
    hazards: dict[str, Callable[[], str]] = {
        "view": lambda: db_hazards.table_as_view(db, table),
        "virtual": lambda: db_hazards.table_as_virtual(db, rng.choice(["META_DATA", "HOST_INFO"])),
        "generated": lambda: db_hazards.generated_column(db),
        "huge name": lambda: db_hazards.huge_name(
            db, rng.choice([5000, 1 << 20, 5 << 20, 50 << 20])
        ),
        "huge frame": lambda: db_hazards.huge_frame(db, rng.choice([1 << 20, 50 << 20])),
        "unused strings": lambda: db_hazards.unused_strings(db, rng.choice([10_000, 1_000_000])),
        "invalid utf-8": lambda: db_hazards.invalid_utf8(
            db,
            *rng.choice(
                [
                    ("STRING_IDS", "value"),
                    ("HOST_INFO", "hostName"),
                    ("META_DATA", "value"),
                    ("ENUM_API_TYPE", "name"),
                ]
            ),
        ),
        "duplicate ids": lambda: db_hazards.duplicate_ids(db),
        "meta value": lambda: db_hazards.meta_value(
            db,
            rng.choice(["ENV_VARIABLES", "parallel_group_info", "SCHEMA_VERSION", "extra"]),
            rng.choice(
                [
                    None,
                    b"\x00\xff",
                    db_hazards.deep_json(100_000),
                    "{",
                    5,
                    1e308,
                    '{"g": {"global_ranks": ["x"]}}',
                    INJECTION,
                ]
            ),
        ),
        "host name": lambda: db_hazards.host_name(
            db, rng.choice([b"\xff" * 8, None, 7, INJECTION])
        ),
        "pending wal": lambda: db_hazards.pending_wal(db),
        "garbage wal": lambda: db_hazards.garbage_wal(db, rng.choice([0, 32, 1 << 20])),
        "fifo": lambda: db_hazards.as_fifo(
            rng.choice([db, analysis] if analysis.exists() else [db])
        ),
    }
    name = rng.choice(sorted(hazards))
    try:
        return f"{_rel(root, db)}: {hazards[name]()}"
    except sqlite3.Error as exc:  # a table this database lacks
        return f"(could not apply {name}: {exc})"


# --------------------------------------------------------------------------- the input tree


def link_hazard(rng: random.Random, root: Path) -> str | None:
    """Links that lead out of the input (to /, to a sibling collection, to a file elsewhere), a
    loop, and folders nested deeper than any recursion limit."""
    ranks = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    if not ranks:
        return None
    rank = rng.choice(ranks)
    how = rng.choice(["slash", "sibling", "file outside", "loop", "deep", "output out"])
    if how == "slash":
        (root / "slash").symlink_to("/", target_is_directory=True)
    elif how == "sibling":
        sibling = root.parent / "sibling"
        shutil.copytree(rank, sibling / f"other_{rank.name}", symlinks=True)
        (root / "sibling").symlink_to(sibling, target_is_directory=True)
    elif how == "file outside":
        outside = root.parent / "outside.json"
        outside.write_text('{"rank_id": 99}')
        files = _files(rank, "*.json", "ASCEND_PROFILER_OUTPUT/*")
        if not files:
            return None
        target = rng.choice(files)
        target.unlink()
        target.symlink_to(outside)
    elif how == "loop":
        (rank / "ASCEND_PROFILER_OUTPUT" / "loop").symlink_to(root, target_is_directory=True)
    elif how == "deep":
        deep = root / "deep"
        for _ in range(1200):  # one level at a time: mkdir(parents=True) recurses
            deep.mkdir()
            deep = deep / "d"
        shutil.copytree(rank, deep.parent / f"deep_{rank.name}", symlinks=True)
    else:
        output = rank / "ASCEND_PROFILER_OUTPUT"
        moved = root.parent / f"moved_{rank.name}"
        if not output.is_dir():
            return None
        shutil.move(output, moved)
        output.symlink_to(moved, target_is_directory=True)
    return f"{how}: {rank.name}"


INPUT_DAMAGES: dict[str, tuple[Damage, int]] = {
    # name: (damage, weight)
    "truncate": (truncate, 10),
    "flip_bytes": (flip_bytes, 10),
    "insert_bytes": (insert_bytes, 6),
    "bad_encoding": (bad_encoding, 5),
    "empty": (empty, 5),
    "grow_sparse": (grow_sparse, 3),
    "to_directory": (to_directory, 3),
    "to_fifo": (to_fifo, 3),
    "to_symlink": (to_symlink, 5),
    "remove": (remove, 3),
    "directory_hazard": (directory_hazard, 5),
    "wrong_type": (wrong_type, 14),
    "deep_nesting": (deep_nesting, 5),
    "long_string": (long_string, 5),
    "odd_names": (odd_names, 3),
    "top_level": (top_level, 4),
    "csv_damage": (csv_damage, 8),
    "db_damage": (db_damage, 8),
    "link_hazard": (link_hazard, 5),
    # round 3 (tests/fuzz/limits.py)
    "db_times": (limits.db_times, 6),
    "text_times": (limits.text_times, 6),
    "user_patterns": (limits.user_patterns, 3),
    "gbk_folder": (limits.gbk_folder, 2),
}


# --------------------------------------------------------------------------- the output


def _parts(out: Path) -> list[Path]:
    """The stored partitions that are files (an earlier damage may have made one a FIFO or a
    link: opened to damage it again, it would block the campaign itself)."""
    found = (out / "tables").glob("*/rank=*/session=*/part-0.parquet")
    return sorted(p for p in found if p.is_file() and not p.is_symlink())


def out_truncate_part(rng: random.Random, out: Path) -> str | None:
    if not (parts := _parts(out)):
        return None
    part = rng.choice(parts)
    with open(part, "r+b") as fh:
        fh.truncate(rng.randrange(part.stat().st_size))
    return f"truncate stored {_rel(out, part)}"


def out_swap_parts(rng: random.Random, out: Path) -> str | None:
    parts = _parts(out)
    by_table: dict[str, list[Path]] = {}
    for part in parts:
        by_table.setdefault(part.parents[2].name, []).append(part)
    pairs = [ps for ps in by_table.values() if len(ps) > 1]
    if not pairs:
        return None
    first, second = rng.sample(rng.choice(pairs), 2)
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)
    return f"swap stored {_rel(out, first)} and {_rel(out, second)}"


def out_foreign_part(rng: random.Random, out: Path) -> str | None:
    if not (parts := _parts(out)):
        return None
    part = rng.choice(parts)
    planted = part.parents[1] / "session=from-another-collection" / "part-0.parquet"
    planted.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(part, planted)
    return f"plant a foreign partition next to {_rel(out, part)}"


def out_garbage_file(rng: random.Random, out: Path) -> str | None:
    if not out.is_dir():  # a run that found no rank writes no output folder
        return None
    name = rng.choice(
        ["manifest.json", "manifest.journal", ".lock", "ingest.json", "findings.json"]
    )
    caches = sorted((out / ".cache").rglob("*.json")) if (out / ".cache").is_dir() else []
    path = rng.choice(caches) if caches and rng.random() < 0.4 else out / name
    if path.is_dir() and not path.is_symlink():
        return None
    if path.is_symlink() or (path.exists() and not path.is_file()):
        path.unlink()  # a FIFO or link an earlier damage left: written, it would block the fuzzer
    path.write_bytes(rng.choice([os.urandom(256), b"[", b'{"version": 1, "sessions": []}',
                                 b'{"key": "0/../../x", "value": {"outcome": {}}}\n', b""]))  # fmt: skip
    return f"garbage in {_rel(out, path)}"


def out_planted_pickle(rng: random.Random, out: Path) -> str | None:
    # Never loaded: the payload only touches a marker the checker looks for.
    payload = (
        b"cposix\nsystem\n(Vtouch " + str(out / "PWNED").encode() + b"\ntR."
    )  # a protocol-0 pickle of os.system("touch OUT/PWNED")
    for place in (out / ".cache" / "rules", out / ".cache" / "rules" / "rank=0"):
        place.mkdir(parents=True, exist_ok=True)
        (place / "rank=0.pkl").write_bytes(payload)
    return "plant a pickle in the rule cache"


VICTIM = "victim"  # a folder beside OUT and the input: what a link in OUT may point at


def out_link(rng: random.Random, out: Path) -> str | None:
    """An entry of OUT replaced by a link: to the input, to another store, to any file."""
    victim = out.parent / VICTIM
    targets = [victim, victim / "file", out.parent / "in", *sorted((out.parent / "in").glob("*"))]
    parts = _parts(out)
    entries = [
        out / n
        for n in (
            "tables",
            ".lock",
            "manifest.json",
            "manifest.journal",
            "plots",
            ".cache",
            "findings.json",
            "report.html",
        )
    ]
    entries += [p.parent.parent for p in parts[:20]]  # a rank's partitions of one table
    entry, target = rng.choice(entries), rng.choice(targets)
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    elif entry.exists() or entry.is_symlink():
        entry.unlink()
    entry.symlink_to(target)
    return f"{_rel(out, entry)} -> {target}"


def out_fifo(rng: random.Random, out: Path) -> str | None:
    """An entry of OUT replaced by a FIFO (a read would wait for a writer forever)."""
    caches = sorted((out / ".cache").rglob("*")) if (out / ".cache").is_dir() else []
    files = [
        out / n
        for n in (".lock", "manifest.json", "manifest.journal", "findings.json", "ingest.json")
    ]
    entry = rng.choice(files + [c for c in caches if c.is_file()] + _parts(out)[:5])
    entry.unlink(missing_ok=True)
    os.mkfifo(entry)
    return f"{_rel(out, entry)} is a FIFO"


def out_mid_damage(rng: random.Random, out: Path) -> str | None:
    """A stored partition damaged in its middle, its size and footer intact."""
    parts = [p for p in _parts(out) if p.stat().st_size > 2 * (64 << 10) + 256]
    parts = parts or [p for p in _parts(out) if p.stat().st_size > 1024]
    if not parts:
        return None
    part = rng.choice(parts)
    size = part.stat().st_size
    at = rng.randrange(4, max(5, size - (64 << 10) if size > (64 << 10) * 2 else size // 2))
    with open(part, "r+b") as fh:
        fh.seek(at)
        data = fh.read(16)
        fh.seek(at)
        fh.write(bytes(b ^ 0x5A for b in data))
    return f"flip 16 bytes at {at} of {size} in {_rel(out, part)}"


OUTPUT_DAMAGES: dict[str, tuple[Damage, int]] = {
    "out_link": (out_link, 3),
    "out_fifo": (out_fifo, 2),
    "out_mid_damage": (out_mid_damage, 2),
    "out_truncate_part": (out_truncate_part, 3),
    "out_swap_parts": (out_swap_parts, 3),
    "out_foreign_part": (out_foreign_part, 2),
    "out_garbage_file": (out_garbage_file, 3),
    "out_planted_pickle": (out_planted_pickle, 1),
}


def choose(rng: random.Random, damages: dict[str, tuple[Damage, int]]) -> tuple[str, Damage]:
    names = list(damages)
    name = rng.choices(names, weights=[damages[n][1] for n in names])[0]
    return name, damages[name][0]
