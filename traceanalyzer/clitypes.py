"""click parameter types shared by the commands, whose refusals say what would have worked."""

from __future__ import annotations

import os
from typing import Any

import click

from traceanalyzer.hints import path_did_you_mean


class ExistingPath(click.Path):
    """``click.Path(exists=True, ...)`` whose refusal of a missing path offers the closest
    existing one: ``Directory 'rulez' does not exist; did you mean 'rules'?``."""

    def __init__(self, **kwargs: Any):
        super().__init__(exists=True, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            hint = "" if os.path.lexists(value) else path_did_you_mean(value)
            if not hint:
                raise
            raise click.BadParameter(exc.message.rstrip(".") + hint, ctx, param) from None
