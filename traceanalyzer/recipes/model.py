"""The recipe model: a recipe is parameters + hook variants + a function that builds files."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from traceanalyzer.recipes.params import Param
from traceanalyzer.recipes.seams import HookVariant, Seam

__all__ = ["Recipe", "RenderedFile", "template_text", "fill", "sh_command", "sh_env"]


@dataclass(frozen=True)
class RenderedFile:
    """One file of a rendered recipe folder."""

    text: str
    executable: bool = False
    snapshot: bool = True  # generated text (commands, env, configs) is snapshot-tested


@dataclass(frozen=True)
class Recipe:
    """A bundled launch recipe.

    ``variants`` are ordered newest first; ``recipe doctor`` picks the first one whose seams all
    exist in the installed vllm-ascend. ``vllm_seams`` must exist in vLLM for every variant.
    ``supported`` maps each claimed vllm-ascend version to the variant expected to match it
    (the real-code test downloads those wheels and checks).
    """

    name: str
    summary: str
    reproduces: str
    expect: str
    params: tuple[Param, ...]
    variants: tuple[HookVariant, ...]
    vllm_seams: tuple[Seam, ...]
    supported: Mapping[str, str]
    build: Callable[[dict[str, Any]], dict[str, RenderedFile]] = field(compare=False)
    cross_check: Callable[[dict[str, Any]], None] | None = field(default=None, compare=False)
    cann_note: Callable[[str | None], str | None] | None = field(default=None, compare=False)
    # the serving evidence the recipe turns on (docs/serving.md), each with the vLLM seam it
    # needs: ``recipe doctor`` says which the installed vLLM has
    evidence: tuple[tuple[str, Seam], ...] = ()

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


def template_text(recipe: str, relpath: str) -> str:
    """Text of a file shipped under ``traceanalyzer/recipes/templates/<recipe>/<relpath>``."""
    node = resources.files("traceanalyzer.recipes").joinpath(
        "templates", recipe, *relpath.split("/")
    )
    return node.read_text(encoding="utf-8")


_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def fill(template: str, values: Mapping[str, str]) -> str:
    """Replace ``@@NAME@@`` placeholders; every placeholder must be given and used."""
    used: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise KeyError(f"template placeholder @@{key}@@ has no value")
        used.add(key)
        return values[key]

    out = _PLACEHOLDER.sub(sub, template)
    unused = set(values) - used
    if unused:
        raise KeyError(f"values given for absent placeholders: {sorted(unused)}")
    return out


def sh_command(argv: Sequence[str], indent: str = "  ", raw: Sequence[int] = ()) -> str:
    """A multi-line shell command, one flag (with its value) per line.

    Items whose index is in ``raw`` are emitted unquoted (e.g. ``"$VLLM"`` or ``"${ARGS[@]}"``).
    """
    parts: list[str] = []
    for i, item in enumerate(argv):
        parts.append(item if i in raw else shlex.quote(item))
    i = 1
    while i < len(parts) and not parts[i].startswith("--"):
        i += 1  # the command and its positional words stay on the first line
    lines: list[str] = [" ".join(parts[:i])]
    while i < len(parts):
        cur = parts[i]
        if cur.startswith("--") and i + 1 < len(parts) and not parts[i + 1].startswith("--"):
            cur = f"{cur} {parts[i + 1]}"
            i += 1
        lines.append(cur)
        i += 1
    return (" \\\n" + indent).join(lines)


def options_argv(options: Mapping[str, str | None]) -> list[str]:
    """The words of command-line ``options`` in their order: each name, then its value (a flag's
    is None)."""
    return [word for name, value in options.items() for word in (name, value) if word is not None]


def sh_env(env: Mapping[str, str]) -> str:
    """``export K=V`` lines in the given order, values shell-quoted."""
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())


def bash_script(header: str, body: str) -> str:
    """A rendered script: ``header`` (its comment lines), strict mode, then ``body``."""
    return f"#!/usr/bin/env bash\n{header}\nset -euo pipefail\n{body}\n"


# A script's lines that source the env.sh rendered beside it.
SOURCE_ENV_SH = (
    '_TA_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    '# shellcheck source=env.sh\nsource "$_TA_HERE/env.sh"\n'
)

# env.sh's lines that source CANN's set_env.sh when it exists (it reads unset variables), then
# name the vllm to run (placeholder: CANN_SET_ENV).
SOURCE_CANN = """\
CANN_SET_ENV=@@CANN_SET_ENV@@
if [[ -f "$CANN_SET_ENV" ]]; then
  set +u
  # shellcheck disable=SC1090
  source "$CANN_SET_ENV"
  set -u
fi
export VLLM="${VLLM:-vllm}"
"""


def offline_analysis(values: Mapping[str, Any]) -> str:
    """run.sh's line that parses the profiles after the run (``analyse=offline``, ANALYSE_PARAM)."""
    if values["analyse"] == "offline":
        return '"$PYTHON" "$HERE/analyse_profiles.py" "$PROFILING_DIR"'
    return "# analyse=inline: the workers parsed their traces at profiler stop"


def shipped(recipe: str, *relpaths: str) -> dict[str, RenderedFile]:
    """Files shipped under ``templates/<recipe>/``, copied as they are (not snapshot-tested)."""
    return {rel: RenderedFile(template_text(recipe, rel), snapshot=False) for rel in relpaths}
