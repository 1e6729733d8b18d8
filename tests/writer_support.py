"""A folder of a user's (a file, a subfolder, a git-like `.git`), for the tests that every command
that writes or deletes leaves what is not its own alone."""

from __future__ import annotations

from pathlib import Path

USER_FILES = {
    ".git/HEAD": "ref: refs/heads/main\n",
    ".git/objects/ab/cdef": "blob",
    "mydata.txt": "mine",
    "sub/notes.md": "# notes",
}


def plant(folder: Path, files: dict[str, str] = USER_FILES) -> dict[str, tuple[str, int]]:
    """Write ``files`` under ``folder``; returns their state (see :func:`user_state`)."""
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return user_state(folder, files)


def user_state(folder: Path, files: dict[str, str] = USER_FILES) -> dict[str, tuple[str, int]]:
    """Each of ``files`` still there: its text and mtime (what a rewrite changes)."""
    return {
        rel: ((folder / rel).read_text(), (folder / rel).stat().st_mtime_ns)
        for rel in files
        if (folder / rel).is_file()
    }
