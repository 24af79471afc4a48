"""One writer at a time in a process, and a bounded wait for the turn.

The writes of a process take turns (a batch of messages, a forget, an edit's forget): a store
that stalls holds the one writing for up to ``[storage] timeout_s``, and those queued behind it
waited their turns one after the other, each then waiting its own limit; with three workers
taking eight messages a second on a PostgreSQL that stopped answering for 40 s, answers came after
up to 30 s and most callers gave up first. A call now waits for its turn no longer than the limit
either, and then fails with :class:`~narrmem.errors.StoreUnavailableError` (503 over HTTP, to be
tried again), having written nothing. On a store of this process alone (SQLite) the turn has no
limit: a long hold there is work (a forget rewriting the file), not a stall.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from narrmem.errors import StoreUnavailableError


class WriteTurn:
    def __init__(self, limit_s: float | None = None) -> None:
        self.limit_s = limit_s  # None: wait as long as the turns before take
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> None:
        if self.limit_s is None:
            await self._lock.acquire()
            return
        try:
            async with asyncio.timeout(self.limit_s):
                await self._lock.acquire()
        except TimeoutError:
            raise StoreUnavailableError(
                f"no turn to write within {self.limit_s:g} s (storage.timeout_s): the writes before "
                "this one are waiting for the store"
            ) from None

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()
