"""Cache keys that cannot go stale: a result's key covers the code that made it, its whole import
closure inside the package, so a helper changed deep in it re-derives everything above it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import traceanalyzer.derived  # noqa: F401 - declares the stages
from traceanalyzer.codekey import ROOT, closure, closure_key, code_key
from traceanalyzer.stages import declared
from traceanalyzer.synth import generate

RULES = ROOT.parent / "rules"
# the derivations whose results are cached, and a helper deep in all of them
CACHED = ("traceanalyzer.derived.stage", "traceanalyzer.overview.stage", "traceanalyzer.kit")


def _copy(tmp: Path) -> Path:
    """The package and the built-in rules, copied where a test may change them."""
    root = tmp / "pkg"
    shutil.copytree(ROOT, root / "traceanalyzer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(RULES, root / "rules", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_the_closure_holds_what_the_code_runs() -> None:
    for name in CACHED:
        files = {p.relative_to(ROOT).as_posix() for p in closure(name)}
        assert {"intervals.py", "kernels.py", "derived/phases.py"} <= files, name
    assert "overview/stage.py" not in {p.relative_to(ROOT).as_posix() for p in closure(CACHED[0])}


def test_the_closure_follows_the_modules_loaded_by_name() -> None:
    """The report package loads its writers through ``importlib`` from a table of names."""
    files = {p.relative_to(ROOT).as_posix() for p in closure("traceanalyzer.report")}
    assert {"report/writer.py", "report/inputs.py"} <= files


def test_a_helper_changed_deep_in_the_closure_changes_every_key_above_it(tmp_path: Path) -> None:
    package = _copy(tmp_path) / "traceanalyzer"
    before = {name: closure_key([name], package) for name in (*CACHED, "traceanalyzer.printable")}
    assert before == {n: code_key(n) for n in before}  # the copy keys as the package does
    helper = package / "intervals.py"
    helper.write_text(helper.read_text("utf-8") + "\n# window_of changed\n", "utf-8")
    after = {name: closure_key([name], package) for name in before}
    assert all(after[name] != before[name] for name in CACHED)
    assert after["traceanalyzer.printable"] == before["traceanalyzer.printable"]  # not above it


def test_a_package_s_imports_key_only_who_imports_a_name_of_it(tmp_path: Path) -> None:
    """A module under a package runs its ``__init__`` (its source counts), but not what that
    imports (``derived/__init__`` imports every stage to register it: no stage is keyed by the
    others); a module importing a name the ``__init__`` defines or imports is keyed by it."""
    package = tmp_path / "traceanalyzer"
    files = {
        "__init__.py": "",
        "sub/__init__.py": "from traceanalyzer.sub import a as a\nfrom traceanalyzer.sub import b\n",
        "sub/a.py": "from traceanalyzer import helper\n",
        "sub/b.py": "",
        "helper.py": "",
        "user.py": "from traceanalyzer.sub import b\nfrom traceanalyzer.sub import *\n",
        "other.py": "from traceanalyzer.sub.a import thing\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text, "utf-8")

    def keyed(name: str) -> set[str]:
        return {p.relative_to(package).as_posix() for p in closure(name, package)}

    assert keyed("traceanalyzer.sub.b") == {"__init__.py", "sub/__init__.py", "sub/b.py"}
    assert keyed("traceanalyzer.other") == {
        "__init__.py", "other.py", "sub/__init__.py", "sub/a.py", "helper.py",
    }  # fmt: skip
    assert keyed("traceanalyzer.user") == set(files) - {"other.py"}  # `*`: every name of sub


def test_a_stage_s_module_keys_only_it_and_the_stages_that_read_it(tmp_path: Path) -> None:
    """The tables derived before the rules are stages of their own: a change to one's module
    changes its key only (its readers' keys hold its key, ``test_stages``), a change to a read
    they share changes the key of each stage that reads it."""
    package = _copy(tmp_path) / "traceanalyzer"
    before_rules = declared(before_rules=True)

    def keys() -> dict[str, str]:
        return {stage.name: closure_key(stage.modules, package) for stage in before_rules}

    assert keys() == {stage.name: stage.code for stage in before_rules}
    changed = {
        "derived/collectives.py": {"collectives"},
        "derived/moe_layers.py": {"moe"},
        "derived/exchanges.py": {"exchanges"},
        "derived/layers.py": {"kernel_layers"},
        "derived/captures.py": {"kernel_layers"},
        "derived/device.py": {"exchanges", "moe", "kernel_layers", "collectives"},
        "derived/phases.py": {"steps", "exchanges", "moe", "kernel_layers", "collectives"},
        "intervals.py": {stage.name for stage in before_rules},
    }
    for path, stages in changed.items():
        was = keys()
        source = package / path
        source.write_text(source.read_text("utf-8") + "\n# changed\n", "utf-8")
        now = keys()
        assert {name for name in now if now[name] != was[name]} == stages, path


def _run(root: Path | None, inputs: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)} if root else dict(os.environ)
    code = "import sys; from traceanalyzer.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", code, "run", str(inputs), "--out", str(out), "-q"],
        env=env,
        cwd=out.parent,  # not the checkout: its package would shadow PYTHONPATH's
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads((out / "findings.json").read_text("utf-8"))


def _host_bound(doc: dict) -> tuple:
    """What host-launch-bound and the overview say of the host-bound idle time."""
    rule = next(r for r in doc["rules"] if r["name"] == "host-launch-bound")
    findings = [f for f in doc["findings"] if f["name"] == "host-launch-bound"]
    idle = doc["summary"]["overview"]["mean"]["idle_host_ns"]
    return rule["status"], [f["metrics"].get("cost_ns") for f in findings], round(idle)


def test_an_out_of_other_code_gives_one_consistent_report(tmp_path: Path) -> None:
    """An OUT written by this code, run again by code whose classify_gaps counts no gap as
    host-bound, says what a cold run of the changed code says: the rule and the overview agree
    (a stale cached breakdown beside a re-evaluated rule contradicted itself)."""
    generate("slow-host-decode", tmp_path / "in", ranks=1, steps=4, layers=2)
    first = _run(None, tmp_path / "in", tmp_path / "out")
    root = _copy(tmp_path)
    helper = root / "traceanalyzer" / "host_gaps.py"
    source = helper.read_text("utf-8")
    late = 'late = pl.col("launch_end_ns") > pl.col("prev_end_ns")'
    assert late in source
    helper.write_text(source.replace(late, "late = pl.lit(False)"), "utf-8")
    warm = _run(root, tmp_path / "in", tmp_path / "out")
    cold = _run(root, tmp_path / "in", tmp_path / "cold")
    assert _host_bound(first) != _host_bound(cold)  # the change matters
    assert _host_bound(warm) == _host_bound(cold)
