"""The step components are declared once (traceanalyzer.step_components): every table that
lists them is that declaration, so a component added there is in each one."""

from __future__ import annotations

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
