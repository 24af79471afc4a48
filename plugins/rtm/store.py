"""Where trees live: the plugin's own table in narrmem's SQLite database.

``rtm_trees`` sits in the same file as the memories, reached through the store's SQLite
capability (:class:`narrmem.store.SQLiteCapable`): reads on ``store.db``, writes in the store's
own ``transaction()``, which serialises every writer on the shared connection.

A store without that capability (PostgreSQL, a test double) gets
:class:`MemoryTreeStore` instead: trees then live in this process only and are rebuilt after a
restart (same ids, since ids derive from the inputs).

Trees belong to a tenant: every read filters by it, so a tree id leaked from one tenant opens
nothing in another.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import aiosqlite
from narrmem_plugins.rtm.tree import Tree

from narrmem.errors import StoreError
from narrmem.store import SQLiteCapable
from narrmem.view import MemoryView

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS rtm_trees (
        tree_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        title TEXT NOT NULL,
        text_sha TEXT NOT NULL,
        params TEXT NOT NULL,
        tree TEXT NOT NULL,
        created_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS rtm_trees_by_text ON rtm_trees (tenant, title, text_sha, created_at)",
]
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
    store = memory.store
    if isinstance(store, SQLiteCapable):
        return SQLiteTreeStore(memory)
    return MemoryTreeStore()


class SQLiteTreeStore:
    persistent = True

    def __init__(self, memory: MemoryView) -> None:
        self.memory = memory
        self._parsed: OrderedDict[str, StoredTree] = OrderedDict()

    @property
    def _db(self) -> aiosqlite.Connection:
        return self._store.db

    @property
    def _store(self) -> SQLiteCapable:
        store = self.memory.store
        if not isinstance(store, SQLiteCapable):
            raise StoreError(f"RTM trees need the sqlite store, not {type(store).__name__}")
        return store

    async def setup(self) -> None:
        await self._transaction([(sql, ()) for sql in SCHEMA])

    async def _transaction(self, statements: list[tuple[str, tuple[Any, ...]]]) -> int:
        """Run ``statements`` in one of the store's write transactions; return the rows changed."""
        changed = 0
        async with self._store.transaction() as db:
            for sql, params in statements:
                cursor = await db.execute(sql, params)
                changed += max(0, cursor.rowcount)
        return changed

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None:
        cached = self._parsed.get(tree_id)
        if cached is not None:
            return cached if cached.tenant == tenant else None
        return await self._one("WHERE tree_id = ? AND tenant = ?", (tree_id, tenant))

    async def latest(self, tenant: str, title: str, text_sha: str) -> StoredTree | None:
        return await self._one(
            "WHERE tenant = ? AND title = ? AND text_sha = ? ORDER BY created_at DESC, rowid DESC LIMIT 1",
            (tenant, title, text_sha),
        )

    async def _one(self, where: str, params: tuple[Any, ...]) -> StoredTree | None:
        async with self._db.execute(
            f"SELECT tree_id, tenant, title, text_sha, params, tree, created_at FROM rtm_trees {where}",
            params,
        ) as cursor:
            row = await cursor.fetchone()
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
        statement = (
            "INSERT OR IGNORE INTO rtm_trees (tree_id, tenant, title, text_sha, params, tree, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
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
        written = await self._transaction([statement])
        if written:
            self._remember(row)
        return bool(written)

    async def count(self) -> int:
        async with self._db.execute("SELECT COUNT(*) FROM rtm_trees") as cursor:
            row = await cursor.fetchone()
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
