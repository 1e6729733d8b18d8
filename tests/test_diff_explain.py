"""``diff`` explains a change: runs that differ by one known cause (synth serving's cause knobs,
``synth/scenarios/causes.py``), and the explanation must name that cause, with its size.

Every pair shares one base: 8 layers, decode batches of 64, a post-attention norm after the
residual Add (so that a fused AddRmsNorm has its two kernels to replace), everything else at
serving's defaults.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from traceanalyzer.compare.diff import diff_outputs
from traceanalyzer.compare.explain import KINDS, UNEXPLAINED, explain_phase
from traceanalyzer.compare.explain_render import modules_text
from traceanalyzer.compare.run_tables import RunTables
from traceanalyzer.compare.settings_diff import settings_changed, settings_of
from traceanalyzer.synth.ops import DECODE_LAYER

# a decode batch of 64: its kernels take their typical time (a smaller batch's are shorter)
BASE = {"layers": 8, "add_norm": "separate", "batch": 64}
CAUSES: dict[str, dict[str, Any]] = {
    "base": {},
    "slow_matmul": {"slow_op": "MatMulV2", "slow_factor": 1.3},
    "new_sync": {"step_syncs": 1},
    "fused": {"add_norm": "fused"},
    "eager": {"graph": "eager"},
    "graph_size": {"batch": 100},  # decode graphs captured for 128 tokens, not 64
    "mix": {"prefill_every": 2},
    "settings": {"env": "TASK_QUEUE_ENABLE=2"},
    "rerun": {"seed": 1},
}
_ROOT = Path(tempfile.mkdtemp(prefix="ta-diff-explain-"))


@cache
def run(cause: str) -> Path:
    """The base run with ``cause`` injected, analysed once per test session; returns OUT."""
    from traceanalyzer.cli import main

    knobs = {**BASE, **CAUSES[cause]}
    seed = str(knobs.pop("seed", 0))
    sets = [arg for k, v in knobs.items() for arg in ("--set", f"{k}={v}")]
    runner = CliRunner()
    result = runner.invoke(
        main, ["synth", "serving", "--out", str(_ROOT / cause), "--seed", seed, *sets]
    )
    assert result.exit_code == 0, result.output
    out = _ROOT / f"{cause}-out"
    result = runner.invoke(main, ["run", str(_ROOT / cause), "--out", str(out), "-q", "-j", "1"])
    assert result.exit_code in (0, 3), result.output
    return out


def teardown_module() -> None:
    shutil.rmtree(_ROOT, ignore_errors=True)


@cache
def diff_doc(cause: str) -> dict[str, Any]:
    return diff_outputs(run("base"), run(cause)).to_dict()


def phase_row(cause: str, phase: str) -> dict[str, Any]:
    (row,) = [r for r in diff_doc(cause)["phases"]["rows"] if r["phase"] == phase]
    return row


def named(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in row["explain"] if c["kind"] != UNEXPLAINED]


def assert_sums_to_the_change(row: dict[str, Any]) -> None:
    """The contributions sum to the phase's mean change within 10%, and with the explicit
    rest exactly."""
    change = row["explanation"]["change_ns"]
    assert change == pytest.approx(row["target"]["mean_ns"] - row["base"]["mean_ns"])
    assert sum(c["delta_ns"] for c in row["explain"]) == pytest.approx(change, abs=1.0)
    assert sum(c["delta_ns"] for c in named(row)) == pytest.approx(change, rel=0.10)
    assert row["explain"][-1]["what"] == UNEXPLAINED
    assert {c["kind"] for c in named(row)} <= set(KINDS)
    deltas = [abs(c["delta_ns"]) for c in named(row)]
    assert deltas == sorted(deltas, reverse=True)


def matmul_ns_per_layer() -> float:
    return sum(k.dur_us * 1e3 for k in DECODE_LAYER if k.op_type == "MatMulV2")


def test_a_slower_kernel_type_is_named_with_its_time() -> None:
    row = phase_row("slow_matmul", "decode")
    assert row["verdict"] == "regressed"
    top = named(row)[0]
    assert (top["what"], top["kind"]) == ("MatMulV2", "kernel")
    truth = 0.3 * BASE["layers"] * matmul_ns_per_layer()  # 30% more of every MatMulV2
    assert top["delta_ns"] == pytest.approx(truth, rel=0.2)
    assert top["evidence"]["base"]["calls"] == top["evidence"]["target"]["calls"] == 4 * 8
    assert top["evidence"]["target"]["mean_ns"] > 1.25 * top["evidence"]["base"]["mean_ns"]
    assert_sums_to_the_change(row)


def test_a_new_synchronisation_per_step_is_named_by_its_api() -> None:
    row = phase_row("new_sync", "decode")
    top = named(row)[0]
    assert top["kind"] == "sync" and top["what"] == "AscendCL@aclrtSynchronizeStream"
    assert (top["evidence"]["base"]["calls"], top["evidence"]["target"]["calls"]) == (1, 2)
    change = row["explanation"]["change_ns"]
    assert top["delta_ns"] == pytest.approx(change, rel=0.2) and change > 150_000
    assert top["evidence"]["component"]["key"] == "idle_sync_ns"
    assert_sums_to_the_change(row)


def test_a_fused_kernel_is_one_change() -> None:
    row = phase_row("fused", "decode")
    top = named(row)[0]
    assert top["what"] == "Add + RmsNorm -> AddRmsNorm (fused)" and top["kind"] == "kernel"
    assert (top["evidence"]["from"], top["evidence"]["to"]) == (["Add", "RmsNorm"], ["AddRmsNorm"])
    truth = BASE["layers"] * (5.0 - 3.0 - 6.0) * 1e3  # AddRmsNorm for the Add and post-norm
    assert top["delta_ns"] == pytest.approx(truth, rel=0.2)
    # the pre-attention RmsNorm still runs: only the calls that went are in the fusion
    assert top["evidence"]["base"]["calls"] == pytest.approx(2 * BASE["layers"])
    assert not [c for c in named(row) if c["what"] in ("Add", "AddRmsNorm")]
    assert_sums_to_the_change(row)


def test_a_change_of_graph_mode_is_its_own_contribution() -> None:
    row = phase_row("eager", "decode")
    top = named(row)[0]
    assert top["kind"] == "graph" and top["what"] == "graph mode full -> eager"
    change = row["explanation"]["change_ns"]
    assert top["delta_ns"] == pytest.approx(change, rel=0.2) and change > 100_000
    assert top["evidence"]["modes"] == {"base": {"full": 1.0}, "target": {"eager": 1.0}}
    assert (top["evidence"]["base"]["calls"], top["evidence"]["target"]["calls"]) == (1, 0)
    assert_sums_to_the_change(row)


def test_a_change_of_graph_size_is_its_own_contribution() -> None:
    row = phase_row("graph_size", "decode")
    top = named(row)[0]
    assert top["kind"] == "graph" and top["what"] == "graph size 64 -> 128 tokens"
    assert top["delta_ns"] == pytest.approx(row["explanation"]["change_ns"], rel=0.2)
    assert_sums_to_the_change(row)


def test_a_change_of_mix_alone_is_no_regression() -> None:
    doc = diff_doc("mix")
    assert doc["mix_changed"] and not doc["phases"]["regressed"]
    split = doc["phases"]["mean_change"]
    total = split["target_ns"] - split["base_ns"]
    assert split["mix_ns"] + split["phases_ns"] == pytest.approx(total)
    assert abs(split["phases_ns"]) < 0.05 * abs(split["mix_ns"])
    assert "is the mix" in doc["phases"]["summary"]
    for row in doc["phases"]["rows"]:
        if row["explanation"] and row["explanation"]["noise_ns"]:
            assert abs(row["explanation"]["change_ns"]) < row["explanation"]["noise_ns"]


def test_a_changed_setting_is_listed_with_both_values() -> None:
    doc = diff_doc("settings")
    assert doc["settings_changed"] == [
        {"setting": "env.TASK_QUEUE_ENABLE", "source": "environment", "base": None,
         "target": "2", "ranks": [0]}
    ]  # fmt: skip
    assert all(r["explain"] == [] for r in doc["phases"]["rows"])  # same seed, same run
    assert diff_doc("slow_matmul")["settings_changed"] == []


def test_a_run_with_itself_explains_nothing_and_says_so(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    result = CliRunner().invoke(
        main, ["diff", str(run("base")), str(run("base")), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert "why each phase changed: no phase changed, nothing to explain" in result.output
    assert "settings and versions: unchanged" in result.output
    doc = json.loads((tmp_path / "diff.json").read_text())
    assert all(r["explain"] == [] for r in doc["phases"]["rows"])
    assert doc["settings_changed"] == []
    assert not list(tmp_path.glob("plots/*.svg"))


def test_a_rerun_changes_nothing_beyond_its_noise() -> None:
    """Another seed: the same work with other jitter. Each phase's change is within the noise
    its iterations' spread gives, and the explanation says so."""
    doc = diff_doc("rerun")
    assert not doc["phases"]["regressed"] and not doc["phases"]["improved"]
    decode = phase_row("rerun", "decode")["explanation"]
    assert abs(decode["change_ns"]) < decode["noise_ns"]
    assert "within the iterations' noise" in decode["summary"]


def test_the_explanation_is_shown_where_people_look(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    out = tmp_path / "d"
    result = CliRunner().invoke(
        main, ["diff", str(run("base")), str(run("slow_matmul")), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "why each phase changed (per iteration, target - base, largest first):" in result.output
    assert "kernel      MatMulV2: 32 calls at" in result.output
    svg = (out / "plots" / "waterfall-decode.svg").read_text()
    assert svg.startswith("<svg") and "MatMulV2" in svg and "base" in svg and "target" in svg
    markdown = (out / "diff.md").read_text()
    assert "## Why each phase changed" in markdown
    assert "![decode waterfall](plots/waterfall-decode.svg)" in markdown
    assert "| MatMulV2 | kernel |" in markdown
    html = (out / "diff.html").read_text()
    assert "Why each phase changed" in html and html.count("<svg") >= 2  # decode and mixed


def test_diff_draws_without_matplotlib(tmp_path: Path) -> None:
    from test_architecture import _loaded_modules

    modules = _loaded_modules(
        str(tmp_path / "modules.txt"), "diff", str(run("base")), str(run("slow_matmul")),
        "--out", str(tmp_path / "d"), "-q",
    )  # fmt: skip
    assert list((tmp_path / "d" / "plots").glob("waterfall-*.svg"))
    assert "traceanalyzer.chart" in modules
    assert not {m for m in modules if m.split(".")[0] == "matplotlib"}


# -------------------------------------------------------------------------------------------
# the decomposition on hand-built tables: renames, modules, the host function that grew
# -------------------------------------------------------------------------------------------


def tables(
    kernels: list[tuple[str, str | None, int]],
    *,
    steps: int = 2,
    graph: str = "eager",
    host: list[tuple[str, str, int, int]] = (),  # type: ignore[assignment]
    idle_host_ns: int = 0,
    module: bool = False,
) -> RunTables:
    """``steps`` decode iterations, each running ``kernels`` (name, op type, ns) one after
    the other and then idling ``idle_host_ns`` on the host; ``host``: (kind, name, calls per
    iteration, ns per call)."""
    busy = sum(ns for _, _, ns in kernels)
    length = busy + idle_host_ns
    step_rows, task_rows = [], []
    for i in range(steps):
        start = i * 10 * length
        step_rows.append({"rank": 0, "session": "s", "step": i + 1, "start_ns": start,
                          "end_ns": start + length, "step_ns": length, "compute_ai_core_ns": busy,
                          "idle_host_ns": idle_host_ns, "phase": "decode", "graph": graph})  # fmt: skip
        t = start
        for n, (name, op, ns) in enumerate(kernels):
            row = {"rank": 0, "session": "s", "stream_id": 2, "start_ns": t, "dur_ns": ns,
                   "name": name, "cls": "ai_core", "model_id": None, "task_type": "AI_CORE",
                   "phase": "decode", "graph": graph, "op_type": op, "shape": "8,4096"}  # fmt: skip
            if module:
                row["module"] = f"layers.{n % 2}"
            task_rows.append(row)
            t += ns
    frame = pl.DataFrame(step_rows, infer_schema_length=None).with_columns(
        pl.lit(0).cast(pl.Int64).alias(c)
        for c in ("compute_ai_vector_ns", "compute_mix_ns", "compute_ai_cpu_ns", "compute_other_ns",
                  "overlapped_ns", "comm_exposed_ns", "device_other_ns", "idle_sync_ns",
                  "idle_stream_ns", "idle_other_ns")
    )  # fmt: skip
    host_rows = [
        {"phase": "decode", "kind": kind, "name": name, "api_name": name, "calls": calls * steps,
         "total_ns": calls * steps * ns}
        for kind, name, calls, ns in host
    ]  # fmt: skip
    host_schema = {"phase": pl.String, "kind": pl.String, "name": pl.String,
                   "api_name": pl.String, "calls": pl.Int64, "total_ns": pl.Int64}  # fmt: skip
    return RunTables(
        frame,
        pl.DataFrame(task_rows, infer_schema_length=None),
        pl.DataFrame(host_rows, schema=host_schema),
        ("module",) if module else (),
    )


def test_kernels_are_matched_by_type_when_their_names_change() -> None:
    """In graph mode a kernel is named by its node: another run names it otherwise, its op
    type is the same kernel."""
    base = tables([("MatMul_1", "MatMulV2", 30_000), ("Add_7", "Add", 3_000)])
    target = tables([("MatMul_9", "MatMulV2", 36_000), ("Add_2", "Add", 3_000)])
    explained = explain_phase("decode", base, target)
    (top,) = [c for c in explained.items() if c["kind"] == "kernel"]
    assert (top["what"], top["delta_ns"]) == ("MatMulV2", 6_000)
    assert top["evidence"]["matched_by"] == "type"
    (kernel,) = top["evidence"]["kernels"]
    assert (kernel["name"], kernel["base_name"]) == ("MatMul_9", "MatMul_1")  # same shape


def test_a_kernel_replaced_at_its_place_is_one_change() -> None:
    base = tables([("a", "MatMulV2", 30_000), ("n", "RmsNorm", 6_000), ("b", "SwiGlu", 8_000)])
    target = tables([("a", "MatMulV2", 30_000), ("m", "RmsNormV2", 4_000), ("b", "SwiGlu", 8_000)])
    (top, rest) = explain_phase("decode", base, target).items()
    assert (top["what"], top["delta_ns"]) == ("RmsNorm -> RmsNormV2 (replaced)", -2_000)
    assert rest["what"] == UNEXPLAINED and rest["delta_ns"] == 0


def test_a_kernel_new_nowhere_in_particular_is_new() -> None:
    base = tables([("a", "MatMulV2", 30_000)])
    target = tables([("a", "MatMulV2", 30_000), ("c", "Cast", 2_000)])
    (top, _) = explain_phase("decode", base, target).items()
    assert (top["what"], top["delta_ns"], top["evidence"]["status"]) == ("Cast", 2_000, "new")


def test_the_kernel_change_is_also_given_per_module() -> None:
    base = tables([("a", "MatMulV2", 30_000), ("b", "MatMulV2", 30_000)], module=True)
    target = tables([("a", "MatMulV2", 30_000), ("b", "MatMulV2", 40_000)], module=True)
    modules = explain_phase("decode", base, target).to_dict()["modules"]
    assert modules == [{"column": "module", "value": "layers.1", "base_ns": 30_000,
                        "target_ns": 40_000, "delta_ns": 10_000}]  # fmt: skip
    assert modules_text(modules) == "by module: layers.1 +10 µs"
    plain = explain_phase("decode", tables([("a", "MatMulV2", 1)]), tables([("a", "MatMulV2", 2)]))
    assert plain.to_dict()["modules"] == []  # a store without the column


def test_a_launch_bound_iteration_names_the_host_function_that_grew() -> None:
    """The outer function grew as much as the inner one (its time includes it): the inner one
    names the cause."""
    kernels = [("a", "MatMulV2", 30_000)]
    base = tables(
        kernels,
        idle_host_ns=10_000,
        host=[("Python", "execute_model", 1, 90_000), ("Python", "_prepare_inputs", 1, 20_000)],
    )
    target = tables(
        kernels,
        idle_host_ns=60_000,
        host=[("Python", "execute_model", 1, 140_000), ("Python", "_prepare_inputs", 1, 70_000)],
    )
    (top, _) = explain_phase("decode", base, target).items()
    assert (top["kind"], top["what"], top["delta_ns"]) == ("host", "_prepare_inputs", 50_000)
    assert top["evidence"]["target"]["mean_ns"] == 70_000
    assert top["evidence"]["moved"] == [
        {"what": "_prepare_inputs", "delta_ns": 50_000},
        {"what": "execute_model", "delta_ns": 50_000},
    ]


def test_without_cann_calls_an_item_still_names_a_sync() -> None:
    """A Level0 export records no CANN call: the idle after an ``.item()`` is counted as
    waiting on the host, and the torch op that waited still makes it a sync."""
    kernels = [("a", "MatMulV2", 30_000)]
    base = tables(kernels, idle_host_ns=10_000, host=[("op", "aten::mm", 1, 5_000)])
    target = tables(
        kernels, idle_host_ns=40_000,
        host=[("op", "aten::mm", 1, 5_000), ("op", "aten::_local_scalar_dense", 1, 30_000)],
    )  # fmt: skip
    (top, _) = explain_phase("decode", base, target).items()
    assert (top["kind"], top["what"], top["delta_ns"]) == (
        "sync",
        "aten::_local_scalar_dense",
        30_000,
    )


def test_a_graph_mode_change_in_part_of_the_iterations() -> None:
    kernels = [("a", "MatMulV2", 30_000)]
    full = tables(kernels, steps=4, graph="full")
    mixed = tables(kernels, steps=4, graph="full", idle_host_ns=20_000)
    mixed = RunTables(
        mixed.steps.with_columns(
            pl.when(pl.col("step") > 2).then(pl.lit("piecewise")).otherwise(pl.col("graph")).alias("graph")
        ),
        mixed.tasks, mixed.host,
    )  # fmt: skip
    (top, _) = explain_phase("decode", full, mixed).items()
    assert top["what"] == "graph mode full -> full 50.0%, piecewise 50.0%"
    assert top["delta_ns"] == 20_000


# -------------------------------------------------------------------------------------------
# settings
# -------------------------------------------------------------------------------------------


def _sessions(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "session": f"s{r['rank']}",
                "start_ns": 0,
                "profiler_level": "Level1",
                "torch_npu_version": None,
                "cann_version": None,
                "export_type": "text",
                "generation": "g3",
                "config": "{}",
                **r,
            }
            for r in rows
        ]  # fmt: skip
    )


def test_settings_are_compared_rank_by_rank() -> None:
    def meta(env: dict[str, str], **extra: Any) -> str:
        return json.dumps({"ENV_VARIABLES": env, **extra})

    base = settings_of(_sessions([
        {"rank": 0, "metadata": meta({"HCCL_OP_EXPANSION_MODE": ""}), "cann_version": "8.1.RC1"},
        {"rank": 1, "metadata": meta({"HCCL_OP_EXPANSION_MODE": ""}), "cann_version": "8.1.RC1"},
    ]))  # fmt: skip
    target = settings_of(_sessions([
        {"rank": 0, "metadata": meta({"HCCL_OP_EXPANSION_MODE": "AIV"}, **{
            "db.SESSION_TIME_INFO": {"startTimeNs": 5}}), "cann_version": "8.2.RC1"},
        {"rank": 1, "metadata": meta({"HCCL_OP_EXPANSION_MODE": ""}), "cann_version": "8.2.RC1"},
    ]))  # fmt: skip
    assert settings_changed(base, target) == [
        {"setting": "env.HCCL_OP_EXPANSION_MODE", "source": "environment", "base": "",
         "target": "AIV", "ranks": [0]},
        {"setting": "version.cann", "source": "version", "base": "8.1.RC1", "target": "8.2.RC1",
         "ranks": [0, 1]},
    ]  # fmt: skip
    assert settings_changed(base, base) == []


def test_a_store_that_cannot_be_read_is_said_not_explained(tmp_path: Path) -> None:
    """An output dir whose store is gone or damaged still gets its findings compared; the
    explanation and the settings say why they are missing."""
    from traceanalyzer.compare.render import render_diff_text

    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run("base") / "findings.json", bare)
    damaged = tmp_path / "damaged"
    shutil.copytree(run("base"), damaged)
    for part in (damaged / "tables" / "summary_steps").rglob("*.parquet"):
        part.write_bytes(part.read_bytes()[:100])
    for side in (bare, damaged):
        result = diff_outputs(run("base"), side)
        assert (
            result.phases.explain_error
            and "a store could not be read" in result.phases.explain_error
        )
        assert result.settings_changed is None
        doc = result.to_dict()
        assert doc["phases"]["explain_error"] and all(
            r["explain"] == [] for r in doc["phases"]["rows"]
        )
        text = render_diff_text(result)
        assert "why each phase changed: not explained: a store could not be read" in text
        assert "settings and versions: not compared" in text


def test_a_phase_without_a_verdict_gets_its_waterfall_when_it_moved() -> None:
    """A profile whose phase is not told (a ProfilerStep loop) gets no verdict, and still a
    waterfall when its mean iteration moved by the verdict's 5%, beyond its noise; a single
    iteration (no noise to judge by) does not."""
    from traceanalyzer.compare.explain import Explanation
    from traceanalyzer.compare.explain_render import waterfall_phases
    from traceanalyzer.compare.phase_diff import PhaseDelta, PhaseDiff, PhaseSide

    def row(phase: str, steps: int) -> PhaseDelta:
        base, target = (
            PhaseSide(steps, None, 1e6, 1e6, 1e6),
            PhaseSide(steps, None, 1.2e6, 1.2e6, 1.2e6),
        )
        return PhaseDelta(phase, base, target)

    def explained(phase: str, noise: float | None) -> Explanation:
        return Explanation(phase, 1e6, 1.2e6, noise, [], 2e5)

    diff = PhaseDiff(
        [row("unknown", 7), row("warmup", 1), row("prefill", 7)],
        {"unknown": explained("unknown", 1e4), "warmup": explained("warmup", None),
         "prefill": explained("prefill", 3e5)},
    )  # fmt: skip
    assert [r.verdict for r in diff.rows] == ["too few", "too few", "regressed"]
    assert waterfall_phases(diff) == ["unknown", "prefill"]
