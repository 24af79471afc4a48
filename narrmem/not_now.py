"""Failures of the embedded store that say "not now" rather than "no": the disk that holds the data
folder is full, or the database stayed locked past ``[storage] busy_timeout_ms``. A public call
raises them as :class:`~narrmem.errors.StoreUnavailableError` (503 with ``Retry-After`` over HTTP,
exit code 75 on the command line, a bot's write kept for later), not as SQLite's own error (an
"internal error", 500): the write was rolled back whole, and the same call succeeds once there is
room again."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from narrmem.errors import StoreUnavailableError

_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def not_now(exc: BaseException, data_dir: Path) -> StoreUnavailableError | None:
    """The error to raise for ``exc`` when it is one of those failures; ``None`` otherwise."""
    if isinstance(exc, sqlite3.OperationalError):
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith("SQLITE_FULL"):
            return _full(data_dir)
        if name.startswith("SQLITE_BUSY"):  # (SQLITE_LOCKED is a conflict within one connection: a bug)
            return StoreUnavailableError(
                f"{data_dir}: the database stayed locked past storage.busy_timeout_ms ({exc})"
            )
    if isinstance(exc, OSError) and exc.errno in _FULL:
        return _full(data_dir)
    return None


def _full(data_dir: Path) -> StoreUnavailableError:
    return StoreUnavailableError(
        f"a disk narrmem writes to is full (the data folder {data_dir}, or a plugin's): free some "
        "room and try again (SQLite rolled back the write it stopped)"
    )
