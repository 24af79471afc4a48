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

from narrmem.errors import StoreError
from narrmem.store import SQLiteCapable
from narrmem.view import MemoryView


class GraphBackend:
    def __init__(self, memory: MemoryView) -> None:
        self.memory = memory

    @staticmethod
    def supports(store: object) -> bool:
        return isinstance(store, SQLiteCapable)

    @property
    def db(self) -> aiosqlite.Connection:
        return self._store.db

    def transaction(self) -> AbstractAsyncContextManager[aiosqlite.Connection]:
        return self._store.transaction()

    @property
    def _store(self) -> SQLiteCapable:
        store = self.memory.store
        if not isinstance(store, SQLiteCapable):
            raise StoreError(f"the graph needs the sqlite store, not {type(store).__name__}")
        return store

    def now(self) -> datetime:
        return self.memory.clock.now()

    async def setup(self) -> None:
        async with self.transaction() as db:
            for statement in SCHEMA:
                await db.execute(statement)
