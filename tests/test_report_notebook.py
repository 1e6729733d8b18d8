"""notebooks/*.ipynb: committed without outputs, and executable headless against the samples."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from report_support import REPO, run_sample

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_is_a_notebook() -> None:
    assert REPO / "notebooks" / "explore_store.ipynb" in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_are_stripped(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("TRACEANALYZER_STORE", str(run_sample("capture_growth_2rank")))
    nb = nbformat.read(path, as_version=4)
    # python3 = the ipykernel of the interpreter running the tests (the project venv)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/svg+xml" in o.get("data", {})
    ]
    assert images, "the finding's plot was not displayed"
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors


def test_notebook_default_sample_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TRACEANALYZER_STORE the notebook ingests ../sample_traces (relative to notebooks/)."""
    from nbclient import NotebookClient

    monkeypatch.delenv("TRACEANALYZER_STORE", raising=False)
    path = REPO / "notebooks" / "explore_store.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[:2]  # the setup cell is what resolves the default path
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    shown = str(nb.cells[1].outputs)
    assert "npu-node0_3104423" in shown  # rank 1 of sample_traces/capture_growth_2rank
