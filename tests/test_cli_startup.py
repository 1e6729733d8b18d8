"""`traceanalyzer --help` stays quick: subcommands load on first use, and their listed help is true."""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from traceanalyzer.cli import LAZY_COMMANDS, main


def test_help_imports_no_heavy_library() -> None:
    probe = (
        "import sys; from click.testing import CliRunner; from traceanalyzer.cli import main; "
        "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in ('polars', 'duckdb', 'pyarrow', 'matplotlib', 'pandas') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_listed_help_is_each_command_own_help() -> None:
    ctx = click.Context(main)
    for name, (_, _, listed) in LAZY_COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.get_short_help_str(limit=120) == listed, name


def test_every_subcommand_still_runs() -> None:
    for name in [*LAZY_COMMANDS, "run"]:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_a_subcommand_that_cannot_load_says_why(monkeypatch) -> None:  # noqa: ANN001
    listed = LAZY_COMMANDS["diff"]
    monkeypatch.setitem(LAZY_COMMANDS, "diff", ("traceanalyzer.no_such_module", "x", listed[2]))
    monkeypatch.delitem(main.commands, "diff", raising=False)
    result = CliRunner().invoke(main, ["diff", "run-a", "run-b", "--format", "md"])
    assert result.exit_code == 2
    assert "'diff' is unavailable" in result.output
    assert "No module named 'traceanalyzer.no_such_module'" in result.output


def test_progress_ticks_on_a_tty_while_a_rank_parses(capsys) -> None:  # noqa: ANN001
    import time

    from traceanalyzer.cli import _Progress
    from traceanalyzer.ingest import SessionOutcome

    progress = _Progress(quiet=False)
    progress.tty, progress.TICK_SECONDS = True, 0.01
    progress("start", 0, 2, None)
    time.sleep(0.1)
    assert "[0/2] parsing … 0 s" in capsys.readouterr().err
    progress("session", 1, 2, SessionOutcome(0, "s", "p", "ingested", seconds=1.5))
    progress("done", 2, 2, None)
    assert "[1/2] rank 0 s: ingested (1.5 s)" in capsys.readouterr().err
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # the ticker stopped
