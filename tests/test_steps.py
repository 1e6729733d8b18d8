"""The steps table: engine iterations and their phases, against the serving generator's plan.

Every evidence source on its own (ProfilerStep, vLLM's annotation and its legacy form, the model
runner's scopes, the Python tracer's functions, device bursts), every graph mode and both
attention-kernel styles; tokens never read from a padded shape; the real exports keep their
ProfilerSteps; the derivation's parameters and its cache; the diff's mix-vs-regression verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from traceanalyzer.derived.derive import compute_tasks, derive_ranks, read_slices
from traceanalyzer.derived.launches import launches_of
from traceanalyzer.derived.stage import step_params
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.ingest import ingest
from traceanalyzer.overview.model import Overview, read_overview
from traceanalyzer.store import Store
from traceanalyzer.synth import generate
from traceanalyzer.synth.scenarios import serving

REAL = Path(__file__).resolve().parents[2] / "shared" / "real_traces" / "g2_level1"
SMALL = {"iterations": 16, "layers": 1}


def _steps(tmp: Path, **knobs: object) -> tuple[pl.DataFrame, list[serving.Iteration]]:
    """The derived iterations of a one-rank serving profile (idle gaps left out), and the
    generator's plan of them."""
    generate("serving", tmp / "in", ranks=1, **SMALL, **knobs)
    ingest(tmp / "in", tmp / "out", jobs=1)
    steps = steps_of(Store.open(tmp / "out"), [0]).filter(pl.col("step_source") != "gap")
    plan = [it for it in serving.plan({**serving.KNOBS, **SMALL, **knobs}, 0) if it.phase != "idle"]
    return steps, plan


CASES = {
    "python functions": ({"markers": "python"}, "python_function"),
    "scopes": ({"markers": "scopes"}, "scope"),
    "annotation": ({"markers": "annotation"}, "annotation"),
    "legacy annotation": ({"markers": "legacy"}, "annotation"),
    "ProfilerStep (msMonitor)": ({"markers": "profiler_step"}, "profiler_step"),
    "nothing on the host": ({"markers": "none"}, "device_activity"),
    "piecewise graphs": ({"markers": "python", "graph": "piecewise"}, "python_function"),
    "eager": ({"markers": "python", "graph": "eager"}, "python_function"),
    "v0.11 ATB kernels": ({"markers": "python", "style": "v0.11"}, "python_function"),
    "v0.11 kernels alone": ({"markers": "none", "style": "v0.11"}, "device_activity"),
    "speculative": ({"markers": "python", "spec_tokens": 2}, "python_function"),
    "start-up captures": ({"markers": "python", "warmup": 2}, "python_function"),
    "dummy batches and idle": (
        {"markers": "python", "dummy_every": 5, "idle_every": 6},
        "python_function",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_evidence_source_finds_every_iteration_and_its_phase(
    case: str, tmp_path: Path
) -> None:
    knobs, source = CASES[case]
    steps, plan = _steps(tmp_path, **knobs)
    assert steps.height == len(plan), steps.select("start_ns", "phase", "step_source")
    assert set(steps["step_source"]) == {source}
    got, truth = steps["phase"].to_list(), [it.phase for it in plan]
    wrong = [
        (i, g, t)
        for i, (g, t) in enumerate(zip(got, truth, strict=True))
        if g not in (t, "unknown")
    ]
    assert not wrong, f"confident wrong labels: {wrong}"
    unknown = got.count("unknown")
    assert unknown <= 1, list(zip(got, truth, strict=True))  # the evidence tells (nearly) every one
    for row in steps.filter(pl.col("phase") == "unknown").iter_rows(named=True):
        assert row["phase_reason"], row  # never unknown without saying why


def test_without_shapes_an_eager_batch_is_unknown_with_the_reason(tmp_path: Path) -> None:
    """Python functions name the call, not the batch: without the attention's shapes a prefill
    or mixed batch cannot be told, and says so; graph decodes are still told by the replay."""
    steps, plan = _steps(tmp_path, markers="python", shapes=False)
    for row, it in zip(steps.iter_rows(named=True), plan, strict=True):
        if row["phase"] == "unknown":
            assert it.phase in ("prefill", "mixed") and row["phase_reason"]
        else:
            assert row["phase"] == it.phase


def test_tokens_come_from_eager_attention_never_from_a_padded_graph(tmp_path: Path) -> None:
    steps, plan = _steps(tmp_path, markers="python", batch=12)  # decodes replay the 16-size graph
    for row, it in zip(steps.iter_rows(named=True), plan, strict=True):
        if row["graph"] == "full":
            assert row["tokens"] is None, row  # the capture size's shapes: not the batch's
        elif row["phase"] in ("prefill", "mixed"):
            assert row["tokens"] == it.tokens, (row, it)


def test_the_annotation_counts_tokens_of_every_step(tmp_path: Path) -> None:
    steps, plan = _steps(tmp_path, markers="annotation")
    assert steps["tokens"].to_list() == [it.tokens for it in plan]
    assert steps["requests"].to_list() == [it.requests for it in plan]


def test_idle_gaps_are_windows_of_their_own(tmp_path: Path) -> None:
    """Idle after iterations 5, 10 and 15: each gap before the next iteration is a window."""
    generate("serving", tmp_path / "in", ranks=1, markers="python", idle_every=5, **SMALL)
    ingest(tmp_path / "in", tmp_path / "out", jobs=1)
    steps = steps_of(Store.open(tmp_path / "out"), [0])
    gaps = steps.filter(pl.col("step_source") == "gap")
    assert gaps.height == 3 and set(gaps["phase"]) == {"idle"} and gaps["step"].is_null().all()
    assert (gaps["step_ns"] >= serving.KNOBS["idle_ms"] * 1e6 * 0.9).all()


@pytest.mark.skipif(not REAL.is_dir(), reason="the real G2 export is not here")
def test_a_real_profile_with_profiler_steps_keeps_them(tmp_path: Path) -> None:
    ingest(REAL, tmp_path / "out", jobs=1)
    steps = steps_of(Store.open(tmp_path / "out"))
    assert steps.select("rank", "step", "step_source").rows() == [
        (0, 50, "profiler_step"),
        (1, 50, "profiler_step"),
    ]
    assert set(steps["phase"]) == {"unknown"}
    assert all("no serving evidence" in r for r in steps["phase_reason"])


# --------------------------------------------------------------------------------------------
# Through `run`: the table, its parameters, its cache
# --------------------------------------------------------------------------------------------


def _run(args: list[str]) -> str:
    from traceanalyzer.cli import main

    result = CliRunner().invoke(main, ["run", *args, "-j", "1"])
    assert result.exit_code == 0, result.output
    return result.output


def test_run_derives_the_steps_once_and_again_when_a_parameter_changes(tmp_path: Path) -> None:
    generate("serving", tmp_path / "in", ranks=1, markers="python", idle_every=5, **SMALL)
    out = tmp_path / "out"
    _run([str(tmp_path / "in"), "--out", str(out)])
    store = Store.open(out)
    assert store.table("steps").collect().filter(pl.col("phase") == "idle").height == 3
    summary = store.table("summary_steps").collect()
    assert {"phase", "step_source", "tokens", "graph"} <= set(summary.columns)
    doc = json.loads((out / "findings.json").read_text())
    phases = {r["phase"] for r in doc["summary"]["overview"]["phases"]["rows"]}
    assert {"prefill", "decode", "mixed", "idle"} <= phases
    assert summary["ep_path"].is_null().all()  # a dense model: no expert exchange
    assert all(r["ep"] is None for r in doc["summary"]["overview"]["phases"]["rows"])
    key = (out / ".cache" / "steps" / "rank=0.key").read_text()
    _run([str(tmp_path / "in"), "--out", str(out)])
    assert (out / ".cache" / "steps" / "rank=0.key").read_text() == key  # nothing re-derived
    _run([str(tmp_path / "in"), "--out", str(out), "--set", "steps.idle_gap_ms=50"])
    assert (out / ".cache" / "steps" / "rank=0.key").read_text() != key
    assert Store.open(out).table("steps").collect().filter(pl.col("phase") == "idle").is_empty()


def test_a_bad_steps_setting_stops_the_run_before_it_writes(tmp_path: Path) -> None:
    from traceanalyzer.cli import main

    generate("serving", tmp_path / "in", ranks=1, **SMALL)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["run", str(tmp_path / "in"), "--out", str(out), "--set", "steps.idle_gap=2"]
    )
    assert result.exit_code == 2 and "idle_gap_ms" in result.output, result.output
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# diff: a change of mix is not a regression
# --------------------------------------------------------------------------------------------


def _doc(**phases: tuple[int, float]) -> Overview:
    rows = [
        {"phase": p, "steps": n, "p50_ns": ms * 1e6, "p95_ns": ms * 1.1e6, "mean": {}}
        for p, (n, ms) in phases.items()
    ]
    return read_overview({"phases": {"rows": rows}})


def test_diff_tells_a_change_of_mix_from_a_regression() -> None:
    from traceanalyzer.compare.phase_diff import phase_deltas

    base = _doc(prefill=(10, 200.0), decode=(90, 30.0))
    more_prefill = phase_deltas(base, _doc(prefill=(40, 201.0), decode=(60, 30.2)))
    assert more_prefill.mix_changed and not more_prefill.regressed
    assert "no phase is slower" in (more_prefill.summary() or "")
    slower_decode = phase_deltas(base, _doc(prefill=(11, 199.0), decode=(89, 36.0)))
    assert not slower_decode.mix_changed and slower_decode.regressed == ["decode"]
    assert "Same mix; a regression per phase: decode slower" in (slower_decode.summary() or "")


def test_a_db_export_gives_the_steps_of_its_text_twin(tmp_path: Path) -> None:
    knobs = {"markers": "python", "dummy_every": 5, **SMALL}
    for export in ("text", "db"):
        generate("serving", tmp_path / export / "in", ranks=1, export=export, **knobs)
        ingest(tmp_path / export / "in", tmp_path / export / "out", jobs=1)
    columns = ["step", "start_ns", "end_ns", "step_source", "phase", "phase_source", "tokens"]
    text, db = (
        steps_of(Store.open(tmp_path / e / "out")).select(*columns, "graph") for e in ("text", "db")
    )
    assert text.height == 16 and text.equals(db)


def test_ranks_derived_together_give_what_each_gives_alone(tmp_path: Path) -> None:
    """One derivation over several ranks (a steps task's batch), each framed by its own
    source; two ranks whose sessions share a name are derived apart, to the same steps."""
    tables: dict[str, list[pl.DataFrame]] = {"slices": [], "kernels": [], "sessions": []}
    styles = ("python", "annotation", "none", "profiler_step")
    for rank, markers in enumerate(styles):
        generate(
            "serving", tmp_path / markers / "in", ranks=1, markers=markers, dummy_every=5, **SMALL
        )
        ingest(tmp_path / markers / "in", tmp_path / markers / "out", jobs=1)
        store = Store.open(tmp_path / markers / "out")
        for name, frames in tables.items():
            frames.append(store.table(name).collect().with_columns(rank=pl.lit(rank, pl.Int32)))
    shared = Store.from_frames({name: pl.concat(frames) for name, frames in tables.items()})
    assert shared.table("sessions").collect()["session"].n_unique() == 1  # one name, four ranks
    renamed = Store.from_frames(
        {
            name: pl.concat(frames).with_columns(
                pl.format("{}-{}", "session", "rank").alias("session")
            )
            for name, frames in tables.items()
        }
    )
    params = step_params()

    def derived(store: Store, ranks: list[int]) -> pl.DataFrame:
        slices = read_slices(store, ranks, params)
        launches = launches_of(store, ranks)
        return derive_ranks(store, ranks, params, launches, slices, compute_tasks(slices))

    for store in (shared, renamed):
        together = derived(store, list(range(len(styles))))
        alone = pl.concat([derived(store, [rank]) for rank in range(len(styles))])
        assert together.equals(alone)
        sources = (
            together.filter(pl.col("step_source") != "gap")
            .group_by("rank")
            .agg(pl.col("step_source").unique())
        )
        assert sources.sort("rank")["step_source"].to_list() == [
            ["python_function"],
            ["annotation"],
            ["device_activity"],
            ["profiler_step"],
        ]


def test_the_steps_tasks_are_as_few_as_the_workers_and_none_too_large() -> None:
    """One task in this process, one per worker in a pool; a task never holds more than
    BATCH_BYTES of input (a rank larger than that is a task of its own)."""
    from types import SimpleNamespace

    from traceanalyzer.derived.stage import STEPS
    from traceanalyzer.stages import _batches

    BATCH_BYTES = STEPS.task_bytes

    mb = 1 << 20

    def sessions(*sizes: int) -> dict:
        return {
            f"{rank}/s{rank}": {"fingerprint": {"files": {"trace_view.json": {"size": size}}}}
            for rank, size in enumerate(sizes)
        }

    local, pool = SimpleNamespace(jobs=2, parallel=False), SimpleNamespace(jobs=2, parallel=True)
    shards = [(r,) for r in range(4)]
    assert _batches(shards, sessions(*[50 * mb] * 4), local, BATCH_BYTES) == [shards]
    assert _batches(shards, sessions(*[50 * mb] * 4), pool, BATCH_BYTES) == [
        shards[:2],
        shards[2:],
    ]
    large = _batches(
        shards, sessions(BATCH_BYTES, 10 * mb, 10 * mb, BATCH_BYTES), local, BATCH_BYTES
    )
    assert large == [[(0,)], [(1,), (2,)], [(3,)]]
    assert _batches(shards[:1], sessions(50 * mb), pool, BATCH_BYTES) == [shards[:1]]
    assert _batches(shards, sessions(*[50 * mb] * 4), local, None) == [[s] for s in shards]
