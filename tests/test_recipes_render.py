"""Render every recipe and check the output without an NPU: syntax, JSON, snapshots, errors."""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from writer_support import plant, user_state

from traceanalyzer import __version__
from traceanalyzer.recipes import ParamError, RenderError, list_recipes, render
from traceanalyzer.recipes.cli import recipe_group
from traceanalyzer.recipes.model import sh_command
from traceanalyzer.recipes.params import parse_host_port, parse_size_gb
from traceanalyzer.recipes.registry import recipe_names
from traceanalyzer.recipes.render import build_files, resolve

SNAPSHOTS = Path(__file__).parent / "snapshots" / "recipes"
UPDATE = os.environ.get("TRACEANALYZER_UPDATE_SNAPSHOTS") == "1"

# (recipe, case name, overrides)
CASES = [
    ("graph-capture-repeat", "defaults", {}),
    (
        "graph-capture-repeat",
        "overrides",
        {
            "tensor_parallel_size": "4",
            "devices": "4,5,6,7",
            "capture_sizes": "1,2,4,8",
            "rounds": "10",
            "profile_rounds": "1,5,10",
            "profiler_level": "Level1",
            "analyse": "inline",
            "arms": "aiv",
            "hook_variant": "gc",
            "model": "/models/my model",
        },
    ),
    ("mooncake-store-transfer", "defaults", {}),
    (
        "mooncake-store-transfer",
        "overrides",
        {
            "model": "/data_test/Qwen3-235B-A22B-W8A8",
            "quantization": "ascend",
            "data_parallel_size": "2",
            "data_parallel_size_local": "1",
            "data_parallel_address": "10.44.190.116",
            "api_server_count": "2",
            "master_server_address": "10.44.190.116:50088",
            "global_segment_size": "20GB",
            "local_hostname": "10.44.190.117",
            "nic_name": "eth8",
            "load_async": "true",
            "profile_calls": "3",
            "skip_calls": "2",
            "arms": "sync",
            "start_master": "false",
            "extra_serve_args": "--enable-prefix-caching --additional-config '{\"x\": 1}'",
        },
    ),
]
CASES += [
    ("serving-window", "defaults", {}),
    (
        "serving-window",
        "overrides",
        {
            "model": "/models/Qwen3-30B-A3B",
            "tensor_parallel_size": "4",
            "devices": "0,1,2,3",
            "burst_prompts": "0",
            "scopes": "false",
            "with_stack": "false",
            "hook_variant": "env",
            "extra_serve_args": "--enable-expert-parallel --async-scheduling",
        },
    ),
]
IDS = [f"{r}-{c}" for r, c, _ in CASES]


@pytest.fixture(params=CASES, ids=IDS)
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, Path]:
    name, case, overrides = request.param
    out = tmp_path / "out"
    render(name, out, overrides)
    return name, case, out


def test_every_recipe_has_cases() -> None:
    assert {r for r, _, _ in CASES} == set(recipe_names())


def test_shell_scripts_parse(rendered: tuple[str, str, Path]) -> None:
    bash = shutil.which("bash")
    assert bash
    _, _, out = rendered
    scripts = sorted(out.rglob("*.sh"))
    assert out / "run.sh" in scripts
    for script in scripts:
        subprocess.run([bash, "-n", str(script)], check=True)
    for executable in ("run.sh",):
        assert os.access(out / executable, os.X_OK)
    text = (out / "run.sh").read_text()
    assert "set -euo pipefail" in text
    assert text.rstrip().endswith('"$TRACEANALYZER" run "$PROFILING_DIR" --out "$ANALYSIS_DIR"')


def test_python_compiles_and_json_is_valid(rendered: tuple[str, str, Path], tmp_path: Path) -> None:
    _, _, out = rendered
    for py in out.rglob("*.py"):
        py_compile.compile(str(py), cfile=str(tmp_path / "x.pyc"), doraise=True)
    for js in out.rglob("*.json"):
        json.loads(js.read_text())


def test_no_vllm_plugins_override(rendered: tuple[str, str, Path]) -> None:
    _, _, out = rendered
    for f in out.rglob("*"):
        if f.is_file() and f.suffix in (".sh", ".py"):
            text = f.read_text()
            assert "export VLLM_PLUGINS" not in text and 'environ["VLLM_PLUGINS"]' not in text


def _snapshot_text(name: str, overrides: dict[str, str]) -> str:
    recipe = next(r for r in list_recipes() if r.name == name)
    files = build_files(recipe, resolve(recipe, overrides))
    chunks = []
    for rel in sorted(files):
        if files[rel].snapshot:
            text = files[rel].text.replace(f"traceanalyzer {__version__}", "traceanalyzer VERSION")
            chunks.append(f"===== {rel} =====\n{text}")
    return "\n".join(chunks)


@pytest.mark.parametrize(("name", "case", "overrides"), CASES, ids=IDS)
def test_snapshot(name: str, case: str, overrides: dict[str, str]) -> None:
    """Generated commands, env and configs. Update: TRACEANALYZER_UPDATE_SNAPSHOTS=1 pytest ..."""
    text = _snapshot_text(name, overrides)
    path = SNAPSHOTS / f"{name}__{case}.txt"
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; rerun with TRACEANALYZER_UPDATE_SNAPSHOTS=1"


def test_graph_config_matches_seed(tmp_path: Path) -> None:
    render("graph-capture-repeat", tmp_path / "o")
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    llm = cfg["llm"]
    assert llm["compilation_config"] == {
        "cudagraph_capture_sizes": [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 96],
        "cudagraph_mode": "FULL",
    }
    assert llm["load_format"] == "dummy"
    assert llm["tensor_parallel_size"] == 8
    assert llm["distributed_executor_backend"] == "mp"
    assert llm["worker_extension_cls"] == "ta_capture_hooks.CaptureRepeatExtension"
    assert cfg["plan"]["profile_rounds"] == [1, 45, 100]
    run_sh = (tmp_path / "o" / "run.sh").read_text()
    for line in (
        "export VLLM_ENABLE_V1_MULTIPROCESSING=0",
        "export VLLM_ASCEND_ENABLE_NZ=0",
        "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:False",
        'export PYTHONPATH="$HERE/hooks${PYTHONPATH:+:$PYTHONPATH}"',
        "aiv) arm_env=(HCCL_OP_EXPANSION_MODE=AIV) ;;",
        "baseline) arm_env=(-u HCCL_OP_EXPANSION_MODE) ;;",
    ):
        assert line in run_sh
    assert (tmp_path / "o" / "hooks" / "ta_capture_hooks.py").is_file()


def test_mooncake_files(tmp_path: Path) -> None:
    render("mooncake-store-transfer", tmp_path / "o", {"global_segment_size": "20"})
    out = tmp_path / "o"
    mc = json.loads((out / "mooncake.json").read_text())
    assert mc == {
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "ascend",
        "device_name": "",
        "master_server_address": "127.0.0.1:50088",
        "global_segment_size": "20 GB",
    }
    serve = (out / "serve.sh").read_text()
    assert '"kv_connector":"AscendStoreConnector"' in serve and '"backend":"mooncake"' in serve
    assert "--enable-expert-parallel" in serve
    bench = (out / "bench.sh").read_text()
    for flag in (
        "--dataset-name prefix_repetition",
        "--save-result",
        '--result-dir "$RESULT_DIR"',
        "--result-filename bench.json",
    ):
        assert flag in bench
    pyproject = (out / "ta_store_hooks" / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]' in pyproject
    assert 'traceanalyzer_store_transfer = "ta_store_hooks:register"' in pyproject
    assert "pip install --quiet --no-deps --no-build-isolation -e" in (out / "run.sh").read_text()
    assert not (out / "serve_secondary.sh").exists()


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        (
            "graph-capture-repeat",
            {"capture_size": "1,2"},
            "unknown parameter(s): 'capture_size' (did you mean 'capture_sizes'?)",
        ),
        (
            "graph-capture-repeat",
            {"capture_sizes": "1,4,2"},
            "must be sorted ascending without duplicates, got 1,4,2",
        ),
        ("graph-capture-repeat", {"capture_sizes": "1,2,2"}, "must be sorted ascending"),
        ("graph-capture-repeat", {"capture_sizes": "0,1"}, "every item must be >= 1"),
        ("graph-capture-repeat", {"capture_sizes": "1,x"}, "expected an integer, got 'x'"),
        (
            "graph-capture-repeat",
            {"profile_rounds": "1,200"},
            "profile_rounds [200] exceed rounds=100",
        ),
        (
            "graph-capture-repeat",
            {"tensor_parallel_size": "16"},
            "devices lists 8 NPUs but tensor_parallel_size is 16",
        ),
        ("graph-capture-repeat", {"arms": "baseline,fast"}, "unknown item(s) fast"),
        ("graph-capture-repeat", {"profiler_level": "Level3"}, "expected one of Level1, Level2"),
        ("graph-capture-repeat", {"per_graph_timing": "maybe"}, "expected true/false"),
        ("graph-capture-repeat", {"python": "python3 -u"}, "without spaces"),
        ("mooncake-store-transfer", {"master_server_address": "10.0.0.1"}, "expected host:port"),
        (
            "mooncake-store-transfer",
            {"master_server_address": "10.0.0.1:99999"},
            "port must be 1-65535",
        ),
        (
            "mooncake-store-transfer",
            {"master_server_address": "300.0.0.1:50088"},
            "bad IPv4 address",
        ),
        ("mooncake-store-transfer", {"global_segment_size": "1.5 GB"}, "whole number of GB"),
        ("mooncake-store-transfer", {"global_segment_size": "512 MB"}, "must be given in GB"),
        ("mooncake-store-transfer", {"global_segment_size": "0 GB"}, "at least 1 GB"),
        (
            "mooncake-store-transfer",
            {"data_parallel_size": "2", "data_parallel_size_local": "1"},
            "needs data_parallel_address",
        ),
        (
            "mooncake-store-transfer",
            {"data_parallel_size": "2", "data_parallel_size_local": "3"},
            "exceeds data_parallel_size",
        ),
        (
            "mooncake-store-transfer",
            {"lookup_rpc_port": "abc"},
            "lookup_rpc_port must be a port number",
        ),
        ("mooncake-store-transfer", {"metric_percentiles": "99,50"}, "sorted ascending"),
        (
            "mooncake-store-transfer",
            {"percentile_metrics": "ttft,latency"},
            "unknown item(s) latency",
        ),
    ],
)
def test_bad_parameters_fail_at_render_time(
    name: str, overrides: dict[str, str], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "o"
    with pytest.raises(ParamError) as exc:
        render(name, out, overrides)
    assert message in str(exc.value)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_parsers() -> None:
    assert parse_host_port("10.0.0.1:50088") == ("10.0.0.1", 50088)
    assert parse_host_port("master-0.svc:1") == ("master-0.svc", 1)
    assert parse_host_port("[fe80::1]:80") == ("fe80::1", 80)
    assert parse_size_gb("10 GB") == 10
    assert parse_size_gb("10GB") == 10
    assert parse_size_gb("4.0 GiB") == 4
    assert parse_size_gb("7") == 7


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_holding_anything_else_is_refused_even_with_force(tmp_path, force) -> None:
    """`recipe render ... --out . --force` in a git checkout deleted `.git` and every file."""
    out = tmp_path / "o"
    before = plant(out)
    with pytest.raises(RenderError, match=r"holds \.git/, mydata\.txt, sub/: not files a recipe"):
        render("serving-window", out, force=force)
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == set(before)
    assert user_state(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # no temp dirs left


def test_out_dot_in_a_checkout_keeps_git(tmp_path: Path, monkeypatch) -> None:
    plant(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(recipe_group, ["render", "serving-window", "--out", ".", "--force"])
    assert res.exit_code == 2 and "holds .git/, mydata.txt, sub/" in res.output, res.output
    assert (tmp_path / ".git" / "HEAD").is_file() and (tmp_path / "mydata.txt").is_file()


def test_force_replaces_a_rendered_recipe_file_by_file(tmp_path: Path, monkeypatch) -> None:
    """A folder of another recipe's files: replaced, its files the new one does not write
    removed (and its folders left empty); the folder itself stays, the shell may be in it."""
    out = tmp_path / "o"
    render("mooncake-store-transfer", out)
    with pytest.raises(RenderError, match="not empty .*pass --force"):
        render("graph-capture-repeat", out)
    monkeypatch.chdir(out)
    inode = out.stat().st_ino
    render("graph-capture-repeat", ".", force=True)
    assert out.stat().st_ino == inode
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(render("graph-capture-repeat", tmp_path / "fresh").files)
    assert not (out / "ta_store_hooks").exists() and not (out / "bench.sh").exists()
    assert os.access(out / "run.sh", os.X_OK)
    (out / "profiling_data" / "sync").mkdir(parents=True)  # run.sh ran: the user's results
    with pytest.raises(RenderError, match="holds profiling_data/"):
        render("graph-capture-repeat", out, force=True)
    assert (out / "profiling_data" / "sync").is_dir()


def test_a_link_named_like_a_recipe_file_is_in_the_way(tmp_path: Path) -> None:
    out = tmp_path / "o"
    render("serving-window", out)
    target = tmp_path / "elsewhere.sh"
    target.write_text("keep")
    (out / "run.sh").unlink()
    (out / "run.sh").symlink_to(target)
    with pytest.raises(RenderError, match="holds run.sh"):
        render("serving-window", out, force=True)
    assert target.read_text() == "keep"


def test_empty_out_is_fine(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    render("mooncake-store-transfer", out)
    assert (out / "mooncake.json").is_file()


def test_sh_command_quotes() -> None:
    cmd = sh_command(
        ['"$VLLM"', "serve", "/m/a b", "--x", "{'a': 1}", "--flag", "--y", "2"], raw=[0]
    )
    assert cmd.splitlines()[0] == "\"$VLLM\" serve '/m/a b' \\"
    assert "--x '{'\"'\"'a'\"'\"': 1}'" in cmd
    assert cmd.splitlines()[-1].strip() == "--y 2"


# ---- CLI ----------------------------------------------------------------------------------


def test_cli_list_and_show() -> None:
    runner = CliRunner()
    res = runner.invoke(recipe_group, ["list"])
    assert res.exit_code == 0, res.output
    assert "graph-capture-repeat" in res.output and "mooncake-store-transfer" in res.output
    res = runner.invoke(recipe_group, ["show", "graph-capture-repeat"])
    assert res.exit_code == 0, res.output
    assert "capture_sizes (int list; default '1,2,4,8,12,16,24,32,40,48,96')" in res.output
    assert "#13688" in res.output
    res = runner.invoke(recipe_group, ["show", "mooncake-store-transfer"])
    assert "global_segment_size (size (whole GB); default '10 GB')" in res.output
    res = runner.invoke(recipe_group, ["show", "nope"])
    assert res.exit_code != 0 and "no recipe 'nope'" in res.output


def test_cli_render(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "o"
    res = runner.invoke(
        recipe_group,
        [
            "render",
            "graph-capture-repeat",
            "--out",
            str(out),
            "--set",
            "rounds=3",
            "--set",
            "profile_rounds=1,3",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["plan"]["rounds"] == 3
    res = runner.invoke(recipe_group, ["render", "graph-capture-repeat", "--out", str(out)])
    assert res.exit_code != 0 and "pass --force" in res.output
    res = runner.invoke(
        recipe_group,
        ["render", "graph-capture-repeat", "--out", str(out), "--force", "--set", "bogus=1"],
    )
    assert res.exit_code != 0 and "unknown parameter(s): 'bogus'" in res.output
    res = runner.invoke(
        recipe_group, ["render", "graph-capture-repeat", "--out", str(out), "--set", "novalue"]
    )
    assert res.exit_code != 0 and "key=value" in res.output


def test_graph_run_sh_with_stubs(tmp_path: Path) -> None:
    """Execute run.sh with a stub python and traceanalyzer: both arms, env per arm, final run."""
    out = tmp_path / "o"
    render("graph-capture-repeat", out)
    stub = tmp_path / "python-stub"
    stub.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == "-c" ]]; then exit 1; fi\n'  # traceanalyzer not importable -> hooks pick variant
        'if [[ "$1" == *launch.py ]]; then\n'
        '  shift; while [[ $# -gt 0 ]]; do [[ "$1" == --out ]] && out="$2"; shift; done\n'
        '  echo "${HCCL_OP_EXPANSION_MODE:-unset} $TA_HOOK_VARIANT $PYTHONPATH" > "$out/env.txt"; exit 0\n'
        "fi\n"
        'echo "$@" >> "$(dirname "$0")/analyse.txt"\n'
    )
    ta = tmp_path / "ta-stub"
    ta.write_text('#!/usr/bin/env bash\necho "$@" > "$(dirname "$0")/ta.txt"\n')
    for f in (stub, ta):
        f.chmod(0o755)
    env = dict(os.environ, PYTHON=str(stub), TRACEANALYZER=str(ta), HCCL_OP_EXPANSION_MODE="AIV")
    res = subprocess.run(
        ["bash", str(out / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
    base = (out / "profiling_data" / "baseline" / "env.txt").read_text().split()
    aiv = (out / "profiling_data" / "aiv" / "env.txt").read_text().split()
    assert base[0] == "unset" and aiv[0] == "AIV"  # baseline unsets an inherited AIV
    assert base[1] == "auto" and base[2].startswith(str(out / "hooks"))
    for arm in ("baseline", "aiv"):
        assert (
            json.loads((out / "profiling_data" / arm / "outcome.json").read_text())["outcome"]
            == "ok"
        )
    assert (tmp_path / "analyse.txt").read_text().split()[-1] == str(out / "profiling_data")
    assert (tmp_path / "ta.txt").read_text().split() == [
        "run",
        str(out / "profiling_data"),
        "--out",
        str(out / "analysis"),
    ]
    # a second run refuses to overwrite an arm's results
    res = subprocess.run(
        ["bash", str(out / "run.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "is not empty" in res.stderr
