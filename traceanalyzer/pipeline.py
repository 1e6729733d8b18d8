"""The one way through: ingest a trace folder, evaluate the rules, write every report.

`traceanalyzer run` and `traceanalyzer diff` (when given trace folders) both call
:func:`analyse`, so an output directory means the same thing whichever command wrote it.
Errors that make the input unusable (:class:`~traceanalyzer.ingest.InputError`, a bad rule
setting, a rule that does not load, a missing executor backend) propagate to the caller, which
decides how to report them; the rules and settings are checked before the ingest writes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from traceanalyzer import outdir
from traceanalyzer.discover import input_root
from traceanalyzer.ingest import IngestResult, ProgressFn, ingest
from traceanalyzer.json_shape import to_json
from traceanalyzer.overview.model import DEFAULT_TOP, SCHEMA_VERSION, TopSizes
from traceanalyzer.parse.trace_view import DEFAULT_PARSE_MEMORY, ParseMemory
from traceanalyzer.store import run_memo, write_atomic_text
from traceanalyzer.text import count

if TYPE_CHECKING:
    from traceanalyzer.engine import RunResult
    from traceanalyzer.engine.config import AppliedConfig
    from traceanalyzer.engine.loader import LoadedRules
    from traceanalyzer.executor import Executor
    from traceanalyzer.report.run_reports import RunReports


@dataclass
class Analysis:
    ingest: IngestResult
    findings: RunResult | None = None  # None when no rank session could be ingested
    reports: RunReports | None = None
    config: AppliedConfig | None = None  # the config file applied, if any


def analyse(
    path: str | os.PathLike[str],
    out: Path,
    *,
    executor: Executor,
    jobs: int = 1,
    progress: ProgressFn | None = None,
    log: Callable[[str], None] | None = None,
    force: bool = False,
    rule_dirs: Sequence[str | os.PathLike[str]] = (),
    overrides: Iterable[str] = (),
    config_path: str | os.PathLike[str] | None = None,
    fail_on: str | None = None,
    memory: ParseMemory = DEFAULT_PARSE_MEMORY,
    rules: LoadedRules | None = None,
    top: TopSizes = DEFAULT_TOP,
    lock_wait: float = outdir.LOCK_WAIT_SECONDS,
    follow_links: bool = False,
    rank_timeout: float | None = None,
) -> Analysis:
    """Bring the store at ``out`` up to date with ``path``, run the rules, write the reports.

    ``progress`` follows the ingest session by session; ``log`` gets one human line before and
    after rule evaluation. ``force`` re-ingests every session and re-evaluates every rank.
    ``rules``: the rules to run, already loaded (default: load them here from ``rule_dirs`` and
    the config file); they are loaded once and go to evaluation, workers and reports.
    ``top`` sizes the overview's top-N tables. ``lock_wait``: seconds to wait for another run
    that writes ``out``. ``follow_links``: follow the links that leave ``path``.
    ``rank_timeout``: seconds a rank session may take to ingest (default: by its size).
    """
    from traceanalyzer.derived.launches import TABLE as LAUNCHES
    from traceanalyzer.derived.stage import STEPS
    from traceanalyzer.engine import write_findings_json
    from traceanalyzer.engine.config import (
        applied_config,
        config_table,
        load_run_rules,
        resolve,
        run_settings,
        split_namespace,
    )
    from traceanalyzer.engine.findings import add_input_caveats
    from traceanalyzer.engine.loader import RulesNotLoaded
    from traceanalyzer.engine.shards import evaluate_store
    from traceanalyzer.memory import NAMESPACE as MEMORY_NAMESPACE
    from traceanalyzer.memory import memory_params, rule_overrides
    from traceanalyzer.report.run_reports import run_reports
    from traceanalyzer.stages import declared, run_stages

    # a config file inside the input sets parameters, never loads its rule code
    root = input_root(path) if Path(path).exists() else Path(path)
    config = applied_config(config_path, [root])
    if rules is None:
        rules = load_run_rules(rule_dirs, config_path, [root])
    # Refused before the ingest writes anything: a rule that does not load, a bad setting.
    step_settings, rest = split_namespace(overrides, STEPS.namespace)
    step_settings = {**config_table(config_path, STEPS.namespace), **step_settings}
    memory_settings, rest = split_namespace(rest, MEMORY_NAMESPACE)
    memory_settings = {**config_table(config_path, MEMORY_NAMESPACE), **memory_settings}
    if rules.errors:
        raise RulesNotLoaded(rules.errors)
    device = memory_params(memory_settings)  # `memory` is the parse's budget
    # `memory.capacity_gb` is every memory rule's too (a rule's own setting after it wins)
    overrides = (*rule_overrides(rules.rules, memory_settings), *rest)
    resolve(rules.rules, run_settings(overrides, config_path))
    STEPS.params(step_settings)
    # The ingest checks and locks `out`; the lock is then held until the reports are written.
    with outdir.held_for(out):
        result = ingest(
            path,
            out,
            jobs=jobs,
            progress=progress,
            force=force,
            executor=executor,
            memory=memory,
            lock_wait=lock_wait,
            follow_links=follow_links,
            rank_timeout=rank_timeout,
        )
        if not result.outcomes:
            return Analysis(result, config=config)
        if log:
            log(f"evaluating rules on {len({o.rank for o in result.outcomes})} rank(s) ...")
        started = time.perf_counter()
        with outdir.writes(out):
            write_atomic_text(out / "ingest.json", json.dumps(result.to_dict(), indent=1))
            # the steps before the rules: they, the overview and diff read them
            derived = run_stages(
                out,
                executor,
                declared(before_rules=True),
                {STEPS.name: step_settings},
                cache=not force,
            )
            if log:
                seconds = time.perf_counter() - started
                # ranks none of whose tables was derived again
                redone = {rank for ranks in derived.computed.values() for rank in ranks}
                cached = len(set(derived.ranks) - redone)
                # the launches only moved here from the rules and the overview
                steps_seconds = sum(derived.seconds.values()) - derived.seconds.get(LAUNCHES, 0)
                log(
                    f"steps and launches of {count(len(derived.ranks), 'rank')} in "
                    f"{seconds:.2f} s (the steps and their EP exchanges {steps_seconds:.2f} s"
                    + (f", {cached} cached)" if cached else ")")
                )
                for rank, why in derived.failed.items():  # its rules derive them again
                    log(f"steps of rank {rank} could not be derived: {why}")
            started = time.perf_counter()
            # the rules and the overview read the store as the stages left it: what both
            # derive of it (the memory stage) is derived once
            with run_memo(out):
                findings = evaluate_store(
                    out,
                    executor,
                    rules,
                    cache=not force,
                    overrides=overrides,
                    config_path=config_path,
                    fail_on=fail_on,
                )
                if log:
                    seconds = time.perf_counter() - started
                    log(f"evaluated {len(findings.rules)} rule(s) in {seconds:.1f} s")
                add_input_caveats(findings.findings, _incomplete_inputs(result))
                # After the rules, not beside them: beside them it saves no time and raises
                # the run's peak (docs/benchmarks/compare.md).
                findings.overview = _overview(
                    out, executor, findings, top, force, log, device.capacity_gb
                )
            findings.config_files = [str(config.path)] if config else []
            write_findings_json(findings, out)
        reports = run_reports(out, findings, rules.rules, input_root=path)
    return Analysis(result, findings, reports, config)


def _incomplete_inputs(result: IngestResult) -> dict[int, list[str]]:
    """Per rank, the files of its sessions that lost data (truncated, rows dropped)."""
    incomplete: dict[int, list[str]] = {}
    for outcome in result.outcomes:
        incomplete.setdefault(outcome.rank, []).extend(outcome.incomplete_files)
    return {rank: files for rank, files in incomplete.items() if files}


def _overview(
    out: Path,
    executor: Executor,
    findings: RunResult,
    top: TopSizes,
    force: bool,
    log: Callable[[str], None] | None,
    capacity_gb: float,
) -> dict | None:
    """Where the time goes (traceanalyzer.overview), with each finding's cost in it, and the
    device memory (``capacity_gb``: the device's, 0 when unknown)."""
    from traceanalyzer.overview import finding_costs, overview_document
    from traceanalyzer.overview.stage import SUMMARY
    from traceanalyzer.stages import declared, run_stages
    from traceanalyzer.store import Store

    started = time.perf_counter()
    try:
        after_rules = declared(before_rules=False)
        done = run_stages(out, executor, after_rules, {SUMMARY.name: top}, cache=not force)
        overview = overview_document(Store.open(out), top, done.failed, capacity_gb)
        seconds = time.perf_counter() - started  # without the findings' costs
        costs = finding_costs(findings.findings, overview)
        document = to_json(replace(overview, costs=costs))
    except Exception as exc:  # the overview is context: its failure must not cost the findings
        if log:
            log(f"overview failed: {type(exc).__name__}: {exc}")
        return {"schema_version": SCHEMA_VERSION, "error": f"{type(exc).__name__}: {exc}"}
    if log:
        log(f"overview of {count(len(overview.ranks), 'rank')} in {seconds:.1f} s")
    return document
