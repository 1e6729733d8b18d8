"""Append-only text sections that spill to disk, so writing stays constant-memory.

trace_view.json must be written in torch_npu's order (framework part, then the
msprof part, then the torch_to_npu flows) although a generator produces those
events interleaved in time. Each part goes to its own spool; ``copy_to`` streams
it into the final file.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import IO

_FLUSH_ITEMS = 4096


class Spool:
    """A list of JSON objects joined by ``sep``, buffered in memory and spilled to a temp file."""

    def __init__(self, sep: str = ", ") -> None:
        self._sep = sep
        self._buf: list[str] = []
        self._file: IO[str] | None = None
        self._written = False  # anything already on disk
        self.chars = 0  # characters added so far (for --target-mb)

    def add(self, item: str) -> None:
        self.chars += len(item) + 2
        self._buf.append(item)
        if len(self._buf) >= _FLUSH_ITEMS:
            self._spill()

    def extend(self, items: list[str]) -> None:
        self.chars += sum(map(len, items)) + 2 * len(items)
        self._buf.extend(items)
        if len(self._buf) >= _FLUSH_ITEMS:
            self._spill()

    def _spill(self) -> None:
        if not self._buf:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile("w+", encoding="utf-8", newline="")  # noqa: SIM115 - lives until copy_to
        if self._written:
            self._file.write(self._sep)
        self._file.write(self._sep.join(self._buf))
        self._buf.clear()
        self._written = True

    @property
    def empty(self) -> bool:
        return not self._written and not self._buf

    def copy_to(self, out: IO[str]) -> None:
        """Write the joined items to ``out`` and release the spool."""
        self._spill()
        if self._file is not None:
            self._file.seek(0)
            shutil.copyfileobj(self._file, out, 1 << 20)
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
