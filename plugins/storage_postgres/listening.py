"""PostgreSQL's ``LISTEN`` / ``NOTIFY`` between the workers of one store
(:class:`narrmem.store.Broadcasts`).

A notification is delivered to every session listening on its channel when the transaction that
sent it commits, in commit order, and is kept nowhere: nothing of it stays in the database. The
listener holds a session of its own (a pooled one would be handed to other statements). It asks
the server every :data:`PROBE_EVERY` seconds whether the session still answers, since a session
cut off without a word (a failover behind a proxy) would hear nothing and say nothing; a session
that ended or stopped answering is replaced, after growing delays while the server is away, and
the listener is told ``lost``: what was sent meanwhile did not reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import asyncpg
from narrmem_plugins.storage_postgres.reach import KEEPALIVE_SQL, unreachable

from narrmem import logs

log = logs.logger("narrmem.storage_postgres")

# PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more.
NOTIFY_LIMIT = 7999
PROBE_EVERY = 15.0
RECONNECT_DELAYS = (0.5, 1.0, 2.0, 5.0)


class Listener:
    def __init__(
        self,
        dsn: str,
        channel: str,
        heard: Callable[[str], None],
        lost: Callable[[], None],
        *,
        timeout_s: float,
    ) -> None:
        self._dsn = dsn
        self._channel = channel
        self._heard = heard
        self._lost = lost
        self._timeout_s = timeout_s
        self._conn: Any = None
        self._keeper: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # the session ended (its termination was seen)
        self._closed = False

    async def start(self) -> None:
        """Listen from now on (raises what connecting raises: the caller says whether it may
        wait)."""
        await self._connect()
        self._keeper = asyncio.ensure_future(self._keep())

    async def close(self) -> None:
        self._closed = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keeper
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s, command_timeout=self._timeout_s)
        try:
            await conn.execute(KEEPALIVE_SQL)
            await conn.add_listener(self._channel, self._notified)
        except BaseException:
            conn.terminate()
            raise
        self._ended.clear()
        conn.add_termination_listener(self._on_end)
        self._conn = conn

    def _on_end(self, conn: Any) -> None:
        if conn is self._conn:
            self._ended.set()

    def _notified(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        try:
            self._heard(payload)
        except Exception:
            log.exception("a broadcast on %r could not be taken", channel)

    async def _keep(self) -> None:
        """Probe the session; replace it when it ended or does not answer."""
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), PROBE_EVERY)
            if self._closed:
                return
            if not self._ended.is_set():
                try:
                    await self._conn.fetchval("SELECT 1")
                    continue
                except Exception as exc:
                    # Whatever it was, the session is in doubt: a keeper that stopped here left
                    # the worker deaf to the others' events without a word.
                    log.warning(
                        "the session listening on %r failed a probe (%s)", self._channel, type(exc).__name__
                    )
            await self._again()

    async def _again(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
        log.warning("the session listening on %r ended; listening again", self._channel)
        attempt = 0
        while not self._closed:
            try:
                await self._connect()
            except Exception as exc:
                if not unreachable(exc):
                    log.warning("listening on %r again failed (%s)", self._channel, type(exc).__name__)
                await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])
                attempt += 1
                continue
            log.warning("listening on %r again; what was sent meanwhile was missed", self._channel)
            self._lost()
            return
