"""Build hook: compile the native trace scanner (traceanalyzer/parse/_trace_scan.c).

Optional by design. Without a C compiler (or Python headers) the build warns and goes on, and
trace_view.json is read by the DuckDB path alone: the same tables, slower (docs/benchmarks).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "traceanalyzer/parse/_trace_scan.c"
MODULE = "traceanalyzer.parse._trace_scan"


class NativeScannerHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        editable = version == "editable"
        if editable:
            _precompile(Path(self.root))
        out = Path(self.root) if editable else Path(tempfile.mkdtemp(prefix="traceanalyzer-ext-"))
        try:
            built = _compile(Path(self.root), out)
        except Exception as exc:  # no compiler, no headers: the pure path still works
            print(
                f"traceanalyzer: native trace scanner not built ({exc}); trace_view.json will "
                "be read by the slower DuckDB path",
                file=sys.stderr,
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:  # an editable install imports the module built in place
            build_data["force_include"][str(built)] = str(built.relative_to(out))


def _precompile(root: Path) -> None:
    """Write the bytecode of an editable install's sources, as pip does for a wheel's.

    An editable install runs the source tree, whose bytecode Python would write at the first
    import; where it may not (PYTHONDONTWRITEBYTECODE, a read-only checkout) every run would
    compile ~90 modules again, about 0.17 s of a run on a small sample. Stale bytecode is
    ignored (its source's mtime is checked), so this is only ever a head start.
    """
    import compileall

    for folder in ("traceanalyzer", "rules"):
        try:
            compileall.compile_dir(str(root / folder), quiet=2)
        except OSError as exc:  # read-only tree: imports compile as they would have
            print(f"traceanalyzer: bytecode not written ({exc})", file=sys.stderr)


def _compile(root: Path, out: Path) -> Path:
    from setuptools import Distribution, Extension

    ext = Extension(MODULE, [str(root / SOURCE)], extra_compile_args=["-O2"])
    dist = Distribution({"name": "traceanalyzer", "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(out)
    cmd.build_temp = tempfile.mkdtemp(prefix="traceanalyzer-obj-")
    cmd.ensure_finalized()
    cmd.run()
    return out / cmd.get_ext_filename(MODULE)
