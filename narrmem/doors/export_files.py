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
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from narrmem import logs
from narrmem.errors import InputError

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: nothing tells a running export's file
    fcntl = None  # type: ignore[assignment]

log = logs.logger("narrmem")

SUFFIX = ".partial"


# mkstemp's names: the prefix, eight of these characters, the suffix.
RANDOM_PART = re.compile(r"[a-z0-9_]{8}")


def prefix(target: Path) -> str:
    return f".{target.name}."


@contextlib.contextmanager
def partial_file(target: Path) -> Iterator[TextIO]:
    """A new file beside ``target`` (never an existing file's name), held by this process while it
    is written, and renamed over ``target`` once the block ends without an error (while still
    held: a complete file is never taken for one a stopped export left). An error deletes it, and
    so does a ``target`` that is a symbolic link (never replaced by a file).

    Where the system has unnamed files (Linux's ``O_TMPFILE``, on most local file systems), the
    file has no name until it is complete: a process killed while it writes leaves nothing (a
    named file stayed, with the words of people forgotten since, until the next export to the
    same target)."""
    fd = _unnamed_file(target.parent)
    path: Path | None = None  # the file's name while it has one of its own
    if fd is None:
        try:
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=prefix(target), suffix=SUFFIX)
        except OSError as exc:  # a folder this process may not write in, a read-only file system
            raise InputError(f"cannot write in {target.parent}: {exc.strerror or exc}", field="file") from exc
        path = Path(name)
    try:
        # Before a byte is written (a file with the header in it is held from the start), and until
        # it is renamed: a complete file is never taken for one a stopped export left.
        _hold(fd)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            fd = -1  # the file object owns it now
            yield out
            out.flush()
            if target.is_symlink():  # renamed over, the user's link would become this file
                raise InputError(f"{target} is a symbolic link: name the file it points to", field="file")
            if path is None:
                path = _name(out.fileno(), target)
            os.replace(path, target)
            path = None
    except BaseException:
        if fd != -1:
            os.close(fd)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # ours: made above
        raise


def _unnamed_file(folder: Path) -> int | None:
    """A new file in ``folder`` without a name, open for writing; ``None`` where there is none."""
    unnamed = getattr(os, "O_TMPFILE", None)
    if unnamed is None or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        return os.open(folder, unnamed | os.O_WRONLY, 0o600)
    except OSError:
        return None  # a file system without them (or a folder not to write in: said below)


def _name(fd: int, target: Path) -> Path:
    """Give the unnamed file ``fd`` a new name of the partial files' pattern beside ``target``."""
    # linkat() following /proc's link to the open file: os.link calls it only when given a folder.
    folder = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(100):
            name = f"{prefix(target)}{secrets.token_hex(4)}{SUFFIX}"
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=folder, follow_symlinks=True)
            except FileExistsError:
                continue
            return target.parent / name
    finally:
        os.close(folder)
    raise InputError(f"no free name for an export's file in {target.parent}", field="file")


def _hold(fd: int) -> None:
    if fcntl is None:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        # A file system without locks (some network mounts): the export goes on unheld, and no
        # export there deletes another's file (it cannot tell whether that one is held either).
        log.debug("no lock on an export's file: %s", exc)


def delete_stale_partials(target: Path, export_format: str) -> int:
    """Delete what stopped exports to ``target`` left; returns how many files."""
    if fcntl is None:
        return 0
    deleted = 0
    for candidate in target.parent.glob(f"{_glob_escape(prefix(target))}*{SUFFIX}"):
        middle = candidate.name[len(prefix(target)) : -len(SUFFIX)]
        if RANDOM_PART.fullmatch(middle) and _stale(candidate, export_format):
            try:
                candidate.unlink()
                deleted += 1
            except FileNotFoundError:
                pass  # another export deleted it first
            except OSError as exc:
                log.warning("could not delete %s, which a stopped export left: %s", candidate, exc)
    if deleted:
        log.info("deleted %d unfinished export file(s) of %s that a stopped export left", deleted, target)
    return deleted


def _stale(candidate: Path, export_format: str) -> bool:
    """Whether ``candidate`` is an export's file whose process is gone."""
    assert fcntl is not None
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)  # a FIFO does not block
    try:
        fd = os.open(candidate, flags)
    except OSError:
        return False  # gone meanwhile, a link, or not ours to read
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # an export writes it now (or the file system has no locks)
        try:
            first = os.pread(fd, 4096, 0).split(b"\n", 1)[0]
        except OSError:
            return False
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
