"""Refusing a connection pooler that moves a connection between server sessions.

narrmem needs each of its connections to stay one server session: the fence between workers and
their claims are advisory locks held by a session, other workers' events arrive by ``LISTEN`` on a
session, and the pool's settings (the HNSW search's, above all ``hnsw.iterative_scan``) are set on
each session. A pooler in transaction or statement mode (PgBouncer's ``pool_mode = transaction``,
the "transaction pooler" addresses hosted databases give first) hands every transaction to
whichever server session is free: the locks then guard nothing, the settings and prepared
statements are found on one session and missed on the next, and the events go to whoever holds the
session. Through PgBouncer 1.18 in transaction mode two workers ingesting at once logged the fence
lost after every few writes, a recall lost its keyword source (``InvalidSQLStatementNameError``),
and the run hung. A pooler in session mode gives a connection one server session for its life, and
works as the database itself does.

What the check reports is a fact: a connection straight to the server, or through a session-mode
pooler, runs every statement in one backend, whose process id never changes, and two connections
never share one, so a connection seeing two ids, or two connections one, is a pooler of the other
kind. :func:`check_one_session_per_connection` asks in the orders in which the usual ways of
handing sessions out (the one used last, or in turns; with one session or several idle) show it:
one connection twice in a row, then the other, then each while the other holds a transaction open
(which pins a session to it in any mode). A pooler handing sessions out by some other rule could
pass it; the prepared statements of the pool's connections would then fail on the next session.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from narrmem.errors import ConfigError, StoreUnavailableError

# How long a probe waits for its statement before letting the other connection end its
# transaction: a transaction pooler with a single server session makes it wait for that.
_PINNED_WAIT_S = 0.2

_PID = "SELECT pg_backend_pid()"


async def check_one_session_per_connection(
    dsn: str, *, where: str, settings_sql: str, timeout_s: float
) -> None:
    """Raise :class:`ConfigError` naming ``storage.dsn`` when ``dsn`` reaches PostgreSQL through a
    pooler that does not keep a connection on one server session. The probes are set up as the
    store's pool sets its connections up (``settings_sql``), so a proxy that keeps a session pinned
    once it holds session state (as Amazon RDS Proxy does) is judged as the pool will meet it."""
    first = await _connect(dsn, settings_sql, timeout_s)
    try:
        try:
            second = await _connect(dsn, settings_sql, timeout_s)
        except TimeoutError as exc:
            # The first session answered a moment ago: a second one that does not is most often
            # a session pooler with no session free for it (the store needs several).
            raise StoreUnavailableError(
                f"PostgreSQL at {where} answered one session but not a second within {timeout_s:g} s "
                "(storage.timeout_s): a connection pooler in session mode with no free session makes a "
                "connection wait so (each worker holds up to 9 sessions with the default pool_size = 4: "
                "give the pooler that many per worker)"
            ) from exc
        try:
            seen = await _backend_ids(first, second)
        finally:
            await second.close(timeout=timeout_s)
    finally:
        await first.close(timeout=timeout_s)
    first_ids, second_ids = seen
    if len(first_ids) > 1 or len(second_ids) > 1 or first_ids & second_ids:
        raise ConfigError(
            f"storage.dsn: {where} is reached through a connection pooler that runs one connection's "
            "transactions in different server sessions (a pooler in transaction or statement mode, such "
            "as PgBouncer's pool_mode = transaction or a hosted database's transaction pooler address). "
            "narrmem holds locks, settings and other workers' events in its sessions: connect to the "
            "database directly, or through the pooler in session mode (PgBouncer's pool_mode = session, "
            "a hosted database's session pooler)"
        )


async def _connect(dsn: str, settings_sql: str, timeout_s: float) -> Any:
    # No named prepared statements: on a transaction pooler they would fail before the check says why.
    conn = await asyncpg.connect(dsn, timeout=timeout_s, command_timeout=timeout_s, statement_cache_size=0)
    try:
        await conn.execute(settings_sql)
    except BaseException:
        conn.terminate()
        raise
    return conn


async def _backend_ids(first: Any, second: Any) -> tuple[set[int], set[int]]:
    first_ids: set[int] = set()
    second_ids: set[int] = set()
    # Outside any transaction, the first connection twice and then the second: a pooler handing
    # out the session used last (PgBouncer's default) gives the second connection the first's;
    # one handing them round gives the first connection another one on its second statement
    # (the two connections asked in turns instead are given two sessions in turns, and pass).
    first_ids.add(await first.fetchval(_PID))
    first_ids.add(await first.fetchval(_PID))
    second_ids.add(await second.fetchval(_PID))
    if len(first_ids) > 1 or first_ids & second_ids:
        return first_ids, second_ids
    # Each in turn holds a transaction, which pins a session to it, while the other asks: the
    # other must then be given a different session, or wait for this one.
    for holder, asker, holder_ids, asker_ids in (
        (second, first, second_ids, first_ids),
        (first, second, first_ids, second_ids),
    ):
        asking: asyncio.Future[Any] | None = None
        try:
            async with holder.transaction():
                holder_ids.add(await holder.fetchval(_PID))
                asking = asyncio.ensure_future(asker.fetchval(_PID))
                await asyncio.wait({asking}, timeout=_PINNED_WAIT_S)
            asker_ids.add(await asking)
        finally:
            if asking is not None and not asking.done():
                asking.cancel()
    return first_ids, second_ids
