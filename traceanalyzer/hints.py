""" "Did you mean": the closest known spelling of a mistyped name or path, for error messages."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# difflib's ratio above which a spelling counts as close (its own default, as click uses)
_CUTOFF = 0.6


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known spelling closest to ``word``, or None when none is close."""
    matches = difflib.get_close_matches(word, list(known), n=1, cutoff=_CUTOFF)
    return matches[0] if matches else None


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'slow-rank'?"`` for the closest of ``known``, or ``""``."""
    match = closest(word, known)
    return f"; did you mean {match!r}?" if match is not None else ""


def path_did_you_mean(path: str | os.PathLike[str]) -> str:
    """For a path that does not exist: ``"; did you mean 'sample_traces/x'?"`` when replacing
    each missing part by the closest name in the folder above it gives a path that exists;
    else ``""``."""
    fixed = Path()
    for name in Path(path).parts:
        if not (fixed / name).exists():
            try:
                siblings = [entry.name for entry in os.scandir(fixed)]
            except OSError:  # unreadable, or not a folder: nothing to offer
                return ""
            match = closest(name, siblings)
            if match is None:
                return ""
            name = match
        fixed /= name
    return f"; did you mean {str(fixed)!r}?" if str(fixed) != str(Path(path)) else ""


# What a value of each type looks like to someone typing it
_LOOKS_LIKE = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    tuple: "a comma-separated list",
    list: "a comma-separated list",
}


def expected(default: Any, kind: type | None = None) -> str:
    """``"a whole number (default 4)"``: what a setting of ``kind`` (default: the default's
    type) takes, for "expected ..., got ..."."""
    kind = kind or type(default)
    return f"{_LOOKS_LIKE.get(kind, kind.__name__)} (default {_as_typed(default)})"


def _as_typed(value: Any) -> str:
    """A value as one would type it after ``=``: ``true``, ``'a,b'``, ``4``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (tuple, list)):
        return repr(",".join(map(str, value)))
    return repr(value)
