"""Run fuzz cases: damage a copy of an export, run ``traceanalyzer run`` on it, check the outcome.

A case passes when the run ends with a documented exit code (0-4), prints no Traceback, takes
at most 60 s, leaves its input and everything beside it but ``OUT`` byte for byte as it was
(a link planted in OUT may point there), never runs code planted in the output or the input,
and (cases run in a subprocess, where memory is measured) peaks at no more than 3x the resident
memory of a clean run of the same export. Most cases run in this process (fast: the imports
are paid once); every ``subprocess_every``-th runs as a fresh process, which measures memory.
Case ``i`` of seed ``s`` is the same case on every machine: ``--seed s --only i`` replays it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from . import limits
from .damage import INPUT_DAMAGES, OUTPUT_DAMAGES, VICTIM, choose

_D = TypeVar("_D")
REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
REAL = REPO.parent / "shared" / "real_traces"  # as tests/conftest.py finds the real exports
EXIT_CODES = {0, 1, 2, 3, 4}  # README "Exit codes"
CASE_SECONDS = 60
RSS_FACTOR = 3.0
ENVIRONMENT_SHARE = 0.05  # cases run with bad values of the variables the CLI reads or sets

# Runs the CLI in a fresh interpreter and writes its peak RSS (KiB, itself or a worker, the
# larger) to argv[1], however the run ends. Its own peak is VmHWM, not ru_maxrss: Linux keeps
# ru_maxrss across exec, so a child of a large process would report its parent's peak.
_WRAPPER = """
import re, resource, sys
try:
    from traceanalyzer.cli import main
    main(sys.argv[2:], prog_name="traceanalyzer")
finally:
    status = open("/proc/self/status").read()
    own = int(re.search(r"VmHWM:\\s+(\\d+)", status).group(1))
    peak = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    open(sys.argv[1], "w").write(str(peak))
"""


def bases(work: Path | None = None) -> list[Path]:
    """The exports cases damage: every bundled sample, a synthetic Db export (written into
    ``work``), and the real exports when present."""
    found = sorted(p for p in SAMPLES.iterdir() if p.is_dir())
    if work is not None:
        found.append(synthetic_db(work))
    if REAL.is_dir():
        found += sorted(p for p in REAL.iterdir() if p.is_dir())
    return found


def synthetic_db(work: Path) -> Path:
    """A two-rank Db export of the baseline scenario (the bundled samples are Text exports)."""
    from traceanalyzer.synth.generate import generate

    root = work / "synthetic_db"
    if not root.is_dir():
        generate("inference-baseline", root, ranks=2, export="db")
    return root


@dataclass
class Case:
    index: int
    base: str
    mode: str  # "in-process" | "subprocess"
    damages: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    exit_code: int | None = None
    seconds: float = 0.0
    rss_mb: float | None = None
    rss_ratio: float | None = None
    failures: list[str] = field(default_factory=list)


@dataclass
class Summary:
    seed: int
    cases: list[Case]
    seconds: float

    @property
    def failed(self) -> list[Case]:
        return [c for c in self.cases if c.failures]

    def to_dict(self) -> dict[str, object]:
        ratios = [c.rss_ratio for c in self.cases if c.rss_ratio is not None]
        return {
            "seed": self.seed,
            "cases": len(self.cases),
            "failed": len(self.failed),
            "subprocess_cases": sum(c.mode == "subprocess" for c in self.cases),
            "exit_codes": dict(sorted(Counter(c.exit_code for c in self.cases).items(), key=str)),
            "damage_kinds": dict(Counter(k for c in self.cases for k in c.kinds).most_common()),
            "bases": dict(Counter(c.base for c in self.cases).most_common()),
            "mean_seconds_by_base": {
                base: round(sum(c.seconds for c in group) / len(group), 2)
                for base, group in _by(self.cases, lambda c: c.base).items()
            },
            "mean_seconds_by_mode": {
                mode: round(sum(c.seconds for c in group) / len(group), 2)
                for mode, group in _by(self.cases, lambda c: c.mode).items()
            },
            "max_case_seconds": max((c.seconds for c in self.cases), default=0.0),
            "slowest_cases": [
                {"index": c.index, "base": c.base, "seconds": c.seconds, "damages": c.damages}
                for c in sorted(self.cases, key=lambda c: -c.seconds)[:5]
            ],
            "largest_rss_cases": [
                {
                    "index": c.index,
                    "base": c.base,
                    "rss_mb": c.rss_mb,
                    "ratio": c.rss_ratio,
                    "damages": c.damages,
                }
                for c in sorted(self.cases, key=lambda c: -(c.rss_ratio or 0))[:5]
                if c.rss_ratio is not None
            ],
            "mean_case_seconds": round(self.seconds / max(1, len(self.cases)), 3),
            "max_rss_ratio": max(ratios, default=None),
            "max_rss_mb": max((c.rss_mb for c in self.cases if c.rss_mb), default=None),
            "campaign_seconds": round(self.seconds, 1),
            "failures": [asdict(c) for c in self.failed],
        }


def _by(cases: list[Case], key: Callable[[Case], str]) -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(key(case), []).append(case)
    return dict(sorted(groups.items()))


# --------------------------------------------------------------------------- the input, unchanged


def _tree(root: Path) -> list[Path]:
    """Every entry under ``root``, links not followed, parents first; a stack of our own (a
    damage nests folders past any recursion limit)."""
    found, stack = [], [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            found.append(Path(entry.path))
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return found


def remove_tree(root: Path) -> None:
    """``shutil.rmtree`` without its recursion: deepest entries first."""
    for path in reversed(_tree(root)):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    with contextlib.suppress(OSError):
        root.rmdir()


def snapshot(root: Path, skip: Path | None = None) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` (but ``skip`` and what is in it), links not followed: kind,
    and for files size, mtime, hash. Nothing but regular files is opened (a FIFO or a link to
    a device is recorded, not read)."""
    entries: dict[str, tuple[object, ...]] = {}
    for path in _tree(root):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        info = path.lstat()
        rel = path.relative_to(root).as_posix()
        if stat.S_ISLNK(info.st_mode):
            entries[rel] = ("link", os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            entries[rel] = ("file", info.st_size, info.st_mtime_ns, digest)
        elif stat.S_ISDIR(info.st_mode):
            entries[rel] = ("dir",)
        else:
            entries[rel] = ("other", stat.S_IFMT(info.st_mode))
    return entries


# --------------------------------------------------------------------------- running the CLI


def run_in_process(args: list[str]) -> tuple[int | None, str, list[str]]:
    from click.testing import CliRunner

    from traceanalyzer import interrupts
    from traceanalyzer.cli import main

    failures = []
    over: list[bool] = []

    def on_alarm(signum: int, frame: object) -> None:
        # the case is over time: stop it as Ctrl-C would (nothing in the tool may swallow it;
        # a rule's own KeyboardInterrupt is another matter, see traceanalyzer.interrupts)
        over.append(True)
        interrupts.on_signal(signum, frame)  # type: ignore[arg-type]

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        result = CliRunner().invoke(main, args, catch_exceptions=True)
    except KeyboardInterrupt:
        result = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    if over or result is None:
        return None, "", [f"over {CASE_SECONDS} s"]
    output = result.output  # stdout and stderr, interleaved
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        trace = "".join(traceback.format_exception(*result.exc_info)[-3:])
        failures.append(f"raised {type(result.exception).__name__}: {trace.strip()[-600:]}")
    return result.exit_code, output, failures


def run_subprocess(
    args: list[str], env: dict[str, str] | None = None
) -> tuple[int | None, str, list[str], float | None]:
    """The CLI in a fresh process (``env``: variables set for it); its exit code, output,
    failures and peak RSS in MB."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, rss.name, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
        try:
            output, _ = proc.communicate(timeout=CASE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return None, "", [f"over {CASE_SECONDS} s"], None
        text = Path(rss.name).read_text().strip()
    return proc.returncode, output, [], int(text) / 1024 if text else None


# --------------------------------------------------------------------------- one case

_BASELINE_MB: dict[tuple[str, str], float] = {}


def baseline_mb(base: Path, work: Path, executor: str) -> float:
    """Peak RSS of a clean run of ``base`` with ``executor`` in a fresh process (measured once
    per export and executor: a process pool's workers are part of the comparison)."""
    key = (str(base), executor)
    if key not in _BASELINE_MB:
        out = Path(tempfile.mkdtemp(dir=work, prefix="baseline-"))
        code, output, _, rss = run_subprocess(_args(base, out / "out", executor))
        remove_tree(out)
        if rss is None:
            raise RuntimeError(f"clean run of {base} failed ({code}): {output[-500:]}")
        _BASELINE_MB[key] = rss
    return _BASELINE_MB[key]


def _args(root: Path, out: Path, executor: str, *extra: str) -> list[str]:
    jobs = ["-j", "2"] if executor == "processes" else []
    return ["run", str(root), "--out", str(out), "--executor", executor, *jobs, "-q", *extra]


def _only(damages: dict[str, _D], kinds: Collection[str] | None) -> dict[str, _D]:
    """``damages`` restricted to ``kinds`` (all of them when none of ``kinds`` is there)."""
    kept = {name: value for name, value in damages.items() if kinds is None or name in kinds}
    return kept or damages


def _damage_input(
    rng: random.Random, root: Path, case: Case, kinds: Collection[str] | None
) -> None:
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        for _attempt in range(3):  # a damage the export offers nothing for: draw another
            name, damage = choose(rng, _only(INPUT_DAMAGES, kinds))
            try:
                done = damage(rng, root)
            except (OSError, ValueError, RecursionError, IndexError, UnicodeError) as exc:
                done = f"(could not apply: {type(exc).__name__})"
            if done:
                case.kinds.append(name)
                case.damages.append(done)
                break


def _shares_out_of_bounds(out: Path) -> list[str]:
    """A share a finding states (a metric ending in ``share``) below 0 or above 1: what a time
    no profile holds made of one (``62133300% of its -7.49e+09 s span idle``)."""
    path = out / "findings.json"
    if not path.is_file() or path.is_symlink():
        return []
    try:
        findings = json.loads(path.read_bytes()).get("findings") or []
    except (ValueError, AttributeError):
        return []  # a damaged findings.json is the out_* damages' to judge
    return [
        f"{finding.get('name')}: {key} = {value}"
        for finding in findings
        if isinstance(finding, dict)
        for key, value in (finding.get("metrics") or {}).items()
        if key.endswith("share") and isinstance(value, (int, float)) and not 0 <= value <= 1
    ]


def run_case(
    seed: int,
    index: int,
    work: Path,
    subprocess_every: int,
    pick: list[Path],
    kinds: Collection[str] | None = None,
) -> Case:
    """Case ``index`` of ``seed`` on one of ``pick``, damaged by ``kinds`` (default: any)."""
    rng = random.Random(f"{seed}:{index}")
    base = rng.choice(pick)
    in_subprocess = subprocess_every > 0 and index % subprocess_every == 0
    # bad environment values take effect in a fresh process (the CLI reads them as it starts)
    share = 1.0 if kinds is not None and "environment" in kinds else ENVIRONMENT_SHARE
    env = limits.environment(rng) if rng.random() < share else {}
    in_subprocess = in_subprocess or bool(env)
    case = Case(index, base.name, "subprocess" if in_subprocess else "in-process")
    if env:
        case.kinds.append("environment")
        case.damages.append(" ".join(f"{k}={v!r}" for k, v in env.items()))
    case_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"case-{index}-"))
    root, out = case_dir / "in", case_dir / "out"
    try:
        shutil.copytree(base, root, symlinks=True)
        (case_dir / VICTIM).mkdir()
        (case_dir / VICTIM / "file").write_text("not the run's to write")
        roll = rng.random()
        if roll < 0.12:  # damage a store a clean run wrote, then run again (warm)
            run_in_process(_args(root, out, "local"))
            for _ in range(rng.choice([1, 2])):
                name, damage = choose(rng, _only(OUTPUT_DAMAGES, kinds))
                try:
                    done = damage(rng, out)
                except OSError as exc:  # a first damage left nothing for it (a link, a FIFO)
                    done = f"(could not apply: {type(exc).__name__})"
                if done:
                    case.kinds.append(name)
                    case.damages.append(done)
        elif roll < 0.16:  # an --out that cannot be used
            how = rng.choice(["inside the input", "under a file", "inside a linked rank"])
            case.kinds.append("out_path")
            case.damages.append(f"--out {how}")
            if how == "under a file":
                (case_dir / "file").write_text("x")
                out = case_dir / "file" / "out"
            elif how == "inside the input":
                out = rng.choice([root, *root.iterdir()]) / "out"
            else:
                rank = next(p for p in root.iterdir() if p.is_dir())
                shutil.move(rank, case_dir / rank.name)
                (root / rank.name).symlink_to(case_dir / rank.name, target_is_directory=True)
                out = case_dir / rank.name / "out"
        else:
            _damage_input(rng, root, case, kinds)
        executor = "processes" if in_subprocess and rng.random() < 0.3 else "local"
        extra = ["--format", "json"] if rng.random() < 0.1 else []
        if (root / limits.CONFIG).is_file():  # a config file inside the input (user_patterns)
            extra += ["--config", str(root / limits.CONFIG)]
        before = snapshot(case_dir, skip=out)
        started = time.perf_counter()
        if in_subprocess:
            code, output, failures, rss = run_subprocess(_args(root, out, executor, *extra), env)
        else:
            (code, output, failures), rss = run_in_process(_args(root, out, executor, *extra)), None
        case.seconds = round(time.perf_counter() - started, 3)
        case.exit_code = code
        case.failures += failures
        if code is not None and code not in EXIT_CODES:
            case.failures.append(f"exit code {code}: {output.strip()[-300:]}")
        if "Traceback" in output:
            case.failures.append(f"Traceback: {output[output.index('Traceback') :][:600]}")
        if case.seconds > CASE_SECONDS:
            case.failures.append(f"took {case.seconds:.0f} s")
        after = snapshot(case_dir, skip=out)
        if after != before:
            changed = sorted(set(after.items()) ^ set(before.items()))[:3]
            case.failures.append(f"the input or a folder beside OUT changed: {changed}")
        if (out / "PWNED").exists() or (case_dir / "PWNED").exists():
            case.failures.append("code planted in the output ran")
        case.failures += _shares_out_of_bounds(out)
        if any("trace_view.json" in done for done in case.damages):
            # both readers on the same damaged trace: one answer wherever the scanner reads it
            traces = [p for p in _tree(root) if p.name == "trace_view.json"]
            case.failures += limits.readers_disagree(root, traces)
        if rss is not None:
            case.rss_mb = round(rss, 1)
            case.rss_ratio = round(rss / baseline_mb(base, work, executor), 2)
            if case.rss_ratio > RSS_FACTOR:
                case.failures.append(f"peak RSS {rss:.0f} MB, {case.rss_ratio}x a clean run")
    except Exception as exc:  # noqa: BLE001 - the fuzzer's own fault: this case's, not the campaign's
        case.failures.append(f"the fuzzer raised {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        remove_tree(case_dir)
    return case


def run_campaign(
    cases: int,
    seed: int = 0,
    subprocess_every: int = 10,
    only: Iterable[int] | None = None,
    work: Path | None = None,
    on_case: Callable[[Case], None] | None = None,
    exports: list[Path] | None = None,
    jobs: int = 1,
    kinds: Collection[str] | None = None,
) -> Summary:
    """``cases`` cases (or the ``only`` ones) of ``seed``; ``work`` holds the case copies;
    ``exports`` are the exports to damage (default :func:`bases`), ``kinds`` the damages (the
    names of ``INPUT_DAMAGES`` and ``OUTPUT_DAMAGES``; default all);
    ``jobs`` worker processes run cases side by side (each case still in-process in its worker,
    or in a fresh process)."""
    indices = list(only) if only is not None else list(range(cases))
    started = time.perf_counter()
    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="traceanalyzer-fuzz-")) if owned else work
    pick = exports or bases(work)
    done: list[Case] = []
    try:
        if jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(jobs, mp_context=context) as pool:
                futures = [
                    pool.submit(run_case, seed, i, work, subprocess_every, pick, kinds)
                    for i in indices
                ]
                for future in futures:
                    done.append(future.result())
                    if on_case:
                        on_case(done[-1])
        else:
            for index in indices:
                done.append(run_case(seed, index, work, subprocess_every, pick, kinds))
                if on_case:
                    on_case(done[-1])
    finally:
        if owned:
            remove_tree(work)
    return Summary(seed, done, time.perf_counter() - started)


def write_report(summary: Summary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_dict(), indent=1, default=str) + "\n")
