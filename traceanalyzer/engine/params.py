"""Rule parameters: a declared default with its meaning, and the values a run resolved.

Thresholds and name patterns are parameters, never literals in a rule's code: ``--set
RULE.PARAM=VALUE`` and ``traceanalyzer.toml`` override them per run, and fixtures per case.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from traceanalyzer.hints import did_you_mean, expected

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ParamError(ValueError):
    """A parameter override names an unknown parameter or has a value of the wrong type."""


@dataclass(frozen=True)
class Param:
    """A tunable value of a rule: its default, what it means, and (optionally) allowed choices.

    The type is the default's type unless given. Overrides from the command line arrive as
    strings and are parsed to that type; overrides from TOML arrive typed and are checked.
    Tuple parameters accept a comma-separated string.
    """

    default: Any
    help: str
    type: type | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def kind(self) -> type:
        return self.type or type(self.default)

    @property
    def is_pattern(self) -> bool:
        """A name pattern: a text parameter whose help says it is a regex (``Regex on ...``)."""
        return self.kind is str and self.help.lower().startswith("regex")

    def coerce(self, value: Any) -> Any:
        """Convert ``value`` (a CLI string or a TOML value) to this parameter's type."""
        kind = self.kind
        try:
            if kind is bool:
                parsed = _parse_bool(value)
            elif kind is tuple or kind is list:
                items = value.split(",") if isinstance(value, str) else list(value)
                parsed = tuple(str(item).strip() for item in items if str(item).strip())
            elif kind is float:
                if isinstance(value, bool):
                    raise ValueError("a boolean is not a number")
                parsed = float(value)
            elif kind is int:
                if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                    raise ValueError("not an integer")
                parsed = int(value)
            else:
                parsed = kind(value)
        except (TypeError, ValueError) as exc:
            raise ParamError(f"expected {expected(self.default, kind)}, got {value!r}") from exc
        if self.is_pattern:
            _check_pattern(parsed)
        if self.choices is not None and parsed not in self.choices:
            raise ParamError(
                f"{parsed!r} is not one of {', '.join(map(str, self.choices))}"
                + did_you_mean(str(parsed), map(str, self.choices))
            )
        return parsed


def _check_pattern(pattern: str) -> None:
    """Refuse a pattern the rules could not match. Patterns are matched by polars' regex
    engine, in time linear in the text (a config file inside a received collection may set
    them: ``patterns.py``); one it does not take (a look-around, an unclosed group, past
    its size limit) is refused here, not left to fail every rule or the steps that use it."""
    import polars as pl

    try:
        pl.select(pl.lit("", pl.String).str.contains(pattern))
    except pl.exceptions.PolarsError as exc:
        reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        reason = reason.split("This error occurred")[0].removeprefix("regex error: ").strip()
        raise ParamError(
            f"{pattern!r} is not a pattern the rules can match ({reason[:200]})"
        ) from None


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true/false")


class Params(Mapping[str, Any]):
    """Resolved parameter values; read as ``ctx.params.min_ratio`` or ``ctx.params["min_ratio"]``."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no parameter {name!r}") from None

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self._values!r})"
