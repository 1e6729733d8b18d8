"""Check the hooks' seams against the *released* vllm-ascend (and vLLM) wheels, read with ast.

Downloads ``vllm-ascend==<v>`` for every version a recipe claims (``Recipe.supported``) with
``pip download --no-deps --only-binary=:all:`` into a cache
(``$TRACEANALYZER_TEST_CACHE`` or ``~/.cache/traceanalyzer-tests/wheels``), never importing
them. Skipped when the download fails or times out (offline). vLLM wheels are ~430 MB each:
they are checked when already cached or when ``TRACEANALYZER_TEST_VLLM_WHEELS=1``.
Skip the whole module with ``TRACEANALYZER_SKIP_WHEEL_TESTS=1`` or ``-m "not slow"``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import traceanalyzer.recipes as recipes_pkg
from traceanalyzer.recipes.doctor import diagnose
from traceanalyzer.recipes.registry import RECIPES
from traceanalyzer.recipes.seams import WheelSource, missing_seams
from traceanalyzer.recipes.versions import Environment

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TRACEANALYZER_SKIP_WHEEL_TESTS") == "1",
        reason="TRACEANALYZER_SKIP_WHEEL_TESTS=1",
    ),
]

CACHE = (
    Path(os.environ.get("TRACEANALYZER_TEST_CACHE", Path.home() / ".cache" / "traceanalyzer-tests"))
    / "wheels"
)
TIMEOUT_S = int(os.environ.get("TRACEANALYZER_WHEEL_TIMEOUT", "300"))
PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_24_x86_64",
)
TEMPLATES = Path(recipes_pkg.__file__).parent / "templates"
VERSIONS = sorted({v for r in RECIPES.values() for v in r.supported})
_failed: dict[str, str] = {}


def _wheel(project: str, version: str, allow_download: bool = True) -> Path:
    dist = project.replace("-", "_")
    found = sorted(CACHE.glob(f"{dist}-{version}-*.whl"))
    if found:
        return found[0]
    key = f"{project}=={version}"
    if key in _failed:
        pytest.skip(_failed[key])
    if "offline" in _failed:
        pytest.skip(_failed["offline"])
    if not allow_download:
        pytest.skip(f"{key} not cached; set TRACEANALYZER_TEST_VLLM_WHEELS=1 to download (~430 MB)")
    CACHE.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
    ]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["--dest", str(CACHE), "--quiet", "--timeout", "20", "--retries", "1", key]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _failed[key] = _failed["offline"] = f"pip download {key} timed out after {TIMEOUT_S}s"
        pytest.skip(_failed[key])
    found = sorted(CACHE.glob(f"{dist}-{version}-*.whl"))
    if proc.returncode != 0 or not found:
        _failed[key] = f"pip download {key} failed (offline?): {proc.stderr.strip()[-300:]}"
        if "No matching distribution" not in proc.stderr:
            _failed["offline"] = _failed[key]  # network trouble: do not try the other versions
        pytest.skip(_failed[key])
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_ascend_seams(version: str) -> None:
    src = WheelSource(_wheel("vllm-ascend", version))
    for recipe in RECIPES.values():
        expected = recipe.supported.get(version)
        if expected is None:
            continue
        variant = next(v for v in recipe.variants if v.name == expected)
        assert missing_seams(src, variant.seams) == [], (
            f"{recipe.name} variant {expected} on vllm-ascend {version}"
        )
        assert version in variant.tested_versions
        # doctor would pick the same variant from these sources
        env = Environment(
            versions={
                "vllm": version,
                "vllm-ascend": version,
                "torch_npu": "x",
                "mooncake": "x",
                "cann": None,
            }
        )
        verdict = diagnose(recipe, env, ascend_src=src, vllm_src=None)
        assert verdict.variant == expected, verdict.problems


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_ascend_keeps_its_general_plugins(version: str) -> None:
    """Our plugin is one more entry point; vllm-ascend's own plugins are untouched (no VLLM_PLUGINS)."""
    import zipfile

    with zipfile.ZipFile(_wheel("vllm-ascend", version)) as zf:
        ep = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = zf.read(ep).decode()
    assert "[vllm.general_plugins]" in text and "ascend_kv_connector" in text


@pytest.mark.parametrize("version", VERSIONS)
def test_vllm_seams(version: str) -> None:
    allow = os.environ.get("TRACEANALYZER_TEST_VLLM_WHEELS") == "1"
    src = WheelSource(_wheel("vllm", version, allow_download=allow))
    for recipe in RECIPES.values():
        if version in recipe.supported:
            assert missing_seams(src, recipe.vllm_seams) == [], f"{recipe.name} on vLLM {version}"


def test_hook_constants_match_seams() -> None:
    """The module paths hard-coded in the hook scripts are the ones the seams check."""
    capture = (TEMPLATES / "graph-capture-repeat" / "hooks" / "ta_capture_hooks.py").read_text()
    store = (
        TEMPLATES / "mooncake-store-transfer" / "ta_store_hooks" / "ta_store_hooks" / "__init__.py"
    ).read_text()
    gcr, mst = RECIPES["graph-capture-repeat"], RECIPES["mooncake-store-transfer"]
    modules = {s.module for v in gcr.variants for s in v.seams}
    assert (
        '"vllm_ascend.compilation.acl_graph"' in capture
        and "vllm_ascend.compilation.acl_graph" in modules
    )
    assert '"vllm_ascend.device_allocator.sleep_mem_optimized"' in capture
    for variant in mst.variants:
        module = variant.seams[0].module
        assert f'"{variant.name}": "{module}"' in store
