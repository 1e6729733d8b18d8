"""Render a recipe into a self-contained folder, atomically."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from traceanalyzer.recipes.model import Recipe, RenderedFile
from traceanalyzer.recipes.params import ParamError, resolve_params
from traceanalyzer.recipes.registry import RECIPES, get_recipe
from traceanalyzer.version import __version__

__all__ = ["ParamError", "RenderError", "Rendered", "resolve", "build_files", "render"]

MANIFEST = "recipe.json"


class RenderError(RuntimeError):
    """The output folder cannot be written (holds files of the user's, ...)."""


@dataclass(frozen=True)
class Rendered:
    recipe: str
    out: Path
    values: dict[str, Any]
    files: tuple[str, ...]


def resolve(recipe: Recipe, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Validated parameter values (defaults + overrides); raises :class:`ParamError`."""
    values = resolve_params(recipe.params, overrides)
    if recipe.cross_check is not None:
        recipe.cross_check(values)
    return values


def build_files(recipe: Recipe, values: Mapping[str, Any]) -> dict[str, RenderedFile]:
    """Every file of the rendered folder, including the ``recipe.json`` manifest and README."""
    files = dict(recipe.build(dict(values)))
    manifest = {
        "recipe": recipe.name,
        "rendered_by": f"traceanalyzer {__version__}",
        "params": {p.name: values[p.name] for p in recipe.params},
        "supported_vllm_ascend": dict(recipe.supported),
    }
    files[MANIFEST] = RenderedFile(json.dumps(manifest, indent=2) + "\n")
    files["README.md"] = RenderedFile(_readme(recipe, values), snapshot=False)
    return files


def _readme(recipe: Recipe, values: Mapping[str, Any]) -> str:
    params = "\n".join(
        f"| `{p.name}` | `{p.format_value(values[p.name])}` | {p.help} |" for p in recipe.params
    )
    return (
        f"# {recipe.name}\n\n{recipe.summary}\n\n## What it reproduces\n\n{recipe.reproduces}\n\n"
        f"## What to expect\n\n{recipe.expect}\n\n## Run\n\n```bash\n./run.sh\n```\n\n"
        "Results land in `profiling_data/<arm>/`; `run.sh` ends with "
        "`traceanalyzer run profiling_data --out analysis`.\n\n"
        f"## Parameters used\n\n| name | value | meaning |\n|---|---|---|\n{params}\n"
    )


def _write_tree(root: Path, files: Mapping[str, RenderedFile]) -> None:
    for rel, f in sorted(files.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f.text, encoding="utf-8")
        if f.executable:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@functools.cache
def recipe_files() -> frozenset[str]:
    """Every file a bundled recipe writes (relative paths; they do not depend on parameters):
    what ``--force`` may replace or remove in a folder a recipe was rendered into."""
    names: set[str] = set()
    for name in RECIPES:
        recipe = get_recipe(name)
        names.update(build_files(recipe, resolve(recipe, {})))
    return frozenset(names)


def _in_the_way(out: Path, own: frozenset[str]) -> list[str]:
    """What ``out`` holds that no recipe writes (``.git``, ``mydata.txt``, ``sub/``, a run's
    ``profiling_data/``): names relative to ``out``, a folder with a ``/``. Entries are looked
    at, never followed: a link is in the way, even one named like a recipe's file."""
    own_dirs = {str(parent) for rel in own for parent in PurePosixPath(rel).parents} - {"."}
    found = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(out / rel_dir) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if rel in own_dirs:
                        stack.append(rel)
                    else:
                        found.append(rel + "/")
                elif rel not in own or not entry.is_file(follow_symlinks=False):
                    found.append(rel)
    return sorted(found)


def _write_in_place(out: Path, files: Mapping[str, RenderedFile], own: frozenset[str]) -> None:
    """Replace the recipe files of ``out`` (already checked: it holds nothing else), each one
    atomically; a recipe file the new render does not write is removed, then any of the
    recipes' folders left empty. ``out`` itself stays (it may be the shell's current folder)."""
    for rel, f in sorted(files.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777 if f.executable else 0o666)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(f.text)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    for rel in sorted(own - files.keys()):
        (out / rel).unlink(missing_ok=True)
    for folder in sorted({p for rel in own for p in PurePosixPath(rel).parents}, reverse=True):
        if str(folder) != "." and (out / folder).is_dir():
            with contextlib.suppress(OSError):  # not empty: it holds the new render's files
                (out / folder).rmdir()


def render(
    name: str,
    out: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    force: bool = False,
) -> Rendered:
    """Render recipe ``name`` into ``out``.

    Parameters are validated before anything is written. A new ``out`` is written to a
    temporary sibling and renamed into place, so it is either absent or complete. An existing
    ``out`` that holds anything but the files a recipe writes (``.git``, the user's files, a
    run's ``profiling_data/``) is refused, naming what is in the way, with ``force`` or
    without: nothing else is ever deleted. One that holds a rendered recipe is replaced, file
    by file, only with ``force=True``.
    """
    recipe = get_recipe(name)
    values = resolve(recipe, overrides or {})
    files = build_files(recipe, values)
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise RenderError(f"{out} exists and is not a directory")
    if out.is_dir():
        own = recipe_files() | files.keys()
        try:
            in_the_way = _in_the_way(out, own)
        except OSError as exc:
            raise RenderError(f"{out} cannot be read: {exc.strerror or exc}") from None
        if in_the_way:
            shown = ", ".join(in_the_way[:8]) + (", ..." if len(in_the_way) > 8 else "")
            raise RenderError(
                f"{out} holds {shown}: not files a recipe writes, and --force replaces only "
                "those; move them, or render into another folder"
            )
        if any(out.iterdir()) and not force:
            raise RenderError(f"{out} is not empty (a rendered recipe); pass --force to replace it")
        _write_in_place(out, files, own)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            _write_tree(tmp, files)
            tmp.chmod(0o755)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Rendered(recipe=name, out=out, values=values, files=tuple(sorted(files)))
