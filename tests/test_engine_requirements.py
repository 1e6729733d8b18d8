"""The canned requirements: one declaration of the data most rules need, with a specific message."""

from __future__ import annotations

import pytest

from traceanalyzer.engine.runner import precondition_gaps
from traceanalyzer.kit import (
    AI_CORE_FREQ_PROCESS,
    AnyOf,
    RuleContext,
    api_statistics,
    communication_ops,
    counters,
    device_tasks,
    host_api,
    kernel_details,
    rule,
)
from traceanalyzer.kit.testing import StoreBuilder, us

DOC = """
## What it detects
x
## Why it matters
x
## How to fix
x
## Example
x
## References
x
"""


def needs(*requires):
    def needs_rule(ctx: RuleContext):
        yield from ()

    needs_rule.__doc__ = DOC
    return rule(id="TA950", name="needs", severity="info", summary="s", requires=list(requires))(
        needs_rule
    )


def test_messages_name_what_the_rule_looks_for():
    assert host_api("aclrtMalloc", "aclrtFree").missing_message() == (
        "missing CANN API events (`aclrtMalloc`, `aclrtFree`) (collect with profiler_level=Level1)"
    )
    assert device_tasks().missing_message(["stream_id"]) == (
        "missing device tasks (process `Ascend Hardware`) [no values in column(s) stream_id] "
        "(collect with ProfilerActivity.NPU)"
    )
    assert counters(AI_CORE_FREQ_PROCESS).describe() == "the AI Core Freq counter"
    assert kernel_details().table == "kernels" and api_statistics().table == "api_stats"
    assert communication_ops().columns == ("wait_ns",)
    with pytest.raises(ValueError, match="at least one counter"):
        counters()


def test_each_requirement_looks_at_its_own_rows():
    b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1_000))
    b.task(0, "s", "MatMulV2", stream=2, start_ns=us(10), dur_ns=us(5), task_type="AI_CORE")
    b.counter(0, "s", "HBM Bandwidth", ts_ns=us(10), value=3.0)
    store = b.store()
    assert precondition_gaps(needs(device_tasks()), store) == []
    # the store's session is Level1: the advice says it records them, not "collect with Level1"
    assert precondition_gaps(needs(host_api("aclrtMemcpy")), store) == [
        "missing CANN API events (`aclrtMemcpy`) (this Level1 export records them but has none)"
    ]
    assert precondition_gaps(needs(counters("HBM Bandwidth")), store) == []
    assert precondition_gaps(needs(counters(AI_CORE_FREQ_PROCESS)), store) == [
        "missing the AI Core Freq counter (collect with ProfilerActivity.NPU)"
    ]
    # alternatives: the kernels table is missing, the trace's task types are there
    assert (
        precondition_gaps(
            needs(AnyOf(kernel_details(), device_tasks(columns=("task_type",)))), store
        )
        == []
    )


def test_a_probe_tells_no_rows_from_a_column_without_values():
    def store_of(*model_ids: int | None):
        b = StoreBuilder().session(0, "s", start_ns=0, end_ns=us(1_000))
        for i, model_id in enumerate(model_ids):
            b.task(0, "s", "MatMulV2", stream=2, start_ns=us(10 + 10 * i), dur_ns=us(5),
                   model_id=model_id)  # fmt: skip
        return b.store()

    in_graphs = needs(device_tasks(columns=("model_id",)))
    assert precondition_gaps(in_graphs, store_of(7)) == []
    # the first row lacks the column, a later one has it: met
    assert precondition_gaps(in_graphs, store_of(None, None, 7)) == []
    [no_values] = precondition_gaps(in_graphs, store_of(None, None))
    assert "[no values in column(s) model_id]" in no_values
    [no_rows] = precondition_gaps(in_graphs, store_of())
    assert no_rows.startswith("missing device tasks") and "no values" not in no_rows
