"""Detect vllm / vllm-ascend / torch_npu / mooncake / CANN versions without importing them.

Package versions come from ``importlib.metadata``; installed sources are located with
``importlib.util.find_spec`` on the *top-level* name only (which does not import the package);
CANN comes from its version files (``version.cfg``, ``*_install.info``, ``version.info``)
under ``$ASCEND_TOOLKIT_HOME`` or the usual ``/usr/local/Ascend`` locations.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Environment",
    "detect",
    "package_version",
    "package_root",
    "cann_version",
    "version_tuple",
]

PACKAGES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm",),
    "vllm-ascend": ("vllm-ascend", "vllm_ascend"),
    "torch_npu": ("torch-npu", "torch_npu"),
    "mooncake": ("mooncake-transfer-engine-npu", "mooncake-transfer-engine"),
}
CANN_HOMES = (
    "/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
    "/usr/local/Ascend/latest",
)


def version_tuple(text: str) -> tuple[int, ...]:
    """``"0.23.0rc1"`` -> ``(0, 23, 0)``; ``"8.5.RC1"`` -> ``(8, 5)``; ``"2.10.0.post4"`` -> ``(2, 10, 0)``."""
    out: list[int] = []
    for part in re.split(r"[.+-]", text.strip()):
        m = re.match(r"^(\d+)", part)
        if not m:
            break
        out.append(int(m.group(1)))
        if m.group(1) != part:
            break
    return tuple(out)


def package_version(key: str) -> str | None:
    """Installed version of one of :data:`PACKAGES`, or ``None``."""
    for dist in PACKAGES.get(key, (key,)):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def package_root(key: str) -> Path | None:
    """The site-packages dir holding the package's top-level module (no import): the key's name,
    ``-`` spelled ``_``."""
    try:
        spec = importlib.util.find_spec(key.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).parent
    for dist in PACKAGES.get(key, (key,)):
        try:
            return Path(str(md.distribution(dist).locate_file("")))
        except md.PackageNotFoundError:
            continue
    return None


_VERSION_LINE = re.compile(r"^\s*(?:version|Version)\s*=\s*(.+?)\s*$", re.M)
_RUNNING = re.compile(r"running_version\s*=\s*\[([^\]:]+)(?::([^\]]+))?\]")


def parse_cann_version_text(text: str) -> str | None:
    """Pull the CANN version from ``*_install.info`` / ``version.info`` / ``version.cfg`` text."""
    m = _VERSION_LINE.search(text)
    if m:
        return m.group(1).strip().strip('"')
    m = _RUNNING.search(text)
    if m:
        return (m.group(2) or m.group(1)).strip()
    return None


def cann_version(env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """``(version, file it came from)``; ``(None, None)`` when no CANN toolkit is found."""
    env = os.environ if env is None else env
    homes = [Path(env[v]) for v in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(v)]
    homes += [Path(p) for p in CANN_HOMES]
    base = Path("/usr/local/Ascend")
    if base.is_dir():
        homes += sorted(base.glob("cann-*"), reverse=True)
    for home in homes:
        candidates = [
            home / "ascend_toolkit_install.info",
            *sorted(home.glob("*/ascend_toolkit_install.info")),
            *sorted(home.glob("*_install.info")),
            home / "compiler" / "version.info",
            home / "runtime" / "version.info",
            home / "version.cfg",
            home / "version.info",
        ]
        for path in candidates:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            version = parse_cann_version_text(text)
            if version:
                return version, str(path)
    return None, None


@dataclass
class Environment:
    """What ``recipe doctor`` found."""

    versions: dict[str, str | None] = field(default_factory=dict)
    roots: dict[str, Path | None] = field(default_factory=dict)
    cann_source: str | None = None


def detect(env: Mapping[str, str] | None = None) -> Environment:
    found = Environment()
    for key in PACKAGES:
        found.versions[key] = package_version(key)
        found.roots[key] = package_root(key) if found.versions[key] else None
    found.versions["cann"], found.cann_source = cann_version(env)
    return found
