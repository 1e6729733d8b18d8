"""Version detection, hook-variant choice and bench-result parsing (no vLLM installed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceanalyzer.recipes import versions
from traceanalyzer.recipes.bench import find_bench_results, format_bench_table, load_bench_result
from traceanalyzer.recipes.cli import recipe_group
from traceanalyzer.recipes.doctor import diagnose, variant_for_version
from traceanalyzer.recipes.registry import get_recipe
from traceanalyzer.recipes.seams import DirSource, Seam, check_seam

GCR = get_recipe("graph-capture-repeat")
MST = get_recipe("mooncake-store-transfer")


def test_version_tuple() -> None:
    assert versions.version_tuple("0.23.0rc1") == (0, 23, 0)
    assert versions.version_tuple("8.5.RC1") == (8, 5)
    assert versions.version_tuple("2.10.0.post4") == (2, 10, 0)
    assert versions.version_tuple("9.1.0") == (9, 1, 0)


@pytest.mark.parametrize(
    ("filename", "text", "expected"),
    [
        (
            "ascend_toolkit_install.info",
            "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100\n",
            "8.5.0",
        ),
        ("version.cfg", "runtime_running_version=[7.0.0.5.242:7.0.RC1]\n", "7.0.RC1"),
        ("version.cfg", "# comment\nVersion=9.1.0\n", "9.1.0"),
    ],
)
def test_cann_version_files(tmp_path: Path, filename: str, text: str, expected: str) -> None:
    (tmp_path / filename).write_text(text)
    version, source = versions.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path)})
    assert version == expected
    assert source == str(tmp_path / filename)


def test_cann_version_in_arch_subdir(tmp_path: Path) -> None:
    (tmp_path / "x86_64-linux").mkdir()
    (tmp_path / "x86_64-linux" / "ascend_toolkit_install.info").write_text("version=9.0.0\n")
    assert versions.cann_version({"ASCEND_TOOLKIT_HOME": str(tmp_path)})[0] == "9.0.0"


def test_detect_does_not_import_heavy_modules() -> None:
    before = set(sys.modules)
    env = versions.detect({})
    assert set(env.versions) == {"vllm", "vllm-ascend", "torch_npu", "mooncake", "cann"}
    new = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not new & {"torch", "torch_npu", "vllm", "vllm_ascend"}


def _site(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


ACL_OLD = """
import torch
class ACLGraphWrapper:
    def __init__(self):
        self.concrete_aclgraph_entries: dict = {}
    def __call__(self, *a):
        with torch.npu.graph(g, pool=self.graph_pool):
            pass
_graph_params = None
_draft_graph_params = None
"""
ACL_NEW = "import weakref\n_acl_graph_wrappers = weakref.WeakSet()\n" + ACL_OLD
RUNNER = "class NPUModelRunner:\n    def capture_model(self):\n        pass\n"
WORKER = "class NPUWorker:\n    def init_device(self):\n        self.model_runner = None\n"
SLEEP = "class AclGraphSleepWakeupManager:\n    @classmethod\n    def reset_all_graph_params(cls):\n        pass\n"


def _env(va: str | None = "0.18.0") -> versions.Environment:
    return versions.Environment(
        versions={
            "vllm": "0.18.0",
            "vllm-ascend": va,
            "torch_npu": "2.8.0",
            "mooncake": "0.3.8",
            "cann": "8.5.0",
        },
        roots={},
    )


def test_doctor_picks_gc_for_old_sources(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        {
            "vllm_ascend/compilation/acl_graph.py": ACL_OLD,
            "vllm_ascend/worker/model_runner_v1.py": RUNNER,
            "vllm_ascend/worker/worker.py": WORKER,
        },
    )
    verdict = diagnose(
        GCR, _env(), ascend_src=DirSource(site), vllm_src=DirSource(tmp_path / "none")
    )
    assert verdict.variant == "gc"
    assert any("CANN 8.5.0 < 9.1.0" in n for n in verdict.notes)


def test_doctor_picks_weakset_for_new_sources(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        {
            "vllm_ascend/compilation/acl_graph.py": ACL_NEW,
            "vllm_ascend/worker/model_runner_v1.py": RUNNER,
            "vllm_ascend/worker/worker.py": WORKER,
            "vllm_ascend/device_allocator/sleep_mem_optimized.py": SLEEP,
        },
    )
    env = _env("0.23.0")
    env.versions["cann"] = "9.1.0"
    verdict = diagnose(GCR, env, ascend_src=DirSource(site))
    assert verdict.ok and verdict.variant == "weakset"
    assert any("has the fix" in n for n in verdict.notes)


WORKER_CONFIG = (
    "class NPUWorker:\n    def profile(self, is_start=True):\n"
    "        cfg = self.vllm_config.profiler_config\n"
)
WORKER_ENV = (
    "import vllm.envs as envs_vllm\nclass NPUWorker:\n    def profile(self, is_start=True):\n"
    "        pass\n    def _init_profiler(self):\n        if envs_vllm.VLLM_TORCH_PROFILER_DIR:\n"
    "            pass\n"
)
VLLM_ENVS = 'environment_variables = {"VLLM_CUSTOM_SCOPES_FOR_PROFILING": lambda: 0}\n'
VLLM_BENCH = 'parser.add_argument("--result-filename")\n'


def test_doctor_picks_the_serving_window_switch_and_says_which_evidence(tmp_path: Path) -> None:
    from traceanalyzer.recipes.registry import get_recipe

    recipe = get_recipe("serving-window")
    new = _site(tmp_path / "new", {"vllm_ascend/worker/worker.py": WORKER_CONFIG})
    vllm = _site(
        tmp_path / "vllm", {"vllm/envs.py": VLLM_ENVS, "vllm/benchmarks/serve.py": VLLM_BENCH}
    )
    verdict = diagnose(recipe, _env(), ascend_src=DirSource(new), vllm_src=DirSource(vllm))
    assert verdict.ok and verdict.variant == "profiler_config"
    assert any(n.startswith("evidence: the model runner's scopes") and n.endswith(": on")
               for n in verdict.notes), verdict.notes  # fmt: skip
    old = _site(tmp_path / "old", {"vllm_ascend/worker/worker.py": WORKER_ENV})
    bare = _site(tmp_path / "bare", {"vllm/benchmarks/serve.py": VLLM_BENCH})
    verdict = diagnose(recipe, _env("0.13.0"), ascend_src=DirSource(old), vllm_src=DirSource(bare))
    assert verdict.ok and verdict.variant == "env"
    assert any("scopes" in n and "not in vLLM" in n for n in verdict.notes), verdict.notes


def test_doctor_refuses_with_reasons(tmp_path: Path) -> None:
    site = _site(
        tmp_path, {"vllm_ascend/compilation/acl_graph.py": "class ACLGraphWrapper:\n    pass\n"}
    )
    verdict = diagnose(GCR, _env("0.11.0"), ascend_src=DirSource(site))
    assert not verdict.ok
    text = " ".join(verdict.problems)
    assert "vllm-ascend 0.11.0 matches no hook variant" in text
    assert "supported: vllm-ascend >= 0.13.0" in text
    assert "has no member concrete_aclgraph_entries" in text


def test_doctor_refuses_missing_packages() -> None:
    env = versions.Environment(
        versions={
            "vllm": None,
            "vllm-ascend": None,
            "torch_npu": None,
            "mooncake": None,
            "cann": None,
        }
    )
    verdict = diagnose(MST, env)
    assert not verdict.ok
    assert "vllm-ascend is not installed" in verdict.problems
    assert any("Mooncake is not installed" in p for p in verdict.problems)


def test_variant_for_version() -> None:
    assert variant_for_version(GCR, "0.23.0").name == "weakset"
    assert variant_for_version(GCR, "0.18.0").name == "gc"
    assert variant_for_version(GCR, "0.12.0") is None
    assert variant_for_version(MST, "0.13.0").name == "kvpool"
    assert variant_for_version(MST, "0.25.1rc1").name == "kv_transfer"


def test_check_seam_uses_and_literal(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        {
            "pkg/m.py": "X = 'AscendStoreConnector'\nclass B:\n    def get(self):\n        self.store.batch_get_into_multi_buffers(1)\n"
        },
    )
    src = DirSource(site)
    assert check_seam(src, Seam("pkg.m", "B.get", uses="batch_get_into_multi_buffers")) is None
    assert "does not use .put" in check_seam(src, Seam("pkg.m", "B.get", uses="put"))
    assert check_seam(src, Seam("pkg.m", literal="AscendStoreConnector")) is None
    assert "not found" in check_seam(src, Seam("pkg.nope"))
    # code that moved between releases: any alternative will do
    assert check_seam(src, Seam("pkg.nope|pkg.m", "B.get")) is None
    assert "pkg.nope" in check_seam(src, Seam("pkg.nope|pkg.m", "C"))


def test_cli_doctor_json_and_variant_only() -> None:
    runner = CliRunner()
    res = runner.invoke(recipe_group, ["doctor", "--json"])
    payload = json.loads(res.output)
    assert {r["recipe"] for r in payload["recipes"]} == {
        "graph-capture-repeat",
        "mooncake-store-transfer",
        "serving-window",
    }
    if not payload["versions"]["vllm-ascend"]:
        assert res.exit_code == 2  # a refusal is a usage/input error, never "a finding" (1)
        res = runner.invoke(recipe_group, ["doctor", "graph-capture-repeat", "--variant-only"])
        assert res.exit_code == 2
        assert "vllm-ascend is not installed" in res.output
    res = runner.invoke(recipe_group, ["doctor", "--variant-only"])
    assert res.exit_code != 0 and "needs a recipe NAME" in res.output


BENCH = {
    "date": "20260812-101010",
    "completed": 50,
    "num_prompts": 50,
    "request_throughput": 0.8,
    "mean_ttft_ms": 60939.35,
    "median_ttft_ms": 60000.0,
    "p99_ttft_ms": 70000.5,
    "mean_tpot_ms": 0.0,
    "p99_tpot_ms": 0.0,
    "p25_e2el_ms": 1.0,
}


def test_bench_results(tmp_path: Path) -> None:
    for arm, ttft in (("baseline", 60939.35), ("sync", 38513.98)):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "bench.json").write_text(json.dumps(dict(BENCH, mean_ttft_ms=ttft)))
    (tmp_path / "sync" / "bench_other.json").write_text('{"not": "a bench"}')
    results = find_bench_results(tmp_path)
    assert [r.arm for r in results] == ["baseline", "sync"]
    assert results[1].get("ttft") == 38513.98
    assert results[0].get("ttft", "p99") == 70000.5
    assert results[0].get("e2el", "p25") == 1.0
    table = format_bench_table(results)
    assert "mean TTFT" in table and "60939.3" in table and "38514.0" in table
    assert load_bench_result(tmp_path / "missing.json") is None


@pytest.mark.parametrize(
    ("verdict", "code"),
    [
        ({"variant": "v1"}, 0),
        ({"problems": ["vLLM is not installed"]}, 2),
        ({"variant": "v1", "problems": ["seam not found"]}, 2),  # a variant, but refused
        ({}, 2),  # no variant fits and no reason given: still a refusal
    ],
)
def test_doctor_exits_alike_in_text_json_and_variant_only(
    monkeypatch: pytest.MonkeyPatch, verdict: dict, code: int
) -> None:
    """One refusal, one exit code: the text, --json and --variant-only answers agree (and a
    refusal is a usage/input error, 2), whatever the installed stack."""
    from traceanalyzer.cli import main
    from traceanalyzer.recipes import cli as recipes_cli
    from traceanalyzer.recipes.doctor import Verdict

    monkeypatch.setattr(recipes_cli, "detect", lambda: versions.Environment())
    monkeypatch.setattr(recipes_cli, "diagnose", lambda r, env: Verdict(r.name, **verdict))
    runner = CliRunner()
    doctor = ["recipe", "doctor", "serving-window"]
    text = runner.invoke(main, doctor)
    as_json = runner.invoke(main, [*doctor, "--json"])
    variant = runner.invoke(main, [*doctor, "--variant-only"])
    assert (text.exit_code, as_json.exit_code, variant.exit_code) == (code, code, code)
    # run.sh's `python -m traceanalyzer.recipes doctor` is the group alone
    assert runner.invoke(recipe_group, doctor[1:] + ["--json"]).exit_code == code
    (recipe,) = json.loads(as_json.stdout)["recipes"]
    assert recipe["ok"] is (code == 0)
    assert ("REFUSED" in text.stdout) is (code != 0)
