"""Text from an input, made fit to show: no control character reaches a terminal, report.md or a
log line.

A trace, a database or a directory name can hold anything: an escape sequence that clears the
screen or writes a hyperlink (OSC 8), a bell, a carriage return that overwrites the line before
it, a right-to-left override that shows a name backwards. Every string that came from an input
goes through :func:`printable` on its way out: C0 and C1 controls, DEL and the bidirectional
controls are removed, and line breaks become spaces (kept, with ``lines=True``, in a text that is
made of lines, such as a finding's message), and a name's bytes that are not UTF-8 are written
``\\xNN`` (:func:`valid_text`; :func:`path_text` for a path). HTML and SARIF escape text their
own way.
"""

from __future__ import annotations

import os
import re

# Line breaks and tabs: a space, so that words stay apart.
_BREAKS = "\t\n\v\f\r\x85\u2028\u2029"
# Everything else that moves the cursor, changes the terminal's state or reorders text.
_CONTROLS = "\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_REMOVED = re.compile(f"[{_CONTROLS}]")
_SPACED = re.compile(f"[{_BREAKS}]")
_SPACED_BUT_LINES = re.compile(f"[{_BREAKS.replace(chr(10), '')}]")
# Lone surrogates: no terminal, file or Parquet column takes them as UTF-8. Python keeps a
# name's bytes that are not UTF-8 (a folder named 数据 in GBK) as U+DC80-U+DCFF.
_SURROGATES = re.compile("[\ud800-\udfff]")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def valid_text(value: str) -> str:
    """``value`` as valid Unicode: a byte of a name that is not UTF-8 written ``\\xca``, any
    other lone surrogate ``\\ud800``."""
    return _SURROGATES.sub(_escaped, value)


def path_text(path: str | os.PathLike[str]) -> str:
    """A path as text a table, a report or a terminal takes: ``/data/\\xca\\xfd\\xbe\\xdd``
    for a folder named in GBK (the path itself stays as it is, to open it)."""
    return valid_text(os.fspath(path))


def printable(value: object, *, lines: bool = False) -> str:
    """``value`` as text without control characters (see the module doc); ``lines`` keeps its
    line feeds."""
    text = _REMOVED.sub("", valid_text(str(value)))
    return (_SPACED_BUT_LINES if lines else _SPACED).sub(" ", text)
