"""Where trees live: the plugin's own table in the store's database.

``rtm_trees`` sits beside the memories, reached through the store's SQL capability
(:class:`narrmem.store.SQLCapable`, which both built-in stores lend): reads on ``store.sql()``,
writes in ``store.sql(write=True)``, one of the store's own transactions. On SQLite that is the
same file as the memories; on PostgreSQL the same database, so every worker sees every tree.

A store without that capability (a test double) gets :class:`MemoryTreeStore` instead: trees
then live in this process only and are rebuilt after a restart (same ids, since ids derive from
the inputs).

Trees belong to a tenant: every read filters by it, so a tree id leaked from one tenant opens
nothing in another.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from narrmem_plugins.rtm.tree import Tree

from narrmem.errors import StoreError
from narrmem.store import SQLCapable
from narrmem.view import MemoryView

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS rtm_trees (
        tree_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        title TEXT NOT NULL,
        text_sha TEXT NOT NULL,
        params TEXT NOT NULL,
        tree TEXT NOT NULL,
        created_at TEXT NOT NULL{order}
    )""",
    "CREATE INDEX IF NOT EXISTS rtm_trees_by_text ON rtm_trees (tenant, title, text_sha, created_at)",
]
# Trees written in the same instant are told apart by the order they were written in: SQLite's
# rowid, on PostgreSQL a column of its own.
WRITE_ORDER = {
    "sqlite": ("rowid", ""),
    "postgres": ("written", ",\n        written BIGINT GENERATED ALWAYS AS IDENTITY"),
}
PARSED_CACHE = 8  # parsed trees kept in memory; a 10,000-clause tree parses in tens of ms


@dataclass(frozen=True)
class StoredTree:
    tree_id: str
    tenant: str
    title: str
    text_sha: str
    params: dict[str, Any]
    tree: Tree
    created_at: str


class TreeStore(Protocol):
    persistent: bool

    async def setup(self) -> None: ...

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None: ...

    async def latest(self, tenant: str, title: str, text_sha: str) -> StoredTree | None:
        """The newest tree built from this text under this title."""
        ...

    async def put(self, row: StoredTree) -> bool:
        """Store ``row`` unless its id exists; ``True`` if it was written."""
        ...

    async def count(self) -> int: ...


def open_tree_store(memory: MemoryView) -> TreeStore:
    if isinstance(memory.store, SQLCapable):
        return SQLTreeStore(memory)
    return MemoryTreeStore()


class SQLTreeStore:
    persistent = True

    def __init__(self, memory: MemoryView) -> None:
        self.memory = memory
        self._parsed: OrderedDict[str, StoredTree] = OrderedDict()
        self._order = "rowid"

    @property
    def _store(self) -> SQLCapable:
        store = self.memory.store
        if not isinstance(store, SQLCapable):
            raise StoreError(f"RTM trees need a store with SQL tables, not {type(store).__name__}")
        return store

    async def setup(self) -> None:
        async with self._store.sql(write=True) as db:
            self._order, column = WRITE_ORDER.get(db.dialect, WRITE_ORDER["postgres"])
            for sql in SCHEMA:
                await db.execute(sql.format(order=column))

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None:
        cached = self._parsed.get(tree_id)
        if cached is not None:
            return cached if cached.tenant == tenant else None
        return await self._one("WHERE tree_id = ? AND tenant = ?", (tree_id, tenant))

    async def latest(self, tenant: str, title: str, text_sha: str) -> StoredTree | None:
        # Ordered by the times they stand for, not by their text: a tree built at 01:10-08:00
        # sorted before one built twenty minutes earlier at 01:50-07:00 (a clock in a zone that
        # left daylight saving time between, or trees imported from a store in another zone).
        async with self._store.sql() as db:
            rows = await db.fetchall(
                f"SELECT tree_id, created_at, {self._order} FROM rtm_trees "
                "WHERE tenant = ? AND title = ? AND text_sha = ?",
                (tenant, title, text_sha),
            )
        if not rows:
            return None
        newest = max(rows, key=lambda r: (_instant(r[1]), r[2]))
        return await self.get(tenant, newest[0])

    async def _one(self, where: str, params: tuple[Any, ...]) -> StoredTree | None:
        async with self._store.sql() as db:
            row = await db.fetchone(
                f"SELECT tree_id, tenant, title, text_sha, params, tree, created_at FROM rtm_trees {where}",
                params,
            )
        if row is None:
            return None
        cached = self._parsed.get(row[0])
        if cached is not None:
            return cached
        stored_params = json.loads(row[4])
        found = StoredTree(
            tree_id=row[0],
            tenant=row[1],
            title=row[2],
            text_sha=row[3],
            params=stored_params,
            tree=Tree.from_json(json.loads(row[5]), stored_params),
            created_at=row[6],
        )
        self._remember(found)
        return found

    async def put(self, row: StoredTree) -> bool:
        async with self._store.sql(write=True) as db:
            written = await db.execute(
                "INSERT INTO rtm_trees (tree_id, tenant, title, text_sha, params, tree, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tree_id) DO NOTHING",
                (
                    row.tree_id,
                    row.tenant,
                    row.title,
                    row.text_sha,
                    json.dumps(row.params, ensure_ascii=False, sort_keys=True),
                    json.dumps(row.tree.to_json(), ensure_ascii=False, separators=(",", ":")),
                    row.created_at,
                ),
            )
        if written:
            self._remember(row)
        return bool(written)

    async def count(self) -> int:
        async with self._store.sql() as db:
            row = await db.fetchone("SELECT COUNT(*) FROM rtm_trees")
        return int(row[0]) if row else 0

    def _remember(self, row: StoredTree) -> None:
        self._parsed[row.tree_id] = row
        self._parsed.move_to_end(row.tree_id)
        while len(self._parsed) > PARSED_CACHE:
            self._parsed.popitem(last=False)


class MemoryTreeStore:
    """Trees in a dict, for store backends the plugin cannot add a table to (lost on close)."""

    persistent = False

    def __init__(self) -> None:
        self._rows: dict[str, StoredTree] = {}

    async def setup(self) -> None:
        return None

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None:
        row = self._rows.get(tree_id)
        return row if row is not None and row.tenant == tenant else None

    async def latest(self, tenant: str, title: str, text_sha: str) -> StoredTree | None:
        rows = [
            r for r in self._rows.values() if (r.tenant, r.title, r.text_sha) == (tenant, title, text_sha)
        ]
        return rows[-1] if rows else None

    async def put(self, row: StoredTree) -> bool:
        if row.tree_id in self._rows:
            return False
        self._rows[row.tree_id] = row
        return True

    async def count(self) -> int:
        return len(self._rows)


def _instant(created_at: str) -> float:
    """A tree's creation time as a number (a time that cannot be read sorts first)."""
    try:
        when = datetime.fromisoformat(created_at)
    except ValueError:
        return float("-inf")
    return when.timestamp() if when.tzinfo is not None else float("-inf")
