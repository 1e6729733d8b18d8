"""Worker extension for the ``graph-capture-repeat`` recipe (rendered by traceanalyzer).

vLLM mixes :class:`CaptureRepeatExtension` into every worker class when the launcher passes
``worker_extension_cls="ta_capture_hooks.CaptureRepeatExtension"``; the launcher then calls
``llm.collective_rpc("ta_recapture", args=(plan,))``. This module must be importable in the
multiprocessing workers, so ``run.sh`` puts its folder on ``PYTHONPATH``.

Nothing heavy is imported at module import time: ``torch``, ``torch_npu``, ``vllm`` and
``vllm_ascend`` are imported inside the functions that run in the worker, so the module can be
imported (and unit-tested) on a machine without them.

What one round does, per rank:

1. clear the captured ACL graphs and the per-capture attention state, the way the installed
   vllm-ascend does it itself (variant ``weakset``: ``AclGraphSleepWakeupManager
   .reset_all_graph_params()``, vllm-ascend >= 0.23; variant ``gc``: find every
   ``ACLGraphWrapper`` with ``gc``, clear ``concrete_aclgraph_entries`` and reset the lists in
   ``_graph_params`` / ``_draft_graph_params``, vllm-ascend 0.13 - 0.22);
2. optionally start ``torch_npu.profiler`` (chosen rounds only), one ``*_ascend_pt`` per rank
   per profiled round, named ``rank{rank}_round{r}``;
3. ``model_runner.capture_model()`` between two ``torch.npu.synchronize()``, timed; every
   ``torch.npu.graph`` context entered meanwhile is timed too (per-graph capture seconds).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import fields, is_dataclass
from typing import Any

ACL_GRAPH_MODULE = "vllm_ascend.compilation.acl_graph"
SLEEP_MANAGER_MODULE = "vllm_ascend.device_allocator.sleep_mem_optimized"
GRAPH_PARAM_GLOBALS = ("_graph_params", "_draft_graph_params", "_draft_graph_prefill_params")
VARIANTS = ("auto", "weakset", "gc")


def _import(name: str) -> Any:
    import importlib

    return importlib.import_module(name)


def _npu_synchronize() -> None:
    import torch
    import torch_npu  # noqa: F401  - registers torch.npu

    torch.npu.synchronize()


def reset_graph_params(params: Any) -> int:
    """Empty every list held in a ``GraphParams`` dataclass (events, handles, attn_params).

    Mirrors ``AclGraphSleepWakeupManager.reset_graph_params`` of vllm-ascend >= 0.23 so the
    older versions get the same treatment. Returns the number of lists emptied.
    """
    if params is None or not is_dataclass(params):
        return 0
    emptied = 0
    for graph_field in fields(params):
        attr = getattr(params, graph_field.name, None)
        if not isinstance(attr, MutableMapping):
            continue
        for key, value in list(attr.items()):
            if isinstance(value, list):
                attr[key] = []
                emptied += 1
    return emptied


def pick_variant(requested: str, acl_graph: Any) -> str:
    """Resolve ``auto``; refuse a variant the installed vllm-ascend cannot do."""
    if requested not in VARIANTS:
        raise ValueError(f"unknown hook variant {requested!r}; expected one of {VARIANTS}")
    has_weakset = hasattr(acl_graph, "_acl_graph_wrappers")
    if requested == "auto":
        return "weakset" if has_weakset else "gc"
    if requested == "weakset" and not has_weakset:
        raise RuntimeError(
            "hook variant 'weakset' needs vllm-ascend >= 0.23 (acl_graph._acl_graph_wrappers); "
            "the installed vllm-ascend does not have it. Re-run `traceanalyzer recipe doctor`."
        )
    return requested


def _wrappers_by_gc(acl_graph: Any, runner: Any) -> list[Any]:
    found: dict[int, Any] = {}
    model = getattr(runner, "model", None)
    if model is not None and hasattr(model, "concrete_aclgraph_entries"):
        found[id(model)] = model  # FULL mode: the model *is* the wrapper
    wrapper_cls = getattr(acl_graph, "ACLGraphWrapper", None)
    if wrapper_cls is not None:
        for obj in gc.get_objects():
            try:
                if isinstance(obj, wrapper_cls):
                    found[id(obj)] = obj
            except ReferenceError:  # dead weak proxies
                continue
    return list(found.values())


def clear_capture_state(
    runner: Any, variant: str = "auto", acl_graph: Any = None
) -> dict[str, Any]:
    """Drop the captured graphs and per-capture state so ``capture_model()`` captures again."""
    if acl_graph is None:
        acl_graph = _import(ACL_GRAPH_MODULE)
    variant = pick_variant(variant, acl_graph)
    if variant == "weakset":
        wrappers = list(acl_graph._acl_graph_wrappers)
        entries = sum(len(w.concrete_aclgraph_entries) for w in wrappers)
        manager = _import(SLEEP_MANAGER_MODULE).AclGraphSleepWakeupManager
        manager.reset_all_graph_params()
        return {"variant": variant, "wrappers": len(wrappers), "entries_cleared": entries}
    wrappers = _wrappers_by_gc(acl_graph, runner)
    entries = 0
    for wrapper in wrappers:
        entries += len(wrapper.concrete_aclgraph_entries)
        wrapper.concrete_aclgraph_entries.clear()
        if hasattr(wrapper, "first_run_finished"):
            wrapper.first_run_finished = False
    for name in GRAPH_PARAM_GLOBALS:
        reset_graph_params(getattr(acl_graph, name, None))
    return {"variant": variant, "wrappers": len(wrappers), "entries_cleared": entries}


def make_timed_graph_class(base: type, sink: list[float]) -> type:
    """A subclass of ``torch_npu.npu.graph`` that appends each capture's seconds to ``sink``."""

    class TimedGraph(base):  # type: ignore[misc, valid-type]
        def __enter__(self) -> Any:
            self._ta_t0 = time.perf_counter()
            return super().__enter__()

        def __exit__(self, *exc: Any) -> Any:
            try:
                return super().__exit__(*exc)
            finally:
                sink.append(time.perf_counter() - self._ta_t0)

    TimedGraph.__name__ = TimedGraph.__qualname__ = getattr(base, "__name__", "graph")
    TimedGraph.__module__ = getattr(base, "__module__", __name__)
    return TimedGraph


@contextlib.contextmanager
def timed_graph_capture(sink: list[float]) -> Iterator[None]:
    """Swap ``torch.npu.graph`` (looked up at call time by ``ACLGraphWrapper.__call__``)."""
    import torch
    import torch_npu

    modules = [torch_npu.npu]
    torch_npu_mod = getattr(torch, "npu", None)
    if torch_npu_mod is not None and torch_npu_mod is not torch_npu.npu:
        modules.append(torch_npu_mod)
    originals = [(m, m.graph) for m in modules]
    timed = make_timed_graph_class(torch_npu.npu.graph, sink)
    for m, _ in originals:
        m.graph = timed
    try:
        yield
    finally:
        for m, orig in originals:
            m.graph = orig


def make_profiler(out_dir: str, worker_name: str, level: str, analyse: bool) -> Any:
    """A ``torch_npu.profiler.profile`` that records CANN API calls (aclmdlRICapture*, memcpy)."""
    import torch_npu

    prof_mod = torch_npu.profiler
    experimental = prof_mod._ExperimentalConfig(
        profiler_level=getattr(prof_mod.ProfilerLevel, level),
        aic_metrics=prof_mod.AiCMetrics.PipeUtilization,
        l2_cache=False,
        data_simplification=True,
        export_type=[prof_mod.ExportType.Text],
    )
    return prof_mod.profile(
        activities=[prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.NPU],
        record_shapes=False,
        with_stack=False,
        experimental_config=experimental,
        on_trace_ready=prof_mod.tensorboard_trace_handler(
            out_dir, worker_name=worker_name, analyse_flag=analyse
        ),
    )


def _add_metadata(prof: Any, items: dict[str, Any]) -> None:
    add = getattr(prof, "add_metadata", None)
    if add is None:
        return
    for key, value in items.items():
        add(key, str(value))


def _capturing_enabled() -> None:
    with contextlib.suppress(ImportError, AttributeError):
        _import("vllm.compilation.monitor").set_cudagraph_capturing_enabled(True)


def _vllm_config_context(vllm_config: Any) -> contextlib.AbstractContextManager[Any]:
    if vllm_config is None:
        return contextlib.nullcontext()
    try:
        return _import("vllm.config").set_current_vllm_config(vllm_config)
    except (ImportError, AttributeError):
        return contextlib.nullcontext()


def run_recapture(
    runner: Any,
    plan: dict[str, Any],
    rank: int = 0,
    vllm_config: Any = None,
    acl_graph: Any = None,
) -> dict[str, Any]:
    """Clear + re-capture ``plan["rounds"]`` times; profile ``plan["profile_rounds"]``.

    ``plan`` keys: rounds, profile_rounds, profiler_level (Level1|Level2), analyse (bool),
    out_dir, arm, hook_variant (auto|weakset|gc), per_graph_timing (bool).
    Returns (and writes to ``out_dir/capture_timings_rank{rank}.json``) the timings.
    """
    rounds = int(plan["rounds"])
    profile_rounds = {int(r) for r in plan.get("profile_rounds", [])}
    out_dir = str(plan.get("out_dir") or os.getcwd())
    level = str(plan.get("profiler_level", "Level2"))
    analyse = bool(plan.get("analyse", False))
    arm = str(plan.get("arm", ""))
    variant = str(plan.get("hook_variant", "auto"))
    per_graph = bool(plan.get("per_graph_timing", True))

    sink: list[float] = []
    results: list[dict[str, Any]] = []
    timer = timed_graph_capture(sink) if per_graph else contextlib.nullcontext()
    with timer:
        for r in range(1, rounds + 1):
            cleared = clear_capture_state(runner, variant, acl_graph)
            _capturing_enabled()
            prof = None
            if r in profile_rounds:
                prof = make_profiler(out_dir, f"rank{rank}_round{r}", level, analyse)
            first_graph = len(sink)
            _npu_synchronize()
            if prof is not None:
                prof.start()
                _add_metadata(
                    prof,
                    {
                        "traceanalyzer.window": "graph_capture",
                        "traceanalyzer.round": r,
                        "traceanalyzer.arm": arm,
                        "traceanalyzer.hccl_op_expansion_mode": os.environ.get(
                            "HCCL_OP_EXPANSION_MODE", ""
                        ),
                    },
                )
            try:
                t0 = time.perf_counter()
                with _vllm_config_context(vllm_config):
                    runner.capture_model()
                _npu_synchronize()
                seconds = time.perf_counter() - t0
            finally:
                if prof is not None:
                    prof.stop()
            results.append(
                {
                    "round": r,
                    "capture_s": seconds,
                    "graphs": len(sink) - first_graph,
                    "graph_s": sink[first_graph:],
                    "entries_cleared": cleared["entries_cleared"],
                    "wrappers": cleared["wrappers"],
                    "profiled": prof is not None,
                }
            )
    out = {
        "rank": rank,
        "pid": os.getpid(),
        "arm": arm,
        "hook_variant": cleared["variant"] if rounds else variant,
        "hccl_op_expansion_mode": os.environ.get("HCCL_OP_EXPANSION_MODE", ""),
        "rounds": results,
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"capture_timings_rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
    os.replace(path + ".tmp", path)
    return out


class CaptureRepeatExtension:
    """Mixed into the vLLM worker class; methods are reached through ``collective_rpc``."""

    def ta_recapture(self, plan: dict[str, Any]) -> dict[str, Any]:
        return run_recapture(
            self.model_runner,  # type: ignore[attr-defined]
            plan,
            rank=int(getattr(self, "rank", 0)),
            vllm_config=getattr(self, "vllm_config", None),
        )
