"""Hook logic against fakes (no NPU), in the style of vllm-ascend's CPU unit tests.

A fake ``torch_npu`` (and ``torch``) goes into ``sys.modules``; the hooks import them lazily, so
the fakes are what they see. Every fake call is appended to one event log so the tests can
assert order: synchronize before the transfer, profiler window around exactly the first K.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import traceanalyzer.recipes as recipes_pkg

TEMPLATES = Path(recipes_pkg.__file__).parent / "templates"


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # keep templates/ clean
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = write_bytecode
        del sys.modules[name]
    return module


@pytest.fixture
def capture_hooks() -> types.ModuleType:
    return _load(
        TEMPLATES / "graph-capture-repeat" / "hooks" / "ta_capture_hooks.py",
        "ta_capture_hooks_under_test",
    )


@pytest.fixture
def store_hooks() -> Any:
    module = _load(
        TEMPLATES / "mooncake-store-transfer" / "ta_store_hooks" / "ta_store_hooks" / "__init__.py",
        "ta_store_hooks_under_test",
    )
    yield module
    module._reset_for_tests()


# ---- fake torch / torch_npu -------------------------------------------------------------------


class FakeProfile:
    instances: list[FakeProfile] = []

    def __init__(self, log: list[Any], **kwargs: Any) -> None:
        self.log = log
        self.kwargs = kwargs
        self.metadata: dict[str, str] = {}
        self.started = self.stopped = False
        FakeProfile.instances.append(self)

    def start(self) -> None:
        self.started = True
        self.log.append(("prof.start", self.kwargs["on_trace_ready"]["worker_name"]))

    def stop(self) -> None:
        self.stopped = True
        self.log.append(("prof.stop", self.kwargs["on_trace_ready"]["worker_name"]))

    def add_metadata(self, key: str, value: str) -> None:
        assert self.started and not self.stopped, "metadata must be added inside the window"
        self.metadata[key] = value


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Install fake ``torch`` / ``torch_npu``; returns the shared event log."""
    log: list[Any] = []
    FakeProfile.instances = []

    npu = types.ModuleType("torch_npu.npu")
    npu.synchronize = lambda: log.append("synchronize")

    class graph:  # noqa: N801 - mirrors torch_npu.npu.graph
        def __init__(self, npu_graph: Any, pool: Any = None) -> None:
            self.npu_graph = npu_graph

        def __enter__(self) -> graph:
            log.append("graph.enter")
            return self

        def __exit__(self, *exc: Any) -> None:
            log.append("graph.exit")

    npu.graph = graph
    npu.NPUGraph = object

    class _RecordFunction:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            log.append(("span.enter", self.name))

        def __exit__(self, *exc: Any) -> None:
            log.append(("span.exit", self.name))

    prof = types.ModuleType("torch_npu.profiler")
    prof.profile = lambda **kw: FakeProfile(log, **kw)
    prof.ProfilerActivity = types.SimpleNamespace(CPU="CPU", NPU="NPU")
    prof.ProfilerLevel = types.SimpleNamespace(Level0="Level0", Level1="Level1", Level2="Level2")
    prof.AiCMetrics = types.SimpleNamespace(PipeUtilization="PipeUtilization")
    prof.ExportType = types.SimpleNamespace(Text="text")
    prof._ExperimentalConfig = lambda **kw: dict(kw)
    prof.tensorboard_trace_handler = lambda dir_name, worker_name=None, analyse_flag=True: {
        "dir_name": dir_name,
        "worker_name": worker_name,
        "analyse_flag": analyse_flag,
    }

    torch_npu = types.ModuleType("torch_npu")
    torch_npu.npu = npu
    torch_npu.profiler = prof

    torch = types.ModuleType("torch")
    torch.npu = npu  # torch_npu registers torch.npu as torch_npu.npu
    torch.profiler = types.SimpleNamespace(record_function=_RecordFunction)

    monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return log


# ---- graph-capture-repeat ------------------------------------------------------------------


@dataclass
class GraphParams:
    events: dict[int, list[Any]] = field(default_factory=dict)
    workspaces: dict[int, Any] = field(default_factory=dict)
    handles: dict[int, list[Any]] = field(default_factory=dict)


class ACLGraphWrapper:
    """Shape of vllm-ascend's wrapper: a dict of captured entries per batch descriptor."""

    def __init__(self) -> None:
        self.concrete_aclgraph_entries: dict[int, str] = {}
        self.first_run_finished = True


def make_acl_graph(with_weakset: bool) -> types.ModuleType:
    mod = types.ModuleType("fake_acl_graph")
    mod.ACLGraphWrapper = ACLGraphWrapper
    mod._graph_params = GraphParams()
    mod._draft_graph_params = None
    if with_weakset:
        mod._acl_graph_wrappers = set()
    return mod


class FakeRunner:
    """``capture_model`` captures every size whose entry is missing, like ACLGraphWrapper.__call__."""

    def __init__(self, acl_graph: types.ModuleType, sizes: list[int], log: list[Any]) -> None:
        self.model = ACLGraphWrapper()  # FULL mode: the model is the wrapper
        if hasattr(acl_graph, "_acl_graph_wrappers"):
            acl_graph._acl_graph_wrappers.add(self.model)
        self.acl_graph = acl_graph
        self.sizes = sizes
        self.log = log
        self.captures = 0

    def capture_model(self) -> int:
        self.log.append("capture_model")
        torch = sys.modules["torch"]
        for size in self.sizes:
            if size in self.model.concrete_aclgraph_entries:
                continue  # would replay, not capture
            with torch.npu.graph(object()):  # looked up at call time, as in acl_graph.py
                self.acl_graph._graph_params.events.setdefault(size, []).append("event")
            self.model.concrete_aclgraph_entries[size] = "graph"
            self.captures += 1
        return 0


@pytest.mark.parametrize("variant", ["gc", "weakset"])
def test_recapture_clears_and_recaptures_n_times(
    variant: str,
    capture_hooks: types.ModuleType,
    fake_npu: list[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acl = make_acl_graph(with_weakset=variant == "weakset")
    sizes = [1, 2, 4, 8]
    runner = FakeRunner(acl, sizes, fake_npu)
    runner.capture_model()  # the engine's own first capture
    assert runner.captures == 4
    if variant == "weakset":
        resets: list[int] = []

        class AclGraphSleepWakeupManager:
            @classmethod
            def reset_all_graph_params(cls) -> None:
                resets.append(1)
                capture_hooks.reset_graph_params(acl._graph_params)
                for w in list(acl._acl_graph_wrappers):
                    w.concrete_aclgraph_entries.clear()
                    w.first_run_finished = False

        sleep_mod = types.ModuleType(capture_hooks.SLEEP_MANAGER_MODULE)
        sleep_mod.AclGraphSleepWakeupManager = AclGraphSleepWakeupManager
        monkeypatch.setitem(sys.modules, capture_hooks.SLEEP_MANAGER_MODULE, sleep_mod)

    plan = {
        "rounds": 5,
        "profile_rounds": [1, 5],
        "profiler_level": "Level2",
        "analyse": False,
        "out_dir": str(tmp_path),
        "arm": "baseline",
        "hook_variant": "auto",
        "per_graph_timing": True,
    }
    original_graph = sys.modules["torch_npu"].npu.graph
    result = capture_hooks.run_recapture(runner, plan, rank=3, acl_graph=acl)

    assert runner.captures == 4 + 5 * 4  # every round re-captured every size
    assert result["hook_variant"] == variant
    assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4, 5]
    for r in result["rounds"]:
        assert r["entries_cleared"] == 4
        assert r["graphs"] == 4 and len(r["graph_s"]) == 4
        assert r["capture_s"] >= 0
        assert r["profiled"] == (r["round"] in (1, 5))
    # per-capture attention state was reset each round, not accumulated
    assert all(len(v) == 1 for v in acl._graph_params.events.values())
    if variant == "weakset":
        assert len(resets) == 5
    # the timed graph class was removed again
    assert sys.modules["torch_npu"].npu.graph is original_graph
    # one profiler window per profiled round, named per rank and round, around capture_model
    names = [p.kwargs["on_trace_ready"]["worker_name"] for p in FakeProfile.instances]
    assert names == ["rank3_round1", "rank3_round5"]
    first = FakeProfile.instances[0]
    assert first.kwargs["on_trace_ready"] == {
        "dir_name": str(tmp_path),
        "worker_name": "rank3_round1",
        "analyse_flag": False,
    }
    assert first.kwargs["experimental_config"]["profiler_level"] == "Level2"
    assert first.kwargs["activities"] == ["CPU", "NPU"]
    assert first.metadata["traceanalyzer.window"] == "graph_capture"
    assert first.metadata["traceanalyzer.round"] == "1"
    i = fake_npu.index(("prof.start", "rank3_round1"))
    assert fake_npu[i - 1] == "synchronize"
    assert fake_npu[i + 1] == "capture_model"
    j = fake_npu.index(("prof.stop", "rank3_round1"))
    assert fake_npu[j - 1] == "synchronize" and "capture_model" in fake_npu[i:j]
    assert (tmp_path / "capture_timings_rank3.json").is_file()


def test_gc_variant_finds_wrappers_not_held_by_runner(capture_hooks: types.ModuleType) -> None:
    acl = make_acl_graph(with_weakset=False)
    piecewise = [ACLGraphWrapper() for _ in range(3)]
    for i, w in enumerate(piecewise):
        w.concrete_aclgraph_entries[i] = "g"
    acl._draft_graph_params = GraphParams(events={1: ["e"]}, workspaces={1: "ws"})
    runner = types.SimpleNamespace(model=object())
    info = capture_hooks.clear_capture_state(runner, "gc", acl)
    assert info["entries_cleared"] >= 3
    assert all(not w.concrete_aclgraph_entries and not w.first_run_finished for w in piecewise)
    assert acl._draft_graph_params.events == {1: []}
    assert acl._draft_graph_params.workspaces == {1: "ws"}  # like vllm-ascend: only lists reset


def test_weakset_variant_refused_on_old_vllm_ascend(capture_hooks: types.ModuleType) -> None:
    with pytest.raises(RuntimeError, match="needs vllm-ascend >= 0.23"):
        capture_hooks.clear_capture_state(object(), "weakset", make_acl_graph(with_weakset=False))


def test_extension_method_uses_worker_state(
    capture_hooks: types.ModuleType, fake_npu: list[Any], tmp_path: Path
) -> None:
    acl = make_acl_graph(with_weakset=False)
    runner = FakeRunner(acl, [1, 2], fake_npu)

    class Worker(capture_hooks.CaptureRepeatExtension):
        rank = 1
        model_runner = runner

    # point the hook at the fake module instead of importing vllm_ascend
    sys.modules[capture_hooks.ACL_GRAPH_MODULE] = acl
    try:
        out = Worker().ta_recapture(
            {"rounds": 2, "profile_rounds": [], "out_dir": str(tmp_path), "per_graph_timing": False}
        )
    finally:
        del sys.modules[capture_hooks.ACL_GRAPH_MODULE]
    assert out["rank"] == 1 and len(out["rounds"]) == 2
    assert runner.captures == 4
    assert FakeProfile.instances == []


def test_hook_modules_import_without_torch() -> None:
    """The hook modules import nothing heavy at import time (they are loaded by tests here)."""
    for path in (
        TEMPLATES / "graph-capture-repeat" / "hooks" / "ta_capture_hooks.py",
        TEMPLATES / "mooncake-store-transfer" / "ta_store_hooks" / "ta_store_hooks" / "__init__.py",
        TEMPLATES / "graph-capture-repeat" / "launch.py",
        TEMPLATES / "common" / "analyse_profiles.py",
    ):
        before = set(sys.modules)
        _load(path, "probe_" + path.stem)
        new = set(sys.modules) - before
        assert not {
            m for m in new if m.split(".")[0] in ("torch", "torch_npu", "vllm", "vllm_ascend")
        }


# ---- mooncake-store-transfer ------------------------------------------------------------------


class FakeMooncakeBackend:
    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def get(self, keys: list[str], addrs: list[list[int]], sizes: list[list[int]]) -> None:
        self.log.append(("transfer", keys[0]))


def _calls(log: list[Any]) -> list[list[Any]]:
    """Split the event log into one list per transfer (ending at prof.stop or the transfer)."""
    out, cur = [], []
    for ev in log:
        cur.append(ev)
        if (isinstance(ev, tuple) and ev[0] == "prof.stop") or (
            isinstance(ev, tuple)
            and ev[0] == "transfer"
            and not any(isinstance(e, tuple) and e[0] == "prof.start" for e in cur)
        ):
            out.append(cur)
            cur = []
    return out


@pytest.mark.parametrize("sync", [False, True])
def test_profiler_window_wraps_exactly_first_k(
    store_hooks: Any, fake_npu: list[Any], tmp_path: Path, sync: bool
) -> None:
    settings = store_hooks.Settings(
        profile_calls=2,
        sync_before_transfer=sync,
        profile_dir=str(tmp_path),
        profiler_level="Level1",
    )
    assert store_hooks.patch_backend_class(FakeMooncakeBackend, settings)
    try:
        backend = FakeMooncakeBackend(fake_npu)
        for i in range(5):
            backend.get([f"k{i}"], [[0]], [[1]])
        calls = _calls(fake_npu)
        assert len(calls) == 5
        pre = ["synchronize"] if sync else []
        for i, call in enumerate(calls[:2], start=1):
            start = call.index(
                next(e for e in call if isinstance(e, tuple) and e[0] == "prof.start")
            )
            name = call[start][1]
            assert name.endswith(f"_get{i}")
            assert call == [
                *pre,
                ("prof.start", name),
                ("span.enter", "batch_get_into_multi_buffers"),
                ("transfer", f"k{i - 1}"),
                ("span.exit", "batch_get_into_multi_buffers"),
                ("prof.stop", name),
            ]
        for i, call in enumerate(calls[2:], start=3):
            assert call == [*pre, ("transfer", f"k{i - 1}")]
        assert len(FakeProfile.instances) == 2
        prof = FakeProfile.instances[0]
        assert prof.metadata["traceanalyzer.window"] == "store_transfer"
        assert prof.metadata["traceanalyzer.sync_before_transfer"] == ("1" if sync else "0")
        assert prof.kwargs["on_trace_ready"]["dir_name"] == str(tmp_path)
        assert prof.kwargs["on_trace_ready"]["analyse_flag"] is False
        assert prof.kwargs["experimental_config"]["profiler_level"] == "Level1"
    finally:
        FakeMooncakeBackend.get = FakeMooncakeBackend.get.__wrapped__
        del FakeMooncakeBackend._ta_store_hooks_patched


def test_skip_calls_then_window(store_hooks: Any, fake_npu: list[Any], tmp_path: Path) -> None:
    class Backend(FakeMooncakeBackend):
        pass

    store_hooks.patch_backend_class(
        Backend, store_hooks.Settings(profile_calls=1, skip_calls=2, profile_dir=str(tmp_path))
    )
    b = Backend(fake_npu)
    for i in range(4):
        b.get([f"k{i}"], [[0]], [[1]])
    starts = [i for i, e in enumerate(fake_npu) if isinstance(e, tuple) and e[0] == "prof.start"]
    assert len(starts) == 1
    assert fake_npu[starts[0] + 2] == ("transfer", "k2")


def test_sync_switch_only(store_hooks: Any, fake_npu: list[Any]) -> None:
    class Backend(FakeMooncakeBackend):
        pass

    store_hooks.patch_backend_class(
        Backend, store_hooks.Settings(profile_calls=0, sync_before_transfer=True)
    )
    Backend(fake_npu).get(["a"], [[0]], [[1]])
    assert fake_npu == ["synchronize", ("transfer", "a")]
    assert FakeProfile.instances == []


def test_patch_is_idempotent(store_hooks: Any, fake_npu: list[Any]) -> None:
    class Backend(FakeMooncakeBackend):
        pass

    settings = store_hooks.Settings(sync_before_transfer=True)
    module = types.SimpleNamespace(MooncakeBackend=Backend)
    assert store_hooks.patch_module(module, settings) is True
    assert store_hooks.patch_module(module, settings) is False
    Backend(fake_npu).get(["a"], [[0]], [[1]])
    assert fake_npu.count("synchronize") == 1


def test_settings_from_env(store_hooks: Any) -> None:
    s = store_hooks.Settings.from_env({})
    assert not s.active
    s = store_hooks.Settings.from_env(
        {
            "TA_STORE_PROFILE_CALLS": "3",
            "TA_STORE_SYNC_BEFORE_TRANSFER": "1",
            "TA_STORE_BACKEND_MODULE": "kvpool",
        }
    )
    assert s.active and s.profile_calls == 3 and s.sync_before_transfer
    assert s.modules() == ("vllm_ascend.distributed.kvpool.backend.mooncake_backend",)
    assert store_hooks.Settings.from_env({"TA_STORE_BACKEND_MODULE": "kv_transfer"}).modules() == (
        "vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.backend.mooncake_backend",
    )


def test_register_patches_on_import_in_worker(
    store_hooks: Any, fake_npu: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """register() imports nothing; the backend is wrapped when the worker imports it."""
    pkg = (
        tmp_path
        / "site"
        / "vllm_ascend"
        / "distributed"
        / "kv_transfer"
        / "kv_pool"
        / "ascend_store"
        / "backend"
    )
    pkg.mkdir(parents=True)
    for d in [pkg, *pkg.parents]:
        if d == tmp_path / "site":
            break
        (d / "__init__.py").write_text("")
    (pkg / "mooncake_backend.py").write_text(
        textwrap.dedent(
            """
            LOG = []
            class MooncakeBackend:
                def get(self, keys, addrs, sizes):
                    LOG.append(("transfer", keys[0]))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("TA_STORE_PROFILE_CALLS", "1")
    monkeypatch.setenv("TA_STORE_PROFILE_DIR", str(tmp_path / "prof"))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    name = "vllm_ascend.distributed.kv_transfer.kv_pool.ascend_store.backend.mooncake_backend"
    try:
        store_hooks.register()
        store_hooks.register()  # vLLM may call it again in the same process
        assert name not in sys.modules and "vllm_ascend" not in sys.modules
        assert sum(isinstance(f, store_hooks.PostImportPatcher) for f in sys.meta_path) == 1
        module = importlib.import_module(name)
        backend = module.MooncakeBackend()
        backend.get(["x"], [[0]], [[1]])
        backend.get(["y"], [[0]], [[1]])
        assert len(FakeProfile.instances) == 1
        assert module.LOG == [("transfer", "x"), ("transfer", "y")]
        assert "VLLM_PLUGINS" not in __import__("os").environ
    finally:
        for mod in [m for m in sys.modules if m == "vllm_ascend" or m.startswith("vllm_ascend.")]:
            del sys.modules[mod]


def test_register_inactive_does_nothing(store_hooks: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TA_STORE_PROFILE_CALLS", raising=False)
    monkeypatch.delenv("TA_STORE_SYNC_BEFORE_TRANSFER", raising=False)
    store_hooks.register()
    assert not any(isinstance(f, store_hooks.PostImportPatcher) for f in sys.meta_path)
