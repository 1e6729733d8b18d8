"""The rule outcome cache: ``OUT/.cache/rules/rank=R.json`` (``group=LO-HI.json`` for a rank
group, :func:`traceanalyzer.store.rank_shards`), and ``global.json`` for the rules that read
every rank at once.

One file per shard (a shared filesystem prefers few files), holding one entry per rule: the
rule's outcome on that shard (or on all ranks), as plain JSON (never pickle: the output directory may sit on
a shared filesystem, and unpickling a planted file runs its code). An entry's key is a hash of
what the outcome depends on -- the rule's code digest, its effective parameters and the rank's
input fingerprints (every rank's, for a global rule) -- so a warm re-run evaluates only the rules and ranks whose code,
parameters or inputs changed. A file or an entry that does not parse or is not of this format
is ignored with a note on the rule, and the rule is evaluated again. The key is the stages'
(:func:`traceanalyzer.stages.result_key`), over the rank's inputs with the keys of the tables
derived before the rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceanalyzer.engine.findings import Cost, Evidence, Finding, Note, Occurrence
from traceanalyzer.engine.runner import RuleOutcome
from traceanalyzer.outdir import read_own
from traceanalyzer.store import shard_label, shard_words, write_atomic_text

Shard = tuple[int, ...]

CACHE_DIR = Path(".cache") / "rules"
FORMAT = "traceanalyzer.rule-outcomes/1"


def outcome_to_json(outcome: RuleOutcome) -> dict[str, Any]:
    doc = asdict(outcome)
    doc["ranks"] = None if outcome.ranks is None else sorted(outcome.ranks)
    return doc


def outcome_from_json(doc: Mapping[str, Any]) -> RuleOutcome:
    """The outcome an entry holds; raises (KeyError, TypeError, ...) on anything malformed."""
    findings = [
        Finding(
            **{
                **f,
                "evidence": [Evidence(**e) for e in f["evidence"]],
                "occurrences": [
                    Occurrence(**{**o, "cost": _cost(o["cost"])}) for o in f["occurrences"]
                ],
                "cost": _cost(f["cost"]),
            }
        )
        for f in doc["findings"]
    ]
    ranks = doc["ranks"]
    return RuleOutcome(
        rule=str(doc["rule"]),
        ranks=None if ranks is None else frozenset(int(r) for r in ranks),
        status=doc["status"],
        findings=findings,
        notes=[Note(**n) for n in doc["notes"]],
        reason=doc["reason"],
        error=doc["error"],
        traceback=doc["traceback"],
        key_figures=[dict(row) for row in doc["key_figures"]],
    )


def _cost(doc: Mapping[str, Any] | None) -> Cost | None:
    return None if doc is None else Cost(**doc)


def _plain(value: Any) -> Any:
    """JSON for what rules put in metrics and series besides plain values (numpy scalars)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


@dataclass
class RankEntries:
    """The cached entries of one shard as read (rule id -> raw entry), and why a file was not."""

    shard: Shard | None  # None: the global rules' file
    entries: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # the whole file was ignored: unreadable, corrupt, not ours


class OutcomeCache:
    """Read and write cached outcomes under ``root`` (an output directory)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, shard: Shard | None) -> Path:
        """The file of ``shard`` (its ranks; None: the global rules')."""
        name = "global.json" if shard is None else f"{shard_label(shard)}.json"
        return self.root / CACHE_DIR / name

    def load(self, shard: Shard | None) -> RankEntries:
        path = self.path(shard)
        try:
            # a FIFO, a device or a link planted in the output directory is never followed
            # or waited on (outdir.open_own)
            text = read_own(path).decode("utf-8", errors="replace")  # bad bytes: corrupt, below
            doc = json.loads(text)
        except FileNotFoundError:
            return RankEntries(shard)
        except OSError as exc:
            return RankEntries(shard, problem=f"unreadable ({exc.strerror or exc})")
        except (ValueError, RecursionError) as exc:
            return RankEntries(shard, problem=f"corrupt ({type(exc).__name__})")
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return RankEntries(shard, problem="not a traceanalyzer outcome file")
        entries = doc.get("rules")
        if not isinstance(entries, dict):
            return RankEntries(shard, problem="corrupt (no rules)")
        return RankEntries(shard, entries)

    def lookup(self, cached: RankEntries, rule_id: str, key: str) -> RuleOutcome | Note | None:
        """The cached outcome of ``rule_id``; None when there is none for ``key``; a :class:`Note`
        saying why the entry (or the whole file) was ignored."""
        if cached.problem:
            return self._ignored(cached.shard, rule_id, cached.problem)
        entry = cached.entries.get(rule_id)
        if entry is None:
            return None
        try:
            if entry["key"] != key:
                return None  # code, parameters or inputs changed: evaluate again
            outcome = outcome_from_json(entry["outcome"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._ignored(cached.shard, rule_id, f"corrupt ({type(exc).__name__}: {exc})")
        scope = None if cached.shard is None else frozenset(cached.shard)
        if outcome.rule != rule_id or outcome.ranks != scope:
            return self._ignored(cached.shard, rule_id, "written for another rule or rank")
        return outcome

    def save(self, cached: RankEntries, outcomes: Mapping[str, tuple[str, RuleOutcome]]) -> None:
        """Write the rank's file: ``outcomes`` (rule id -> (key, outcome)) over the entries read
        (other rules' entries are kept). Errors are not remembered: next time may pass."""
        entries = {} if cached.problem else dict(cached.entries)
        for rule_id, (key, outcome) in outcomes.items():
            if outcome.status == "error":
                entries.pop(rule_id, None)
            else:
                entries[rule_id] = {"key": key, "outcome": outcome_to_json(outcome)}
        doc = {"format": FORMAT, "rules": entries}
        write_atomic_text(self.path(cached.shard), json.dumps(doc, default=_plain))

    def _ignored(self, shard: Shard | None, rule_id: str, why: str) -> Note:
        where = self.path(shard).relative_to(self.root)
        scope = "all ranks" if shard is None else shard_words(shard)
        text = f"{scope}: cached outcome in {where} ignored, {why}; evaluated again"
        rank = shard[0] if shard is not None and len(shard) == 1 else None
        return Note(rule=rule_id, rank=rank, text=text)
