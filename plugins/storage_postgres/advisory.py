"""A session advisory lock held for as long as a block runs (``PostgresStore.exclusive``), kept
across a lost connection.

A session lock lives as long as its connection. A server restart, a failover or an idle timeout
ends the connection, and with it the lock, while the worker that took it goes on as its holder
(the settling claim of a worker's unsettled entries is such a lock: :mod:`narrmem.settling`).
When the connection ends, the lock is taken again on a new connection: at once, then after
growing delays, and every 30 seconds while the server does not answer, until the block ends. A
connection the client saw end may live on in the server for a while (a network cut it: the
server learns of it only from TCP keepalives), holding the lock: that old session of ours is
ended (``pg_terminate_backend``) and the lock taken. Another worker that finds the lock free
meanwhile (one that opens and looks for the jobs of workers that are gone) holds it a moment only,
and takes the job only if it is still free two seconds later (``narrmem.settling``): the tries go
on. One still held by another worker after the first tries is logged as an error, since both may
then run its job. Releasing a lock whose connection is gone is not an error: the lock went with
it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
from typing import Any

import asyncpg

from narrmem import logs

log = logs.logger("narrmem.storage_postgres")

# Seconds before each try to take a lost lock again; the last repeats until the block ends.
RETAKE_DELAYS = (0.0, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
HOLDER = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1"
)
HOLDS_IT = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1 "
    "AND pid = pg_backend_pid())"
)
# Tries that find the lock held by another worker before that is logged as an error: the sixth
# comes 8.7 s after the loss (RETAKE_DELAYS), far longer than another worker's check of whether
# this one is gone holds it (a moment, then again after narrmem.settling.TAKEOVER_GRACE_S).
OTHER_HOLDER_ERROR_AFTER = 6
# How often the connection holding a lock is asked whether it still answers. Nothing else uses it,
# and a failover or a network cut that sends no reset leaves the client unaware that the session,
# and the lock with it, is gone: another worker then took this one's job while it went on.
PROBE_EVERY_S = 15.0
PROBES_UNANSWERED = 2  # in a row, before the connection is taken for lost
# What a call on a connection that ended raises.
CONNECTION_ENDED = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError, OSError)


class AdvisoryLock:
    def __init__(self, pool: asyncpg.Pool, key: int, name: str, *, timeout_s: float | None = None) -> None:
        self.pool = pool
        self.timeout_s = timeout_s  # the wait for a connection
        self.key = key
        self.name = name
        self._conn: Any = None
        self.server_pid: int | None = None  # the server process of the session holding the lock
        self._retaking: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None
        self._stop_probing = asyncio.Event()
        self._released = False
        self.retaken = 0  # how many times the lock was taken again after a lost connection

    async def take(self) -> bool:
        """Whether the lock is now held here (``False``: another session holds it)."""
        conn = await self.pool.acquire(timeout=self.timeout_s)
        try:
            # The server's own pid: behind a connection pooler the client's is the pooler's key.
            held, pid = await conn.fetchrow("SELECT pg_try_advisory_lock($1), pg_backend_pid()", self.key)
        except BaseException:
            await _release_quietly(self.pool, conn)
            raise
        if not held:
            await self.pool.release(conn)
            return False
        self._conn = conn
        self.server_pid = int(pid)
        conn.add_termination_listener(self._ended)
        self._probing = asyncio.ensure_future(self._probe(conn))
        return True

    async def _probe(self, conn: Any) -> None:
        """Ask ``conn`` every :data:`PROBE_EVERY_S` whether it answers and still holds the lock;
        when not, end it here, and the lock is taken again (see :meth:`_ended`)."""
        unanswered = 0
        while conn is self._conn and not self._released:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_probing.wait(), PROBE_EVERY_S)
                return  # released
            try:
                held = await conn.fetchval(HOLDS_IT, *_halves(self.key), timeout=self.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A server slow to answer once is not a lost session: ended then, the lock went
                # with it while the worker was still there, and another could take its job.
                unanswered += 1
                if unanswered < PROBES_UNANSWERED:
                    continue
                held, reason = False, f"{unanswered} probes unanswered, {type(exc).__name__}"
            else:
                unanswered, reason = 0, "its session no longer holds it"
            if not held and conn is self._conn and not self._released:
                log.warning("the connection holding the lock %r is lost (%s); ending it", self.name, reason)
                conn.terminate()  # its termination listener takes the lock again
                return

    def _ended(self, conn: Any) -> None:
        if self._released or conn is not self._conn:
            return
        log.warning("the connection holding the lock %r ended; taking the lock again", self.name)
        self._retaking = asyncio.ensure_future(self._take_again())

    async def _take_again(self) -> None:
        lost, self._conn = self._conn, None
        old_pid = self.server_pid
        others = 0  # tries that found the lock held by another worker
        await _release_quietly(self.pool, lost)
        for attempt in itertools.count():
            await asyncio.sleep(RETAKE_DELAYS[min(attempt, len(RETAKE_DELAYS) - 1)])
            if self._released:
                return
            try:
                if await self.take():
                    self.retaken += 1
                    log.warning("the lock %r is held again", self.name)
                    return
                holder = await self.holder()
                if holder is not None and holder == old_pid:
                    # Our own old session, still alive in the server: it goes, and the lock with it.
                    await self.pool.execute("SELECT pg_terminate_backend($1, 5000)", old_pid)
                    continue
            except Exception as exc:
                # Another connection of the pool may have ended too, unnoticed until used.
                log.warning("taking the lock %r again failed (%r); trying again", self.name, exc)
                continue
            if holder is not None:
                # Another worker holds it: one checking whether this one is gone, which lets go at
                # once, or one that found it free for longer than its grace and took the job.
                others += 1
                log_other = log.warning if others < OTHER_HOLDER_ERROR_AFTER else log.error
                log_other(
                    "the lock %r is held by another worker since this one's connection was lost "
                    "(%d tries); trying again%s",
                    self.name,
                    others,
                    "" if others < OTHER_HOLDER_ERROR_AFTER else ": both may run its job",
                )

    async def holder(self) -> int | None:
        """The server process of the session that holds the lock, if any."""
        pid: int | None = await self.pool.fetchval(HOLDER, *_halves(self.key))
        return pid

    async def release(self) -> None:
        self._released = True
        self._stop_probing.set()
        probing, self._probing = self._probing, None
        if probing is not None:
            # Not cancelled: a probe under way ends within its time limit, and the connection
            # is then free for the unlock.
            await asyncio.gather(probing, return_exceptions=True)
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


def lock_key(name: str) -> int:
    """A stable 64-bit advisory lock key for a name (the same in every worker)."""
    digest = hashlib.blake2b(f"narrmem:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _halves(key: int) -> tuple[int, int]:
    """The two 32-bit halves ``pg_locks`` shows a 64-bit advisory key as."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF
