"""Find and import rules: built-in folder, extra folders (``--rules DIR``), and entry points.

A rule folder holds one rule per ``*.py`` file (files starting with ``_`` are helpers, and the
``fixtures/`` sub-folder holds test fixtures, not rules). Each file is imported under a private
module name, and every :class:`~traceanalyzer.engine.rule.Rule` object at its top level is
registered. Installed rule packs declare an entry point in the group ``traceanalyzer.rules``
that resolves to a Rule, an iterable of Rules, a module containing Rules, or a folder path.

A file that fails to import does not stop the others: it becomes a :class:`LoadError`, which
the runner reports next to the rule errors.

Every loaded rule gets a code digest (:func:`rule_digest`): its file, the helper files beside it
and the engine's own code. Outcome caches are keyed by it, so an edited rule is never answered
with what the old code found. A :class:`RuleSource` says where the rules came from, so a worker
process loads exactly the same rules (rule objects hold functions; they are not shipped).
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import sys
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from traceanalyzer.codekey import ROOT, code_key, source_imports
from traceanalyzer.engine.registry import DuplicateRuleError, RuleSet
from traceanalyzer.engine.rule import Helper, Rule
from traceanalyzer.hints import path_did_you_mean
from traceanalyzer.interrupts import contained

ENTRY_POINT_GROUP = "traceanalyzer.rules"
FIXTURES_DIR = "fixtures"


@dataclass(frozen=True)
class LoadError:
    source: str
    error: str
    traceback: str


class RulesNotLoaded(Exception):
    """Rule files that do not load. A run without them would judge the trace without their
    rules and look complete, so the commands refuse to run (a usage error, exit 2)."""

    def __init__(self, errors: Iterable[LoadError]):
        self.errors = list(errors)
        lines = [f"{e.source}: {e.error}" for e in self.errors]
        super().__init__(
            "cannot load the rules (fix the file, or leave its folder out of --rules and "
            "rule_dirs): " + "; ".join(lines)
        )


@dataclass(frozen=True)
class RuleSource:
    """Where a rule set was loaded from: enough for another process to load the same rules."""

    dirs: tuple[str, ...] = ()
    builtin: bool = True
    entry_points: bool = True

    def load(self) -> LoadedRules:
        return load_rules(self.dirs, builtin=self.builtin, entry_points=self.entry_points)


@dataclass
class LoadedRules:
    rules: RuleSet = field(default_factory=RuleSet)
    errors: list[LoadError] = field(default_factory=list)
    source: RuleSource | None = None  # None: built in memory, cannot be loaded elsewhere

    def digests(self) -> dict[str, str]:
        """Rule id -> code digest, for every rule."""
        return {r.id: rule_digest(r) for r in self.rules}


def builtin_rules_dir() -> Path | None:
    """The built-in rules: ``traceanalyzer/builtin_rules`` in a wheel, ``rules/`` in a checkout."""
    for candidate in (ROOT / "builtin_rules", ROOT.parent / "rules"):
        if candidate.is_dir():
            return candidate
    return None


def rule_files(folder: Path) -> list[Path]:
    """The rule files of a folder, sorted (helpers ``_*.py`` and ``fixtures/`` excluded)."""
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def import_file(path: Path, namespace: str = "traceanalyzer_rules") -> ModuleType:
    """Import one Python file under a private, stable module name derived from its path."""
    path = path.resolve()
    digest = hashlib.sha256(str(path.parent).encode()).hexdigest()[:10]
    module_name = f"{namespace}_{digest}.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def rules_in(obj: Any) -> Iterator[Rule]:
    """The Rule objects defined at the top level of a module (or given directly)."""
    if isinstance(obj, Rule):
        yield obj
    elif isinstance(obj, ModuleType):  # a rule bound to two names: once
        yield from {id(v): v for v in vars(obj).values() if isinstance(v, Rule)}.values()
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from rules_in(item)


def _add(loaded: LoadedRules, rules: Iterable[Rule], source: str) -> None:
    for rule in rules:
        try:
            loaded.rules.add(rule)
        except DuplicateRuleError as exc:
            loaded.errors.append(LoadError(source, str(exc), ""))


def _failure(source: str, exc: BaseException) -> LoadError:
    # the line of the rule file that raised (a SyntaxError's message already names it)
    real = os.path.realpath(source)
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == real
    ]
    line = f"line {frames[-1].lineno}: " if frames else ""
    return LoadError(source, f"{line}{type(exc).__name__}: {exc}", traceback.format_exc())


def _engine_digest() -> str:
    """The code every rule runs on: the engine, the kit and all they import in the package."""
    return code_key("traceanalyzer.kit", "traceanalyzer.engine.runner")


def _file_digest(path: Path) -> str:
    """A rule file with the helper files (``_*.py``) beside it, which it may import, and the
    package modules it imports (with all they import)."""
    digest = hashlib.sha256(_engine_digest().encode())
    digest.update(code_key(*source_imports(path)).encode())
    for item in [path, *sorted(p for p in path.parent.glob("_*.py") if p != path)]:
        digest.update(item.name.encode())
        digest.update(item.read_bytes())
    return digest.hexdigest()


def _code_digest(rule: Rule) -> str:
    """A rule without a file (built in memory, e.g. ``sql_rule``): its functions' bytecode."""
    digest = hashlib.sha256(_engine_digest().encode())
    digest.update(repr((rule.id, rule.name, rule.doc, sorted(rule.params))).encode())
    shown = rule.presentation
    for fn in (rule.body, shown.figure, shown.compute_key_figures, shown.marks):
        code = getattr(fn, "__code__", None)
        digest.update(marshal.dumps(code) if code is not None else b"-")
        # a closure's values are code too (sql_rule's query and templates)
        cells = getattr(fn, "__closure__", None) or ()
        digest.update(repr([c.cell_contents for c in cells]).encode())
    return digest.hexdigest()


def rule_digest(rule: Rule) -> str:
    """The digest of the code that produces this rule's outcomes (set at load time)."""
    if not rule.digest:
        source = rule.source
        rule.digest = _file_digest(source) if source and source.is_file() else _code_digest(rule)
    return rule.digest


def load_folder(folder: Path, loaded: LoadedRules) -> None:
    for path in rule_files(folder):
        try:
            digest = _file_digest(path)  # before the import: the code that is about to run
            module = import_file(path)
        except BaseException as exc:  # SystemExit at import is the file's failure too
            if not contained(exc):
                raise
            loaded.errors.append(_failure(str(path), exc))
            continue
        found = list(rules_in(module))
        undeclared = _undeclared_helpers(module, found)
        if undeclared:
            loaded.errors.append(LoadError(str(path), undeclared, ""))
            continue
        for rule in found:
            if rule.source is None or rule.source.name != path.name:
                rule.source = path
            rule.digest = digest
        _add(loaded, found, str(path))


def _undeclared_helpers(module: ModuleType, rules: list[Rule]) -> str:
    """Why the module's rules cannot load: a helper with parameters of its own, imported into
    the file, that a rule there does not declare (it would run without them); "" when none."""
    helpers = {v.name for v in vars(module).values() if isinstance(v, Helper)}
    for rule in rules:
        missing = sorted(helpers - set(rule.uses))
        if missing:
            names = ", ".join(missing)
            return (
                f"rule {rule.id} {rule.name} imports the kit helper(s) {names}, which read "
                f"parameters of their own, without declaring them: add uses=[{names}] to @rule"
            )
    return ""


def load_entry_points(loaded: LoadedRules, group: str = ENTRY_POINT_GROUP) -> None:
    for entry in metadata.entry_points(group=group):
        source = f"entry point {entry.name} ({entry.value})"
        try:
            target = entry.load()
            if isinstance(target, (str, Path)):
                load_folder(Path(target), loaded)
                continue
            _add(loaded, rules_in(target), source)
        except BaseException as exc:
            if not contained(exc):
                raise
            loaded.errors.append(_failure(source, exc))


def load_rules(
    rule_dirs: Iterable[str | Path] = (),
    *,
    builtin: bool = True,
    entry_points: bool = True,
) -> LoadedRules:
    """Load the built-in rules, then each extra folder, then installed rule packs."""
    source = RuleSource(tuple(str(Path(d).resolve()) for d in rule_dirs), builtin, entry_points)
    loaded = LoadedRules(source=source)
    folders = []
    if builtin and (default := builtin_rules_dir()) is not None:
        folders.append(default)
    folders += [Path(d) for d in source.dirs]
    seen: set[Path] = set()
    for folder in folders:
        if folder.resolve() in seen:
            continue  # `--rules rules` in a checkout names the built-in folder again
        seen.add(folder.resolve())
        if not folder.is_dir():
            why = "not a directory" if folder.exists() else "no such folder"
            loaded.errors.append(LoadError(str(folder), why + path_did_you_mean(folder), ""))
            continue
        load_folder(folder, loaded)
    if entry_points:
        load_entry_points(loaded)
    return loaded
