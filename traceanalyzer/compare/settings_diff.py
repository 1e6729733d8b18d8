"""``diff``'s ``settings_changed``: the environment, profiler settings and versions that differ
between two runs, as their stores' ``sessions`` tables recorded them (profiler_metadata.json,
profiler_info.json, a Db export's META_DATA).

Each setting is compared rank by rank (the ranks both runs profiled; every value of each run
when they share none), and listed with both values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from traceanalyzer.engine.findings import rank_words
from traceanalyzer.store import Store

# sessions columns compared as they are: setting name and what it is
COLUMNS = {
    "torch_npu_version": ("version.torch_npu", "version"),
    "cann_version": ("version.cann", "version"),
    "profiler_level": ("profiler.level", "profiler"),
    "export_type": ("profiler.export_type", "profiler"),
    "generation": ("profiler.export_generation", "profiler"),
}
ENVIRONMENT_KEY = "ENV_VARIABLES"  # profiler_metadata.json's record of the process environment
# what always differs between two runs, or repeats another setting: not a setting that changed
IGNORED = (
    r"^metadata\.db\.SESSION_TIME_INFO\.",  # when the Db export's session ran
    r"^metadata\.db\.ENV_VARIABLES\.",  # the environment again (env.*)
)
NOT_RECORDED = "(not recorded)"


def settings_of(sessions: pl.DataFrame) -> dict[str, dict[int, Any]]:
    """Setting name -> rank -> value (the rank's first session), from a ``sessions`` table."""
    out: dict[str, dict[int, Any]] = {}
    ignored = re.compile("|".join(IGNORED))
    for row in sessions.sort("rank", "start_ns", nulls_last=True).iter_rows(named=True):
        rank = int(row["rank"])
        flat: dict[str, Any] = {name: row.get(column) for column, (name, _) in COLUMNS.items()}
        metadata = _json(row.get("metadata"))
        environment = metadata.pop(ENVIRONMENT_KEY, None)
        if isinstance(environment, Mapping):
            flat |= {f"env.{k}": _value(v) for k, v in environment.items()}
        flat |= _flatten("metadata", metadata)
        flat |= _flatten("profiler", _json(row.get("config")))
        for name, value in flat.items():
            if not ignored.search(name):
                out.setdefault(name, {}).setdefault(rank, value)
    return out


def _json(text: Any) -> dict[str, Any]:
    if not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flatten(f"{prefix}.{k}", v)
        return out
    return {prefix: _value(value)}


def _value(value: Any) -> Any:
    """A scalar as it is, anything else as compact JSON (a list compares by its text)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _source(name: str) -> str:
    if name.startswith("env."):
        return "environment"
    return dict(COLUMNS.values()).get(name, name.split(".", 1)[0])


def _shown(values: Mapping[int, Any], ranks: Iterable[int]) -> Any:
    """The value on ``ranks``; when they differ, each value with its ranks, in words."""
    by_value: dict[str, list[int]] = {}
    for rank in ranks:
        value = values.get(rank)
        by_value.setdefault(json.dumps(value), []).append(rank)
    if len(by_value) == 1:
        return json.loads(next(iter(by_value)))
    return "; ".join(f"{value_text(json.loads(v))} ({rank_words(r)})" for v, r in by_value.items())


def value_text(value: Any) -> str:
    """A setting's value as the reports write it."""
    return NOT_RECORDED if value is None else str(value)


def settings_changed(
    base: Mapping[str, Mapping[int, Any]], target: Mapping[str, Mapping[int, Any]]
) -> list[dict[str, Any]]:
    """Every setting whose value differs: ``setting``, ``source`` (environment, profiler,
    version, metadata), ``base`` and ``target`` (None: not recorded) and ``ranks`` (where)."""
    out = []
    base_ranks = {r for values in base.values() for r in values}
    target_ranks = {r for values in target.values() for r in values}
    common = sorted(base_ranks & target_ranks)
    for name in sorted({*base, *target}):
        b, t = base.get(name, {}), target.get(name, {})
        if common:
            ranks = [r for r in common if b.get(r) != t.get(r)]
            if not ranks:
                continue
            shown_b, shown_t = _shown(b, ranks), _shown(t, ranks)
        else:
            shown_b, shown_t = _shown(b, sorted(base_ranks)), _shown(t, sorted(target_ranks))
            if shown_b == shown_t:
                continue
            ranks = []
        out.append(
            {"setting": name, "source": _source(name), "base": shown_b, "target": shown_t,
             "ranks": ranks}
        )  # fmt: skip
    return out


def run_settings(out_dir: Path) -> dict[str, dict[int, Any]]:
    """:func:`settings_of` the store of ``out_dir``."""
    return settings_of(Store.open(out_dir).table("sessions").collect())
