"""The benchmarks' large ranks, built from the real G2 Level1 export and cached.

- :func:`build_input`: the real rank-0 Text export with EVERY file tiled by one factor, so the
  side files keep their real share of the rank (about 30% of the trace): trace_view.json's
  events, each CSV's rows, communication.json's and communication_matrix.json's steps.
- :func:`build_db_input`: the real Db export of the same workload, every table's rows repeated
  as often.
- :func:`build_serving_input`: a ``traceanalyzer synth serving`` rank of the same size.
- :func:`build_realistic_collection`: that rank copied to make a collection of ranks.
- :func:`build_moe_input`: a ``traceanalyzer synth moe-ep`` collection of expert-parallel ranks.
- :func:`build_small_collection`: many small ``traceanalyzer synth inference-baseline`` ranks
  (about 120 KB each), for the per-rank fixed cost of a run.

Tile ``k`` of a tiled file is the real one shifted in time by ``k`` spans of the trace (a whole
number of µs, added to the digits of every timestamp: exact, never through a float) with its
ids offset, so that it reads as the next steps of the same run: ProfilerStep#N, ``Step Id``,
``stepN`` numbers follow on (steps stay distinct), flow ids, connection, correlation, Python and
sequence ids are offset by a round power of ten above the real ones (flows still pair), the
ids torch_npu derives from a time (``async_npu`` flows: the device task's start in ns) move
with the time, and collective names ``hcom_<op>__<a>_<n>_<m>`` take the next ``n`` (one op
key per op). Metadata events (``ph: M``) are written once, as a longer trace has them.
``api_statistic.csv`` and ``op_statistic.csv`` are aggregates: a k-times longer run has the
same rows with k-times the counts and totals, so they are scaled, not repeated. Task ids are
kept (the hardware's wrap; every join on them is also on time).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL_RANK = REPO.parent / "shared" / "real_traces" / "g2_level1" / "rank0_ascend_pt"
# The Db export of the same workload (another session of it), tiled as many times as the trace.
REAL_DB_RANK = REPO.parent / "shared" / "real_traces" / "g2_db_level1" / "rank0_ascend_pt"
CACHE = Path(os.environ.get("TRACEANALYZER_BENCH_CACHE", "/tmp/traceanalyzer-bench"))
OUTPUT = "ASCEND_PROFILER_OUTPUT"
TRACE = "trace_view.json"
# Bump when a builder changes what it writes: cached inputs of an older version are rebuilt.
VERSION = 1


def _read(path: Path) -> str:
    """A file's text as it is (its line ends kept: a CSV's CRLF is part of the format)."""
    return path.read_bytes().decode("utf-8")


def tile_copies(mb: int) -> int:
    """How many tiles of the real rank make a trace_view.json of ``mb`` MB."""
    size = (REAL_RANK / OUTPUT / TRACE).stat().st_size
    return max(1, (mb << 20) // size)


def _cached(folder: Path, build: Callable[[Path], Path]) -> Path:
    """``build(folder)``'s rank, built once: a half-built folder (a killed build) is rebuilt."""
    marker = folder / ".complete"
    if marker.is_file():
        return Path(marker.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rank = build(folder)
    marker.write_text(str(rank))
    return rank


def build_input(mb: int) -> Path:
    """The real rank-0 Text export, every file tiled to a ``mb`` MB trace (cached)."""
    folder = CACHE / f"real_tiled_v{VERSION}_{mb}mb"
    return _cached(
        folder, lambda f: tile_text_rank(REAL_RANK, f / "bench_ascend_pt", tile_copies(mb)).rank
    )


def build_db_input(copies: int) -> Path:
    """The real Db export of the same workload, every table tiled ``copies`` times (cached)."""
    folder = CACHE / f"real_tiled_db_v{VERSION}_{copies}x"
    return _cached(folder, lambda f: tile_db_rank(REAL_DB_RANK, f / "bench_db_ascend_pt", copies))


def build_serving_input(mb: int) -> Path:
    """A synthetic serving rank (``traceanalyzer synth serving --target-mb``) of ``mb`` MB."""
    from traceanalyzer.synth import generate

    def build(folder: Path) -> Path:
        (rank,) = generate("serving", folder, ranks=1, target_mb=mb * (1 << 20) / 1e6)
        return rank

    return _cached(CACHE / f"serving_v{VERSION}_{mb}mb", build)


def build_realistic_collection(ranks: int, mb: int) -> Path:
    """``ranks`` copies of :func:`build_input`'s rank, each its own rank (``profiler_info``'s
    ``rank_id``), every other file hard-linked: a collection of realistic ranks at no extra
    bytes on disk (the page cache holds one copy, as a cluster's shared filesystem would not)."""
    source = build_input(mb)
    info = source / "profiler_info_0.json"

    def build(folder: Path) -> Path:
        root = folder / "ranks"
        for rank in range(ranks):
            target = root / f"rank{rank}_ascend_pt"
            shutil.copytree(
                source, target, copy_function=os.link, ignore=shutil.ignore_patterns(info.name)
            )
            doc = json.loads(info.read_text("utf-8"))
            doc["rank_id"] = rank
            (target / f"profiler_info_{rank}.json").write_text(json.dumps(doc, indent=4))
        return root

    return _cached(CACHE / f"real_tiled_v{VERSION}_{mb}mb_x{ranks}", build)


def build_moe_input(ranks: int, mb: int) -> Path:
    """A ``traceanalyzer synth moe-ep`` collection: ``ranks`` expert-parallel ranks of ``mb`` MB
    each (one hot expert rank), for the MoE path's share of a run."""
    from traceanalyzer.synth import generate

    def build(folder: Path) -> Path:
        generate("moe-ep", folder / "ranks", ranks=ranks, target_mb=mb * (1 << 20) / 1e6)
        return folder / "ranks"

    return _cached(CACHE / f"moe_v{VERSION}_{ranks}x{mb}mb", build)


SMALL_SCENARIO = "inference-baseline"
# 4 steps of one layer: about 120 KB of files per rank (more at thousands of ranks, as every
# rank's profiler_metadata.json lists the whole group)
SMALL_KNOBS = {"steps": 4, "layers": 1}


def _rank_id(rank: Path) -> int:
    """The rank id a synth rank directory's ``profiler_info_<rank>.json`` names."""
    (info,) = rank.glob("profiler_info_*.json")
    return int(info.stem.rsplit("_", 1)[1])


def build_small_collection(ranks: int, of: int | None = None) -> Path:
    """A collection of ``ranks`` small ranks (``traceanalyzer synth inference-baseline`` with
    :data:`SMALL_KNOBS`), cached. With ``of``: ranks 0 to ``ranks - 1`` of the ``of``-rank
    collection, their files hard-linked (the same bytes per rank, so that two sizes of
    collection differ only in how many ranks they hold). Generating takes about 5 ms a rank,
    so every rank is generated (each its own trace and ids), none copied. Checked: discovery
    finds ``ranks`` distinct ranks."""
    from traceanalyzer.discover import discover
    from traceanalyzer.synth import generate

    if of is not None and not 1 <= ranks <= of:
        raise ValueError(f"a subset of 1 to {of} ranks, not {ranks}")

    def build(folder: Path) -> Path:
        root = folder / "ranks"
        if of is None or of == ranks:
            generate(SMALL_SCENARIO, root, ranks=ranks, **SMALL_KNOBS)
        else:
            source = build_small_collection(of)
            root.mkdir()
            for rank in sorted(source.iterdir()):
                if _rank_id(rank) < ranks:
                    shutil.copytree(rank, root / rank.name, copy_function=os.link)
        found = {s.rank for s in discover(root).sessions}
        if found != set(range(ranks)):
            raise RuntimeError(f"{root}: discovery found {len(found)} ranks, not {ranks}")
        return root

    name = f"small_v{VERSION}_{ranks}" + (f"_of{of}" if of not in (None, ranks) else "")
    return _cached(CACHE / name, build)


# --------------------------------------------------------------------------- the template


@dataclass
class _Template:
    """A text with holes: numbers that move with the tile. ``static[i]`` comes before hole
    ``i``; a hole is (its value in tile 0, its family, its decimals). In tile ``k`` a hole is
    its value plus ``k`` times its family's step, written with as many decimals."""

    static: list[str] = field(default_factory=lambda: [""])
    holes: list[tuple[int, str, int]] = field(default_factory=list)

    def text(self, piece: str) -> None:
        self.static[-1] += piece

    def hole(self, value: int, family: str, decimals: int = 0) -> None:
        self.holes.append((value, family, decimals))
        self.static.append("")

    def render(self, steps: dict[str, int], k: int) -> str:
        shift = {family: k * step for family, step in steps.items()}
        out = [self.static[0]]
        for (value, family, decimals), after in zip(self.holes, self.static[1:], strict=True):
            digits = str(value + shift[family])
            out.append(f"{digits[:-decimals]}.{digits[-decimals:]}" if decimals else digits)
            out.append(after)
        return "".join(out)


def _decimal_units(text: str) -> tuple[int, int]:
    """``"1736408883704643.212"`` -> (1736408883704643212, 3): the digits as one integer, and
    how many of them are decimals."""
    whole, _, frac = text.partition(".")
    return int(whole + frac), len(frac)


def _us_family(decimals: int) -> str:
    """The family of a time in µs written with ``decimals`` decimals (its step: the span)."""
    return f"us{decimals}"


def _round_step(top: int) -> int:
    """An id step above every id of a family: the next power of ten (ids stay readable)."""
    return 10 ** len(str(max(top, 1)))


_HCOM = re.compile(r"(hcom_[A-Za-z]+__\d+_)(\d+)(_\d+)")
_STEP_NAME = re.compile(r"(ProfilerStep#)(\d+)")
_TS = re.compile(r'("ts": "?)(\d+(?:\.\d+)?)')
# args that are ids of a family (a value of -1 is "none", left alone)
_ARG_IDS = {
    "connection_id": "conn",
    "correlation_id": "corr",
    "Python id": "py",
    "Python parent id": "py",
    "Sequence number": "seq",
}
# the flow categories whose ids are one of those families (others: a family per category)
_FLOW_FAMILY = {"HostToDevice": "conn", "async_task_queue": "corr", "fwdbwd": "seq"}
# ... and the one whose ids are a time: the device task's start in ns
_FLOW_NS = "async_npu"


@dataclass
class TiledRank:
    rank: Path
    copies: int
    span_us: int  # the shift from one tile to the next
    steps: dict[str, int]  # every family's step per tile


# --------------------------------------------------------------------------- trace_view.json


def _events(text: str) -> Iterator[tuple[str, dict]]:
    """The raw text and the decoded object of every event of a JSON array."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "]":
            return
        event, end = decoder.raw_decode(text, pos)
        yield text[pos:end], event
        pos = end


class _Ids:
    """The largest value seen per id family, and the families' steps once all are seen."""

    def __init__(self) -> None:
        self.top: dict[str, int] = {}

    def see(self, family: str, value: int) -> None:
        self.top[family] = max(self.top.get(family, 0), value)


def _trace_template(text: str, ids: _Ids) -> tuple[_Template, int, int]:
    """The trace's events (all but metadata) as one template, with the first ``ts`` and the
    last end in ns."""
    template = _Template()
    first, last, written = None, 0, False
    for raw, event in _events(text):
        ph = event.get("ph")
        ts = event.get("ts")
        if ts is not None:
            units, decimals = _decimal_units(str(ts))
            ns = units * 10 ** (3 - decimals) if decimals <= 3 else units // 10 ** (decimals - 3)
            first = ns if first is None else min(first, ns)
            last = max(last, ns + math.ceil(float(event.get("dur") or 0) * 1000))
        if ph == "M":
            continue
        holes: list[tuple[int, int, int, str, int]] = []  # start, end, value, family, decimals
        for m in _TS.finditer(raw):
            value, decimals = _decimal_units(m.group(2))
            holes.append((m.start(2), m.end(2), value, _us_family(decimals), decimals))
        args = event.get("args") or {}
        for key, family in _ARG_IDS.items():
            value = args.get(key)
            if isinstance(value, int) and value >= 0:
                m = re.search(rf'"{re.escape(key)}": ({value})\b', raw)
                holes.append((m.start(1), m.end(1), value, family, 0))
                ids.see(family, value)
        if ph in ("s", "f", "t") and "id" in event:
            cat = event.get("cat") or ""
            value = int(event["id"])
            if cat == _FLOW_NS:
                family = "ns"
            else:
                family = _FLOW_FAMILY.get(cat, f"flow:{cat}")
                # ids far above the family's (HostToDevice's 20-digit ones) are a family apart
                if len(str(value)) > 12:
                    family += ":wide"
                ids.see(family, value)
            m = re.search(r'"id": "?(\d+)', raw)
            holes.append((m.start(1), m.end(1), value, family, 0))
            m = re.search(rf'"name": "HostToDevice({value})"', raw)
            if m:
                holes.append((m.start(1), m.end(1), value, family, 0))
        name = str(event.get("name") or "")
        for m in _STEP_NAME.finditer(raw) if "ProfilerStep#" in name else ():
            holes.append((m.start(2), m.end(2), int(m.group(2)), "step", 0))
            ids.see("step", int(m.group(2)))
        for m in _HCOM.finditer(raw) if "hcom_" in raw else ():
            holes.append((m.start(2), m.end(2), int(m.group(2)), "op", 0))
            ids.see("op", int(m.group(2)))
        if written:
            template.text(", ")
        written = True
        pos = 0
        for start, end, value, family, decimals in sorted(holes):
            template.text(raw[pos:start])
            template.hole(value, family, decimals)
            pos = end
        template.text(raw[pos:])
    return template, first or 0, last


# --------------------------------------------------------------------------- CSV files

# Absolute times (µs) and step numbers, by header; every other field is kept as it is.
_CSV_TIMES = {
    "Start Time(us)",
    "Task Start Time(us)",
    "Timestamp(us)",
    "Allocation Time(us)",
    "Release Time(us)",
    "Active Release Time(us)",
    "task_start(us)",
    "task_stop(us)",
}
_CSV_STEPS = {"Step Id", "Step"}
# Aggregates over the run: a longer run has the same rows, these columns scaled.
_CSV_TOTALS = {
    "api_statistic.csv": {"Time(us)", "Count"},
    "op_statistic.csv": {"Count", "Total Time(us)"},
}
_FIELD = re.compile(r'"(?:[^"]|"")*"|[^,\r\n]*')
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _csv_rows(text: str) -> Iterator[list[tuple[str, str]]]:
    """Each row of a CSV text as its raw fields, each with what follows it (``,``, the line's
    end, or nothing at the end of the file): written back, they are the text byte for byte."""
    pos, row = 0, []
    while pos < len(text):
        m = _FIELD.match(text, pos)
        pos = m.end()
        for sep in (",", "\r\n", "\n"):
            if text.startswith(sep, pos):
                break
        else:
            sep = ""
        row.append((m.group(0), sep))
        pos += len(sep)
        if sep != ",":
            yield row
            row = []
    if row:
        yield row


def _csv_template(text: str, ids: _Ids) -> tuple[str, _Template]:
    """A CSV's header line, and its rows as a template."""
    rows = _csv_rows(text)
    header = next(rows)
    names = [raw.strip().strip('"') for raw, _ in header]
    template = _Template()
    for row in rows:
        for i, (raw, sep) in enumerate(row):
            name = names[i] if i < len(names) else ""
            number = _NUMBER.search(raw) if name in _CSV_TIMES or name in _CSV_STEPS else None
            if number and name in _CSV_TIMES:
                value, decimals = _decimal_units(number.group(0))
                template.text(raw[: number.start()])
                template.hole(value, _us_family(decimals), decimals)
                template.text(raw[number.end() :] + sep)
            elif number and re.fullmatch(r"\d+", number.group(0)):
                ids.see("step", int(number.group(0)))
                template.text(raw[: number.start()])
                template.hole(int(number.group(0)), "step")
                template.text(raw[number.end() :] + sep)
            elif "hcom_" in raw:
                pos = 0
                for m in _HCOM.finditer(raw):
                    ids.see("op", int(m.group(2)))
                    template.text(raw[pos : m.start(2)])
                    template.hole(int(m.group(2)), "op")
                    pos = m.end(2)
                template.text(raw[pos:] + sep)
            else:
                template.text(raw + sep)
    return "".join(raw + sep for raw, sep in header), template


def _scaled_totals(text: str, columns: set[str], copies: int) -> str:
    """An aggregate CSV as a run ``copies`` times as long writes it: totals and counts times
    ``copies`` (exact, in decimal), the rest as it is."""
    rows = list(_csv_rows(text))
    names = [raw.strip() for raw, _ in rows[0]]
    out = []
    for n, row in enumerate(rows):
        for i, (raw, sep) in enumerate(row):
            if n and i < len(names) and names[i] in columns and _NUMBER.fullmatch(raw):
                raw = str(Decimal(raw) * copies)
            out.append(raw + sep)
    return "".join(out)


# --------------------------------------------------------------------------- communication


def _tile_comm(data: dict, copies: int, steps: dict[str, int], span_us: int) -> dict:
    """communication(_matrix).json's steps, one per tile and step: ``stepN`` numbered on, op
    keys and ``Op Name`` renamed (the next op numbers), start times shifted."""

    def op(text: str, k: int) -> str:
        return _HCOM.sub(lambda m: f"{m[1]}{int(m[2]) + k * steps['op']}{m[3]}", text)

    def moved(value: object, k: int) -> object:
        if isinstance(value, dict):
            return {
                op(key, k): (
                    float(Decimal(repr(v)) + k * span_us)
                    if key == "Start Timestamp(us)" and isinstance(v, int | float)
                    else op(v, k)
                    if key == "Op Name" and isinstance(v, str)
                    else moved(v, k)
                )
                for key, v in value.items()
            }
        return value

    out: dict = {}
    for k in range(copies):
        for step, body in data.items():
            m = re.fullmatch(r"step(\d+)", step)
            key = f"step{int(m[1]) + k * steps['step']}" if m else step
            tile = moved(body, k)
            if key in out:  # no step numbers: every tile's ops under the one key
                for kind, ops in tile.items():
                    out[key].setdefault(kind, {}).update(ops)
            else:
                out[key] = tile
    return out


# --------------------------------------------------------------------------- the Text rank


def tile_text_rank(src: Path, dst: Path, copies: int) -> TiledRank:
    """``src`` (a real Text rank dir) with every file tiled ``copies`` times, into ``dst``."""
    shutil.copytree(src, dst)
    out = dst / OUTPUT
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    ids = _Ids()
    text = _read(src / OUTPUT / TRACE)
    trace, first, last = _trace_template(text, ids)
    csvs = {}
    for path in sorted((src / OUTPUT).glob("*.csv")):
        if path.name not in _CSV_TOTALS:
            csvs[path.name] = _csv_template(_read(path), ids)
    comm = {
        name: json.loads((src / OUTPUT / name).read_text(encoding="utf-8"))
        for name in ("communication.json", "communication_matrix.json")
        if (src / OUTPUT / name).is_file()
    }
    for data in comm.values():  # step and op numbers named only here count too
        for step, body in data.items():
            if m := re.fullmatch(r"step(\d+)", step):
                ids.see("step", int(m[1]))
            for m in _HCOM.finditer(json.dumps(body)):
                ids.see("op", int(m[2]))
    # one µs past the last end: a tile's events never touch the next one's
    span_us = (last - first + 999) // 1000 + 1
    steps = {family: _round_step(top) for family, top in ids.top.items()}
    # steps and ops follow on: tile k's are the next ones of the same run
    steps["step"] = ids.top.get("step", 0) - _min_step(text, csvs) + 1
    steps["op"] = ids.top.get("op", -1) + 1
    steps["ns"] = span_us * 1000
    for decimals in range(10):
        steps[_us_family(decimals)] = span_us * 10**decimals
    for family in {h[1] for t in [trace, *(t for _, t in csvs.values())] for h in t.holes}:
        steps.setdefault(family, _round_step(0))

    with open(out / TRACE, "w", encoding="utf-8") as fh:
        fh.write(text.rstrip()[:-1].rstrip())  # tile 0: the real file, less its closing "]"
        for k in range(1, copies):
            fh.write(", ")
            fh.write(trace.render(steps, k))
        fh.write("]")
    for name, (header, rows) in csvs.items():
        with open(out / name, "w", encoding="utf-8", newline="") as fh:
            fh.write(header)
            for k in range(copies):
                fh.write(rows.render(steps, k))
    for name, columns in _CSV_TOTALS.items():
        if (src / OUTPUT / name).is_file():
            scaled = _scaled_totals(_read(src / OUTPUT / name), columns, copies)
            (out / name).write_bytes(scaled.encode("utf-8"))
    for name, data in comm.items():
        tiled = _tile_comm(data, copies, steps, span_us)
        (out / name).write_text(json.dumps(tiled, ensure_ascii=False), encoding="utf-8")
    for info in dst.glob("profiler_info*.json"):  # the collection ends with the last tile
        data = json.loads(info.read_text(encoding="utf-8"))
        end = data.get("end_info") or {}
        for key in ("collectionTimeEnd", "MonotonicTimeEnd"):
            if isinstance(end.get(key), int):
                end[key] += (copies - 1) * span_us * 1000
        info.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return TiledRank(dst, copies, span_us, steps)


def _min_step(text: str, csvs: dict[str, tuple[str, _Template]]) -> int:
    found = [int(m[2]) for m in _STEP_NAME.finditer(text)]
    found += [v for _, t in csvs.values() for v, family, _ in t.holes if family == "step"]
    return min(found, default=0)


# --------------------------------------------------------------------------- the Db rank

# Tables of one row per session (or a dictionary): never repeated.
_DB_ONCE = {
    "STRING_IDS",
    "META_DATA",
    "HOST_INFO",
    "NPU_INFO",
    "RANK_DEVICE_MAP",
    "SESSION_TIME_INFO",
    "status_info",
    "sqlite_sequence",
}
# Columns that are a time in ns, in any table (PYTORCH_API keeps its as text).
_DB_TIMES = {
    "startNs",
    "endNs",
    "timestampNs",
    "timestamp",
    "allocationTime",
    "releaseTime",
    "activeReleaseTime",
}
# Id columns and their family: (table, column) first, then the column in any table.
_DB_TABLE_IDS = {
    ("CONNECTION_IDS", "id"): "connid",
    ("PYTORCH_API", "connectionId"): "connid",  # PYTORCH_API's is CONNECTION_IDS' id
    ("PYTORCH_API", "sequenceNumber"): "seq",
    ("PYTORCH_API", "callchainId"): "chain",
    ("PYTORCH_CALLCHAINS", "id"): "chain",
    ("STEP_TIME", "id"): "step",
}
_DB_IDS = {"connectionId": "conn", "globalTaskId": "task", "opId": "opid"}
# Columns holding STRING_IDS ids of names that move with the tile (ProfilerStep#N, hcom ops).
_DB_NAMES = {"name", "opName"}


def _db_family(table: str, column: str) -> str | None:
    return _DB_TABLE_IDS.get((table, column)) or _DB_IDS.get(column)


def tile_db_rank(src: Path, dst: Path, copies: int) -> Path:
    """``src`` (a real Db rank dir) with every event table's rows repeated ``copies`` times
    into ``dst``: times shifted by the span per copy, ids offset, step and op names numbered
    on (new STRING_IDS), analysis.db's steps and ops alike."""
    shutil.copytree(src, dst)
    out = dst / OUTPUT
    for path in [dst, *dst.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    db = next(out.glob("ascend_pytorch_profiler*.db"))
    con = sqlite3.connect(db)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    columns = {t: [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')] for t in tables}
    tiled = [t for t in tables if t not in _DB_ONCE and not t.startswith("ENUM_")]

    def extent(fn: str) -> int:
        values = [
            con.execute(f'SELECT {fn}(CAST("{c}" AS INTEGER)) FROM "{t}"').fetchone()[0]
            for t in tiled
            for c in columns[t]
            if c in ("startNs", "endNs")
        ]
        return (min if fn == "min" else max)(v for v in values if v is not None)

    span_ns = ((extent("max") - extent("min") + 999) // 1000 + 1) * 1000
    top: dict[str, int] = {}
    for t in tiled:
        for c in columns[t]:
            if family := _db_family(t, c):
                found = con.execute(f'SELECT max("{c}") FROM "{t}"').fetchone()[0] or 0
                top[family] = max(top.get(family, 0), found)
    steps = {family: _round_step(value) for family, value in top.items()}
    first_step = (
        con.execute("SELECT min(id) FROM STEP_TIME").fetchone()[0]
        if "STEP_TIME" in tables
        else None
    )
    strings = dict(con.execute("SELECT id, value FROM STRING_IDS"))
    numbers = [int(m[2]) for v in strings.values() for m in _STEP_NAME.finditer(v or "")]
    if first_step is not None:
        steps["step"] = top["step"] - first_step + 1
        numbers.append(first_step)
    else:
        steps["step"] = max(numbers, default=0) - min(numbers, default=0) + 1
    analysis = out / "analysis.db"
    ops = [int(m[2]) for v in strings.values() for m in _HCOM.finditer(v or "")]
    steps["op"] = max(ops, default=-1) + 1

    def renamed(text: str, k: int) -> str:
        text = _STEP_NAME.sub(lambda m: f"{m[1]}{int(m[2]) + k * steps['step']}", text)
        return _HCOM.sub(lambda m: f"{m[1]}{int(m[2]) + k * steps['op']}{m[3]}", text)

    # New names (ProfilerStep#51, hcom_..._4_1) for each copy, and the map to them.
    con.execute(
        "CREATE TEMP TABLE name_map (k INTEGER, old INTEGER, new INTEGER, PRIMARY KEY (k, old))"
    )
    by_value = {v: i for i, v in strings.items()}
    next_id = max(strings, default=0) + 1
    moving = {i: v for i, v in strings.items() if v and (_STEP_NAME.search(v) or _HCOM.search(v))}
    for k in range(1, copies):
        for old, value in moving.items():
            new_value = renamed(value, k)
            if new_value not in by_value:
                con.execute(
                    "INSERT INTO STRING_IDS (id, value) VALUES (?, ?)", (next_id, new_value)
                )
                by_value[new_value], next_id = next_id, next_id + 1
            con.execute("INSERT INTO name_map VALUES (?, ?, ?)", (k, old, by_value[new_value]))
    for table in tiled:
        # An AUTOINCREMENT id is left to SQLite; every other column is copied, moved.
        cols = [c for c in columns[table] if not (table == "OVERLAP_ANALYSIS" and c == "id")]
        last = con.execute(f'SELECT coalesce(max(rowid), 0) FROM "{table}"').fetchone()[0]
        for k in range(1, copies):
            exprs = []
            for c in cols:
                family = _db_family(table, c)
                if c in _DB_TIMES:
                    moved = f'CAST("{c}" AS INTEGER) + {k * span_ns}'
                    # a time kept as text stays text
                    exprs.append(
                        f"CASE WHEN typeof(\"{c}\") = 'text' THEN CAST({moved} AS TEXT) "
                        f'WHEN "{c}" IS NULL THEN NULL ELSE {moved} END'
                    )
                elif family:
                    exprs.append(
                        f'CASE WHEN "{c}" >= 0 THEN "{c}" + {k * steps[family]} ELSE "{c}" END'
                    )
                elif c in _DB_NAMES and moving:
                    exprs.append(
                        f'coalesce((SELECT new FROM name_map WHERE k = {k} AND old = "{c}"), "{c}")'
                    )
                else:
                    exprs.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(
                f'INSERT INTO "{table}" ({names}) SELECT {", ".join(exprs)} FROM "{table}" '
                f"WHERE rowid <= {last}"
            )
    if "SESSION_TIME_INFO" in tables:
        con.execute(
            f"UPDATE SESSION_TIME_INFO SET endTimeNs = endTimeNs + {(copies - 1) * span_ns}"
        )
    con.commit()
    con.execute("VACUUM")
    con.close()
    if analysis.is_file():
        _tile_analysis_db(analysis, copies, steps, span_ns // 1000, renamed)
    for info in dst.glob("profiler_info*.json"):
        data = json.loads(info.read_text(encoding="utf-8"))
        end = data.get("end_info") or {}
        for key in ("collectionTimeEnd", "MonotonicTimeEnd"):
            if isinstance(end.get(key), int):
                end[key] += (copies - 1) * span_ns
        info.write_text(json.dumps(data, indent=4), encoding="utf-8")
    return dst


def _tile_analysis_db(
    path: Path, copies: int, steps: dict[str, int], span_us: int, renamed: Callable[[str, int], str]
) -> None:
    """analysis.db's communication and step tables, a copy per tile: ``step`` numbered on, op
    names renamed, start times (µs) shifted."""
    con = sqlite3.connect(path)

    def step(text: object, k: int) -> object:
        if not isinstance(text, str):
            return text
        m = re.fullmatch(r"(step)?(\d+)", text)
        return f"{m[1] or ''}{int(m[2]) + k * steps['step']}" if m else text

    con.create_function("tile_step", 2, step, deterministic=True)
    con.create_function(
        "tile_name", 2, lambda t, k: renamed(t, k) if isinstance(t, str) else t, deterministic=True
    )
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]
        last = con.execute(f'SELECT coalesce(max(rowid), 0) FROM "{table}"').fetchone()[0]
        for k in range(1, copies):
            exprs = []
            for c in cols:
                if c == "step":
                    exprs.append(f'tile_step("{c}", {k})')
                elif c in ("hccl_op_name", "op_name"):
                    exprs.append(f'tile_name("{c}", {k})')
                elif c == "start_timestamp":
                    exprs.append(f'"{c}" + {k * span_us}')
                else:
                    exprs.append(f'"{c}"')
            names = ", ".join(f'"{c}"' for c in cols)
            con.execute(
                f'INSERT INTO "{table}" ({names}) SELECT {", ".join(exprs)} FROM "{table}" '
                f"WHERE rowid <= {last}"
            )
    con.commit()
    con.execute("VACUUM")
    con.close()
