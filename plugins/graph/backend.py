"""Where the graph lives: narrmem's SQLite database, reached through the built-in store's connection.

Every write runs in the store's ``transaction()`` (``BEGIN IMMEDIATE`` under the lock every writer on
the shared connection takes); reads go straight to ``store.db``. A store without these (another
backend) cannot hold the graph: the plugin then stays idle and its tools say so.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime

import aiosqlite
from narrmem_plugins.graph.schema import SCHEMA

from narrmem.clock import Clock
from narrmem.store import SQLiteCapable


class GraphBackend:
    """The graph's tables on ``store``; ``clock`` dates what is written."""

    def __init__(self, store: SQLiteCapable, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    @property
    def db(self) -> aiosqlite.Connection:
        return self._store.db

    def transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]:
        return self._store.transaction()

    def now(self) -> datetime:
        return self._clock.now()

    async def setup(self) -> None:
        async with self.transaction() as db:
            for statement in SCHEMA:
                await db.execute(statement)
