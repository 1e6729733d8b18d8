"""Every snippet of the docs (README.md, docs/*.md) runs: Python blocks are executed, shell and
console commands of ``traceanalyzer`` are run on a bundled sample (paths of the examples mapped
to it), TOML blocks are applied as a config file. The few that need what a test cannot have (an
Ascend host, a Ray cluster, minutes of benchmark) are listed in :data:`NOT_RUN` with the reason.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_support import REPO, SAMPLES

from traceanalyzer.engine.config import tomllib

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^( *)```(\w+)\n(.*?)^ *```", re.S | re.M)
RUN_LANGUAGES = ("python", "bash", "console", "toml")

# A block's first line -> why no test runs it (each is covered where it can be).
NOT_RUN = {
    'COMPUTE_KERNELS = Read("compute_kernels", read_compute_kernels, (STEP_SLICES,))': (
        "an excerpt of the exchanges stage's declaration and a read (derived/exchanges.py, derive.py), "
        "which every run declares: declared again, its name would be taken"
    ),
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/traceanalyzer run "
    "sample_traces/capture_growth_2rank --out out/capture_growth_2rank": "installs the package "
    "(tests/test_readme.py checks the sample, CI runs the install)",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,ray]' && .venv/bin/python -m "
    "pytest": "is the test suite itself (tests/test_readme.py checks CI runs it)",
    "nodeA$ ray get-auth-token --generate       # once: the cluster's token, in ~/.ray/auth_token": (
        "starts a Ray cluster on two hosts"
    ),
    "$ python benchmarks/bench_scale.py --cache /tmp/ta-bench/cache --work /tmp/ta-bench/work \\": (
        "a benchmark of minutes (benchmarks/, never a timed test)"
    ),
    "$ python benchmarks/bench_scale.py --small 2000 --jobs 2 --json "
    "docs/scale-bench-small2000.json --clean": "a benchmark of minutes",
    "$ python benchmarks/bench_scale.py --realistic 16 --jobs 2 --json "
    "docs/scale-bench-realistic16.json --clean": "a benchmark of minutes",
    "$ python benchmarks/bench_scale.py --cases 1x200,16x200 --executors processes --jobs 2 \\": (
        "a benchmark of minutes"
    ),
    "pip install 'ray[default]>=2.9'     # or: pip install -e '.[dev,ray]'": "installs Ray",
    "def derive_stream_busy(store: Store, ranks: list[int], params: Params) -> pl.DataFrame:": (
        "declares a stage of a table the schema has not (tests/test_stages.py declares it and "
        "runs it)"
    ),
}
# commands that only make sense on a host the test is not
NOT_RUN_COMMANDS = {
    "gcr/run.sh": "runs vLLM on an Ascend host",
    "sw/run.sh": "runs vLLM on an Ascend host",
    "traceanalyzer rules test --rules myrules --all": "the built-in rules' fixtures: "
    "tests/test_rules_builtin.py runs each",
    "traceanalyzer rules test": "the built-in rules' fixtures: tests/test_rules_builtin.py",
    "python -m traceanalyzer.authoring.docs > docs/rules.md": "writes the repository's docs "
    "(tests/test_schema_docs.py compares its output)",
}
# --executor ray needs a Ray runtime: tests/test_scale_ray.py runs it
RAY = "--executor ray"
# the examples' inputs and outputs, as the test's folder has them
INPUTS = ("./profiling_data", "profiling_data", "/data/profiling",
          "/mnt/shared/job42/profiling", "/mnt/lustre/job42/profiling")  # fmt: skip
OUTPUTS = {"/shared/ta-out": "ta-out", "/mnt/shared/job42/ta-out": "ta-out",
           "/mnt/lustre/job42/ta-out": "ta-out"}  # fmt: skip
SAMPLE = "store_stall_2rank_rank1_sick"


@dataclass(frozen=True)
class Snippet:
    doc: Path
    line: int
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.doc.name}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for doc in DOCS:
        source = doc.read_text("utf-8")
        for m in FENCE.finditer(source):
            if m.group(2) in RUN_LANGUAGES:
                line = source.count("\n", 0, m.start()) + 1
                text = textwrap.dedent(m.group(3)) if m.group(1) else m.group(3)
                found.append(Snippet(doc, line, m.group(2), text))
    return found


SNIPPETS = snippets()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the snippets run in: the sample as ``profiling_data``, its run as ``OUT``,
    ``out`` and ``out/capture_growth_2rank``, ``out/before`` and ``out/after``."""
    from report_support import run_sample

    root = tmp_path_factory.mktemp("snippets")
    shutil.copytree(SAMPLES / SAMPLE, root / "profiling_data")
    _with_short_syncs(SAMPLES / SAMPLE, root / "profiling_data_after")
    ran = run_sample(SAMPLE)
    for name in ("OUT", "out/capture_growth_2rank", "out/before", "out/after", "out/sample"):
        shutil.copytree(ran, root / name, symlinks=True, ignore=shutil.ignore_patterns(".lock"))
    for name in ("findings.json", "manifest.json", "ingest.json", "tables"):
        src = root / "out" / "sample" / name
        dest = root / "out" / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest)
    return root


def _with_short_syncs(sample: Path, dest: Path) -> None:
    """The sample after the worked example's fix: its synchronisations of over 10 ms cut to 5."""
    shutil.copytree(sample, dest)
    for trace in dest.glob("*/ASCEND_PROFILER_OUTPUT/trace_view.json"):
        events = json.loads(trace.read_text("utf-8"))
        for event in events:
            slow = float(event.get("dur") or 0) > 10_000
            if event.get("name") == "AscendCL@aclrtSynchronizeStream" and slow:
                event["dur"] = "5000.000"
        trace.write_text(json.dumps(events), "utf-8")


def _commands(snippet: Snippet) -> list[tuple[str, list[str]]]:
    """(command, the output lines the block shows after it) of a shell or console block."""
    commands: list[tuple[str, list[str]]] = []
    pending = ""
    for raw in snippet.text.splitlines():
        line = raw.rstrip()
        if snippet.language == "console":
            prompt = re.match(r"^\S*\$ ", line)
            if pending:
                line = pending + " " + line.strip()
            elif prompt:
                line = line[prompt.end() :]
            else:
                if commands and line.strip() and line.strip() != "...":
                    commands[-1][1].append(line.strip())
                continue
        elif pending:
            line = pending + " " + line.strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        pending = ""
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            commands.append((command, []))
    return commands


def _run_command(command: str, workdir: Path) -> tuple[int, str]:
    from traceanalyzer.cli import main

    for old, new in OUTPUTS.items():
        command = command.replace(old, new)
    args = shlex.split(command)
    assert args[0] == "traceanalyzer", command
    args = [
        str(workdir / "profiling_data") if a in INPUTS else a.replace("[NAME]", "") for a in args
    ]
    args = [str(workdir / a) if a == "profiling_data_after" else a for a in args]
    args = [a for a in args if a not in ("[--json]", "")]
    if args[1] == "run":
        args += ["-j", "1"]  # the machine is shared; the examples' -j stays
    result = CliRunner().invoke(main, args[1:], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.id)
def test_snippet_runs(snippet: Snippet, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = snippet.text.splitlines()[0]
    if first in NOT_RUN:
        pytest.skip(NOT_RUN[first])
    monkeypatch.chdir(workdir)
    if snippet.language == "python":
        _run_python(snippet, workdir)
    elif snippet.language == "toml":
        _apply_toml(snippet, workdir)
    else:
        for command, shown in _commands(snippet):
            if command in NOT_RUN_COMMANDS or RAY in command:
                continue
            code, output = _run_command(command, workdir)
            refused = code == 2 and "recipe doctor" in command and "REFUSED" in output
            assert code in (0, 1) or refused, f"{command}\n{output}"  # no NPU stack here
            assert "Traceback" not in output
            for line in shown:
                assert line in output, f"{command}: {line!r} not in\n{output}"


# the names a python block of writing-rules.md takes from the blocks before it and the text
PRELUDE = '''
from collections.abc import Iterator, Mapping
from typing import Any

import polars as pl

from traceanalyzer.kit import *  # noqa: F403
from traceanalyzer.kit.testing import *  # noqa: F403
import traceanalyzer

DOC = """
## What it detects
Long synchronisations.
## Why it matters
They block the host.
## How to fix
Remove them.
## Example
`long-syncs on rank 0`
## References
docs/writing-rules.md
"""
store = traceanalyzer.open_store("OUT")
'''


def _run_python(snippet: Snippet, workdir: Path) -> None:
    if "myrules" in snippet.text and not (workdir / "myrules").is_dir():
        code, output = _run_command("traceanalyzer rules new slow-sync --rules myrules", workdir)
        assert code == 0, output
    namespace: dict = {}
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    # a block of a guide builds on the blocks before it in the same guide
    earlier = [
        e.text
        for e in SNIPPETS
        if e.doc == snippet.doc and e.line < snippet.line and e.language == "python"
    ]
    for text in earlier if snippet.doc.name == "writing-rules.md" else []:
        exec(compile(text, snippet.id, "exec"), namespace)
    exec(compile(snippet.text, snippet.id, "exec"), namespace)


def _apply_toml(snippet: Snippet, workdir: Path) -> None:
    doc = tomllib.loads(snippet.text)
    if "project" in doc:  # a rule pack's pyproject.toml: its entry point names a folder
        assert "traceanalyzer.rules" in doc["project"]["entry-points"]
        return
    ours = "slow-sync" in doc.get("rules", {})
    if "rule_dirs" in doc or ours:
        code, output = _run_command("traceanalyzer rules new slow-sync --rules myrules", workdir)
        assert code == 0 or "already exists" in output, output
    config = workdir / f"snippet-{snippet.line}.toml"
    config.write_text(snippet.text, "utf-8")
    extra = " --rules myrules" if ours else ""
    out = f"out-toml-{snippet.line}"
    code, output = _run_command(
        f"traceanalyzer run profiling_data --out {out} -q --config {config}{extra}", workdir
    )
    assert code in (0, 1), output
    assert f"config: {config}" in output or str(config) in output, output
