"""A PostgreSQL that cannot be reached, told apart from one that refuses.

A server down, restarting or failing over, refusing new sessions (too many, starting up), a
connection ended under a call, or no answer within the store's time limit: each is a
:class:`~narrmem.errors.StoreUnavailableError`, which a caller may try again a moment later (503
with ``Retry-After`` over HTTP). What the server answers and refuses (a constraint, a read-only
transaction, a missing database, a wrong password) stays a :class:`~narrmem.errors.StoreError`:
trying again gives the same answer.

:class:`GuardedPool` is the store's pool with both rules applied to every call on it and to every
block that holds one of its connections: a statement is given ``timeout_s`` (asyncpg's
``command_timeout``, set on the pool), and so is the wait for a free connection, a new session
and the reset of a connection handed back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from narrmem.errors import StoreUnavailableError

# Server-side refusals that say "not now" rather than "no": the server is shutting down, crashed,
# starting up or out of sessions.
_NOT_NOW = (
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
)


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server could not be reached (rather than that it refused)."""
    if isinstance(exc, asyncio.CancelledError):
        return False
    if isinstance(exc, (OSError, TimeoutError, *_NOT_NOW)):
        return True
    # asyncpg's own words for a connection or pool that ended under a call; its other interface
    # errors are misuse, which trying again would not mend.
    return isinstance(exc, asyncpg.InterfaceError) and ("is closed" in str(exc) or "is closing" in str(exc))


def unavailable(
    exc: BaseException, where: str, scrub: Callable[[str], str], limit_s: float
) -> StoreUnavailableError:
    """The error a caller gets for ``exc`` (:func:`unreachable`), naming the server by ``where``
    and with any password in asyncpg's words scrubbed."""
    if isinstance(exc, TimeoutError):
        return StoreUnavailableError(
            f"PostgreSQL at {where} did not answer within {limit_s:g} s (storage.timeout_s)"
        )
    said = scrub(str(exc)) or type(exc).__name__
    return StoreUnavailableError(f"PostgreSQL at {where} cannot be reached now: {said}")


class GuardedPool:
    """An ``asyncpg.Pool`` whose calls fail as :func:`unavailable` errors when the server cannot
    be reached, and take no longer than the limit to find a connection. Everything else passes
    through to the pool (``terminate``, ``release``, ``get_size``)."""

    def __init__(
        self, pool: asyncpg.Pool, *, where: str, scrub: Callable[[str], str], limit_s: float
    ) -> None:
        self.raw = pool
        self.where = where
        self.limit_s = limit_s
        self._scrub = scrub

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    @contextlib.asynccontextmanager
    async def reaching(self) -> AsyncIterator[None]:
        """A block whose failures to reach the server are :func:`unavailable` errors."""
        try:
            yield
        except StoreUnavailableError:
            raise
        except Exception as exc:
            if not unreachable(exc):
                raise
            raise unavailable(exc, self.where, self._scrub, self.limit_s) from exc

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        """A connection for the block, handed back after it (reset within the limit)."""
        async with self.reaching():
            conn = await self.raw.acquire(timeout=self.limit_s)
            try:
                yield conn
            except BaseException:
                # The block's own error is the one to hear: a failed reset of the connection
                # (asyncpg then ends it) must not turn a refusal into "unreachable".
                with contextlib.suppress(Exception):
                    await self.raw.release(conn, timeout=self.limit_s)
                raise
            await self.raw.release(conn, timeout=self.limit_s)

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        async with self.acquire() as conn:
            return list(await conn.fetch(query, *args))

    async def fetchrow(self, query: str, *args: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self.acquire() as conn:
            return str(await conn.execute(query, *args))

    async def executemany(self, query: str, args: Any) -> None:
        async with self.acquire() as conn:
            await conn.executemany(query, args)


# How the server learns that a worker's host or network is gone: TCP keepalives on the session,
# which the operating system's defaults send after two hours, if at all. A session of a dead
# worker holding a lock (the fence between workers, a settling claim) then stopped every other
# worker's forgets and writes for over two hours. Probing after 30 s idle, every 10 s, 3 times:
# such a session ends within a minute. Any role may set them; a Unix socket ignores them.
KEEPALIVE_SQL = "SET tcp_keepalives_idle = 30;SET tcp_keepalives_interval = 10;SET tcp_keepalives_count = 3;"
