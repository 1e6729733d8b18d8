"""A run output's documents read back, checked before anything acts on them: ``findings.json``
and ``ingest.json``.

An output folder may be one someone sent: what it holds is data. Each document is read only
from a regular file (a FIFO is refused at once, never waited on) within a size cap, as UTF-8,
as JSON without ``NaN`` or ``Infinity`` (which JSON has not), and every field a reader uses is
checked for its type; a session id must be a name discovery could have made, never a path.
A document that does not fit is refused with the reason (:class:`DamagedDocument`):
``OUT/findings.json: damaged: findings[0].fingerprint: missing``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from traceanalyzer import json_shape
from traceanalyzer.discover import is_session_id
from traceanalyzer.overview.model import overview_problems

__all__ = [
    "FINDINGS_DOCUMENT",
    "INGEST_DOCUMENT",
    "DamagedDocument",
    "read_findings",
    "read_ingest",
]

DOCUMENT_MAX_BYTES = 1 << 30
_RANK = json_shape.integer(-1, (1 << 31) - 1)
_RANKS = json_shape.list_of(_RANK)
_TEXTS = json_shape.list_of(json_shape.string)


# A session id names a folder annotate writes: a name, never a path (a crafted "../../x")
_session_id = json_shape.name_of(is_session_id, "a session id (a name, never a path)")
_FINDING = json_shape.Obj(
    {
        "fingerprint": json_shape.string,
        "rule": json_shape.string,
        "name": json_shape.string,
        "severity": json_shape.one_of("info", "warning", "error"),
        "ranks": _RANKS,
        "ranks_label": json_shape.string,
        "title": json_shape.string,
        "metrics": json_shape.Obj(),
        "sessions": json_shape.list_of(_session_id),
        "phases": _TEXTS,
    },
    required=("fingerprint", "rule", "name"),
)
_KEY_FIGURE = json_shape.Obj(
    {
        "name": json_shape.string,
        "figure": json_shape.string,
        "label": json_shape.string,
        "better": json_shape.one_of("lower", "higher"),
        "unit": json_shape.string,
        "values": json_shape.Items(
            json_shape.Obj({"rank": _RANK, "value": json_shape.number}, required=("rank",))
        ),
    },
    required=("name", "figure", "label"),
)
FINDINGS_DOCUMENT = json_shape.Obj(
    {
        "findings": json_shape.Items(_FINDING),
        "key_figures": json_shape.Items(_KEY_FIGURE),
        # its fields are checked against their declaration (overview.model.overview_problems)
        "summary": json_shape.Obj({"ranks": _RANKS, "overview": json_shape.Obj()}),
        "rules": json_shape.Items(
            json_shape.Obj({"rule": json_shape.string, "params": json_shape.Obj()})
        ),
    }
)
"""What the reports and ``diff`` read of a findings.json, and the type each field must have."""

INGEST_DOCUMENT = json_shape.Obj(
    {
        "sessions": json_shape.Items(
            json_shape.Obj(
                {
                    "rank": _RANK,
                    "session": _session_id,
                    "path": json_shape.string,
                    "status": json_shape.string,
                    "missing_files": _TEXTS,
                    "not_collected": _TEXTS,
                    "incomplete_files": _TEXTS,
                    "warnings": _TEXTS,
                    "error": json_shape.string,
                    "seconds": json_shape.number,
                    "generation": json_shape.string,
                    "profiler_level": json_shape.string,
                },
                required=("rank", "session"),
            )
        ),
        "problems": json_shape.Items(
            json_shape.Obj(
                {
                    "severity": json_shape.string,
                    "path": json_shape.string,
                    "message": json_shape.string,
                }
            )
        ),
        "notes": _TEXTS,
    }
)
"""What the reports read of an ingest.json (the run summary), and the type each field must have."""


class DamagedDocument(ValueError):
    """A document of a run output that cannot be used: says which file and why."""


def read_document(
    path: Path, shape: json_shape.Obj, check: Callable[[Any], list[str]] | None = None
) -> dict[str, Any]:
    """``path`` decoded and checked against ``shape`` (see the module doc), and then by
    ``check`` (the problems of a part declared elsewhere)."""
    try:
        text = json_shape.read_regular_file(path, DOCUMENT_MAX_BYTES).decode("utf-8")
        doc = json_shape.loads(text, constants=False)
    except UnicodeDecodeError as exc:
        raise DamagedDocument(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json_shape.InputFileError as exc:
        raise DamagedDocument(f"{path}: {exc}") from None
    _, problems = json_shape.conform(doc, shape)
    if not problems and check is not None:
        problems = check(doc)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DamagedDocument(f"{path}: damaged: {problems[0]}{more}")
    return doc


def _overview_problems(doc: dict[str, Any]) -> list[str]:
    overview = (doc.get("summary") or {}).get("overview")
    return [] if overview is None else overview_problems(overview)


def read_findings(out: Path) -> dict[str, Any]:
    """``OUT/findings.json``, checked (its overview against :mod:`traceanalyzer.overview.model`);
    :class:`DamagedDocument` says why it cannot be used."""
    return read_document(out / "findings.json", FINDINGS_DOCUMENT, _overview_problems)


def read_ingest(out: Path) -> dict[str, Any] | None:
    """``OUT/ingest.json``, checked (None when there is none: an older run, or a store
    written by the API alone)."""
    path = out / "ingest.json"
    if not path.exists() and not path.is_symlink():
        return None
    return read_document(path, INGEST_DOCUMENT)
