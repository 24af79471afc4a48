"""The file an export is written to before it is complete (``.FILE.<random>.partial`` beside
``FILE``), and what a stopped export left of one.

An export writes under a name of its own and renames it over its target once complete. A process
killed in the middle left that file behind, holding part of the store (people's words among it,
people forgotten since among them). While an export writes, it holds an exclusive lock on its
file (``flock``; the system lets go of it when the process ends, however it ends), and writes the
export's header line first. The next export to the same target deletes the files of that pattern
that begin with that header and that no process holds: the ones a stopped export left. Any other
file, an export still running in another process included, is left be.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: nothing tells a running export's file
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("narrmem")

SUFFIX = ".partial"


def prefix(target: Path) -> str:
    return f".{target.name}."


def new_partial(target: Path) -> tuple[int, Path]:
    """A new file beside ``target`` (never an existing file), held by this process while it is
    open; returns its descriptor and path."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=prefix(target), suffix=SUFFIX)
    if fcntl is not None:
        # Taken before a byte is written: a file with the header in it is held from the start.
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, Path(name)


def delete_stale_partials(target: Path, export_format: str) -> int:
    """Delete what stopped exports to ``target`` left; returns how many files."""
    if fcntl is None:
        return 0
    deleted = 0
    for candidate in target.parent.glob(f"{_glob_escape(prefix(target))}*{SUFFIX}"):
        if _stale(candidate, export_format):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                deleted += 1
    if deleted:
        log.info("deleted %d unfinished export file(s) of %s that a stopped export left", deleted, target)
    return deleted


def _stale(candidate: Path, export_format: str) -> bool:
    """Whether ``candidate`` is an export's file whose process is gone."""
    assert fcntl is not None
    try:
        fd = os.open(candidate, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False  # gone meanwhile, a link, or not ours to read
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # an export writes it now
        with os.fdopen(os.dup(fd), "rb") as fh:
            first = fh.readline(4096)
        try:
            header = json.loads(first)
        except ValueError:
            return False
        return isinstance(header, dict) and header.get("format") == export_format
    finally:
        os.close(fd)


def _glob_escape(text: str) -> str:
    """``text`` with the characters glob reads as patterns taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)
