"""Typed recipe parameters: declared once (type, default, help), parsed and validated at render time.

A parameter's *kind* decides how a ``--set key=value`` string is parsed and what "valid" means.
Every error is a :class:`ParamError` whose message names the parameter and what was expected,
so ``recipe render`` can print it as is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from traceanalyzer.hints import closest

__all__ = [
    "Param",
    "ParamError",
    "parse_assignments",
    "resolve_params",
    "parse_host_port",
    "parse_size_gb",
    "check_no_shell",
]


class ParamError(ValueError):
    """A recipe parameter is unknown, malformed or inconsistent with another one."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9-]{1,63})*$"
)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_host_port(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (IPv4, hostname, or ``[v6]:port``); raise ``ValueError`` otherwise."""
    text = text.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)", text)
    if m:
        host, port_s = m.group(1), m.group(2)
    else:
        if text.count(":") != 1:
            raise ValueError(f"expected host:port, got {text!r}")
        host, port_s = text.split(":")
        if not _HOST_RE.match(host):
            raise ValueError(f"bad host {host!r} in {text!r}")
        if re.fullmatch(r"[\d.]+", host):
            octets = host.split(".")
            if len(octets) != 4 or any(not o or int(o) > 255 for o in octets):
                raise ValueError(f"bad IPv4 address {host!r} in {text!r}")
    if not port_s.isdigit() or not 1 <= int(port_s) <= 65535:
        raise ValueError(f"port must be 1-65535, got {port_s!r} in {text!r}")
    return host, int(port_s)


def parse_size_gb(text: str) -> int:
    """Parse a Mooncake size such as ``"10 GB"`` / ``"10GB"`` / ``"10"`` into whole GB.

    Mooncake segments are allocated in whole GB here; ``"1.5 GB"`` or ``"512 MB"`` is refused.
    """
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"expected a size like '10 GB', got {text!r}")
    number, unit = m.group(1), m.group(2).upper()
    if unit not in ("", "G", "GB", "GIB"):
        raise ValueError(f"size must be given in GB (e.g. '10 GB'), got unit {m.group(2)!r}")
    if "." in number and float(number) != int(float(number)):
        raise ValueError(f"size must be a whole number of GB, got {text!r}")
    value = int(float(number))
    if value <= 0:
        raise ValueError(f"size must be at least 1 GB, got {text!r}")
    return value


def check_no_shell(text: str) -> None:
    """Values pasted unquoted into shell defaults: no quotes, spaces, ``$`` or backslashes."""
    if not text or any(c in text for c in "\"'`$\\ \t\n;&|<>(){}"):
        raise ValueError(
            f"must be a plain command or path without spaces or shell characters: {text!r}"
        )


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _parse_int_list(text: str) -> list[int]:
    body = text.strip().strip("[]")
    if not body:
        return []
    return [_parse_int(part) for part in body.split(",")]


def _parse_str_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


_PARSERS: dict[str, Callable[[str], Any]] = {
    "str": lambda s: s,
    "int": _parse_int,
    "bool": _parse_bool,
    "int_list": _parse_int_list,
    "str_list": _parse_str_list,
    "choice": lambda s: s.strip(),
    "host_port": lambda s: s.strip(),
    "size_gb": lambda s: s.strip(),
}


@dataclass(frozen=True)
class Param:
    """One recipe parameter.

    ``kind`` is one of ``str, int, bool, int_list, str_list, choice, host_port, size_gb``.
    ``choices`` restricts ``choice`` values and the items of ``str_list``.
    ``minimum`` bounds ``int`` values and ``int_list`` items.
    ``check`` is an extra validator that raises ``ValueError`` with a readable message.
    """

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    sorted_unique: bool = False
    check: Callable[[Any], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in _PARSERS:
            raise TypeError(f"unknown parameter kind {self.kind!r} for {self.name}")

    @property
    def type_label(self) -> str:
        if self.kind == "choice":
            return "|".join(self.choices)
        if self.kind == "str_list" and self.choices:
            return "list of " + "|".join(self.choices)
        return {
            "int_list": "int list",
            "str_list": "list",
            "host_port": "host:port",
            "size_gb": "size (whole GB)",
        }.get(self.kind, self.kind)

    def format_value(self, value: Any) -> str:
        """Render a value the way ``--set`` accepts it (used by ``recipe show``)."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)

    def parse(self, raw: Any) -> Any:
        """Parse a string (or pass a typed value through) and validate it."""
        try:
            value = _PARSERS[self.kind](raw) if isinstance(raw, str) else raw
            self.validate(value)
        except ValueError as exc:
            raise ParamError(f"parameter {self.name!r}: {exc}") from None
        return value

    def validate(self, value: Any) -> None:
        kind = self.kind
        if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"expected an integer, got {value!r}")
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"expected true/false, got {value!r}")
        if kind == "choice" and value not in self.choices:
            raise ValueError(f"expected one of {', '.join(self.choices)}; got {value!r}")
        if kind == "int" and self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be >= {self.minimum}, got {value}")
        if kind in ("int_list", "str_list"):
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"expected a comma-separated list, got {value!r}")
            if kind == "int_list":
                for item in value:
                    if self.minimum is not None and item < self.minimum:
                        raise ValueError(f"every item must be >= {self.minimum}, got {item}")
            if self.choices:
                bad = [v for v in value if v not in self.choices]
                if bad:
                    raise ValueError(
                        f"unknown item(s) {', '.join(map(str, bad))}; allowed: {', '.join(self.choices)}"
                    )
            if self.sorted_unique and list(value) != sorted(set(value)):
                raise ValueError(
                    f"must be sorted ascending without duplicates, got {','.join(map(str, value))}"
                    f" (did you mean {','.join(map(str, sorted(set(value))))}?)"
                )
        if kind == "host_port":
            parse_host_port(value)
        if kind == "size_gb":
            parse_size_gb(value)
        if self.check is not None:
            self.check(value)


def parse_assignments(assignments: Sequence[str]) -> dict[str, str]:
    """Turn ``["k=v", ...]`` into a dict; a later assignment of the same key wins."""
    out: dict[str, str] = {}
    for item in assignments:
        if "=" not in item:
            raise ParamError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key:
            raise ParamError(f"--set expects key=value, got {item!r}")
        out[key] = value
    return out


def resolve_params(params: Sequence[Param], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Defaults overlaid with ``overrides``; unknown keys are an error listing the known ones."""
    by_name = {p.name: p for p in params}
    unknown = sorted(set(overrides) - set(by_name))
    if unknown:
        hints = []
        for key in unknown:
            close = closest(key, by_name)
            hints.append(f"{key!r}" + (f" (did you mean {close!r}?)" if close else ""))
        raise ParamError(
            f"unknown parameter(s): {', '.join(hints)}. Known: {', '.join(sorted(by_name))}"
        )
    resolved: dict[str, Any] = {}
    for p in params:
        raw = overrides.get(p.name, p.default)
        resolved[p.name] = p.parse(raw)
    return resolved


# Shared by every recipe that profiles: where torch_npu's parse of the raw data runs.
ANALYSE_PARAM = Param(
    "analyse",
    "choice",
    "offline",
    "offline: analyse_flag=False in the workers, parse after the run; inline: parse at profiler stop",
    choices=("offline", "inline"),
)


# Every recipe's environment parameters: which python runs vLLM, and CANN's set_env.sh.
PYTHON_PARAM = Param(
    "python",
    "str",
    "python3",
    "python of the vLLM environment (PYTHON overrides at run time)",
    check=check_no_shell,
)
CANN_SET_ENV_PARAM = Param(
    "cann_set_env",
    "str",
    "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    "sourced by the rendered scripts when it exists",
)
READY_TIMEOUT_PARAM = Param(
    "ready_timeout_s", "int", 1800, "how long run.sh waits for /health", minimum=10
)
