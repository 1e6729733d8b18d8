"""A session's side files, the CSV summaries and the communication JSON: parsed beside or after
the trace, what is missing, not collected or unreadable said in the outcome, and a file whose
times lie far from the session's left out (another session's)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from traceanalyzer import outdir
from traceanalyzer.discover import RankSession
from traceanalyzer.ingest.outcome import SessionOutcome
from traceanalyzer.ingest.sink import PartitionSink
from traceanalyzer.parse.comm import parse_communication, parse_communication_matrix
from traceanalyzer.parse.csv_tables import SPECS, CsvDatabase, CsvResult, CsvSpec, parse_csv
from traceanalyzer.schema import TABLES
from traceanalyzer.vocabulary import GENERATIONS

# Side files larger than this are parsed after the trace, not beside its last tables: each CSV
# parse holds a batch's text and its conversion (docs/benchmarks/ingest.md).
SIDE_FILES_ALONGSIDE_BYTES = 32 << 20
COMM_FILES = (
    ("communication.json", "comm_ops", parse_communication),
    ("communication_matrix.json", "comm_links", parse_communication_matrix),
)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # gone since it was listed: its parse says so
        return 0


class SideFiles:
    """The CSV and communication JSON files of a session: parsed into ``sink``, with what went
    wrong kept for the outcome (merged after the trace's, so the order never depends on which
    finished first)."""

    def __init__(
        self,
        session: RankSession,
        sink: PartitionSink,
        scratch: Path,
        filled: frozenset[str] = frozenset(),
    ):
        """``filled``: tables already read from the Db; their files are not read, and the
        files of the other tables are optional (the Db was the session's source). ``scratch``
        takes the private copies of damaged files."""
        self.session, self.sink, self.filled = session, sink, filled
        self.scratch = scratch
        self.missing: list[str] = []
        self.not_collected: list[CsvSpec] = []
        self.warnings: list[str] = []
        self.incomplete: list[str] = []
        self.specs = [spec for spec in SPECS if spec.table not in filled]
        self.comm = [entry for entry in COMM_FILES if entry[1] not in filled]
        names = [spec.file for spec in self.specs] + [name for name, _, _ in self.comm]
        paths = [session.output_dir / name for name in names]
        self.size = sum(_file_size(p) for p in paths if session.readable(p))

    def parse(self, threads: int = 1) -> dict[str, list[str]]:
        """Parse every side file, the CSVs on up to ``threads`` threads (the CSV readers, polars
        and the Parquet writer release the GIL); returns the CSV headers (they tell the generation)."""
        headers: dict[str, list[str]] = {}
        present: list[tuple[CsvSpec, Path]] = []
        for spec in self.specs:
            path = self.session.output_dir / spec.file
            if self.session.readable(path):
                present.append((spec, path))
            elif self.filled:
                continue  # the Db was the source: the file is optional
            elif spec.collected_with:
                self.not_collected.append(spec)
            else:
                self.missing.append(spec.file)
        csv_db = CsvDatabase(self.scratch)

        def parse_one(item: tuple[CsvSpec, Path]) -> CsvResult | Exception:
            try:
                return parse_csv(item[1], item[0], self.sink, csv_db)
            except Exception as exc:
                if outdir.is_output_failure(exc, self.sink.out):
                    raise
                return exc

        # the largest first, so that the last to finish is a small one (results in file order)
        largest_first = sorted(range(len(present)), key=lambda i: -_file_size(present[i][1]))
        try:
            with ThreadPoolExecutor(max(1, min(threads, len(present)))) as pool:
                done = pool.map(parse_one, [present[i] for i in largest_first])
                by_position = dict(zip(largest_first, done, strict=True))
            results = [by_position[i] for i in range(len(present))]
        finally:
            csv_db.close()
        for (spec, path), parsed in zip(present, results, strict=True):  # in file order
            if isinstance(parsed, Exception):
                self.warnings.append(f"{path}: could not be parsed ({parsed})")
                self.incomplete.append(f"{spec.file} (could not be parsed)")
            else:
                headers[spec.file] = parsed.header
                self.warnings += parsed.warnings
        for name, _table, parser in self.comm:
            path = self.session.output_dir / name
            if not self.session.readable(path):
                if not self.filled:
                    self.missing.append(name)
                continue
            try:
                parser(path, self.sink)
            except Exception as exc:
                if outdir.is_output_failure(exc, self.sink.out):
                    raise
                self.warnings.append(f"{path}: could not be parsed ({exc})")
                self.incomplete.append(f"{name} (could not be parsed)")
        return headers

    def report(self, outcome: SessionOutcome) -> None:
        """Into ``outcome`` (its generation already named)."""
        outcome.missing_files += self.missing
        age = GENERATIONS.index(outcome.generation) if outcome.generation in GENERATIONS else -1
        for spec in self.not_collected:
            if spec.written_from in GENERATIONS and age < GENERATIONS.index(spec.written_from):
                outcome.not_in_generation.append(spec.file)
            elif _setting_on(self.session.config, spec.collected_with):
                # asked for (profiler_info says so) and not written: missing, not uncollected
                outcome.missing_files.append(f"{spec.file} ({spec.collected_with} was set)")
            else:
                outcome.not_collected.append(f"{spec.file} ({spec.collected_with})")
        outcome.warnings += self.warnings
        outcome.incomplete_files += self.incomplete


# One profiler session writes all its files on one host clock, seconds apart: a file whose
# times lie farther than this from the session's (its trace, else its directory time) belongs
# to another session (a kernel_details.csv of November beside a trace of January).
_FOREIGN_GAP_NS = 10 * 60 * 10**9


def leave_out_foreign_files(
    sink: PartitionSink, span: tuple[int | None, int | None], outcome: SessionOutcome
) -> None:
    """Empty the tables of side files whose times lie far outside ``span`` (the session's first
    and last time), and say which and why: their rows are another session's."""
    start, end = span
    if start is None:
        return
    end = end if end is not None else start
    for table, (first, last) in sorted(sink.spans.items()):
        gap = max(start - last, first - end)
        if gap <= _FOREIGN_GAP_NS:
            continue
        name = Path(TABLES[table].source).name
        sink.empty(table)
        side = "before" if last < start else "after"
        outcome.warnings.append(
            f"{name} does not belong to this session: its times ({_when(first)} to "
            f"{_when(last)}) lie {_ago(gap)} {side} the session's ({_when(start)} to "
            f"{_when(end)}); left out, not mixed in"
        )
        outcome.incomplete_files.append(f"{name} (another session's: left out)")


def _when(ns: int) -> str:
    import datetime as dt

    try:
        return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


def _ago(ns: int) -> str:
    seconds = ns / 1e9
    for unit, size in (("days", 86_400), ("hours", 3_600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _setting_on(config: dict[str, Any], collected_with: str) -> bool:
    """Whether profiler_info's ``config`` has the ``NAME=True`` setting ``collected_with``
    names on (``common_config.NAME``, or ``experimental_config._NAME``)."""
    name, _, value = collected_with.partition("=")
    if value != "True" or not name.isidentifier():
        return False
    common, experimental = config.get("common_config"), config.get("experimental_config")
    # (a received profiler_info may hold anything: a field of another type says nothing)
    return (isinstance(common, dict) and common.get(name) is True) or (
        isinstance(experimental, dict) and experimental.get(f"_{name}") is True
    )
