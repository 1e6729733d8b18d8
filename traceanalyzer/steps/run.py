"""Derive a store's ``steps`` table: one task per rank on the executor, before the rules.

A rank whose inputs, the derivation's code and its parameters are unchanged since the last run
is not derived again (``store.derived_key``, like the overview's cache); the key is also what
the rules' outcome cache sees of the steps, so a rule whose steps changed runs again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceanalyzer.engine.config import ConfigError
from traceanalyzer.engine.params import ParamError, Params
from traceanalyzer.steps.derive import derive_rank
from traceanalyzer.steps.evidence import NAMESPACE, STEP_PARAMS, default_params
from traceanalyzer.store import (
    TABLES_DIR,
    RankStore,
    Store,
    derived_key,
    derived_key_path,
    load_manifest,
    write_atomic_text,
    write_derived_table,
)

if TYPE_CHECKING:
    from traceanalyzer.executor import Executor

TABLE = "steps"


class StepSettingError(ConfigError):
    """A ``steps.NAME`` setting names no parameter or has a bad value."""


def step_params(values: Mapping[str, Any] | None = None) -> Params:
    """The derivation's parameters: defaults overlaid with ``values`` (``--set steps.X=...``,
    ``[steps]`` of the config file), each coerced to its declared type."""
    from traceanalyzer.hints import did_you_mean

    resolved = dict(default_params())
    for name, raw in (values or {}).items():
        spec = STEP_PARAMS.get(name)
        if spec is None:
            raise StepSettingError(
                f"{NAMESPACE} has no parameter {name!r}" + (did_you_mean(name, STEP_PARAMS) or "")
            )
        try:
            resolved[name] = spec.coerce(raw)
        except ParamError as exc:
            raise StepSettingError(f"{NAMESPACE}.{name}: {exc}") from None
    return Params(resolved)


def steps_rank(store_root: str, rank: int, values: Mapping[str, Any]) -> int:
    """The worker task: the rank's steps, written into the store; returns their count."""
    root = Path(store_root)
    frame = derive_rank(RankStore(root, [rank]), rank, step_params(values))
    write_derived_table(root, TABLE, rank, frame)
    return frame.height


def _code_digest() -> str:
    from traceanalyzer import __version__

    digest = hashlib.sha256(__version__.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def derive_store(
    out: str | Path,
    executor: Executor,
    values: Mapping[str, Any] | None = None,
    *,
    cache: bool = True,
) -> dict[str, Any]:
    """Bring the store's ``steps`` table up to date; returns what failed, by rank."""
    from traceanalyzer.engine.runner import store_ranks
    from traceanalyzer.executor import TaskCrashed

    step_params(values)  # a bad setting stops the run here, before any worker
    root = Path(out)
    ranks = store_ranks(Store.open(root))
    code, sessions = _code_digest(), load_manifest(root).sessions
    keys = {}
    for rank in ranks:
        inputs = {k: v.get("fingerprint") for k, v in sessions.items() if k.startswith(f"{rank}/")}
        doc = {"code": code, "inputs": inputs, "params": dict(values or {})}
        keys[rank] = hashlib.sha256(
            json.dumps(doc, sort_keys=True, default=str).encode()
        ).hexdigest()
    todo = [
        r
        for r in ranks
        if not (
            cache
            and derived_key(root, TABLE, r) == keys[r]
            and (root / TABLES_DIR / TABLE / f"rank={r}").is_dir()
        )
    ]
    failed: dict[int, str] = {}
    tasks = [(str(root), rank, dict(values or {})) for rank in todo]
    for index, result in executor.map(steps_rank, tasks):
        rank = todo[index]
        if isinstance(result, TaskCrashed):  # no stale steps: the rules then derive them
            failed[rank] = str(result)
            derived_key_path(root, TABLE, rank).unlink(missing_ok=True)
            shutil.rmtree(root / TABLES_DIR / TABLE / f"rank={rank}", ignore_errors=True)
        else:
            write_atomic_text(derived_key_path(root, TABLE, rank), keys[rank])
    for stale in (root / TABLES_DIR / TABLE).glob("rank=*"):  # ranks no longer in the store
        if int(stale.name.split("=", 1)[1]) not in ranks:
            shutil.rmtree(stale, ignore_errors=True)
    return {"failed": failed, "computed": todo, "ranks": ranks}
