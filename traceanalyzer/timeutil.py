"""Every conversion of a time unit to int64 nanoseconds: one per language (polars, DuckDB SQL;
the native scanner's C mirrors :func:`us_expr_to_ns`).

torch_npu writes epoch timestamps as ``"1736408883704643.212"`` (µs, 3 decimals = ns precision).
An epoch in ns (~1.7e18) needs 61 bits; float64 keeps 53, so a float round trip moves
timestamps by up to ~256 ns. Everything here works on the decimal digits instead.
"""

from __future__ import annotations

import polars as pl

# Characters torch_npu/msprof leave around numbers in CSVs: trailing TAB, literal quotes, spaces.
_JUNK = "\t \"'\r\n"


def us_expr_to_ns(expr: pl.Expr) -> pl.Expr:
    """A µs text column as exact int64 ns: digits past the ns rounded half up; nulls, `N/A`
    and text that is no number become null.

    >>> pl.select(us_expr_to_ns(pl.lit("1736408883704643.212\t"))).item()
    1736408883704643212
    >>> pl.select(us_expr_to_ns(pl.lit("55.1610625"))).item()
    55161
    """
    s = expr.cast(pl.String).str.strip_chars(_JUNK)
    s = (
        pl.when(s.str.to_uppercase().is_in(["", "N/A", "NA", "NAN", "NONE", "NULL", "-"]))
        .then(None)
        .otherwise(s)
    )
    parts = s.str.extract_groups(r"^([+-]?)(\d*)(?:\.(\d*))?$")
    sign = pl.when(parts.struct.field("1") == "-").then(-1).otherwise(1)
    whole = parts.struct.field("2").replace("", "0").cast(pl.Int64, strict=False)
    frac4 = (
        (parts.struct.field("3").fill_null("") + "0000")
        .str.slice(0, 4)
        .cast(pl.Int64, strict=False)
    )
    exact = sign * (whole * 1000 + (frac4 + 5) // 10)
    # Scientific notation never appears in torch_npu timestamps; keep it usable for durations.
    scientific = (s.cast(pl.Float64, strict=False) * 1000).round(0).cast(pl.Int64, strict=False)
    return pl.when(parts.struct.field("2").is_not_null()).then(exact).otherwise(scientific)


def duckdb_us_to_ns(col: str) -> str:
    """SQL expression converting a VARCHAR µs column to exact BIGINT ns in DuckDB.

    Fast path for torch_npu's own shape (exactly 3 decimals): drop the dot and cast. Anything
    else (no decimals, more digits, quotes, tabs) takes the general digit arithmetic.
    """
    c = f"trim({col}, '\t \"')"
    sign = f"(CASE WHEN starts_with({c}, '-') THEN -1 ELSE 1 END)"
    whole = f"abs(TRY_CAST(coalesce(nullif(split_part({c}, '.', 1), ''), '0') AS HUGEINT))"
    frac4 = f"TRY_CAST(rpad(left(split_part({c}, '.', 2), 4), 4, '0') AS HUGEINT)"
    general = f"CAST({sign} * ({whole} * 1000 + ({frac4} + 5) // 10) AS BIGINT)"
    # A CASE, not coalesce(fast, general): DuckDB evaluates a CASE branch only for the rows that
    # take it, and every coalesce argument for all rows (3x slower on a 200 MB trace).
    return (
        f"(CASE WHEN {col} LIKE '%_.___' THEN TRY_CAST(replace({col}, '.', '') AS BIGINT) "
        f"ELSE {general} END)"
    )


# A duration written as a float µs (``dur`` in trace_view.json, Db and analysis.db columns in
# µs) is exact to the ns through float64 below ~100 days; an epoch timestamp is not (it takes
# the digit paths above).


def float_us_to_ns(expr: pl.Expr) -> pl.Expr:
    """A float µs duration column as int64 ns, rounded to the nearest ns."""
    return (expr * 1000).round(0).cast(pl.Int64)


def float_ms_to_ns(expr: pl.Expr) -> pl.Expr:
    """A float ms duration column as int64 ns, rounded to the nearest ns."""
    return (expr * 1_000_000).round(0).cast(pl.Int64)


def duckdb_float_us_to_ns(expr: str) -> str:
    """:func:`float_us_to_ns` as a DuckDB expression over the DOUBLE ``expr``."""
    return f"CAST(round({expr} * 1000) AS BIGINT)"
