"""Arms tests/ingest_faults.py in every Python process started with this folder on PYTHONPATH
(it wraps ``ingest_session`` only once the process imports it)."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

import ingest_faults  # noqa: E402

ingest_faults.install()
