"""A forget in one worker against the writes in flight in the others (``narrmem.store.WorkersFence``).

Two session advisory locks, the same in every worker of the database, on one connection of this
process's own:

* the **units** lock, held shared by a worker while it has a unit under way (an ingest batch from
  just before its write until its after-store hooks have run), and exclusively by a forget, which
  so waits for every other worker's units;
* the **gate** lock, held exclusively by a forget from before it asks for the units lock until it
  ends. A worker passes the gate (takes it shared, then the units lock, then lets the gate go)
  before its first unit; while it holds the units lock, each new unit only checks the gate with a
  try. Once a forget holds or waits for the gate, that try fails: the worker then lets its units
  end, gives the units lock back, and waits at the gate. So a forget is not held off for ever by a
  worker that is never idle, and a unit begun during it is written after it.

The lock is given back as soon as the worker has no unit under way: a worker that held it while
idle would hold every forget back until its next message.

A connection lost while the units lock is held takes the lock with it: the units under way are
unfenced until the next unit, which takes it again on a new connection (logged). Two forgets
from workers whose trigger callbacks forget could wait for each other across workers, so a
forget run from hooks or a callback does not use this fence (``narrmem.fence`` does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from narrmem_plugins.storage_postgres.advisory import CONNECTION_ENDED, lock_key
from narrmem_plugins.storage_postgres.dsn import scrub

from narrmem.errors import StoreError

log = logging.getLogger("narrmem.storage_postgres")

GATE = lock_key("fence:gate")
UNITS = lock_key("fence:units")
# One trip: wait at the gate (a forget holds it), take the units lock shared, let the gate go.
PASS_GATE = (
    f"SELECT pg_advisory_lock_shared({GATE}); SELECT pg_advisory_lock_shared({UNITS}); "
    f"SELECT pg_advisory_unlock_shared({GATE})"
)
# Whether no forget holds or waits for the gate, taking nothing (CASE evaluates in order).
GATE_OPEN = (
    f"SELECT CASE WHEN pg_try_advisory_lock_shared({GATE}) "
    f"THEN pg_advisory_unlock_shared({GATE}) ELSE false END"
)
GIVE_BACK = f"SELECT pg_advisory_unlock_shared({UNITS})"
CLOSE_GATE = f"SELECT pg_advisory_lock({GATE}); SELECT pg_advisory_lock({UNITS})"
OPEN_GATE = f"SELECT pg_advisory_unlock({UNITS}); SELECT pg_advisory_unlock({GATE})"


class PostgresWorkersFence:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._conn: Any = None
        self._lock = asyncio.Lock()  # one command at a time on the connection
        self._units = 0
        self._held = False  # the units lock, shared, by this connection's session
        self._idle = asyncio.Event()  # set whenever the units lock is not held
        self._idle.set()
        self._giving_back: set[asyncio.Task[None]] = set()
        self._closed = False

    async def begin(self) -> None:
        while True:
            async with self._lock:
                conn = await self._connection()
                try:
                    if not self._held:
                        await conn.execute(PASS_GATE)
                        self._hold()
                        self._units += 1
                        return
                    if await conn.fetchval(GATE_OPEN):
                        self._units += 1
                        return
                    if self._units == 0:
                        await self._give_back(conn)
                        continue
                except CONNECTION_ENDED:
                    self._lost()
                    continue
            # A forget of another worker waits for this one's units: they end, the lock goes
            # back, and this unit waits at the gate.
            await self._idle.wait()

    async def join(self) -> None:
        if not self.extend():
            await self.begin()

    def extend(self) -> bool:
        if self._units == 0 or not self._held:
            return False
        self._units += 1
        return True

    def end(self) -> None:
        self._units -= 1
        if self._units == 0 and self._held and not self._closed:
            task = asyncio.ensure_future(self._give_back_if_idle())
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    @contextlib.asynccontextmanager
    async def forgetting(self) -> AsyncIterator[None]:
        # This session's own shared hold does not stand in its way (a session never waits for
        # itself), and this process's units are held back by narrmem.fence first.
        async with self._lock:
            conn = await self._connection()
            try:
                await conn.execute(CLOSE_GATE)
            except CONNECTION_ENDED as exc:
                self._lost()
                raise StoreError(
                    f"the forget lost its connection to PostgreSQL: {scrub(str(exc), self._dsn)}"
                ) from exc
        try:
            yield
        finally:
            async with self._lock:
                if conn is self._conn:
                    try:
                        await conn.execute(OPEN_GATE)
                    except CONNECTION_ENDED:
                        self._lost()  # the locks went with the session

    async def close(self) -> None:
        self._closed = True
        for task in list(self._giving_back):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        async with self._lock:
            conn, self._conn = self._conn, None
            self._held = False
            self._idle.set()
            if conn is not None:
                with contextlib.suppress(*CONNECTION_ENDED):
                    await conn.close()

    # --- the connection and the units lock ---------------------------------------------------

    async def _connection(self) -> Any:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self._conn is not None:
            self._lost()
        try:
            self._conn = await asyncpg.connect(self._dsn)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"cannot connect to PostgreSQL: {scrub(str(exc), self._dsn)}") from exc
        return self._conn

    def _hold(self) -> None:
        self._held = True
        self._idle.clear()

    def _lost(self) -> None:
        if self._held and self._units:
            log.warning(
                "the connection fencing forgets against this worker's writes ended; %d unit(s) under way "
                "are not fenced against other workers' forgets until the next one",
                self._units,
            )
        self._conn = None
        self._held = False
        self._idle.set()

    async def _give_back(self, conn: Any) -> None:
        try:
            await conn.execute(GIVE_BACK)
        except CONNECTION_ENDED:
            self._lost()
            return
        self._held = False
        self._idle.set()

    async def _give_back_if_idle(self) -> None:
        async with self._lock:
            if self._units == 0 and self._held and self._conn is not None:
                await self._give_back(self._conn)
