"""The bot backlog on disk: what waits for the store outlives the process that received it.

Each backlog that has something waiting keeps it in a file of its own in the memory's data folder,
``bot-backlog/<token>.jsonl``: a first line that says the file is narrmem's, then one line per
waiting call (what it is and what it needs: the message, the ids, the person). A file beside it,
``<token>.lock``, is held with an OS lock (``flock``) while its process runs, and goes with the
process however it ends: a file whose lock is free belongs to no running process, and the next
backlog of the folder to be used takes its calls over, in their order, before its own.

The file is written again whenever a waiting call is dropped (a forget took it: its words leave
the file at once) and every :data:`REWRITE_EVERY` calls made; it is deleted, with its lock, once
nothing waits. Written anew means a new file renamed over the old one, so a crash leaves the old
file or the new one, never half of one; one that stops between a call made and the next rewrite
has that call made again at the next start (ingest keeps one copy of a message; an edit or a
forget made twice changes nothing more). Files with another first line, and names this module does
not make, are never read, written or deleted. All file work runs off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from narrmem import logs

log = logs.logger("narrmem.doors.integrations")

FOLDER = "bot-backlog"
HEADER = {"narrmem": "bot backlog", "format": 1}
LOCK_SIGNATURE = b"narrmem bot backlog lock\n"
REWRITE_EVERY = 100  # calls made between two rewrites of a file while its backlog drains
NO_LOCK_FILE = -1
NEW = ".jsonl.new"  # a file being written whole again, renamed over the file once complete


class Spool:
    """This process's file of one backlog (see the module)."""

    def __init__(self, data_dir: Path) -> None:
        self.folder = Path(data_dir) / FOLDER
        self.token = uuid.uuid4().hex
        self.path = self.folder / f"{self.token}.jsonl"
        self._lock_path = self.folder / f"{self.token}.lock"
        self._lock_fd: int | None = None
        self._turn = asyncio.Lock()  # file work in the order it was asked for

    async def append(self, records: list[dict[str, Any]]) -> None:
        """Add waiting calls at the end of the file (made with its lock if there is none yet)."""
        await self._in_turn(self._append, records)

    async def rewrite(self, records: list[dict[str, Any]]) -> None:
        """The file holds ``records`` and nothing else; none: the file and its lock go."""
        await self._in_turn(self._rewrite, records)

    async def release(self) -> None:
        """Let the file go as it is (the memory closed with calls waiting): the next process to
        use a backlog on this folder takes them over."""
        await self._in_turn(self._unlock)

    async def discard(self) -> None:
        """Delete the file as it is (it may hold what a forget took, and cannot be written again)."""
        await self._in_turn(self._rewrite, [])

    async def take_over(self) -> list[dict[str, Any]]:
        """The waiting calls of the files no running process holds, oldest file first; those
        files are deleted once their calls are in this process's own file."""
        taken: list[dict[str, Any]] = await self._in_turn(self._take_over)
        return taken

    async def _in_turn(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` on a worker thread once the file work asked before it has ended. A
        caller cancelled meanwhile does not give the turn back before the thread ends: the next
        work would write the same file beside it."""
        async with self._turn:
            running = asyncio.ensure_future(asyncio.to_thread(work, *args))
            cancelled = False
            while not running.done():
                try:
                    await asyncio.wait([running])
                except asyncio.CancelledError:
                    cancelled = True  # however often: the turn is held until the thread ends
            if cancelled:
                raise asyncio.CancelledError
            return running.result()

    # --- on a worker thread ------------------------------------------------------------------

    def _append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        self._hold()
        fresh = not self.path.exists()
        with open(self.path, "a", encoding="utf-8", opener=_private) as file:
            if fresh:
                file.write(json.dumps(HEADER) + "\n")
            for record in records:
                file.write(_line(record))
            file.flush()
            os.fsync(file.fileno())
        if fresh:
            _sync_folder(self.folder)  # the file's name too, or a power cut loses it whole

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        if not records:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            if self._lock_fd is not None:
                with contextlib.suppress(FileNotFoundError):
                    self._lock_path.unlink()
                self._unlock()
            if self.folder.is_dir():
                _sync_folder(self.folder)  # gone for good: a power cut does not bring it back
            return
        self._hold()
        fresh = self.path.with_name(f"{self.token}{NEW}")
        try:
            with open(fresh, "w", encoding="utf-8", opener=_private) as file:
                file.write(json.dumps(HEADER) + "\n")
                for record in records:
                    file.write(_line(record))
                file.flush()
                os.fsync(file.fileno())
            os.replace(fresh, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                fresh.unlink()  # half written (a full disk): a person's words in no file of use
            raise
        _sync_folder(self.folder)

    def _hold(self) -> None:
        if self._lock_fd is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, LOCK_SIGNATURE)
        except OSError:
            # Taken for a moment by a process looking for stopped files: tried again next time.
            os.close(fd)
            with contextlib.suppress(OSError):
                self._lock_path.unlink()
            raise
        self._lock_fd = fd
        _sync_folder(self.folder)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the flock goes with it
            self._lock_fd = None

    def _take_over(self) -> list[dict[str, Any]]:
        if not self.folder.is_dir():
            return []
        taken: list[dict[str, Any]] = []
        gone: list[Path] = []
        held: list[int] = []
        tokens = {p.name.split(".", 1)[0] for p in self.folder.glob("*.jsonl*")}
        files = [self.folder / f"{t}.jsonl" for t in tokens if _is_token(t) and t != self.token]
        try:
            for path in sorted(files, key=_modified):
                lock = _free_lock(path.with_suffix(".lock"))
                if lock is None:
                    continue  # its process runs (or the lock is not narrmem's): left to it
                if lock != NO_LOCK_FILE:
                    held.append(lock)  # until its calls are in this process's file and it is gone
                half = path.with_name(f"{path.stem}{NEW}")
                if half.exists() and _ours(half):
                    gone.append(half)  # a rewrite its process did not finish
                    if not path.exists() and _read(half) is not None:
                        path = half  # complete, and the only copy left
                if not path.exists():
                    continue
                records = _read(path)
                if records is None:
                    log.warning("%s does not start as narrmem's bot backlog does: left as it is", path)
                    continue
                taken.extend(records)
                if path not in gone:
                    gone.append(path)
            if taken:
                self._append(taken)  # in this process's file before theirs go: a crash keeps one
            for path in gone:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / f"{path.name.split('.', 1)[0]}.lock").unlink()
            if gone:
                _sync_folder(self.folder)
        finally:
            for fd in held:
                os.close(fd)
        return taken


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)  # a person's words: readable by the bot's user alone


def _is_token(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _free_lock(lock: Path) -> int | None:
    """An open descriptor holding ``lock``'s flock when no process holds it (``None`` when one
    does, or the file is not narrmem's); :data:`NO_LOCK_FILE` when there is none, which counts as
    free (a process makes the lock before the file, and deletes the file before the lock)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return NO_LOCK_FILE
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if os.read(fd, len(LOCK_SIGNATURE) + 1) not in (LOCK_SIGNATURE, b""):
        os.close(fd)
        return None  # not ours: nothing of it is touched
    return fd


def _ours(path: Path) -> bool:
    """Whether ``path`` is a file this module wrote (whole or cut short: its first bytes are, or
    begin, the header line)."""
    head = (json.dumps(HEADER) + "\n").encode()
    try:
        with open(path, "rb") as file:
            start = file.read(len(head))
    except OSError:
        return False
    return head.startswith(start)


def _line(record: dict[str, Any]) -> str:
    # ASCII: a line cut short by a stop cannot end inside a character.
    return json.dumps(record, ensure_ascii=True) + "\n"


def _read(path: Path) -> list[dict[str, Any]] | None:
    """A file's waiting calls; ``None`` when its first line is not narrmem's. A line cut short
    (a stop while it was appended) is left out."""
    try:
        lines = path.read_bytes().split(b"\n")
        if json.loads(lines[0]) != HEADER:
            return None
    except (OSError, ValueError, IndexError):
        return None
    records: list[dict[str, Any]] = []
    for line in lines[1:]:
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:  # a JSON error, or bytes that are no UTF-8
            log.warning("a line of %s cut short by a stop while it was written: left out", path)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
