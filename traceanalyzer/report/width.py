"""Lines that fit the terminal: its width, tables laid out within it, wrapping with a hanging
indent, and long names shortened in the middle (a kernel's name says most at its start and its
end)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from collections.abc import Collection
from dataclasses import dataclass, field

ELLIPSIS = "…"
# the narrowest text column a wrapped line keeps beside its hanging indent; narrower, the
# continuation lines start further left
MIN_TEXT = 30
# the narrowest a table's free last column (a name) is shortened to before it is left out
MIN_NAME = 16
# a number and its unit, which a wrap keeps on one line
_QUANTITY = re.compile(r"\d (?:ns|µs|us|ms|s|MB|GB|KB|MHz|steps?|ranks?)\b")
_HOLD = "\x00"


def terminal_width() -> int | None:
    """The width to fit: ``COLUMNS`` when set, else the terminal's when stdout is one; None (no
    limit) for a pipe or a file, so that ``grep`` sees whole lines."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def shorten_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and end, an ellipsis between."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def wrap(line: str, width: int | None, indent: int) -> list[str]:
    """``line`` wrapped to ``width`` (unchanged without one), its continuation lines indented
    by ``indent`` (less when that would leave under :data:`MIN_TEXT` columns of text)."""
    if width is None or len(line) <= width:
        return [line]
    indent = indent if width - indent >= MIN_TEXT else min(indent, 4)
    held = _QUANTITY.sub(lambda m: m.group(0).replace(" ", _HOLD), line)  # "12 ms" stays whole
    lines = textwrap.wrap(
        held, width, subsequent_indent=" " * indent, break_long_words=False,
        break_on_hyphens=False,
    )  # fmt: skip
    return [part.replace(_HOLD, " ") for part in lines] or [line]


@dataclass
class Table:
    """A terminal table: ``headers`` (one line, or two when a header's words are stacked),
    ``rows``, the columns right-aligned but those of ``left`` and a free last one
    (a name, left-aligned, unpadded), ``left`` aligned left; and what :func:`fit` left out to
    fit the width."""

    headers: list[str]
    rows: list[list[str]]
    free_last: bool = False
    left: frozenset[str] = frozenset()  # the headers of the left-aligned columns
    stacked: bool = False  # the headers' words on two lines
    blank: list[str] = field(default_factory=list)  # left out: nothing in them on any row
    dropped: list[str] = field(default_factory=list)  # left out for want of room

    def _heads(self) -> list[list[str]]:
        if not self.stacked:
            return [self.headers]
        split = [_stack(h) for h in self.headers]
        tops = [top for top, _ in split]
        return [*([tops] if any(tops) else []), [bottom for _, bottom in split]]

    def _widths(self) -> list[int]:
        fixed = len(self.headers) - (1 if self.free_last else 0)
        lines = [*self._heads(), *self.rows]
        return [max(len(line[i]) for line in lines) for i in range(fixed)]

    def width(self) -> int:
        widths = self._widths()
        free = max((len(line[-1]) for line in [*self._heads(), *self.rows]), default=0)
        used = sum(widths) + 2 * (len(widths) - 1)
        return 2 + used + (2 + free if self.free_last else 0)

    def lines(self) -> list[str]:
        widths = self._widths()
        out = []
        for line in [*self._heads(), *self.rows]:
            fixed = zip(line, widths, self.headers, strict=False)  # a free last has no width
            cells = [c.ljust(w) if h in self.left else c.rjust(w) for c, w, h in fixed]
            tail = "  " + line[-1] if self.free_last else ""
            out.append(("  " + "  ".join(cells) + tail).rstrip())
        return out

    def _without(self, index: int) -> None:
        self.headers.pop(index)
        for row in self.rows:
            row.pop(index)


def _stack(header: str) -> tuple[str, str]:
    """A header on two lines, split at the space that makes the longer line shortest."""
    words = header.split(" ")
    if len(words) == 1:
        return "", header
    cuts = [(" ".join(words[:i]), " ".join(words[i:])) for i in range(1, len(words))]
    return min(cuts, key=lambda cut: max(len(cut[0]), len(cut[1])))


def fit(
    headers: list[str],
    rows: list[list[str]],
    width: int | None,
    *,
    free_last: bool = False,
    keep: int = 3,
    blank: Collection[str] = ("", "0.0%"),
    left: Collection[str] | None = None,
) -> Table:
    """The table within ``width`` (as is without one), giving up least first: columns with
    nothing in them (every cell in ``blank``), then the headers' words stacked on two lines,
    then the free last column shortened in the middle (to :data:`MIN_NAME`) and left out, then
    columns from the right; the first ``keep`` (what a row is) always stay. ``left``: the
    headers of the left-aligned columns (None: the first; the others right-aligned)."""
    aligned = frozenset(headers[:1] if left is None else left)
    table = Table(list(headers), [list(r) for r in rows], free_last, aligned)
    if width is None or not rows or table.width() <= width:
        return table
    last = len(table.headers) - (1 if free_last else 0)
    for i in reversed(range(keep, last)):
        if all(row[i] in blank for row in table.rows):
            table.blank.insert(0, table.headers[i])
            table._without(i)
    table.stacked = table.width() > width
    if table.free_last and table.width() > width:
        widths = table._widths()  # the fixed columns'
        room = width - (2 + sum(widths) + 2 * (len(widths) - 1)) - 2
        if room >= MIN_NAME:
            for row in table.rows:
                row[-1] = shorten_middle(row[-1], room)
        else:
            table.dropped.append(table.headers[-1])
            table._without(-1)
            table.free_last = False
    while len(table.headers) > keep and table.width() > width:
        table.dropped.insert(0, table.headers[-1])
        table._without(-1)
    return table


def left_out(table: Table, width: int | None) -> list[str]:
    """The lines saying what :func:`fit` left out of ``table``, wrapped to ``width``."""
    said = []
    if table.blank:
        said.append(f"{', '.join(table.blank)}: 0 or empty on every row")
    if table.dropped:
        said.append(f"no room for {', '.join(table.dropped)}: report.md has every column")
    return wrap(f"  ({'; '.join(said)})", width, 3) if said else []


def table_lines(
    headers: list[str],
    rows: list[list[str]],
    width: int | None,
    name_width: int | None = None,
    *,
    keep: int = 3,
    blank: Collection[str] = ("", "0.0%"),
    left: Collection[str] | None = None,
) -> list[str]:
    """A terminal table within ``width`` (None: no limit) by :func:`fit` (``keep``, ``blank``,
    ``left`` are its), then the line saying what it left out; ``name_width``: the last column
    is a name, shortened in the middle to it and left free (unpadded)."""
    if name_width:
        rows = [[*row[:-1], shorten_middle(row[-1], name_width)] for row in rows]
    free = bool(name_width)
    table = fit(headers, rows, width, free_last=free, keep=keep, blank=blank, left=left)
    return table.lines() + left_out(table, width)
