"""A session advisory lock held for as long as a block runs (``PostgresStore.exclusive``), kept
across a lost connection.

A session lock lives as long as its connection. A server restart, a failover or an idle timeout
ends the connection, and with it the lock, while the worker that took it goes on as its holder
(the settling claim of a worker's unsettled entries is such a lock: :mod:`narrmem.settling`).
When the connection ends, the lock is taken again on a new connection, at once and then after
growing delays until the server answers; if another worker took it meanwhile, that is logged as
an error, since two workers may then run the same job. Releasing a lock whose connection is gone
is not an error: the lock went with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import asyncpg

log = logging.getLogger("narrmem.storage_postgres")

# Seconds between tries to take a lost lock again while the server does not answer.
RETAKE_DELAYS = (0.0, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# What a call on a connection that ended raises.
CONNECTION_ENDED = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError, OSError)


class AdvisoryLock:
    def __init__(self, pool: asyncpg.Pool, key: int, name: str) -> None:
        self.pool = pool
        self.key = key
        self.name = name
        self._conn: Any = None
        self._retaking: asyncio.Task[None] | None = None
        self._released = False
        self.retaken = 0  # how many times the lock was taken again after a lost connection

    async def take(self) -> bool:
        """Whether the lock is now held here (``False``: another session holds it)."""
        conn = await self.pool.acquire()
        try:
            held = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key))
        except BaseException:
            await _release_quietly(self.pool, conn)
            raise
        if not held:
            await self.pool.release(conn)
            return False
        self._conn = conn
        conn.add_termination_listener(self._ended)
        return True

    def _ended(self, conn: Any) -> None:
        if self._released or conn is not self._conn:
            return
        log.warning("the connection holding the lock %r ended; taking the lock again", self.name)
        self._retaking = asyncio.ensure_future(self._take_again())

    async def _take_again(self) -> None:
        lost, self._conn = self._conn, None
        await _release_quietly(self.pool, lost)
        for delay in RETAKE_DELAYS:
            await asyncio.sleep(delay)
            if self._released:
                return
            try:
                held = await self.take()
            except Exception as exc:
                # Another connection of the pool may have ended too, unnoticed until used.
                log.warning("taking the lock %r again failed (%r); trying again", self.name, exc)
                continue
            if held:
                self.retaken += 1
                log.warning("the lock %r is held again", self.name)
            else:
                log.error(
                    "the lock %r was taken by another worker while this one's connection was lost: "
                    "both may run its job",
                    self.name,
                )
            return
        log.error("the lock %r could not be taken again: the server does not answer", self.name)

    async def release(self) -> None:
        self._released = True
        retaking, self._retaking = self._retaking, None
        if retaking is not None and not retaking.done():
            retaking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retaking
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(*CONNECTION_ENDED):
            conn.remove_termination_listener(self._ended)
        try:
            await conn.execute("SELECT pg_advisory_unlock($1)", self.key)
        except CONNECTION_ENDED:
            pass  # the session ended, and its lock with it
        finally:
            await _release_quietly(self.pool, conn)


async def _release_quietly(pool: asyncpg.Pool, conn: Any) -> None:
    with contextlib.suppress(*CONNECTION_ENDED):
        await pool.release(conn)
