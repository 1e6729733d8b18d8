"""Name patterns (parameters): matched in linear time, and joined into one.

A pattern parameter can be set by a config file inside a received collection, so it is input:
Python's ``re`` backtracks (``^(a|a)*$`` against a 41-character group name never ends), polars'
Rust regex engine runs in time linear in the text whatever the pattern. Rules match a pattern
on a column with polars (``pl.col(c).str.contains(p.x_pattern)``) and on one text with
:func:`first_match`; never with ``re`` (tests/test_architecture.py holds them to it).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl


def first_match(pattern: str, text: str) -> str | None:
    """The first text ``pattern`` matches in ``text`` (as ``re.search(...).group(0)``), or None."""
    return pl.select(pl.lit(text, pl.String).str.extract(pattern, 0)).item()


def any_of(patterns: Sequence[str]) -> str:
    """One regex that matches where any of ``patterns`` does, each in a group of its own (its
    inline flags stay its own): a column searched once, not once per pattern. None matches
    nothing."""
    return "|".join(f"(?:{p})" for p in patterns) if patterns else r"[^\s\S]"
