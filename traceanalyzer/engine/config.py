"""Per-run rule settings: ``--set RULE.PARAM=VALUE`` and the config file.

Config file, searched in the working directory when not given (first match wins):

- ``traceanalyzer.toml``::

      [rules.slow-sync]
      min_ms = 5.0

      [rules.other-rule]
      enabled = false          # skip this rule

- ``pyproject.toml`` with the same tables under ``[tool.traceanalyzer.rules.<rule>]``.

Parameter sets that are no rule have a top-level table of their own (``[steps]``: how engine
iterations and phases are found, ``traceanalyzer.derived.parameters``; ``[memory]``: the device's
capacity, ``traceanalyzer.memory``), and ``--set steps.NAME=...``, ``--set memory.NAME=...``.

Extra rule folders, loaded after the built-in rules as if given with ``--rules``, are listed at
the top level (``rule_dirs = ["myrules"]``, or under ``[tool.traceanalyzer]``), relative to the
config file's folder. A config file inside the analysed input (found there because the run
started inside it, or named with ``--config``) is the input's, not the user's: it may set rule
parameters, never load code; its ``rule_dirs`` are not loaded (:class:`AppliedConfig`).

``<rule>`` is a rule id or name. Precedence: parameter defaults < config file < ``--set``.
Unknown rules and parameters are errors (a typo must not silently run with the default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from traceanalyzer.engine.loader import LoadedRules, load_rules
from traceanalyzer.engine.params import Param, ParamError, Params
from traceanalyzer.engine.registry import RuleSet, UnknownRuleError
from traceanalyzer.engine.rule import Rule
from traceanalyzer.hints import did_you_mean

CONFIG_FILE = "traceanalyzer.toml"
# Where `rules new` writes by default; `run` and the other `rules` commands read it when it
# exists and no --rules is given. Never `rules/`: at the root of a checkout that is the
# built-in rules' own folder.
DEFAULT_RULES_DIR = Path("traceanalyzer-rules")
ENABLED_KEY = "enabled"
_ENABLED = Param(True, "Evaluate this rule.")  # what the enabled setting is coerced by


class ConfigError(ValueError):
    """A setting names an unknown rule or parameter, or has a bad value; says which and where."""


@dataclass
class RuleSettings:
    """Raw settings per rule key (id or name) as read; resolved against rules by :func:`resolve`."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # rule key -> where it came from

    def merge(self, other: RuleSettings) -> RuleSettings:
        merged = {k: dict(v) for k, v in self.values.items()}
        for key, params in other.values.items():
            merged.setdefault(key, {}).update(params)
        return RuleSettings(merged, {**self.origin, **other.origin})


def parse_set_options(options: Iterable[str]) -> RuleSettings:
    """``["TA100.min_ms=2", "slow-sync.api_pattern=^aclrtMemcpy"]`` -> settings."""
    settings = RuleSettings()
    for option in options:
        target, sep, value = option.partition("=")
        rule_key, dot, param = target.strip().rpartition(".")
        if not sep or not dot or not rule_key or not param:
            raise ConfigError(f"--set {option!r}: expected RULE.PARAM=VALUE")
        settings.values.setdefault(rule_key, {})[param] = value.strip()
        settings.origin[rule_key] = "--set"
    return settings


def split_namespace(options: Iterable[str], namespace: str) -> tuple[dict[str, str], list[str]]:
    """The ``--set NAMESPACE.NAME=VALUE`` options of a parameter set that is no rule (the steps
    derivation's, ``steps.idle_gap_ms=2``) as {NAME: VALUE}, and the other options."""
    mine: dict[str, str] = {}
    rest: list[str] = []
    for option in options:
        target, sep, value = option.partition("=")
        key, dot, name = target.strip().partition(".")
        if sep and dot and key == namespace and name:
            mine[name] = value.strip()
        else:
            rest.append(option)
    return mine, rest


def namespace_params(
    namespace: str,
    specs: Mapping[str, Param],
    values: Mapping[str, Any] | None,
    error: type[ConfigError] = ConfigError,
) -> Params:
    """A parameter set that is no rule's (``steps``, ``memory``): the defaults of ``specs``
    overlaid with ``values`` (``--set NAMESPACE.NAME=...``, the config file's ``[NAMESPACE]``),
    each coerced to its declared type; an unknown name or a bad value raises ``error``."""
    resolved = {name: spec.default for name, spec in specs.items()}
    for name, raw in (values or {}).items():
        spec = specs.get(name)
        if spec is None:
            raise error(
                f"{namespace} has no parameter {name!r}" + (did_you_mean(name, specs) or "")
            )
        try:
            resolved[name] = spec.coerce(raw)
        except ParamError as exc:
            raise error(f"{namespace}.{name}: {exc}") from None
    return Params(resolved)


def config_table(config_path: str | Path | None | bool, name: str) -> dict[str, Any]:
    """The top-level ``[name]`` table of the run's config file ({} without one)."""
    path = config_path_for(config_path)
    if path is None:
        return {}
    table = _config_doc(path).get(name, {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{path}: [{name}] must be a table")
    return dict(table)


def find_config(start: Path | None = None) -> Path | None:
    """``traceanalyzer.toml``, else a ``pyproject.toml`` with ``[tool.traceanalyzer]``, in ``start``."""
    folder = start or Path.cwd()
    candidate = folder / CONFIG_FILE
    if candidate.is_file():
        return candidate
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            doc = tomllib.loads(pyproject.read_text("utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            return None
        if "traceanalyzer" in doc.get("tool", {}):
            return pyproject
    return None


def _config_doc(path: Path) -> dict[str, Any]:
    try:
        doc = tomllib.loads(Path(path).read_text("utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({exc})") from exc
    if Path(path).name == "pyproject.toml":
        doc = doc.get("tool", {}).get("traceanalyzer", {})
    return doc


def config_path_for(config_path: str | Path | None | bool) -> Path | None:
    """The config file a run uses: the given one, None for ``False``, else :func:`find_config`."""
    if config_path is False:
        return None
    if config_path is None or config_path is True:
        return find_config()
    return Path(config_path)


@dataclass(frozen=True)
class AppliedConfig:
    """The config file a run applies; ``inside`` is the input it lies in, when it does: then it
    only sets parameters (rule code is loaded from ``--rules`` or a config outside the input)."""

    path: Path
    inside: Path | None = None

    def rule_dirs(self) -> list[Path]:
        """Its ``rule_dirs``, resolved against its folder (none for a config of the input)."""
        dirs = _config_doc(self.path).get("rule_dirs", [])
        if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
            raise ConfigError(f"{self.path}: rule_dirs must be a list of folder paths")
        return [] if self.inside is not None else [self.path.parent / d for d in dirs]

    def describe(self) -> str:
        """What the run says of it: ``config: PATH`` and, inside the input, what it may not do."""
        if self.inside is None:
            return f"config: {self.path}"
        ignored = (
            "; its rule_dirs are not loaded" if _config_doc(self.path).get("rule_dirs") else ""
        )
        return (
            f"config: {self.path} (inside the input {self.inside}: rule settings only{ignored}; "
            "rule code loads from --rules DIR or a config outside the input)"
        )


def applied_config(
    config_path: str | Path | None | bool, inputs: Iterable[str | Path] = ()
) -> AppliedConfig | None:
    """The config file a run over ``inputs`` applies (:func:`config_path_for`), None without."""
    path = config_path_for(config_path)
    if path is None:
        return None
    # where it is found and where it leads (a link in the input to a file elsewhere is still
    # found in the input, and its rule_dirs would be read relative to it)
    places = (Path(os.path.abspath(path)), path.resolve())
    for root in inputs:
        containers = (Path(os.path.abspath(root)), Path(root).resolve())
        if any(c == p or c in p.parents for c in containers for p in places):
            return AppliedConfig(path, Path(root))
    return AppliedConfig(path)


def configured_rule_dirs(
    config_path: str | Path | None | bool, inputs: Iterable[str | Path] = ()
) -> list[Path]:
    """``rule_dirs`` of the run's config file, resolved against the file's folder; none from a
    config file inside one of ``inputs``."""
    config = applied_config(config_path, inputs)
    return config.rule_dirs() if config is not None else []


def default_rule_dirs(
    rule_dirs: tuple[Path, ...], inputs: Iterable[str | Path] = ()
) -> tuple[tuple[Path, ...], str | None]:
    """``rule_dirs``, or ``./traceanalyzer-rules`` when none is given and it exists, and what
    to say about that folder (None: nothing to say). A folder inside one of ``inputs`` (the
    data being analysed) is never loaded: it came with the data."""
    if rule_dirs or not DEFAULT_RULES_DIR.is_dir():
        return rule_dirs, None
    folder = DEFAULT_RULES_DIR.resolve()
    if any(folder.is_relative_to(Path(root).resolve()) for root in inputs):
        return rule_dirs, (
            f"rules: ./{DEFAULT_RULES_DIR} is inside the analysed folder: it came with the data "
            f"and is not loaded (--rules {DEFAULT_RULES_DIR} loads it)"
        )
    return (DEFAULT_RULES_DIR,), (
        f"rules: built-in and ./{DEFAULT_RULES_DIR} (the default folder of your rules, which "
        "`rules list` and `rules test` read too; --rules DIR for another)"
    )


def load_run_rules(
    rule_dirs: Iterable[str | Path] = (),
    config_path: str | Path | None | bool = None,
    inputs: Iterable[str | Path] = (),
) -> LoadedRules:
    """A run's rules, loaded once: built-in, ``rule_dirs`` (``--rules``), the config file's
    ``rule_dirs`` (unless it is inside one of ``inputs``), then installed rule packs."""
    return load_rules([*rule_dirs, *configured_rule_dirs(config_path, inputs)])


def load_config(path: Path) -> RuleSettings:
    """Read rule settings from ``traceanalyzer.toml`` or ``pyproject.toml``."""
    doc = _config_doc(path)
    tables = doc.get("rules", {})
    if not isinstance(tables, Mapping):
        raise ConfigError(f"{path}: [rules] must be a table of per-rule tables")
    settings = RuleSettings()
    for rule_key, params in tables.items():
        if not isinstance(params, Mapping):
            raise ConfigError(f"{path}: [rules.{rule_key}] must be a table")
        settings.values[rule_key] = dict(params)
        settings.origin[rule_key] = str(path)
    return settings


def run_settings(
    overrides: Mapping[str, Mapping[str, Any]] | Iterable[str],
    config_path: str | Path | None | Literal[False],
) -> RuleSettings:
    """A run's settings: the config file's, overlaid with ``overrides`` (``--set`` strings, or
    ``{rule: {param: value}}``)."""
    path = config_path_for(config_path)
    from_file = load_config(path) if path else RuleSettings()
    if isinstance(overrides, Mapping):
        cli = RuleSettings(
            {k: dict(v) for k, v in overrides.items()}, dict.fromkeys(overrides, "--set")
        )
    else:
        cli = parse_set_options(overrides)
    return from_file.merge(cli)


@dataclass
class ResolvedSettings:
    params: dict[str, dict[str, Any]]  # rule id -> full parameter values
    disabled: set[str]  # rule ids switched off with enabled = false


def resolve(rules: RuleSet, settings: RuleSettings) -> ResolvedSettings:
    """Typed parameter values for every rule: defaults overlaid with ``settings``."""
    params = {r.id: {name: p.default for name, p in r.params.items()} for r in rules}
    disabled: set[str] = set()
    for rule_key, values in settings.values.items():
        where = settings.origin.get(rule_key, "settings")
        try:
            rule = rules.get(rule_key)
        except UnknownRuleError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        for name, raw in values.items():
            if name == ENABLED_KEY:
                try:
                    enabled = _ENABLED.coerce(raw)
                except ParamError as exc:
                    raise ConfigError(f"{where}: {rule.name}.enabled: {exc}") from None
                if not enabled:
                    disabled.add(rule.id)
                continue
            params[rule.id][name] = coerce_param(rule, name, raw, where)
    return ResolvedSettings(params, disabled)


def coerce_param(rule: Rule, name: str, raw: Any, where: str = "settings") -> Any:
    spec = rule.params.get(name)
    if spec is None:
        known = ", ".join(rule.params) or "(none)"
        raise ConfigError(
            f"{where}: rule {rule.id} {rule.name} has no parameter {name!r}"
            + (did_you_mean(name, rule.params) or f"; known: {known}")
        )
    try:
        return spec.coerce(raw)
    except ParamError as exc:
        raise ConfigError(f"{where}: {rule.name}.{name}: {exc}") from None
