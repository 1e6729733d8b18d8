"""µs text -> exact ns: the fast paths (a timestamp's 3 decimals, a short duration through a
double) give what the digit-group rule gives, text by text."""

from __future__ import annotations

import decimal
import random
import re

import polars as pl

from traceanalyzer.timeutil import duckdb_us_to_ns, us_expr_to_ns, us_series_to_ns

_NULL_WORDS = {"", "N/A", "NA", "NAN", "NONE", "NULL", "-"}


def _reference(text: str | None) -> int | None:
    """The rule as documented: junk stripped, null words null, digits past the ns rounded
    half up; an exponent moves the point (exact, rounded alike); anything else null."""
    if text is None:
        return None
    s = text.strip("\t \"'\r\n")
    if s.upper() in _NULL_WORDS:
        return None
    m = re.fullmatch(r"([+-]?)(\d*)(?:\.(\d*))?", s)
    if m is None:
        if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+", s, re.ASCII):
            return None
        value = decimal.Decimal(s) * 1000
        if abs(value) >= 2**63:
            return None
        return int(value.quantize(1, rounding=decimal.ROUND_HALF_UP))
    if not (m[2] + (m[3] or "")).isascii() or not m[2] + (m[3] or ""):
        return None
    frac4 = int(((m[3] or "") + "0000")[:4])
    ns = int(m[2] or "0") * 1000 + (frac4 + 5) // 10
    if int(m[2] or "0") > (2**63 - 1000) // 1000:  # no int64 ns: no time
        return None
    return -ns if m[1] == "-" else ns


def _texts() -> list[str | None]:
    rng = random.Random(5)
    texts: list[str | None] = [
        None, "", "N/A", "nan", "None", "-", "+", ".", "+.", "5.", ".5", "-.5", "-0.0005",
        "1e3", "2.5E1", "abc", "12a", "1.2.3", "١٢.٣٤٥", "'12.345'", '"12.345\t"', " 7 ",
        "1736408883704643.212\t", "8999999999999999.999", "1.2345", "1.23449999", "1.23455",
        "840.07675", "2.30003125", "4028.6750000000175", "0.000", "00012.340", "12345678901234",
        "99999999999.99999", "999999999999.9", "9999999999999999.999", "-9223372036854775.807",
        "99999999999999999999999", "1.736408883704643e15", "1.0005e0", "-1.0005E0", "5e-4",
        "4.9999e-4", "0e300", "1e300", "1e20", "0x1e5", "1_0e3", "+.5e3", "5.e1", "1e", "e5",
    ]  # fmt: skip
    for _ in range(3000):
        whole = str(rng.randint(0, 10 ** rng.randint(1, 15)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 9)))
        sign = rng.choice(["", "", "", "-", "+"])
        texts.append(sign + whole + ("." + frac if frac or rng.random() < 0.1 else ""))
    for _ in range(2000):
        texts.append(
            "".join(rng.choice("0123456789.+-eE \t\"'N/A") for _ in range(rng.randint(0, 8)))
        )
    return texts


def test_fast_paths_give_the_digit_rule() -> None:
    texts = _texts()
    got = us_series_to_ns(pl.Series("t", texts, dtype=pl.String)).to_list()
    wrong = [(t, g, _reference(t)) for t, g in zip(texts, got, strict=True) if g != _reference(t)]
    assert not wrong, wrong[:10]


def test_the_expression_is_the_series_function_in_any_frame() -> None:
    texts = _texts()
    frame = pl.DataFrame({"t": texts}, schema={"t": pl.String})
    eager = frame.select(us_expr_to_ns(pl.col("t")))["t"]
    lazy = frame.lazy().select(us_expr_to_ns(pl.col("t"))).collect()["t"]
    assert eager.to_list() == lazy.to_list() == us_series_to_ns(frame["t"]).to_list()


def test_a_value_beyond_int64_ns_is_null_in_duckdb_as_in_polars() -> None:
    import duckdb

    # (these failed DuckDB's whole read with a conversion error)
    texts = ["9223372036854774.9999", "9999999999999999.9999", "99999999999999999999999", "12.5"]
    got = [duckdb.sql(f"SELECT {duckdb_us_to_ns(repr(t))}").fetchall()[0][0] for t in texts]
    assert got == us_series_to_ns(pl.Series(texts)).to_list()
    assert got == [9223372036854775000, None, None, 12500]


def test_duckdb_converts_every_text_as_polars_does() -> None:
    """One conversion in two languages (and a third, the C scanner's: test_ingest_native.py):
    an exponent among them (DuckDB read 1.7e15 at its dot, as 1 µs)."""
    import duckdb

    texts = _texts()
    con = duckdb.connect()
    con.register("texts", pl.DataFrame({"i": range(len(texts)), "t": texts}).to_arrow())
    got = [
        ns
        for _, ns in con.sql(f"SELECT i, {duckdb_us_to_ns('t')} FROM texts ORDER BY i").fetchall()
    ]
    wrong = [(t, g, _reference(t)) for t, g in zip(texts, got, strict=True) if g != _reference(t)]
    assert not wrong, wrong[:10]
