"""The code seams the recipe hooks touch, as data, checked against source text with ``ast``.

One table serves two users:

* ``recipe doctor`` checks the *installed* vllm / vllm-ascend sources (located without
  importing them) and picks the first hook variant whose seams all exist;
* the real-code test checks the *released wheels* of every version a recipe claims to support.

Nothing here imports vllm, vllm_ascend, torch or torch_npu.
"""

from __future__ import annotations

import ast
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

__all__ = [
    "Seam",
    "HookVariant",
    "SourceReader",
    "DirSource",
    "WheelSource",
    "check_seam",
    "missing_seams",
]


class SourceReader(Protocol):
    """Reads a package file by its path relative to site-packages (``vllm_ascend/x.py``)."""

    def read(self, relpath: str) -> str | None: ...


@dataclass(frozen=True)
class DirSource:
    """Sources below a site-packages-like directory."""

    root: Path

    def read(self, relpath: str) -> str | None:
        path = Path(self.root) / relpath
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None


@dataclass
class WheelSource:
    """Sources inside a wheel (a zip), read without extracting or importing."""

    path: Path
    _names: set[str] = field(default_factory=set, init=False, repr=False)

    def read(self, relpath: str) -> str | None:
        with zipfile.ZipFile(self.path) as zf:
            if not self._names:
                self._names = set(zf.namelist())
            if relpath not in self._names:
                return None
            return zf.read(relpath).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Seam:
    """One thing a hook relies on.

    ``module`` is dotted (``vllm_ascend.compilation.acl_graph``). ``symbol`` is ``""`` (the module
    itself), ``name`` (module-level def/class/assignment/import) or ``Class.member`` (method,
    class attribute, or ``self.member = ...`` in any method). ``uses`` names an attribute that
    must be accessed inside the symbol (``batch_get_into_multi_buffers`` in ``MooncakeBackend.get``).
    ``literal`` is a string constant that must occur in the module.
    """

    module: str
    symbol: str = ""
    uses: str = ""
    literal: str = ""
    why: str = ""

    def describe(self) -> str:
        text = self.module + (f".{self.symbol}" if self.symbol else "")
        if self.uses:
            text += f" (uses .{self.uses})"
        if self.literal:
            text += f" (contains {self.literal!r})"
        return text


# The model runner's scopes (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1): a recipe that profiles
# iterations turns them on, and `recipe doctor` says whether the installed vLLM has the switch.
SCOPES_EVIDENCE = (
    "the model runner's scopes mark each iteration (VLLM_CUSTOM_SCOPES_FOR_PROFILING=1)",
    Seam("vllm.envs", literal="VLLM_CUSTOM_SCOPES_FOR_PROFILING"),
)


@dataclass(frozen=True)
class HookVariant:
    """A way of hooking one recipe into one range of vllm-ascend releases."""

    name: str
    summary: str
    min_version: str
    max_version: str | None  # exclusive
    seams: tuple[Seam, ...]
    tested_versions: tuple[str, ...] = ()


def _read_module(src: SourceReader, module: str) -> str | None:
    base = module.replace(".", "/")
    for rel in (base + ".py", base + "/__init__.py"):
        text = src.read(rel)
        if text is not None:
            return text
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    """What ``node`` assigns to (nothing: not an assignment)."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def _defines(node: ast.AST, name: str, defs: tuple[type[ast.AST], ...]) -> bool:
    """``node`` is one of ``defs`` (function or class definitions) named ``name``, or assigns
    to the bare ``name``."""
    if isinstance(node, defs):
        return node.name == name  # type: ignore[attr-defined]
    return any(isinstance(t, ast.Name) and t.id == name for t in _targets(node))


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if _defines(node, name, (*_FUNCTIONS, ast.ClassDef)):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if (alias.asname or alias.name.split(".")[0]) == name:
                    return node
    # names defined under ``if TYPE_CHECKING`` / ``try`` blocks count too
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    return None


def _class_member(cls: ast.ClassDef, member: str) -> ast.AST | None:
    for node in cls.body:
        if _defines(node, member, _FUNCTIONS):
            return node
    for node in ast.walk(cls):
        for t in _targets(node):
            if (
                isinstance(t, ast.Attribute)
                and t.attr == member
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                return node
    return None


def check_seam(src: SourceReader, seam: Seam) -> str | None:
    """``None`` when the seam exists, else a one-line reason.

    ``module`` may list alternatives separated by ``|`` (code that moved between releases);
    the seam exists when it exists in any of them.
    """
    if "|" in seam.module:
        reasons = [check_seam(src, replace(seam, module=alt)) for alt in seam.module.split("|")]
        return None if None in reasons else " / ".join(filter(None, reasons))
    text = _read_module(src, seam.module)
    if text is None:
        return f"module {seam.module} not found"
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:  # pragma: no cover - released sources parse
        return f"module {seam.module} does not parse: {exc}"
    node: ast.AST = tree
    if seam.symbol:
        head, _, member = seam.symbol.partition(".")
        found = _top_level(tree, head)
        if found is None:
            return f"{seam.module} has no {head}"
        node = found
        if member:
            if not isinstance(found, ast.ClassDef):
                return f"{seam.module}.{head} is not a class"
            sub = _class_member(found, member)
            if sub is None:
                return f"{seam.module}.{head} has no member {member}"
            node = sub
    if seam.uses and not any(
        isinstance(n, ast.Attribute) and n.attr == seam.uses for n in ast.walk(node)
    ):
        return f"{seam.module}.{seam.symbol} does not use .{seam.uses}"
    if seam.literal and not any(
        isinstance(n, ast.Constant) and n.value == seam.literal for n in ast.walk(tree)
    ):
        return f"{seam.module} does not contain {seam.literal!r}"
    return None


def missing_seams(src: SourceReader, seams: Iterable[Seam]) -> list[str]:
    """Reasons for every seam that is missing (empty list: all present)."""
    return [reason for seam in seams if (reason := check_seam(src, seam)) is not None]
