"""Where the graph lives: narrmem's SQLite database, reached through the built-in store's connection.

Every write runs in the store's ``transaction()`` (``BEGIN IMMEDIATE`` under the lock every writer on
the shared connection takes); reads go straight to ``store.db``. A store without these (another
backend) cannot hold the graph: the plugin then stays idle and its tools say so.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.schema import SCHEMA


class GraphBackend:
    def __init__(self, memory: Any) -> None:
        self.memory = memory

    @staticmethod
    def supports(store: Any) -> bool:
        return callable(getattr(store, "transaction", None)) and hasattr(store, "db")

    @property
    def db(self) -> Any:
        return self.memory.store.db

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        return self.memory.store.transaction()

    def now(self) -> datetime:
        return self.memory.clock.now()

    async def setup(self) -> None:
        async with self.transaction() as db:
            for statement in SCHEMA:
                await db.execute(statement)
