"""Render a recipe into a self-contained folder, atomically."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceanalyzer import __version__
from traceanalyzer.recipes.model import Recipe, RenderedFile
from traceanalyzer.recipes.params import ParamError, resolve_params
from traceanalyzer.recipes.registry import get_recipe

__all__ = ["RenderError", "Rendered", "resolve", "build_files", "render"]

MANIFEST = "recipe.json"


class RenderError(RuntimeError):
    """The output folder cannot be written (exists and is not empty, ...)."""


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


def render(
    name: str,
    out: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    force: bool = False,
) -> Rendered:
    """Render recipe ``name`` into ``out``.

    Parameters are validated before anything is written. The folder is written to a temporary
    sibling and renamed into place, so ``out`` is either the old folder or the complete new
    one. A non-empty ``out`` is only replaced with ``force=True``.
    """
    recipe = get_recipe(name)
    values = resolve(recipe, overrides or {})
    files = build_files(recipe, values)
    out = Path(out).absolute()
    if out.exists() and not out.is_dir():
        raise RenderError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise RenderError(f"{out} is not empty; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_tree(tmp, files)
        tmp.chmod(0o755)
        old: Path | None = None
        if out.is_dir():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            old.rmdir()
            out.rename(old)
        try:
            tmp.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Rendered(recipe=name, out=out, values=values, files=tuple(sorted(files)))


__all__ += ["ParamError"]
