"""Inside the graphs: each step's graph size, real batch and padding, and the decode batches that
fall out of the FULL aclgraph (graph-fallback), against the serving generator's truth."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from traceanalyzer.derived import captures
from traceanalyzer.derived.tables import steps_of
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.registry import RuleSet
from traceanalyzer.engine.runner import evaluate
from traceanalyzer.ingest import ingest
from traceanalyzer.store import Store
from traceanalyzer.synth import generate
from traceanalyzer.synth.scenarios import serving

DECODE = {"iterations": 12, "layers": 2, "prefill_every": 0, "markers": "python"}
BATCHES = "8,16,40,64"


def _run(tmp: Path, **knobs: object) -> tuple[Store, pl.DataFrame, list[serving.Iteration]]:
    generate("serving", tmp / "in", ranks=1, **DECODE, **knobs)
    ingest(tmp / "in", tmp / "out", jobs=1)
    store = Store.open(tmp / "out")
    steps = steps_of(store, [0]).filter(pl.col("step_source") != "gap")
    plan = [
        it for it in serving.plan({**serving.KNOBS, **DECODE, **knobs}, 0) if it.phase != "idle"
    ]
    return store, steps, plan


@pytest.mark.parametrize(
    "knobs",
    [
        {"batches": "3,8,12,20", "capture_sizes": "1,2,4,8,16,32"},
        {"batches": "3,5,12", "spec_tokens": 1, "capture_sizes": "1,2,4,8,16,32"},
        {"batches": "3,8,12,20", "graph": "piecewise"},
    ],
    ids=["full", "full-spec", "piecewise"],
)
def test_graph_size_batch_and_padding_are_the_generators(tmp_path: Path, knobs: dict) -> None:
    _, steps, plan = _run(tmp_path, **knobs)
    settings = {**serving.KNOBS, **DECODE, **knobs}
    checked = 0
    for it, row in zip(plan, steps.iter_rows(named=True), strict=True):
        size = serving.padded(it.tokens, settings)
        assert row["batch"] == it.requests, row
        assert row["graph_size"] == size, (row, size)
        assert row["padded_tokens"] == size - it.tokens, row
        checked += 1
    assert checked == len(plan)


def _fallback(store: Store) -> dict:
    """The finding's metrics as findings.json writes them (its cost as cost_ns, cost_share)."""
    rule = load_rules(entry_points=False).rules.get("graph-fallback")
    result = evaluate(store, rules=RuleSet([rule]), config_path=False)
    return result.findings[0].to_dict()["metrics"] if result.findings else {}


def test_fallen_out_batches_and_their_cost_against_a_covered_twin(tmp_path: Path) -> None:
    """The cost is what the fell-out iterations took beyond replays at their size: the twin,
    which captured those sizes too, replays them."""
    sick, sick_steps, plan = _run(tmp_path / "sick", batches=BATCHES, capture_sizes="1,2,4,8,16,32")
    _, twin_steps, _ = _run(tmp_path / "twin", batches=BATCHES, capture_sizes="1,2,4,8,16,32,40,64")
    found = _fallback(sick)
    assert found["batch_sizes"] == [40, 64]
    fell = [i for i, it in enumerate(plan) if it.requests > 32]
    truth = sum(
        sick_steps["step_ns"][i] - twin_steps["step_ns"][i]  # type: ignore[operator]
        for i in fell
    )
    assert set(sick_steps["graph"][i] for i in fell) == {"eager"}
    assert set(twin_steps["graph"][i] for i in fell) == {"full"}
    assert found["cost_ns"] == pytest.approx(truth, rel=0.25)


@pytest.mark.parametrize("graph", ["full_and_piecewise", "piecewise", "eager"])
def test_each_decoder_kernel_gets_its_layer(tmp_path: Path, graph: str) -> None:
    """The generator writes each layer's nine kernels in order: the cut at the attention (the
    layer's fourth) gives every one of them its layer, eager or replayed alike; the sampler
    after the layers is in none, and the slow layer is named in the overview."""
    generate(
        "serving", tmp_path / "in", ranks=1, iterations=8, layers=4, graph=graph,
        slow_layer=2, markers="python",
    )  # fmt: skip
    from traceanalyzer.executor import LocalExecutor
    from traceanalyzer.pipeline import analyse

    analyse(tmp_path / "in", tmp_path / "out", executor=LocalExecutor())
    store = Store.open(tmp_path / "out")
    layered = store.table("kernel_layers").collect().sort("start_ns")
    per_layer = len(serving.ops.DECODE_LAYER)
    checked = 0
    for (_, _), part in layered.group_by("session", "step", maintain_order=True):
        decoder = part.filter(pl.col("module") != "sampling")
        truth = [i // per_layer for i in range(decoder.height)]
        assert decoder["layer"].to_list() == truth, decoder.select("name", "layer")
        checked += decoder.height
        assert (
            part.filter(pl.col("module") == "sampling")["layer"].null_count()
            == part.filter(pl.col("module") == "sampling").height
        )
    assert checked >= 8 * 4 * per_layer
    import json

    rows = json.loads((tmp_path / "out" / "findings.json").read_text())["summary"]["overview"][
        "phases"
    ]["rows"]
    decode = next(r for r in rows if r["phase"] == "decode")
    assert [s["layer"] for s in decode["layers"]["slow_layers"]] == [2]


CAPTURED = {"capture_sizes": "8,16,32", "batches": "5,12,30", "warmup": 3, "layers": 3}


def _layered(tmp: Path, analysed: bool = False, **knobs: object) -> pl.DataFrame:
    """The ``kernel_layers`` rows of a one-rank decode profile: derived by the run's steps task
    (``analysed``), else by the table's reader on an ingested store."""
    generate("serving", tmp / "in", ranks=1, **{**DECODE, **knobs})
    if analysed:
        from traceanalyzer.executor import LocalExecutor
        from traceanalyzer.pipeline import analyse

        analyse(tmp / "in", tmp / "out", executor=LocalExecutor())
    else:
        ingest(tmp / "in", tmp / "out", jobs=1)
    return Store.open(tmp / "out").derived("kernel_layers", [0]).collect().sort("start_ns")


def test_replayed_kernels_take_the_call_site_of_the_launch_they_were_captured_from(
    tmp_path: Path,
) -> None:
    """The profile holds the capture of every size (an eager warm-up, then the capture's
    launches with their Python frames and nn.Modules): each kernel of a FULL replay gets the
    call site, torch op and module of its launch, and its layer from the decoder-layer module
    around it, the generator's own."""
    layered = _layered(tmp_path, analysed=True, **CAPTURED)
    replays = layered.filter((pl.col("phase") == "decode") & (pl.col("module") != "sampling"))
    layer = serving.causes.layer({})
    sites = serving.call_sites(layer)
    checked = 0
    for (_, _), part in replays.group_by("session", "step", maintain_order=True):
        assert part.height == CAPTURED["layers"] * len(layer)
        for i, row in enumerate(part.iter_rows(named=True)):
            module, frame = sites[i % len(layer)]
            assert row["attribution"] == "capture", row
            assert row["call_site"] == frame, row
            assert row["name"].startswith(row["host_op"] + "_"), row  # the aclnn op
            assert row["host_module"] == (module or serving.DECODER_LAYER), row
            assert row["layer"] == i // len(layer), row
            assert row["capture_note"] is None, row
            checked += 1
    assert checked == DECODE["iterations"] * CAPTURED["layers"] * len(layer)
    eager = layered.filter(pl.col("phase") == "warmup")  # the warm-ups ran eagerly
    assert eager.height and set(eager["attribution"]) == {"sequence"}
    assert eager["call_site"].null_count() == eager.height


def test_without_a_capture_or_when_it_disagrees_the_sequence_stays_and_says_why(
    tmp_path: Path,
) -> None:
    """No capture in the profile: every replayed kernel keeps the sequence's layer, with the
    reason. The capture of size 16 launched one kernel its replays do not run: those replays
    fall back, named; the other sizes are still mapped."""
    absent = _layered(tmp_path / "absent", **{**CAPTURED, "warmup": 0})
    decode = absent.filter(pl.col("phase") == "decode")
    replayed = decode.filter(pl.col("module") != "sampling")
    assert set(decode["attribution"]) == {"sequence"}
    assert set(replayed["capture_note"]) == {captures.NO_CAPTURE}
    assert replayed["call_site"].null_count() == replayed.height

    drift = _layered(tmp_path / "drift", **{**CAPTURED, "capture_drift": 16})
    steps = drift.filter((pl.col("phase") == "decode") & (pl.col("module") != "sampling"))
    per_step = steps.group_by("step").agg(
        pl.col("attribution").unique(), pl.col("capture_note").unique(), pl.len()
    )
    kernels = CAPTURED["layers"] * len(serving.causes.layer({}))
    note = f"the capture of size 16 launched {kernels + 1} kernels, its replay ran {kernels}"
    notes = {tuple(r["capture_note"]) for r in per_step.iter_rows(named=True)}
    assert notes == {(None,), (note,)}
    mapped = per_step.filter(pl.col("attribution").list.contains("capture"))
    assert mapped.height == DECODE["iterations"] * 2 // 3  # the replays at 8 and 32
    # the layers by sequence are the same as by capture
    assert steps["layer"].to_list() == [
        i % kernels // len(serving.causes.layer({})) for i in range(steps.height)
    ]


def _replay_kernels(names: list[str], size: int = 16) -> pl.DataFrame:
    """One FULL replay's kernel_layers rows, as the derivation hands them to the capture's
    mapping."""
    n = len(names)
    return pl.DataFrame(
        {
            "rank": [0] * n, "session": ["s"] * n, "stream_id": [2] * n,
            "start_ns": list(range(1000, 1000 + 10 * n, 10)), "name": names,
            "layer": [0] * n, "module": ["other"] * n, "_named_module": ["other"] * n,
            "_replay": [900] * n, "graph": ["full"] * n, "graph_size": [size] * n,
        },
        schema_overrides={"rank": pl.Int32},
    )  # fmt: skip


def _launches(names: list[str], size: int = 16) -> pl.DataFrame:
    n = len(names)
    return pl.DataFrame(
        {
            "rank": [0] * n, "session": ["s"] * n, "capture": [10] * n, "size": [size] * n,
            "full": [True] * n, "pos": list(range(n)), "launch": names,
            "call_site": [f"site {i}" for i in range(n)], "host_op": ["op"] * n,
            "host_module": ["M"] * n, "capture_layer": [0] * n, "after_layers": [False] * n,
            "layered": [True] * n,
        },
        schema=captures.LAUNCH_SCHEMA,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("launched", "size", "note"),
    [
        (["aclnnMm", "aclnnAdd"], 16, None),  # the ops' names prefix their kernels'
        (
            ["aclnnMm", "aclnnMul"],
            16,
            "kernel 2 of the replay is aclnnAdd_AddAiCore_Add, launch 2 of the capture of size "
            "16 is aclnnMul",
        ),
        (["aclnnMm"], 16, "the capture of size 16 launched 1 kernels, its replay ran 2"),
        (["aclnnMm", "aclnnAdd"], 32, "no FULL capture of size 16 in the profile"),
    ],
    ids=["names-agree", "a-name-differs", "count-differs", "other-size"],
)
def test_a_replay_maps_to_its_capture_only_when_every_kernel_agrees(
    launched: list[str], size: int, note: str | None
) -> None:
    kernels = _replay_kernels(["aclnnMm_MatMulCommon_MatMulV2", "aclnnAdd_AddAiCore_Add"])
    out = captures.attribute(kernels, lambda: _launches(launched, size))
    assert out["capture_note"].to_list() == [note, note]
    mapped = note is None
    assert out["attribution"].to_list() == ["capture" if mapped else "sequence"] * 2
    assert out["call_site"].to_list() == (["site 0", "site 1"] if mapped else [None, None])


def test_the_real_exports_hold_no_capture_and_no_layers(real_g2_store: Path) -> None:
    """The real G2 exports (training, no attention, no graph) are left as they were: no capture
    to map, no kernel_layers rows."""
    from traceanalyzer.derived.launches import host_calls

    store = Store.open(real_g2_store)
    ranks = sorted(set(store.sessions()["rank"]))
    assert captures.capture_windows_in(host_calls(store, ranks)).is_empty()
    assert store.derived("kernel_layers", ranks).collect().is_empty()


def test_a_piecewise_replay_or_one_of_unknown_size_is_not_mapped_and_says_why() -> None:
    names = ["aclnnMm_MatMulCommon_MatMulV2", "aclnnAdd_AddAiCore_Add"]
    launches = _launches(["aclnnMm", "aclnnAdd"])
    piecewise = _replay_kernels(names).with_columns(pl.lit("piecewise").alias("graph"))
    unsized = _replay_kernels(names).with_columns(pl.lit(None, pl.Int64).alias("graph_size"))
    for kernels, note in ((piecewise, captures.PIECEWISE), (unsized, captures.NO_SIZE)):
        out = captures.attribute(kernels, lambda: launches)
        assert out["capture_note"].to_list() == [note, note]
        assert set(out["attribution"]) == {"sequence"}
