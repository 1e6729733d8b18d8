"""A set of loaded rules, looked up by id (``TA001``) or name (``capture-memcpy-growth``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from traceanalyzer.engine.rule import Rule
from traceanalyzer.hints import did_you_mean


class UnknownRuleError(KeyError):
    """No loaded rule has this id or name."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateRuleError(ValueError):
    """Two rule files declare the same id or name."""


class RuleSet:
    """Rules in id order. Ids and names are unique; either one finds the rule."""

    def __init__(self, rules: Iterable[Rule] = ()):
        self._by_id: dict[str, Rule] = {}
        self._by_name: dict[str, Rule] = {}
        for rule in rules:
            self.add(rule)

    def add(self, rule: Rule) -> None:
        for key, index in ((rule.id, self._by_id), (rule.name, self._by_name)):
            other = index.get(key)
            if other is not None and other is not rule:
                raise DuplicateRuleError(
                    f"rule {key!r} is defined twice: {other.source} and {rule.source}"
                )
        self._by_id[rule.id] = rule
        self._by_name[rule.name] = rule

    def get(self, key: str) -> Rule:
        rule = self._by_id.get(key) or self._by_name.get(key) or self._by_id.get(key.upper())
        if rule is None:
            hint = did_you_mean(key, self._by_name) or did_you_mean(key.upper(), self._by_id)
            known = ", ".join(f"{r.id} {r.name}" for r in self)
            raise UnknownRuleError(
                f"unknown rule {key!r}" + (hint or f"; known rules: {known or '(none)'}")
            )
        return rule

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in self._by_id or key in self._by_name)

    def __iter__(self) -> Iterator[Rule]:
        return iter(sorted(self._by_id.values(), key=lambda r: r.id))

    def __len__(self) -> int:
        return len(self._by_id)

    def select(self, keys: Iterable[str] | None) -> RuleSet:
        """The rules named by ``keys`` (ids or names); all rules when ``keys`` is None."""
        return self if keys is None else RuleSet(self.get(k) for k in keys)
