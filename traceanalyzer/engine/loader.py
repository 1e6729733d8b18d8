"""Find and import rules: built-in folder, extra folders (``--rules DIR``), and entry points.

A rule folder holds one rule per ``*.py`` file (files starting with ``_`` are helpers, and the
``fixtures/`` sub-folder holds test fixtures, not rules). Each file is imported under a private
module name, and every :class:`~traceanalyzer.engine.rule.Rule` object at its top level is
registered. Installed rule packs declare an entry point in the group ``traceanalyzer.rules``
that resolves to a Rule, an iterable of Rules, a module containing Rules, or a folder path.

A file that fails to import does not stop the others: it becomes a :class:`LoadError`, which
the runner reports next to the rule errors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import traceanalyzer
from traceanalyzer.engine.registry import DuplicateRuleError, RuleSet
from traceanalyzer.engine.rule import Rule

ENTRY_POINT_GROUP = "traceanalyzer.rules"
FIXTURES_DIR = "fixtures"


@dataclass(frozen=True)
class LoadError:
    source: str
    error: str
    traceback: str


@dataclass
class LoadedRules:
    rules: RuleSet = field(default_factory=RuleSet)
    errors: list[LoadError] = field(default_factory=list)


def builtin_rules_dir() -> Path | None:
    """The built-in rules: ``traceanalyzer/builtin_rules`` in a wheel, ``rules/`` in a checkout."""
    package = Path(traceanalyzer.__file__).parent
    for candidate in (package / "builtin_rules", package.parent / "rules"):
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
    elif isinstance(obj, ModuleType):
        seen: set[int] = set()
        for value in vars(obj).values():
            if isinstance(value, Rule) and id(value) not in seen:
                seen.add(id(value))
                yield value
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
    return LoadError(source, f"{type(exc).__name__}: {exc}", traceback.format_exc())


def load_folder(folder: Path, loaded: LoadedRules) -> None:
    for path in rule_files(folder):
        try:
            module = import_file(path)
        except Exception as exc:
            loaded.errors.append(_failure(str(path), exc))
            continue
        found = list(rules_in(module))
        for rule in found:
            if rule.source is None or rule.source.name != path.name:
                rule.source = path
        _add(loaded, found, str(path))


def load_entry_points(loaded: LoadedRules, group: str = ENTRY_POINT_GROUP) -> None:
    for entry in metadata.entry_points(group=group):
        source = f"entry point {entry.name} ({entry.value})"
        try:
            target = entry.load()
            if isinstance(target, (str, Path)):
                load_folder(Path(target), loaded)
                continue
            _add(loaded, rules_in(target), source)
        except Exception as exc:
            loaded.errors.append(_failure(source, exc))


def load_rules(
    rule_dirs: Iterable[str | Path] = (),
    *,
    builtin: bool = True,
    entry_points: bool = True,
) -> LoadedRules:
    """Load the built-in rules, then each extra folder, then installed rule packs."""
    loaded = LoadedRules()
    folders = []
    if builtin and (default := builtin_rules_dir()) is not None:
        folders.append(default)
    folders += [Path(d) for d in rule_dirs]
    seen: set[Path] = set()
    for folder in folders:
        if folder.resolve() in seen:
            continue  # `--rules rules` in a checkout names the built-in folder again
        seen.add(folder.resolve())
        if not folder.is_dir():
            loaded.errors.append(LoadError(str(folder), "not a directory", ""))
            continue
        load_folder(folder, loaded)
    if entry_points:
        load_entry_points(loaded)
    return loaded
