"""The per-rank rule outcome cache: ``OUT/.cache/rules/rank=R/<rule id>.json``.

An entry is one rule's outcome on one rank shard, as plain JSON (never pickle: the output
directory may sit on a shared filesystem, and unpickling a planted file runs its code). Its key
is a hash of what the outcome depends on -- the rule's code digest, its effective parameters and
the rank's input fingerprints -- so a warm re-run evaluates only the rules and ranks whose code,
parameters or inputs changed. An entry that does not parse, is for another key, or is not of
this format is ignored with a note on the rule, and the rule is evaluated again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from traceanalyzer.engine.findings import Evidence, Finding, Note
from traceanalyzer.engine.runner import RuleOutcome
from traceanalyzer.store import write_atomic_text

CACHE_DIR = Path(".cache") / "rules"
FORMAT = "traceanalyzer.rule-outcome/1"


def outcome_key(digest: str, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
    """The cache key of one rule on one rank: code digest, effective parameters, inputs."""
    doc = {"code": digest, "params": params, "inputs": inputs}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def outcome_to_json(outcome: RuleOutcome) -> dict[str, Any]:
    doc = asdict(outcome)
    doc["ranks"] = None if outcome.ranks is None else sorted(outcome.ranks)
    return doc


def outcome_from_json(doc: Mapping[str, Any]) -> RuleOutcome:
    """The outcome an entry holds; raises (KeyError, TypeError, ...) on anything malformed."""
    findings = [
        Finding(**{**f, "evidence": [Evidence(**e) for e in f["evidence"]]})
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


def _plain(value: Any) -> Any:
    """JSON for what rules put in metrics and series besides plain values (numpy scalars)."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


class OutcomeCache:
    """Read and write cached outcomes under ``root`` (an output directory)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, rank: int, rule_id: str) -> Path:
        return self.root / CACHE_DIR / f"rank={rank}" / f"{rule_id}.json"

    def read(self, rank: int, rule_id: str, key: str) -> RuleOutcome | Note | None:
        """The cached outcome; None when there is none for this key; a :class:`Note` saying why
        an entry was ignored when it is unreadable or not ours."""
        path = self.path(rank, rule_id)
        try:
            text = path.read_text("utf-8", errors="replace")  # bad bytes: corrupt, below
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._ignored(rank, rule_id, f"unreadable ({exc.strerror or exc})")
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                return self._ignored(rank, rule_id, "not a traceanalyzer outcome")
            if doc.get("key") != key:
                return None  # code, parameters or inputs changed: evaluate again
            outcome = outcome_from_json(doc["outcome"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self._ignored(rank, rule_id, f"corrupt ({type(exc).__name__}: {exc})")
        if outcome.rule != rule_id or outcome.ranks != frozenset({rank}):
            return self._ignored(rank, rule_id, "written for another rule or rank")
        return outcome

    def write(self, rank: int, key: str, outcome: RuleOutcome) -> None:
        if outcome.status == "error":
            return  # a rule that crashed may pass next time: do not remember the failure
        doc = {"format": FORMAT, "key": key, "outcome": outcome_to_json(outcome)}
        write_atomic_text(self.path(rank, outcome.rule), json.dumps(doc, default=_plain))

    def _ignored(self, rank: int, rule_id: str, why: str) -> Note:
        where = self.path(rank, rule_id).relative_to(self.root)
        text = f"rank {rank}: cached outcome {where} ignored, {why}; evaluated again"
        return Note(rule=rule_id, rank=rank, text=text)
