"""One process at a time on a data folder: an OS file lock held while the store is open.

SQLite itself would let a second process in, but the vector index lives in that process's memory:
it would not see the first one's vectors, and a forget in one would leave the other's index files
holding the forgotten vectors. The lock (``flock``) goes with the process, so a crash or a
``kill -9`` never leaves a stale lock behind; the pid written in the file only names the holder in
the error a second process gets.

The file says it is narrmem's (``narrmem lock, process 1234``), so that a file of the user's at
that name is never taken over. One of a bare process id, as narrmem wrote before 2026-12-06, is
taken only beside the database it locked; an empty one holds nothing to lose (a process stopped
between making it and writing it).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from narrmem.errors import StoreError

SIGNATURE = "narrmem lock, process "


class FolderLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, folder: Path) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise StoreError(
                f"the data folder {folder} is in use by {who}: one process opens a data folder at a "
                "time (close the other one, or give this process its own folder)"
            ) from None
        if not _ours(fd, database=self.path.with_suffix("")):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise StoreError(
                f"{self.path} exists and is not a narrmem lock file: narrmem does not "
                "overwrite a file it did not create; move it away or choose another database name"
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"{SIGNATURE}{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # The file stays: removing it would let a third process lock a new file while a second
        # still waits on the old one.
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def _ours(fd: int, *, database: Path) -> bool:
    """Empty, or as narrmem writes it: its signature and a process id, or (before the signature)
    a bare process id beside the database it locked."""
    try:
        head = os.pread(fd, 65, 0)
    except OSError:
        return False
    if not head:
        return True
    if len(head) > 64:
        return False
    text = head.decode("ascii", "replace").strip()
    if text.startswith(SIGNATURE):
        return text[len(SIGNATURE) :].isdigit()
    return text.isdigit() and database.is_file()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    text = text.removeprefix(SIGNATURE)
    return int(text) if text.isdigit() else None
