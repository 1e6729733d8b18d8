"""parse/rows.py: the one sorted order the readers write their large tables in."""

from __future__ import annotations

import random

import polars as pl

from traceanalyzer.parse.rows import stable_order

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _frame(rows: int, seed: int) -> pl.DataFrame:
    rng = random.Random(seed)

    def pick(values: list[object]) -> list[object]:
        return [rng.choice(values) for _ in range(rows)]

    return pl.DataFrame(
        {
            # few distinct values, so every later key breaks ties; the extremes of int64 too
            "ts": pick([None, INT64_MIN, -1, 0, 1, 1_700_000_000_000_000_001, INT64_MAX]),
            "dur": pick([None, 0, 5, 2**62]),
            "tid": pl.Series(pick([None, 0, 3, 7]), dtype=pl.UInt32),
            "name": pl.Series(pick([None, "b", "a", "ab", ""]), dtype=pl.Categorical),
            "value": pick([None, -0.5, 0.0, 2.5, float("nan"), float("-inf")]),
            "flag": pick([None, True, False]),
            "text": pick([None, "b", "a", "ab", ""]),
        },
        schema_overrides={"ts": pl.Int64, "dur": pl.Int64, "value": pl.Float64},
    )


def test_stable_order_is_a_stable_sort_on_every_key_nulls_last() -> None:
    by = ["ts", "dur", "tid", "name", "value", "flag", "text"]
    for seed in range(64):
        frame = _frame(300, seed).with_row_index("row")
        descending = [bool((seed * 37) & (1 << i)) for i in range(len(by))]
        expected = frame.sort(by, descending=descending, nulls_last=True, maintain_order=True)
        order = stable_order(frame, by, descending)
        assert order.dtype == pl.Int64
        assert order.to_list() == expected["row"].cast(pl.Int64).to_list()


def test_stable_order_of_no_rows() -> None:
    assert stable_order(_frame(0, 0), ["ts", "name"]).to_list() == []
