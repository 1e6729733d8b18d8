"""vLLM general plugin: profile the first K Mooncake store transfers (traceanalyzer recipe).

vLLM calls :func:`register` in every process it starts (API server, EngineCore, workers), maybe
more than once, so it is idempotent and imports nothing heavy. It does not import the
vllm-ascend backend either (that would pull ``mooncake.store`` into the API server); it waits
for the backend module to be imported and then wraps ``MooncakeBackend.get``, the Python caller
of ``store.batch_get_into_multi_buffers``:

* ``TA_STORE_SYNC_BEFORE_TRANSFER=1``: ``torch.npu.synchronize()`` before every transfer,
  outside the profiler window (the fix under test in the Mooncake KV-pool TTFT report);
* ``TA_STORE_PROFILE_CALLS=K`` (after ``TA_STORE_PROFILE_SKIP=S`` calls): each of calls
  S+1..S+K of this process runs inside its own ``torch_npu.profiler`` window written to
  ``TA_STORE_PROFILE_DIR`` as ``rank{rank}_get{n}_*_ascend_pt``, with a ``record_function``
  span ``batch_get_into_multi_buffers`` and ``add_metadata("traceanalyzer.window",
  "store_transfer")`` so the analyzer knows what the window wraps.

It never sets ``VLLM_PLUGINS`` (that variable filters *all* plugins, vllm-ascend's included).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SPAN_NAME = "batch_get_into_multi_buffers"
WINDOW_KEY = "traceanalyzer.window"
WINDOW_VALUE = "store_transfer"
VARIANT_MODULES = {
    # vllm-ascend >= 0.18
    "kv_transfer": "vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.backend.mooncake_backend",
    # vllm-ascend 0.13.x
    "kvpool": "vllm_ascend.distributed.kvpool.backend.mooncake_backend",
}
BACKEND_MODULES = tuple(VARIANT_MODULES.values())
_MARK = "_ta_store_hooks_patched"


@dataclass(frozen=True)
class Settings:
    """What the wrapper does; read from the environment once per process."""

    profile_calls: int = 0
    skip_calls: int = 0
    sync_before_transfer: bool = False
    profile_dir: str = "./profiling_data"
    profiler_level: str = "Level1"
    analyse: bool = False
    backend_module: str = "auto"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        return cls(
            profile_calls=int(env.get("TA_STORE_PROFILE_CALLS", "0") or 0),
            skip_calls=int(env.get("TA_STORE_PROFILE_SKIP", "0") or 0),
            sync_before_transfer=env.get("TA_STORE_SYNC_BEFORE_TRANSFER", "0") == "1",
            profile_dir=env.get("TA_STORE_PROFILE_DIR", "./profiling_data"),
            profiler_level=env.get("TA_STORE_PROFILER_LEVEL", "Level1"),
            analyse=env.get("TA_STORE_ANALYSE", "0") == "1",
            backend_module=env.get("TA_STORE_BACKEND_MODULE", "auto") or "auto",
        )

    @property
    def active(self) -> bool:
        return self.profile_calls > 0 or self.sync_before_transfer

    def modules(self) -> tuple[str, ...]:
        """Modules to patch: all candidates (``auto``), a variant's module, or a dotted name."""
        if self.backend_module == "auto":
            return BACKEND_MODULES
        return (VARIANT_MODULES.get(self.backend_module, self.backend_module),)


class _Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0

    def next(self) -> int:
        with self._lock:
            self.calls += 1
            return self.calls


def _synchronize() -> None:
    import torch
    import torch_npu  # noqa: F401  - registers torch.npu

    torch.npu.synchronize()


def _record_function(name: str) -> contextlib.AbstractContextManager[Any]:
    import torch_npu

    rf = getattr(torch_npu.profiler, "record_function", None)
    if rf is None:
        import torch

        rf = torch.profiler.record_function
    return rf(name)


def _rank_label() -> str:
    """``rank{global rank}`` (and ``dp{n}_`` when data parallel), never importing torch early."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    dp = None
    with contextlib.suppress(Exception):
        from vllm.distributed import parallel_state as ps

        rank = str(ps.get_world_group().rank)
        dp_group = ps.get_dp_group()
        if dp_group.world_size > 1:
            dp = dp_group.rank_in_group
    if rank is None:
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                rank = str(dist.get_rank())
    label = f"rank{rank if rank is not None else 'pid' + str(os.getpid())}"
    return f"dp{dp}_{label}" if dp is not None else label


def make_profiler(settings: Settings, worker_name: str) -> Any:
    import torch_npu

    prof_mod = torch_npu.profiler
    return prof_mod.profile(
        activities=[prof_mod.ProfilerActivity.CPU, prof_mod.ProfilerActivity.NPU],
        record_shapes=False,
        experimental_config=prof_mod._ExperimentalConfig(
            aic_metrics=prof_mod.AiCMetrics.PipeUtilization,
            profiler_level=getattr(prof_mod.ProfilerLevel, settings.profiler_level),
            l2_cache=False,
            data_simplification=True,
            export_type=[prof_mod.ExportType.Text],
        ),
        on_trace_ready=prof_mod.tensorboard_trace_handler(
            settings.profile_dir, worker_name=worker_name, analyse_flag=settings.analyse
        ),
    )


@contextlib.contextmanager
def profiler_window(settings: Settings, call_no: int) -> Iterator[Any]:
    prof = make_profiler(settings, f"{_rank_label()}_get{call_no}")
    prof.start()
    try:
        add = getattr(prof, "add_metadata", None)
        if add is not None:
            add(WINDOW_KEY, WINDOW_VALUE)
            add("traceanalyzer.call", str(call_no))
            add("traceanalyzer.sync_before_transfer", "1" if settings.sync_before_transfer else "0")
        with _record_function(SPAN_NAME):
            yield prof
    finally:
        prof.stop()


def wrap_get(orig: Callable[..., Any], settings: Settings) -> Callable[..., Any]:
    """Wrap ``MooncakeBackend.get`` (sync outside, profiler window around the first K calls)."""
    counter = _Counter()
    window_lock = threading.Lock()
    first, last = settings.skip_calls + 1, settings.skip_calls + settings.profile_calls

    @functools.wraps(orig)
    def get(self: Any, *args: Any, **kwargs: Any) -> Any:
        if settings.sync_before_transfer:
            _synchronize()
        call_no = counter.next()
        if not first <= call_no <= last:
            return orig(self, *args, **kwargs)
        with window_lock, profiler_window(settings, call_no):
            return orig(self, *args, **kwargs)

    get.ta_counter = counter  # type: ignore[attr-defined]
    get.ta_settings = settings  # type: ignore[attr-defined]
    return get


def patch_backend_class(cls: type, settings: Settings) -> bool:
    """Wrap ``cls.get`` once; ``False`` when it was already wrapped."""
    if cls.__dict__.get(_MARK):
        return False
    cls.get = wrap_get(cls.get, settings)  # type: ignore[attr-defined]
    setattr(cls, _MARK, True)
    return True


def patch_module(module: Any, settings: Settings) -> bool:
    cls = getattr(module, "MooncakeBackend", None)
    if cls is None:
        return False
    return patch_backend_class(cls, settings)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, settings: Settings) -> None:
        self._inner = inner
        self._settings = settings

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        patch_module(module, self._settings)


class PostImportPatcher(importlib.abc.MetaPathFinder):
    """Patches the backend module right after whoever imports it first."""

    def __init__(self, targets: tuple[str, ...], settings: Settings) -> None:
        self.targets = set(targets)
        self.settings = settings

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.settings)
                return spec
        return None


_state: dict[str, Any] = {"registered": False}


def register() -> None:
    """Entry point of the ``vllm.general_plugins`` group; safe to call many times."""
    if _state["registered"]:
        return
    settings = Settings.from_env()
    _state["registered"] = True
    _state["settings"] = settings
    if not settings.active:
        return
    modules = settings.modules()
    for name in modules:
        if name in sys.modules:
            patch_module(sys.modules[name], settings)
    if not any(isinstance(f, PostImportPatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportPatcher(modules, settings))


def _reset_for_tests() -> None:
    _state.clear()
    _state["registered"] = False
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PostImportPatcher)]
