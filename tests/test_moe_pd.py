"""MoE expert parallelism and PD disaggregation: the rules against the synthetic scenarios'
truth (which rank is hot, what the others wait), one owner per wait, and the kit's per-step
EP exchange paths."""

from __future__ import annotations

import polars as pl
import pytest
from report_support import assert_typed_round_trip

from traceanalyzer.derived.exchanges import fits
from traceanalyzer.engine import evaluate
from traceanalyzer.engine.loader import load_rules
from traceanalyzer.engine.params import Params
from traceanalyzer.engine.rule import RuleContext
from traceanalyzer.engine.runner import evaluate_rule
from traceanalyzer.kit import routed_tokens
from traceanalyzer.kit.testing.rank_builder import scenario_store
from traceanalyzer.synth.scenarios import get_scenario, moe

RULES = {r.name: r for r in load_rules(entry_points=False).rules}
SMALL = {"iterations": 8, "layers": 2}


def _true_wait(knobs: dict, world: int = 4) -> tuple[dict[int, int], int, int]:
    """From the simulation: in how many served steps each rank is hot, what the others wait
    for it in the exchanges back (dummy and warm-up steps left out), and the served steps."""
    plan = moe.simulate(get_scenario("moe-ep").resolve(knobs), world)
    hot: dict[int, int] = {}
    wait = served = 0
    for i in range(len(plan.starts)):
        its = {r: plan.ranks[r][i] for r in range(world)}
        if {it.phase for it in its.values()} & {"dummy", "warmup"}:
            continue
        served += 1
        for r, it in its.items():
            if it.hot is not None and it.hot != r:
                wait += sum(it.waits)
            if it.hot == r:
                hot[r] = hot.get(r, 0) + 1
    return hot, wait, served


def _findings(store, name: str) -> list:
    return [f for f in evaluate(store).findings if f.name == name]


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"comm": "alltoall", "graph": False},
        {"comm": "allgather", "graph": False, "hot_rank": 3, "skew": 1.6},
        {"rotate": True},
        {"persistence": 0.5, "hot_from": 2, "dummy_ranks": "0", "dummy_every": 4},
    ],
    ids=["mc2", "alltoall", "allgather", "moving", "window-and-dummies"],
)
def test_hot_rank_and_cost_match_the_simulation(knobs: dict) -> None:
    knobs = {**SMALL, **knobs}
    found = _findings(scenario_store("moe-ep", ranks=4, **knobs), "moe-load-imbalance")
    hot, wait, served = _true_wait(knobs)
    assert len(found) == 1
    # named: hot in at least min_hot_share (0.2) of the served steps
    assert found[0].ranks == sorted(r for r, n in hot.items() if n >= 0.2 * served)
    assert found[0].cost.ns == pytest.approx(wait, rel=0.2)


def test_one_owner_for_the_hot_ranks_wait() -> None:
    """All-to-all path: collective-straggler sees rank 1 late at every combine; the wait is
    moe-load-imbalance's, the straggler keeps only what the experts do not explain."""
    knobs = {**SMALL, "comm": "alltoall", "graph": False}
    result = evaluate(scenario_store("moe-ep", ranks=4, **knobs))
    by_name = {f.name: f for f in result.findings}
    moe_cost = by_name["moe-load-imbalance"].cost.ns
    straggler = by_name["collective-straggler"]
    assert straggler.location["cause"] == "moe"
    assert straggler.metrics["moe_owned_ns"] > 0.9 * moe_cost / 3  # mean over the 3 peers
    assert straggler.cost.ns < 0.05 * moe_cost
    _, wait, _ = _true_wait(knobs)
    total = moe_cost + 3 * straggler.cost.ns
    assert total == pytest.approx(wait, rel=0.2)  # counted once, not twice


def test_routed_tokens_counts_like_ep_load_balance() -> None:
    assert routed_tokens("512,7168;16,7168,4096;16", 2) == 512
    assert routed_tokens('"256,7168;256,7168;16,7168,4096;16"', 2) == 512  # two x tensors
    assert routed_tokens("512,7168;;16,7168,4096;16", 2) == 512  # empty inputs skipped
    assert routed_tokens("512,7168", 2) is None  # one input: nothing to count
    assert routed_tokens("N/A;16,7168,4096;16", 2) is None
    assert routed_tokens(None, 2) is None


def test_exchange_paths_per_step() -> None:
    """Decode steps within the MC2 capacity take MC2, prefill chunks all-to-all; each step's
    exchange time and what of it is exposed."""
    store = scenario_store("moe-ep", ranks=2, **SMALL, prefill_every=4, graph=False)
    rule = RULES["moe-load-imbalance"]
    ctx = RuleContext(rule, store, Params({k: v.default for k, v in rule.params.items()}))
    from traceanalyzer.kit import moe_exchange_paths

    paths = moe_exchange_paths(ctx)
    assert paths.columns == [
        "rank", "session", "step", "phase", "tokens", "path", "paths", "exchanges",
        "exchange_ns", "exposed_ns", "fits",
    ]  # fmt: skip
    by_phase = dict(paths.group_by("phase").agg(pl.col("path").unique()).iter_rows())
    assert by_phase["decode"] == ["mc2"] and by_phase["prefill"] == ["alltoall"]
    assert paths["exchanges"].min() == 4  # two MoE layers, there and back
    assert (paths["exposed_ns"] <= paths["exchange_ns"]).all()
    assert paths["fits"].all()
    from traceanalyzer.derived.exchanges import exchanges_of

    assert exchanges_of(store, [0, 1]).equals(paths)  # the overview's way in, outside a rule
    assert exchanges_of(store, [1])["rank"].unique().to_list() == [1]
    # other patterns than the table's: the rule derives its own, from the same device tasks
    values = {k: v.default for k, v in rule.params.items()}
    values["mc2_ops"] = r"MoeDistribute(?:Dispatch|Combine)\w*"
    own = moe_exchange_paths(RuleContext(rule, store, Params(values)))
    assert own.equals(paths)


def test_the_overview_says_which_exchange_each_phase_used(tmp_path) -> None:
    """Per phase of an MoE profile: the path of its steps, the time in it and what of it was
    exposed, the same figures as the kit's; a dense profile has no EP section."""
    from traceanalyzer.executor import make_executor
    from traceanalyzer.overview.model import read_overview
    from traceanalyzer.pipeline import analyse
    from traceanalyzer.report.overview_text import ep_lines
    from traceanalyzer.synth.generate import generate

    generate("moe-ep", tmp_path / "in", ranks=2, **SMALL, prefill_every=4, graph=False)
    with make_executor("local") as executor:
        result = analyse(tmp_path / "in", tmp_path / "out", executor=executor, config_path=False)
    overview = result.findings.overview
    rows = {r["phase"]: r for r in overview["phases"]["rows"]}
    assert rows["decode"]["ep"]["paths"] == {"mc2": rows["decode"]["ep"]["steps"]}
    assert set(rows["prefill"]["ep"]["paths"]) == {"alltoall"}
    from traceanalyzer.derived.exchanges import exchanges_of
    from traceanalyzer.store import Store

    paths = exchanges_of(Store.open(tmp_path / "out"), [0, 1])
    decode = paths.filter(pl.col("phase") == "decode")
    assert rows["decode"]["ep"]["steps"] == decode.height
    assert rows["decode"]["ep"]["exposed_ns"] == pytest.approx(decode["exposed_ns"].mean())
    lines = ep_lines(read_overview(overview))
    assert any(line.startswith("decode: MC2 in") for line in lines), lines
    assert not any(line.startswith("information") for line in lines)  # every path fits


def test_the_exchange_paths_are_named_once() -> None:
    """The paths synth writes, the names findings give them and the overview's short names come
    from one table (vocabulary.EP_PATHS)."""
    from traceanalyzer.kit import PATH_NAMES
    from traceanalyzer.report.overview_text import EP_PATH_WORDS
    from traceanalyzer.vocabulary import EP_PATHS

    assert set(moe.PATHS) == set(PATH_NAMES) == set(EP_PATH_WORDS) == set(EP_PATHS)
    assert (PATH_NAMES["mc2"], EP_PATH_WORDS["mc2"]) == EP_PATHS["mc2"]


def test_a_path_that_does_not_fit_its_size_is_flagged() -> None:
    steps = pl.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "path": ["mc2", "mc2", "alltoall", "alltoall"],
            "tokens": [32, 64, 48, 4096],
        }
    )
    assert fits(steps)["fits"].to_list() == [True, False, False, True]


def test_prefill_and_decode_costs_match_the_scenario() -> None:
    """Serialized layerwise sends: the prefill side costs every send (all after the forward);
    the decode side the waits for each new request's KV."""
    knobs = {"iterations": 6, "layers": 6, "overlap": False}
    store = scenario_store("pd-kv", ranks=2, **knobs)
    found = {f.location["side"]: f for f in _findings(store, "kv-transfer-overlap")}
    sends = (
        store.table("slices")
        .filter(pl.col("name").str.contains("batch_transfer_sync_write"))
        .select((pl.col("end_ns") - pl.col("start_ns")).sum())
        .collect()
        .item()
    )
    assert found["prefill"].ranks == [0] and found["decode"].ranks == [1]
    assert found["prefill"].cost.ns == pytest.approx(sends, rel=0.05)
    requests = 2  # iterations 0 and 3 of 6 bring a new request (requests_every=3)
    assert found["decode"].cost.ns == pytest.approx(requests * 3000e3, rel=0.2)


def test_rules_asking_about_the_expert_load_read_its_parameters() -> None:
    """A rule's own parameter of the same name would silently change the helper's verdict."""
    from traceanalyzer.analyses.moe import MOE_PARAMS

    users = [r for r in RULES.values() if "moe_imbalance" in r.uses]
    assert {r.name for r in users} >= {"moe-load-imbalance", "collective-straggler", "slow-rank"}
    for r in users:
        assert all(r.params[k] is v for k, v in MOE_PARAMS.items()), r.name


def test_kv_findings_are_the_same_from_a_db_export() -> None:
    """The connector's python functions and no-forward iterations reach the same tables from
    ascend_pytorch_profiler_{rank}.db."""
    knobs = {"iterations": 4, "layers": 4, "overlap": False}
    text, db = (scenario_store("pd-kv", ranks=2, export=e, **knobs) for e in ("text", "db"))
    titles = [sorted(f.title for f in _findings(s, "kv-transfer-overlap")) for s in (text, db)]
    assert titles[0] == titles[1] and len(titles[0]) == 2


def test_the_straggler_source_is_the_same_every_run() -> None:
    """communication.json and the Notify Wait tasks hold the same waits here: the two sources
    tie, and the trace's own tasks speak, however the rows happen to be ordered (a float sum in
    the order a group_by returned made either source win, run to run)."""
    import inspect

    rule = RULES["collective-straggler"]
    module = inspect.getmodule(rule.body)
    store = scenario_store("moe-ep", ranks=4, **SMALL, comm="alltoall", graph=False)
    ctx = RuleContext(rule, store, Params({k: v.default for k, v in rule.params.items()}))
    ops = module._from_tasks(ctx)
    window = {rank: 10**9 for rank in range(4)}
    found = module.stragglers(ops, ctx.params, window, "tasks")
    shuffled = module.stragglers(
        ops.sample(fraction=1.0, shuffle=True, seed=3), ctx.params, window, "tasks"
    )
    assert [s.lost_ns for s in found] == [s.lost_ns for s in shuffled]
    for _ in range(3):
        (finding,) = evaluate_rule(rule, store).findings
        assert "waits from Notify Wait tasks" in finding.message


def test_the_stored_moe_layers_are_what_the_rule_derives(tmp_path) -> None:
    """The moe_layers and moe_dense tables the steps' task stores (at the default patterns) give
    the verdict the rule derives from the device tasks with other patterns that match the same
    kernels; a rank the tables hold no row for is not derived again."""
    from traceanalyzer.derived.moe_layers import DENSE, LAYERS, moe_tables_of
    from traceanalyzer.executor import make_executor
    from traceanalyzer.kit import moe_imbalance
    from traceanalyzer.pipeline import analyse
    from traceanalyzer.store import RankStore, Store, derived_ranks
    from traceanalyzer.synth.generate import generate

    generate("moe-ep", tmp_path / "in", ranks=4, **SMALL, prefill_every=4, graph=False)
    with make_executor("local") as executor:
        analyse(tmp_path / "in", tmp_path / "out", executor=executor, config_path=False)
    root = tmp_path / "out"
    ranks = [0, 1, 2, 3]
    assert derived_ranks(root, LAYERS, ranks) == set(ranks)
    stored = {t: Store.open(root).table(t).collect() for t in (LAYERS, DENSE)}
    assert stored[LAYERS]["rank"].unique().sort().to_list() == ranks
    assert stored[DENSE].height > 0
    rule = RULES["moe-load-imbalance"]
    defaults = {k: v.default for k, v in rule.params.items()}
    other = {**defaults, "expert_core": r"GroupedMatmul|NoSuchKernel"}
    verdicts = [
        moe_imbalance(RuleContext(rule, RankStore(root, ranks), Params(values)))
        for values in (defaults, other)
    ]
    assert verdicts[0].rows.height > 0
    assert (
        verdicts[0]
        .rows.sort("rank", "sidx", "step", "layer")
        .equals(verdicts[1].rows.sort("rank", "sidx", "step", "layer"))
    )
    assert [f.cost_ns for f in verdicts[0].findings] == [f.cost_ns for f in verdicts[1].findings]
    # fixtures' stores (nothing stored) derive the same tables
    in_memory = Store.from_frames(
        {
            "slices": Store.open(root).table("slices").collect(),
            "kernels": Store.open(root).table("kernels").collect(),
            "sessions": Store.open(root).table("sessions").collect(),
        }
    )
    derived = moe_tables_of(in_memory, ranks)
    assert derived[LAYERS].sort("rank", "first_ns").equals(stored[LAYERS].sort("rank", "first_ns"))


def test_one_picture_of_moe_time(tmp_path) -> None:
    """synth moe-ep: the MC2 exchange the peers wait in is exposed communication in the
    headline and the rank table (their comm wait exceeds the hot rank's by the finding's wait
    per step), no tight cluster scores a z of 8 beside "no outlier rank", and the finding's
    cost share is one value in its metrics, its details and its cost."""
    from traceanalyzer.executor import make_executor
    from traceanalyzer.overview.model import read_overview
    from traceanalyzer.pipeline import analyse
    from traceanalyzer.report.overview_text import cost_text
    from traceanalyzer.synth.generate import generate

    generate("moe-ep", tmp_path / "in", ranks=4)
    with make_executor("local") as executor:
        result = analyse(tmp_path / "in", tmp_path / "out", executor=executor, config_path=False)
    overview = result.findings.overview
    assert "exposed communication" in overview["headline"], overview["headline"]
    (finding,) = [f for f in result.findings.findings if f.name == "moe-load-imbalance"]
    hot = finding.ranks[0]
    wait = {c["rank"]: c["comm_wait_ns"] for c in overview["cluster"]}
    peers = [wait[r] for r in wait if r != hot]
    per_step = finding.metrics["wait_ns_per_step"]
    for peer in peers:
        assert peer - wait[hot] == pytest.approx(per_step, rel=0.05)
    for row in overview["cluster"]:
        assert (row["step_z"] > 3.5) == row["outlier"], row
    cost = read_overview(overview).costs[finding.fingerprint]
    assert cost.cost_share == pytest.approx(finding.cost.share)
    share = f"{cost.cost_share:.1%}"
    assert share in cost_text(cost) and share in finding.message, finding.message
    assert_typed_round_trip(overview)  # costs per phase, EP exchanges, graphs, layers
