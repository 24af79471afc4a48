"""Writes that survive a power loss, not only a killed process.

A rename is atomic for processes, but after a power loss the file system may show a renamed file
without its data (delayed allocation writes the name before the blocks). So a file is flushed to
disk before a step that relies on it (the vector index's manifest naming it), and a folder is
flushed after a rename in it, so the new name itself is on disk.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path


def sync_files(paths: Iterable[Path]) -> None:
    """Flush each file's data to disk. Called once for the files of a save, after all are written,
    so the kernel writes them back together and the first flush waits for most of them."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (the names renamed into it). Windows cannot open a folder for
    this; its file system journals renames itself."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # some file systems refuse a folder's fsync (EINVAL)
            os.fsync(fd)
    finally:
        os.close(fd)


def replace_synced(partial: Path, target: Path) -> None:
    """Make ``partial`` (written and closed) ``target``: its data on disk first, then the rename,
    then the folder's entry."""
    sync_files([partial])
    os.replace(partial, target)
    sync_folder(target.parent)
