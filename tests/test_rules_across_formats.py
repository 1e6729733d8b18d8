"""The rules give the same verdicts on the Text and Db copies of every synthetic sample.

Each committed sample of ``sample_traces/`` is a Text export written by ``traceanalyzer synth``
(:data:`traceanalyzer.synth.samples.SAMPLES`); its Db copy is the same scenario, knobs and seed
written with ``export="db"`` (into a temp dir: the samples stay within their size budget).
``run`` on each must give every rule the same status and every rank the same findings (by
fingerprint and severity).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceanalyzer.executor import make_executor
from traceanalyzer.pipeline import analyse
from traceanalyzer.synth.samples import SAMPLES, Sample, default_dest, write

# The whole file takes about 30 s on 2 cores; these two-rank samples take 4-5 s each
# (`-m "not slow"` leaves them out; the single-rank samples cover the same scenarios).
_SLOW = {"capture_growth_2rank", "straggler_2rank", "store_stall_2rank_rank1_sick"}


def _verdicts(out: Path) -> dict[str, object]:
    doc = json.loads((out / "findings.json").read_text("utf-8"))
    return {
        "rules": sorted((r["name"], r["status"]) for r in doc["rules"]),
        "findings": sorted(
            (f["rule"], f["fingerprint"], f["severity"], tuple(f.get("ranks") or ()))
            for f in doc["findings"]
        ),
    }


def _params() -> list[object]:
    return [
        pytest.param(s, id=s.name, marks=[pytest.mark.slow] if s.name in _SLOW else [])
        for s in SAMPLES
    ]


@pytest.mark.parametrize("sample", _params())
def test_the_db_copy_of_a_sample_gets_the_text_copys_verdicts(
    sample: Sample, tmp_path: Path
) -> None:
    text = default_dest() / sample.name
    db = tmp_path / "db"
    write(sample, db, export="db")
    # the same rank directories, holding only the Db
    assert sorted(p.name for p in db.iterdir()) == sorted(
        p.name for p in text.iterdir() if p.is_dir()
    )
    verdicts = []
    with make_executor("local") as executor:
        for name, root in (("text", text), ("db", db)):
            run = analyse(root, tmp_path / f"out-{name}", executor=executor)
            assert {o.source_format for o in run.ingest.outcomes} == {name}
            verdicts.append(_verdicts(tmp_path / f"out-{name}"))
    assert verdicts[1] == verdicts[0]
