"""notebooks/*.ipynb: committed without outputs, and executable headless against the samples;
the notebook writes its rule as docs/writing-rules.md does (the kit only, StoreBuilder fixtures,
a rules folder `rules test` accepts) and shows something on a store without captures."""

from __future__ import annotations

import ast
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


def _executed(path: Path, sample: str, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    monkeypatch.setenv("TRACEANALYZER_STORE", str(run_sample(sample)))
    nb = nbformat.read(path, as_version=4)
    # python3 = the ipykernel of the interpreter running the tests (the project venv)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
    return nb


def _images(nb: nbformat.NotebookNode) -> list:
    return [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/svg+xml" in o.get("data", {})
    ]


def _printed(nb: nbformat.NotebookNode) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb = _executed(path, "capture_growth_2rank", monkeypatch)
    assert len(_images(nb)) >= 2, "the steps chart and the finding's plot were not displayed"
    printed = _printed(nb)
    assert "capture(s) over 2.0 ms" in printed  # the prototype fired on the sample
    assert "4 passed, 0 failed (1 rule(s))" in printed  # its folder's fixtures passed


def test_notebook_shows_a_store_without_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eager decode store: no capture, no finding; the steps chart still shows, each empty
    section says so, and the rule's folder still tests green."""
    nb = _executed(REPO / "notebooks" / "explore_store.ipynb", "inference_baseline", monkeypatch)
    assert _images(nb), "nothing drawn for a store without captures"
    printed = _printed(nb)
    assert "0 capture window(s)" in printed
    assert "no finding with a figure on this store" in printed
    assert "4 passed, 0 failed (1 rule(s))" in printed


def test_the_notebooks_rule_follows_the_guide() -> None:
    """The rule and fixture cells are files of a rules folder, as docs/writing-rules.md writes
    them: they import nothing of traceanalyzer but the kit, and fixtures use StoreBuilder."""
    nb = nbformat.read(REPO / "notebooks" / "explore_store.ipynb", as_version=4)
    files = {
        c.source.split("\n", 1)[0].split("/")[-1]: c.source.split("\n", 1)[1]
        for c in nb.cells
        if c.cell_type == "code" and c.source.startswith("%%writefile {rules_dir}/")
    }
    assert set(files) == {"slow_capture.py"}, files  # the rule and its fixtures' file
    sources = [c.source for c in nb.cells if c.source.startswith("%%writefile")]
    assert len(sources) == 2
    for source, surface in zip(
        sources, ("traceanalyzer.kit", "traceanalyzer.kit.testing"), strict=True
    ):
        tree = ast.parse(source.split("\n", 1)[1])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("traceanalyzer"):
                assert node.module == surface, node.module
    assert "StoreBuilder()" in sources[1] and "Store.from_frames" not in "".join(sources)


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
