"""Where the graph lives: its tables in the store's database, reached through the store's SQL
capability (:class:`narrmem.store.SQLCapable`, which both built-in stores lend). On SQLite that is
the file beside the memories; on PostgreSQL the same database, so every worker sees every graph.

Reads open :meth:`GraphBackend.read`; every write runs in :meth:`GraphBackend.transaction`, one of
the store's write transactions. Graph writes read what they change first (is the node there, does
the triplet contradict one?), so they take turns as SQLite's single writer makes them: on
PostgreSQL each write transaction first takes one lock every worker shares.

The graph's SQL is SQLite's, with node names compared through ``nocase(...)`` (see
:func:`dialect_sql`), so that names compare as SQLite's ``NOCASE`` compares them on both backends.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.schema import TABLES, schema_for
from narrmem_plugins.graph.vectors import LabelVectors

from narrmem.clock import Clock
from narrmem.errors import StoreError
from narrmem.store import SQLCapable, SQLConnection
from narrmem.table_transfer import table_columns

# A transaction-level advisory lock on PostgreSQL: graph writes of every worker, one at a time.
WRITE_LOCK = 0x6E61_7272_6D67_7270  # "narrmgrp"

_ASCII_FOLD = r"translate(\1, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"
_FOLDED = re.compile(r"\b(?:nocase|lower)\(([^()]*)\)")
_NOCASE = re.compile(r"\bnocase\(([^()]*)\)")
_INDEX = re.compile(r"\s*CREATE\s+(UNIQUE\s+)?INDEX\b", re.I)
_TABLE = re.compile(r"\s*CREATE TABLE IF NOT EXISTS (\w+)")
# Tables added after the graph's first version: a store from before is read without them.
ADDED_LATER = ("graph_task_messages",)


@functools.lru_cache(maxsize=1024)
def dialect_sql(sql: str, dialect: str) -> str:
    """The graph's SQL as ``dialect`` runs it. ``nocase(x)`` marks a side of a comparison with a node
    name (``=``, ``<>``, ``IN``): on SQLite it is ``x``, the ``name`` column's ``NOCASE`` collation
    doing the folding; on PostgreSQL both sides are folded as SQLite folds them (ASCII letters
    only), which is also what SQLite's ``lower()`` does; ``instr`` is PostgreSQL's ``strpos``."""
    if dialect == "sqlite":
        return _NOCASE.sub(r"\1", sql) if "nocase(" in sql else sql
    return re.sub(r"\binstr\(", "strpos(", _FOLDED.sub(_ASCII_FOLD, sql))


class GraphSQL:
    """The store's :class:`~narrmem.store.SQLConnection`, speaking the graph's SQL (:func:`dialect_sql`)."""

    def __init__(self, db: SQLConnection) -> None:
        self._db = db
        self.dialect = db.dialect

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._db.execute(dialect_sql(sql, self.dialect), params)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self._db.executemany(dialect_sql(sql, self.dialect), rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._db.fetchall(dialect_sql(sql, self.dialect), params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return await self._db.fetchone(dialect_sql(sql, self.dialect), params)

    async def insert(self, sql: str, params: Sequence[Any]) -> int:
        """Run an ``INSERT ... RETURNING id``; the id."""
        row = await self.fetchone(sql, params)
        if row is None:
            raise StoreError(f"no id came back from {' '.join(sql.split())[:60]}")
        return int(row[0])


class GraphBackend:
    """The graph's tables on ``store``; ``clock`` dates what is written."""

    def __init__(self, store: SQLCapable, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        # Label embeddings a recall made: in this process only (a recall writes nothing).
        self.label_vectors = LabelVectors()
        self.tables: list[str] = list(TABLES)  # the graph's tables the store holds

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[GraphSQL]:
        async with self._store.sql() as db:
            yield GraphSQL(db)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[GraphSQL]:
        async with self._store.sql(write=True) as db:
            if db.dialect == "postgres":
                await db.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK,))
            yield GraphSQL(db)

    def now(self) -> datetime:
        return self._clock.now()

    async def setup(self, *, read_only: bool = False) -> None:
        """Make the tables and indexes that are not there. Read-only, they are left to the next
        writable open: a store from a version before an index or a table was added is read
        without it (:attr:`tables` says which tables there are)."""
        async with self._store.sql(write=True) as db:
            graph = GraphSQL(db)
            if read_only:
                self.tables = [t for t in TABLES if await table_columns(db, t)]
                missing = sorted(set(TABLES) - set(self.tables) - set(ADDED_LATER))
                if missing:
                    raise StoreError(f"the store has no graph tables ({', '.join(missing)} missing)")
            for statement in schema_for(graph.dialect):
                made = _TABLE.match(statement)
                if read_only and (_INDEX.match(statement) or (made and made.group(1) not in self.tables)):
                    continue
                await graph.execute(statement)
