"""Trace-derived text made inert for Markdown (report.md, SARIF ``message.markdown``).

Names come from the trace, and a trace can hold anything: a name must never close the code span
a rule put it in, start a heading or a list, make a link (``javascript:``) or an image (a remote
fetch), or inject HTML. :func:`md_inline` keeps the code spans a text has (rules write names in
backticks) and makes everything else literal:

- control characters are removed and line breaks become spaces
  (:func:`~traceanalyzer.printable.printable`: a name cannot start a block of its own, nor
  hold an escape sequence);
- outside code spans, ``\\ [ ]`` are backslash-escaped (no link, image or reference
  definition can form), and so are a ``<`` that would open a tag or an autolink and an ``&``
  that would form an entity; the file stays readable as plain text (no ``&gt;`` in it);
- a backtick run without its closing run is escaped (it cannot pair with a later one);
- a leading block marker (``#``, ``-``, ``+``, ``*``, ``=``, ``|``, ``~``, ``>``, ``1.``) is escaped.

Inside a code span nothing is interpreted (CommonMark), so its text is kept as written; a span
holding what a less careful renderer could take for HTML is written as escaped text instead.
"""

from __future__ import annotations

import re
from typing import Any

from traceanalyzer.printable import printable

_TICKS = re.compile(r"`+")
# what would start a tag or an autolink, or an entity: escaped, the rest stays as written
# (``p<1e-16``, ``670 µs -> 2.47 ms`` and ``CANN >= 9.1.0`` read as they should)
_MARKUP = r"<(?=[A-Za-z/!?])|&(?=#?\w+;)"
_PLAIN = re.compile(r"[\\\[\]]|" + _MARKUP)
_HTML = re.compile(_MARKUP)
_BLOCK_START = re.compile(r"^(\s*(?:\d+(?=[.)]))?)([#+*=|~.)>-])")


def _plain(text: str) -> str:
    return _PLAIN.sub(lambda m: "\\" + m.group(), text)


def md_inline(value: Any, *, line_start: bool = True) -> str:
    """``value`` as one line of inert Markdown, its code spans kept (see the module doc).

    ``line_start=False`` for text that never starts a line (a table cell): no block marker can
    form there, so ``1.5 s`` and ``+2.5 s`` stay as written."""
    text = printable(value if value is not None else "")
    out: list[str] = []
    position = 0
    while (opening := _TICKS.search(text, position)) is not None:
        fence = opening.group()
        closing = next(
            (m for m in _TICKS.finditer(text, opening.end()) if m.group() == fence), None
        )
        out.append(_plain(text[position : opening.start()]))
        if closing is None:  # a lone run is literal text
            out.append("\\`" * len(fence))
            position = opening.end()
        else:
            code = text[opening.end() : closing.start()]
            # a code span shows markup characters as written; a span holding them is written
            # as escaped text instead, so no renderer can take them for HTML
            out.append(_plain(code) if _HTML.search(code) else fence + code + fence)
            position = closing.end()
    out.append(_plain(text[position:]))
    line = "".join(out)
    if not line_start:
        return line
    return _BLOCK_START.sub(lambda m: m.group(1) + "\\" + m.group(2), line, count=1)


def md_lines(text: Any) -> list[str]:
    """Each line of a multi-line text (a finding's message) through :func:`md_inline`; a line
    break inside a code span (a name that holds one) is a space, not a line of its own."""
    lines: list[str] = []
    for line in printable(text or "", lines=True).split("\n"):
        fence = _open_fence(lines[-1]) if lines else None
        if fence is not None and fence in _TICKS.findall(line):
            lines[-1] += " " + line
        else:
            lines.append(line)
    return [md_inline(line) for line in lines]


def _open_fence(line: str) -> str | None:
    """The backtick run of a code span ``line`` opens and does not close, if any."""
    runs = _TICKS.findall(line)
    while runs:
        fence = runs.pop(0)
        if fence not in runs:
            return fence
        runs = runs[runs.index(fence) + 1 :]
    return None
