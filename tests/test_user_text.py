"""User-facing text speaks of the field reports by their content ("the Mooncake KV-pool TTFT
report"), never by the project's internal labels ("seed 002", "issue 2", "field report 000")."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INTERNAL_LABEL = re.compile(r"\bseed 0\d\d\b|\bissue #?\d+|\bfield report 0\d\d\b", re.IGNORECASE)


def user_facing_files() -> list[Path]:
    """Docs, sample notes, rule texts and docs, finding snapshots, CLI help, recipe templates."""
    files = [REPO / "README.md", REPO / "sample_traces" / "README.md"]
    files += sorted((REPO / "docs").rglob("*.md"))
    files += sorted((REPO / "rules").glob("*.py"))
    files += sorted((REPO / "rules" / "fixtures" / "snapshots").rglob("*.txt"))
    package = REPO / "traceanalyzer"
    files += sorted(p for p in package.rglob("*") if p.is_file() and p.suffix in (".py", ".tmpl"))
    return files


def test_no_internal_labels_in_user_facing_text() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in user_facing_files()
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if INTERNAL_LABEL.search(line)
    ]
    assert not found, "name the report by its content:\n" + "\n".join(found)


def test_rules_explain_names_reports_by_content() -> None:
    from click.testing import CliRunner

    from traceanalyzer.cli import main

    for rule in ("capture-memcpy-growth", "store-transfer-stall", "slow-rank"):
        text = CliRunner().invoke(main, ["rules", "explain", rule]).output
        assert not INTERNAL_LABEL.search(text), text
    explained = CliRunner().invoke(main, ["rules", "explain", "store-transfer-stall"]).output
    assert "the Mooncake KV-pool TTFT report" in " ".join(explained.split())


def test_recipes_name_reports_by_content(tmp_path: Path) -> None:
    """`recipe show` and the rendered run.sh say which report a recipe reproduces by content."""
    from click.testing import CliRunner

    from traceanalyzer.cli import main

    for recipe, report in (
        ("graph-capture-repeat", "the aclgraph capture slowdown report"),
        ("mooncake-store-transfer", "the Mooncake KV-pool TTFT report"),
    ):
        shown = CliRunner().invoke(main, ["recipe", "show", recipe]).output
        rendered = CliRunner().invoke(
            main, ["recipe", "render", recipe, "--out", str(tmp_path / recipe)]
        )
        assert rendered.exit_code == 0, rendered.output
        run_sh = (tmp_path / recipe / "run.sh").read_text()
        for text in (shown, run_sh):
            assert not INTERNAL_LABEL.search(text), text
            assert report.lower() in " ".join(text.split()).lower(), text
