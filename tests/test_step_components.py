"""The step components are declared once (traceanalyzer.step_components): every table that
lists them is that declaration, so a component added there is in each one."""

from __future__ import annotations

import subprocess
import sys

from traceanalyzer.step_components import BY_KEY, COLUMNS, COMPONENT_NAMES, COMPONENTS, PARTS


def _keys(groups: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    return [key for _, keys in groups for key in keys]


def test_every_consumer_lists_every_component_in_order() -> None:
    from traceanalyzer.compare.explain import GRAPH_PARTS
    from traceanalyzer.compare.overview_diff import LOWER_IS_BETTER
    from traceanalyzer.overview.breakdown import COMPUTE_COMPONENTS, STEP_COLUMNS
    from traceanalyzer.report.overview_plots import COLORS
    from traceanalyzer.report.overview_text import COMPACT
    from traceanalyzer.schema import DERIVED_TABLES

    stored = [c.name for c in DERIVED_TABLES["summary_steps"].columns]
    assert [c for c in stored if c in BY_KEY] == list(COMPONENT_NAMES)
    assert [c for c in STEP_COLUMNS if c in BY_KEY] == list(COMPONENT_NAMES)
    assert _keys(COLUMNS) == _keys(PARTS) == _keys(COMPACT) == list(COMPONENT_NAMES)
    assert list(COLORS) == list(COMPONENT_NAMES)
    groups = {c.group for c in COMPONENTS}
    assert set(COMPUTE_COMPONENTS.values()) == {c.key for c in COMPONENTS if c.group == "compute"}
    assert groups == {"compute", "communication", "device", "idle"}
    assert set(LOWER_IS_BETTER) - {"step_ns"} <= set(COMPONENT_NAMES)
    assert set(GRAPH_PARTS) <= set(COMPONENT_NAMES)


def test_every_device_task_class_is_drawn_in_its_components_colour() -> None:
    from traceanalyzer.overview.breakdown import CLASSES
    from traceanalyzer.report.overview_timeline import CLASS_COLORS

    drawn = set(CLASSES) - {"host_gap", "sync_gap", "exchange"}  # intervals, not tasks
    assert set(CLASS_COLORS) == drawn
    assert all(CLASS_COLORS[c.task_class] == c.colour for c in COMPONENTS if c.task_class)


ADDED = """
import sys, types
from pathlib import Path
import traceanalyzer
path = Path(traceanalyzer.__file__).parent / "step_components.py"
source = path.read_text("utf-8").replace(
    "COMPONENT_NAMES: tuple[str, ...] =",
    "COMPONENTS = (*COMPONENTS, Component(key='idle_added_ns', label='idle: added', group='idle',"
    " doc='Added.', column='added', part='the added part', colour='#123456', task_class='added',"
    " kind='idle', lost=True, launch_idle=True))\\nCOMPONENT_NAMES: tuple[str, ...] =",
)
module = types.ModuleType("traceanalyzer.step_components")
module.__file__ = str(path)
sys.modules[module.__name__] = module
exec(compile(source, str(path), "exec"), module.__dict__)

from traceanalyzer.compare.explain import GRAPH_PARTS
from traceanalyzer.compare.overview_diff import LOWER_IS_BETTER
from traceanalyzer.overview.breakdown import STEP_COLUMNS
from traceanalyzer.overview.model import MEAN_KEYS
from traceanalyzer.report.overview_plots import COLORS
from traceanalyzer.report.overview_text import COMPACT, compact_headers
from traceanalyzer.report.overview_timeline import CLASS_COLORS
from traceanalyzer.schema import DERIVED_TABLES
from traceanalyzer.step_components import PARTS

key = "idle_added_ns"
assert key in [c.name for c in DERIVED_TABLES["summary_steps"].columns]
assert key in STEP_COLUMNS and key in MEAN_KEYS and key in COLORS and key in GRAPH_PARTS
assert key in LOWER_IS_BETTER and CLASS_COLORS["added"] == "#123456"
assert ("added", (key,)) in COMPACT and "added" in compact_headers()
assert ("the added part", (key,)) in PARTS
print("shown everywhere")
"""


def test_a_component_added_to_the_registry_is_in_every_consumer() -> None:
    """The consumers derive their tables from the registry when they are imported: one more
    component there (here patched in before any consumer loads) is in each of them."""
    done = subprocess.run([sys.executable, "-c", ADDED], capture_output=True, text=True)
    assert done.returncode == 0 and "shown everywhere" in done.stdout, done.stderr
