"""Exit codes, the same for every command (README "Exit codes").

``1`` means "a finding at or above ``--fail-on``" (``run``), "new findings" (``diff
--fail-on-new``) or "a fixture failed" (``rules test``); nothing else uses it, so a CI gate can
tell a finding from a mistake in its own invocation.
"""

from __future__ import annotations

import click

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
# the output could not be written during the run (disk full, permissions): never the input's fault
EXIT_OUTPUT = 4


class UsageFailure(click.ClickException):
    """A usage or input error (unknown rule, refused output folder, refused environment): exit 2."""

    exit_code = EXIT_USAGE
