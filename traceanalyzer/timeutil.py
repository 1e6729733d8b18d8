"""Every conversion of a time unit to int64 nanoseconds: one per language (polars, DuckDB SQL;
the native scanner's C mirrors :func:`us_expr_to_ns`).

torch_npu writes epoch timestamps as ``"1736408883704643.212"`` (µs, 3 decimals = ns precision).
An epoch in ns (~1.7e18) needs 61 bits; float64 keeps 53, so a float round trip moves
timestamps by up to ~256 ns. Everything here works on the decimal digits instead.
"""

from __future__ import annotations

import decimal

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
    # On the column at once (elementwise, so any batch of it gives the same values): as one
    # expression, polars evaluated the shared parts (the stripped text, the digit groups) once
    # per use, 3x the work (docs/benchmarks/ingest.md).
    return expr.cast(pl.String).map_batches(
        us_series_to_ns, return_dtype=pl.Int64, is_elementwise=True
    )


# torch_npu's own shape, exactly 3 decimals: the digits without the dot are the ns. At most
# 16 whole digits, the 16th below 9, so that they fit in int64 (a 2262 epoch is 9.2e15 µs).
_THREE_DECIMALS = r"^(?:\d{1,15}|[1-8]\d{15})\.\d{3}$"
# A duration: at most 11 whole digits, its first 4 decimals (all the rounding looks at) exact
# through a double: 15 digits, so times 10^4 the double is within 0.25 of their integer.
_SHORT = r"^\d{1,11}(?:\.\d+)?$"
_SHORT_DIGITS = r"^(\d{1,11}(?:\.\d{1,4})?)"
_NULL_WORDS = ["", "N/A", "NA", "NAN", "NONE", "NULL", "-"]
# The most whole µs whose ns (and any decimals) fit in int64, as the C scanner's bound.
INT64_WHOLE_US = (2**63 - 1000) // 1000

# The times a profile can hold (parse/times.py drops or clears the others, with a note): an
# epoch timestamp from 2000 to 2100, a duration from 0 to 7 days. A time past them is damage
# (a startNs of 1e300, a task that ends before it starts), never a measurement: kept, one such
# time made a 1.7e18 ns span negative and a rule report 62,133,300% of it idle.
EARLIEST_NS = 946_684_800 * 10**9  # 2000-01-01T00:00:00Z
LATEST_NS = 4_102_444_800 * 10**9  # 2100-01-01T00:00:00Z
LONGEST_NS = 7 * 86_400 * 10**9


def us_series_to_ns(values: pl.Series) -> pl.Series:
    """:func:`us_expr_to_ns` of a text series: a timestamp's 3-decimal text by dropping its
    dot, a short duration through a double, the rest (longer decimals, signs, exponents) by
    their digit groups; each way only on the rows that take it (a timestamp column is all
    the first: 2.7x faster than every way on every row)."""
    s = values.str.strip_chars(_JUNK)  # a null word is no digits: it takes the general way
    stamp = s.str.contains(_THREE_DECIMALS)
    out = (
        pl.select(
            pl.when(stamp).then(s.str.replace(".", "", literal=True).cast(pl.Int64, strict=False))
        )
        .to_series()
        .rename(values.name)
    )
    others = (~stamp).fill_null(False)
    if not others.any():
        return out
    rest = s.filter(others)
    # the whole digits and up to 4 decimals, of a short duration
    short = pl.select(
        pl.when(rest.str.contains(_SHORT)).then(rest.str.extract(_SHORT_DIGITS, 1))
    ).to_series()
    tenths = (short.cast(pl.Float64, strict=False) * 10_000).round(0).cast(pl.Int64, strict=False)
    ns = (tenths + 5) // 10  # half up, as the digit groups' rounding
    general = short.is_null()
    if general.any():
        ns = ns.scatter(general.arg_true(), _us_general(rest.filter(general)))
    return out.scatter(others.arg_true(), ns)


# A plain decimal µs text, and one with an exponent (never in torch_npu's output; a damaged or
# hand-made file): the grammar the three conversions accept, and nothing else (no hex, no
# ``1_000``, no nan or inf words, which DuckDB's casts and C's strtod would read).
_PLAIN = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
_EXPONENT = _PLAIN + r"[eE][+-]?[0-9]+"


def _us_general(s: pl.Series) -> pl.Series:
    """Any µs text (stripped) by its sign, whole and decimal digits, null for a null word; a
    text with an exponent by its exact value (the point moved), null for anything else."""
    s = pl.select(
        pl.when(s.str.to_uppercase().is_in(_NULL_WORDS)).then(None).otherwise(s)
    ).to_series()
    parts = s.str.extract_groups(r"^([+-]?)(\d*)(?:\.(\d*))?$").struct.unnest()
    frame = pl.DataFrame({"s": s, "sign": parts[:, 0], "whole": parts[:, 1], "frac": parts[:, 2]})
    sign = pl.when(pl.col("sign") == "-").then(-1).otherwise(1)
    whole = pl.col("whole").replace("", "0").cast(pl.Int64, strict=False)
    frac4 = (pl.col("frac").fill_null("") + "0000").str.slice(0, 4).cast(pl.Int64, strict=False)
    exact = sign * (whole * 1000 + (frac4 + 5) // 10)
    digits = pl.col("whole").is_not_null() & (pl.col("whole") + pl.col("frac").fill_null("") != "")
    fits = whole <= INT64_WHOLE_US  # beyond int64's ns (year 2262): no time, null
    ns = frame.select(pl.when(digits & fits).then(exact)).to_series()
    exponent = s.str.contains(f"^{_EXPONENT}$").fill_null(False)
    if exponent.any():  # (matched by polars' regex engine: linear whatever the text)
        rows = exponent.arg_true()
        ns = ns.scatter(rows, [_exponent_ns(text) for text in s.gather(rows).to_list()])
    return ns


def _exponent_ns(text: str) -> int | None:
    """``1.736408883704643e15`` (µs) as exact ns, rounded half away from zero (as the C scanner
    and DuckDB's DECIMAL cast round); None past int64."""
    context = decimal.Context(prec=60, traps=[decimal.InvalidOperation, decimal.Overflow])
    try:
        ns = context.multiply(decimal.Decimal(text), 1000)
        if abs(ns) > 2**63:  # (before the exponent is spelt out in digits)
            return None
        whole = int(ns.quantize(1, rounding=decimal.ROUND_HALF_UP, context=context))
    except (decimal.InvalidOperation, decimal.Overflow, ValueError):
        return None
    return whole if -(2**63) <= whole < 2**63 else None


def duckdb_us_to_ns(col: str) -> str:
    """SQL expression converting a VARCHAR µs column to exact BIGINT ns in DuckDB, as
    :func:`us_expr_to_ns` and the C scanner convert it.

    Fast path for torch_npu's own shape (exactly 3 decimals): drop the dot and cast. Anything
    else (no decimals, more digits, quotes, tabs) takes the general digit arithmetic; a text
    with an exponent is cast to a DECIMAL, exact too (read at its dot, 1.7e15 was 1 µs: a time
    in 1970).
    """
    junk = _JUNK.replace("'", "''")
    c = f"trim({col}, '{junk}')"
    sign = f"(CASE WHEN starts_with({c}, '-') THEN -1 ELSE 1 END)"
    whole = (
        f"abs(TRY_CAST(coalesce(nullif(ltrim(split_part({c}, '.', 1), '+-'), ''), '0') AS HUGEINT))"
    )
    frac4 = f"TRY_CAST(rpad(left(split_part({c}, '.', 2), 4), 4, '0') AS HUGEINT)"
    # beyond int64's ns: null, as the polars and C conversions (a CAST would fail the file)
    general = (
        f"(CASE WHEN regexp_full_match({c}, '{_PLAIN}') AND {whole} <= {INT64_WHOLE_US} "
        f"THEN CAST({sign} * ({whole} * 1000 + ({frac4} + 5) // 10) AS BIGINT) END)"
    )
    us = f"TRY_CAST({c} AS DECIMAL(38, 3))"
    exponent = (
        f"(CASE WHEN regexp_full_match({c}, '{_EXPONENT}') AND abs({us}) <= {INT64_WHOLE_US} "
        f"THEN CAST({us} * 1000 AS BIGINT) END)"
    )
    # A CASE, not coalesce(fast, general): DuckDB evaluates a CASE branch only for the rows that
    # take it, and every coalesce argument for all rows (3x slower on a 200 MB trace).
    return (
        f"(CASE WHEN regexp_full_match({col}, '[0-9]{{1,18}}\\.[0-9]{{3}}') "
        f"THEN TRY_CAST(replace({col}, '.', '') AS BIGINT) "
        f"WHEN contains({col}, 'e') OR contains({col}, 'E') THEN {exponent} "
        f"ELSE {general} END)"
    )


def duckdb_duration_us_to_ns(col: str) -> str:
    """A trace event's ``dur`` (VARCHAR: a JSON number's text or a string) as BIGINT ns,
    converted as a ``ts`` is: 0 when absent or null, null when it is no number (the derivation
    drops the event, with a note), as the C scanner's ``dur_to_ns``."""
    return f"(CASE WHEN {col} IS NULL THEN 0 ELSE {duckdb_us_to_ns(col)} END)"


# A duration written as a float µs (Db and analysis.db columns in µs) is exact to the ns through
# float64 below ~100 days; an epoch timestamp is not (it takes the digit paths above).


def float_us_to_ns(expr: pl.Expr) -> pl.Expr:
    """A float µs duration column as int64 ns, rounded to the nearest ns (:func:`_float_to_ns`)."""
    return _float_to_ns(expr, 1000)


def float_ms_to_ns(expr: pl.Expr) -> pl.Expr:
    """A float ms duration column as int64 ns, rounded to the nearest ns (:func:`_float_to_ns`)."""
    return _float_to_ns(expr, 1_000_000)


# What a float that is no int64 ns becomes (inf, NaN, 1e300): a time no table keeps, so
# parse/times.py drops or clears it with the other impossible times, and says so (a cast to
# int64 failed the rank).
NO_NS = -(2**63)


def _float_to_ns(expr: pl.Expr, scale: int) -> pl.Expr:
    ns = (expr * scale).round(0)
    fits = ns.abs() < 2.0**63  # (false for NaN)
    return (
        pl.when(fits)
        .then(ns.cast(pl.Int64, strict=False))
        .when(expr.is_not_null())
        .then(pl.lit(NO_NS, pl.Int64))
    )
