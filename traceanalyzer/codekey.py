"""The key of the code a result was made by: a module's import closure inside the package.

A cached result (a derived table, an overview shard, a rule's outcome, an ingested session) is
valid only while the code that made it is the same. Hand-kept file lists go stale (the steps
run ``intervals``, ``launch_links`` and ``kernels``, which a list of their files misses), so
the key is derived from the code itself: the module's source and the source of every package
module it imports, directly or through others (``import``, ``from ... import``, relative
imports, and the modules loaded through ``importlib`` by a name the source spells:
:func:`named_loads`), with the package version. Change a helper deep in the closure and
every key above it changes.

A module's packages run with it, so their ``__init__`` sources count; what an ``__init__``
imports counts only for a module that imports a name it defines (``from traceanalyzer.kit import
x``), not for one that only lives under it (``traceanalyzer.derived.collectives`` is not keyed by
every stage ``derived/__init__`` imports to register them).
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from traceanalyzer.version import __version__

PACKAGE = "traceanalyzer"
ROOT = Path(__file__).parent


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of package module ``name`` (``traceanalyzer.derived.run``), or None."""
    return _modules(root).get(name)


@functools.cache
def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package tree at ``root``, by name (one listing, not a look-up per
    imported name)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGE, *parts))] = path
    return found


# import statements, read as text (parsing every module of the closure took a second): a
# ``from a import (b, c)`` may span lines; names inside strings or comments only widen the key
_FROM = re.compile(r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w.][\w., \t]*)", re.M)
_BY_NAME = re.compile(r"import_module\(\s*[\"'](traceanalyzer[\w.]*)[\"']")
_COMPUTED = re.compile(r"import_module\(\s*[^\"'\s]")
_NAMED = re.compile(r"[\"'](traceanalyzer(?:\.\w+)+)[\"']")


def named_loads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every package module a source loads by name through ``importlib``: a
    literal ``import_module("traceanalyzer.x")``, and, in a source that computes the name it
    loads (a table of lazy commands or exports), every quoted package module name it spells.
    What the cache keys follow and the architecture test checks (names that are no module
    only widen a key)."""
    found = list(_BY_NAME.finditer(source))
    if _COMPUTED.search(source):
        found += _NAMED.finditer(source)
    return sorted({(source.count("\n", 0, m.start()) + 1, m.group(1)) for m in found})


def _imported(source: str, name: str, is_package: bool) -> set[str]:
    """The package names a module's source imports: modules, or names defined in one (a
    ``from a import b`` yields ``a.b``, a module or a name of ``a``: :func:`_imported_module`
    tells which)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for base, names in _FROM.findall(source):
        level = len(base) - len(base.lstrip("."))
        if level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (level - 1)]
            base = ".".join([*anchor, base[level:]] if base[level:] else anchor)
        items = names.strip("()").replace("\n", ",").split(",")
        words = (item.split("#")[0].split(" as ")[0].strip() for item in items)
        named = [f"{base}.{word}" for word in words if word.isidentifier()]
        found.update(named or [base])  # `from a import *`: a itself
    for names in _IMPORT.findall(source):
        found.update(item.split(" as ")[0].strip() for item in names.split(","))
    found.update(name for _, name in named_loads(source))
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def closure(name: str, root: Path = ROOT) -> tuple[Path, ...]:
    """The source files of ``name`` (a module, or a name one defines) and of every package
    module it imports, transitively, in a stable order (each once; a package's ``__init__``
    with the module under it)."""
    return _closure(_imported_module(name, root), root)


@functools.cache
def _closure(module: str, root: Path) -> tuple[Path, ...]:
    seen: dict[str, Path] = {}
    followed: set[str] = set()
    todo = [(module, True)]
    while todo:
        current, imported = todo.pop()
        path = module_file(current, root)
        if path is None or (current in followed or (current in seen and not imported)):
            continue
        seen[current] = path
        # a module's packages run with it: their sources count, their imports only when a
        # name of theirs is imported
        parent = current.rpartition(".")[0]
        if parent:
            todo.append((parent, False))
        if imported and current != PACKAGE:
            followed.add(current)
            todo += [(imported, True) for imported in _imported_modules(path, current, root)]
        # (the package's own __init__ counts, as every parent does, but not its imports: it is
        # the API's façade, whose functions import lazily from every layer)
    return tuple(seen[n] for n in sorted(seen))


@functools.cache
def _imported_modules(path: Path, name: str, root: Path) -> tuple[str, ...]:
    """The package modules one module's file imports, once per process (the closures of
    several keys share most modules)."""
    imported = _imported(path.read_text("utf-8"), name, path.name == "__init__.py")
    return tuple(sorted({_imported_module(n, root) for n in imported}))


def _imported_module(name: str, root: Path) -> str:
    """The module an imported ``name`` is: itself, or the module that defines it."""
    return name if module_file(name, root) is not None else name.rpartition(".")[0]


def files_digest(paths: list[Path] | tuple[Path, ...], root: Path = ROOT) -> str:
    """The package version and the given files' package-relative names and contents, hashed."""
    digest = hashlib.sha256(__version__.encode())
    for path in paths:
        stat = path.stat()
        digest.update(_shown(path, root) + _content_digest(path, stat.st_mtime_ns, stat.st_size))
    return digest.hexdigest()


@functools.cache
def _shown(path: Path, root: Path) -> bytes:
    """A file's name in a key: package-relative, else its own (once per process: a run's rules
    hash the same files in each of their keys, and ``relative_to`` was most of that time)."""
    try:
        shown = path.relative_to(root).as_posix()
    except ValueError:
        shown = path.name
    return shown.encode() + b"\0"


@functools.cache
def _content_digest(path: Path, mtime_ns: int, size: int) -> bytes:
    """One file's contents, hashed once per process while it is unchanged (the keys of a run's
    rules share most of their files)."""
    return hashlib.sha256(path.read_bytes()).digest()


@functools.cache
def code_key(*names: str) -> str:
    """The key of the code of the package modules ``names`` and all they import (once per
    process: the code does not change under a running process)."""
    return closure_key(names, ROOT)


def closure_key(names: tuple[str, ...] | list[str], root: Path) -> str:
    """:func:`code_key` of a package tree at ``root`` (a test's copy)."""
    return files_digest(sorted({path for name in names for path in closure(name, root)}), root)


def source_imports(path: Path) -> list[str]:
    """The package modules a file outside the package (a rule file) imports."""
    return sorted(_imported(path.read_text("utf-8"), "rule", False))
