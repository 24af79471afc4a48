"""Where trees live: the plugin's own table in the store's database.

``rtm_trees`` sits beside the memories, reached through the store's SQL capability
(:class:`narrmem.store.SQLCapable`, which both built-in stores lend): reads on ``store.sql()``,
writes in ``store.sql(write=True)``, one of the store's own transactions. On SQLite that is the
same file as the memories; on PostgreSQL the same database, so every worker sees every tree.

A store without that capability (a test double) gets :class:`MemoryTreeStore` instead: trees
then live in this process only and are rebuilt after a restart (same ids, since ids derive from
the inputs).

Trees belong to a tenant: every read filters by it, so a tree id leaked from one tenant opens
nothing in another. A tree also knows whose words it holds: the user and the chat the call that
built it named (``user_id``, ``chat_id``; ``NULL``: not named). A forget deletes the trees whose
text may hold what it forgets (:meth:`TreeStore.forget`): a tree of a person goes with that person,
one of a chat with that chat, and a column left ``NULL`` matches every forget, so a tree that names
no one (built without an owner, or stored before trees kept one) goes with any forget of its tenant.

Trees are a cache of what their text makes (the same text, title and parameters build the same
tree, under the same id): the table keeps the newest ``trees_kept`` trees written, the oldest going
first.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from narrmem_plugins.rtm.tree import Tree

from narrmem.errors import StoreError
from narrmem.store import SQLCapable, SQLConnection
from narrmem.table_transfer import table_columns
from narrmem.view import MemoryView

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS rtm_trees (
        tree_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        title TEXT NOT NULL,
        text_sha TEXT NOT NULL,
        params TEXT NOT NULL,
        tree TEXT NOT NULL,
        created_at TEXT NOT NULL{order},
        user_id TEXT,
        chat_id TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS rtm_trees_by_text ON rtm_trees (tenant, title, text_sha, created_at)",
]
# Added on 2026-12-07, last in the table (where ALTER TABLE puts them in a store made before): a
# store's rows from before keep NULL, whose words the tree holds not being known.
OWNER_COLUMNS = ("user_id", "chat_id")
OWNER_INDEX = "CREATE INDEX IF NOT EXISTS rtm_trees_by_owner ON rtm_trees (tenant, user_id, chat_id)"
DEFAULT_KEPT = 256
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
    user_id: str | None = None
    chat_id: str | None = None


class TreeStore(Protocol):
    persistent: bool

    async def setup(self) -> None: ...

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None: ...

    async def latest(
        self, tenant: str, title: str, text_sha: str, user_id: str | None = None, chat_id: str | None = None
    ) -> StoredTree | None:
        """The newest tree built from this text under this title, of this owner."""
        ...

    async def put(self, row: StoredTree) -> bool:
        """Store ``row`` unless its id exists; ``True`` if it was written. The oldest trees go
        past the number kept."""
        ...

    async def forget(self, tenant: str, user_id: str | None, chat_id: str | None) -> int:
        """Delete the trees of ``tenant`` that may hold the words of the user and/or chat
        forgotten (``None``: any): those of that owner and those whose owner is not known."""
        ...

    async def forget_owned(self, tenant: str, user_id: str, chat_id: str) -> int:
        """Delete the trees of ``user_id``'s words in ``chat_id`` or across their chats (those a
        message of theirs in the chat may be in; a tree that names no one is left)."""
        ...

    async def forget_chat(self, tenant: str, chat_id: str) -> int:
        """Delete every tree that names ``chat_id``, whoever's words it holds, and every tree of
        a person across their chats (a message of the chat may be in any of them)."""
        ...

    def forget_cached(self, tenant: str | None) -> None:
        """Drop the trees of ``tenant`` (``None``: every tenant) held parsed in this process."""
        ...

    async def count(self) -> int: ...


def open_tree_store(memory: MemoryView, kept: int = DEFAULT_KEPT) -> TreeStore:
    if isinstance(memory.store, SQLCapable):
        return SQLTreeStore(memory, kept)
    return MemoryTreeStore(kept)


def _owner_clause(user_id: str | None, chat_id: str | None) -> tuple[str, list[str]]:
    """The trees a forget of ``user_id`` and/or ``chat_id`` takes: a NULL owner column matches any."""
    where, params = "", []
    for column, value in zip(OWNER_COLUMNS, (user_id, chat_id), strict=True):
        if value is not None:
            where += f" AND ({column} IS NULL OR {column} = ?)"
            params.append(value)
    return where, params


def _same_owner(user_id: str | None, chat_id: str | None) -> tuple[str, list[str]]:
    """The trees of exactly this owner (a column ``NULL`` for an id not given)."""
    where, params = "", []
    for column, value in zip(OWNER_COLUMNS, (user_id, chat_id), strict=True):
        if value is None:
            where += f" AND {column} IS NULL"
        else:
            where += f" AND {column} = ?"
            params.append(value)
    return where, params


class SQLTreeStore:
    persistent = True

    def __init__(self, memory: MemoryView, kept: int = DEFAULT_KEPT) -> None:
        self.memory = memory
        self.kept = kept
        self._parsed: OrderedDict[str, StoredTree] = OrderedDict()
        self._order = "rowid"
        # Whether the table has the owner columns: a store from before them, opened read-only,
        # is read without them (nothing can be written, nor forgotten).
        self._owners = True

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
            have = {c.name for c in await table_columns(db, "rtm_trees")}
            missing = [name for name in OWNER_COLUMNS if name not in have]
            if missing and self.memory.read_only:
                self._owners = False
                return
            # PostgreSQL: another worker may add them meanwhile (each worker of a store opens it).
            exists = "" if db.dialect == "sqlite" else "IF NOT EXISTS "
            for name in missing:
                await db.execute(f"ALTER TABLE rtm_trees ADD COLUMN {exists}{name} TEXT")
            await db.execute(OWNER_INDEX)

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None:
        cached = self._parsed.get(tree_id)
        if cached is not None:
            if cached.tenant != tenant:
                return None
            # Forgotten since, maybe by another worker: the parsed copy is not answered unchecked.
            async with self._store.sql() as db:
                if await db.fetchone("SELECT 1 FROM rtm_trees WHERE tree_id = ?", (tree_id,)) is not None:
                    return cached
            self._parsed.pop(tree_id, None)
            return None
        return await self._one("WHERE tree_id = ? AND tenant = ?", (tree_id, tenant))

    async def latest(
        self, tenant: str, title: str, text_sha: str, user_id: str | None = None, chat_id: str | None = None
    ) -> StoredTree | None:
        # Ordered by the times they stand for, not by their text: a tree built at 01:10-08:00
        # sorted before one built twenty minutes earlier at 01:50-07:00 (a clock in a zone that
        # left daylight saving time between, or trees imported from a store in another zone).
        owner, params = _same_owner(user_id, chat_id) if self._owners else ("", [])
        async with self._store.sql() as db:
            rows = await db.fetchall(
                f"SELECT tree_id, created_at, {self._order} FROM rtm_trees "
                f"WHERE tenant = ? AND title = ? AND text_sha = ?{owner}",
                (tenant, title, text_sha, *params),
            )
        if not rows:
            return None
        newest = max(rows, key=lambda r: (_instant(r[1]), r[2]))
        return await self.get(tenant, newest[0])

    async def _one(self, where: str, params: tuple[Any, ...]) -> StoredTree | None:
        owners = ", ".join(OWNER_COLUMNS) if self._owners else "NULL, NULL"
        async with self._store.sql() as db:
            row = await db.fetchone(
                "SELECT tree_id, tenant, title, text_sha, params, tree, created_at, "
                f"{owners} FROM rtm_trees {where}",
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
            user_id=row[7],
            chat_id=row[8],
        )
        self._remember(found)
        return found

    async def put(self, row: StoredTree) -> bool:
        async with self._store.sql(write=True) as db:
            written = await db.execute(
                "INSERT INTO rtm_trees (tree_id, tenant, title, text_sha, params, tree, created_at, "
                "user_id, chat_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tree_id) DO NOTHING",
                (
                    row.tree_id,
                    row.tenant,
                    row.title,
                    row.text_sha,
                    json.dumps(row.params, ensure_ascii=False, sort_keys=True),
                    json.dumps(row.tree.to_json(), ensure_ascii=False, separators=(",", ":")),
                    row.created_at,
                    row.user_id,
                    row.chat_id,
                ),
            )
            # The oldest written go past the number kept: trees are built again from their text.
            # Counted per tenant: one tenant's trees never push out another's (a caller of one
            # tenant deleted every other's by building trees).
            [(count,)] = await db.fetchall("SELECT COUNT(*) FROM rtm_trees WHERE tenant = ?", (row.tenant,))
            over = int(count) - self.kept
            if over > 0:
                oldest = await db.fetchall(
                    f"SELECT tree_id FROM rtm_trees WHERE tenant = ? ORDER BY {self._order} LIMIT ?",
                    (row.tenant, over),
                )
                await _delete(db, [r[0] for r in oldest])
                self._drop([r[0] for r in oldest])
        if written:
            self._remember(row)
        return bool(written)

    async def forget_chat(self, tenant: str, chat_id: str) -> int:
        async with self._store.sql(write=True) as db:
            found = await db.fetchall(
                "SELECT tree_id FROM rtm_trees WHERE tenant = ? "
                "AND (chat_id = ? OR (chat_id IS NULL AND user_id IS NOT NULL))",
                (tenant, chat_id),
            )
            gone = [r[0] for r in found]
            await _delete(db, gone)
        self._drop(gone)
        return len(gone)

    async def forget_owned(self, tenant: str, user_id: str, chat_id: str) -> int:
        # A message's words are in the trees of its person in its chat, or across their chats.
        async with self._store.sql(write=True) as db:
            found = await db.fetchall(
                "SELECT tree_id FROM rtm_trees WHERE tenant = ? AND user_id = ? "
                "AND (chat_id IS NULL OR chat_id = ?)",
                (tenant, user_id, chat_id),
            )
            gone = [r[0] for r in found]
            await _delete(db, gone)
        self._drop(gone)
        return len(gone)

    async def forget(self, tenant: str, user_id: str | None, chat_id: str | None) -> int:
        owner, params = _owner_clause(user_id, chat_id)
        async with self._store.sql(write=True) as db:
            found = await db.fetchall(
                f"SELECT tree_id FROM rtm_trees WHERE tenant = ?{owner}", (tenant, *params)
            )
            gone = [r[0] for r in found]
            await _delete(db, gone)
        self._drop(gone)
        return len(gone)

    def forget_cached(self, tenant: str | None) -> None:
        self._drop([k for k, row in self._parsed.items() if tenant is None or row.tenant == tenant])

    async def count(self) -> int:
        async with self._store.sql() as db:
            row = await db.fetchone("SELECT COUNT(*) FROM rtm_trees")
        return int(row[0]) if row else 0

    def _drop(self, tree_ids: list[str]) -> None:
        for tree_id in tree_ids:
            self._parsed.pop(tree_id, None)

    def _remember(self, row: StoredTree) -> None:
        self._parsed[row.tree_id] = row
        self._parsed.move_to_end(row.tree_id)
        while len(self._parsed) > PARSED_CACHE:
            self._parsed.popitem(last=False)


async def _delete(db: SQLConnection, tree_ids: list[str]) -> None:
    for start in range(0, len(tree_ids), 500):
        part = tree_ids[start : start + 500]
        await db.execute(
            f"DELETE FROM rtm_trees WHERE tree_id IN ({', '.join('?' for _ in part)})", tuple(part)
        )


class MemoryTreeStore:
    """Trees in a dict, for store backends the plugin cannot add a table to (lost on close)."""

    persistent = False

    def __init__(self, kept: int = DEFAULT_KEPT) -> None:
        self.kept = kept
        self._rows: dict[str, StoredTree] = {}

    async def setup(self) -> None:
        return None

    async def get(self, tenant: str, tree_id: str) -> StoredTree | None:
        row = self._rows.get(tree_id)
        return row if row is not None and row.tenant == tenant else None

    async def latest(
        self, tenant: str, title: str, text_sha: str, user_id: str | None = None, chat_id: str | None = None
    ) -> StoredTree | None:
        wanted = (tenant, title, text_sha, user_id, chat_id)
        rows = [
            r for r in self._rows.values() if (r.tenant, r.title, r.text_sha, r.user_id, r.chat_id) == wanted
        ]
        return rows[-1] if rows else None

    async def put(self, row: StoredTree) -> bool:
        if row.tree_id in self._rows:
            return False
        self._rows[row.tree_id] = row
        tenants = [key for key, kept in self._rows.items() if kept.tenant == row.tenant]
        for key in tenants[: max(0, len(tenants) - self.kept)]:
            del self._rows[key]
        return True

    async def forget_chat(self, tenant: str, chat_id: str) -> int:
        gone = [
            key
            for key, r in self._rows.items()
            if r.tenant == tenant and (r.chat_id == chat_id or (r.chat_id is None and r.user_id is not None))
        ]
        for key in gone:
            del self._rows[key]
        return len(gone)

    async def forget_owned(self, tenant: str, user_id: str, chat_id: str) -> int:
        gone = [
            key
            for key, r in self._rows.items()
            if r.tenant == tenant and r.user_id == user_id and r.chat_id in (None, chat_id)
        ]
        for key in gone:
            del self._rows[key]
        return len(gone)

    async def forget(self, tenant: str, user_id: str | None, chat_id: str | None) -> int:
        gone = [
            key
            for key, r in self._rows.items()
            if r.tenant == tenant
            and (user_id is None or r.user_id in (None, user_id))
            and (chat_id is None or r.chat_id in (None, chat_id))
        ]
        for key in gone:
            del self._rows[key]
        return len(gone)

    def forget_cached(self, tenant: str | None) -> None:
        return None  # the trees themselves are in this process: forget deletes them

    async def count(self) -> int:
        return len(self._rows)


def _instant(created_at: str) -> float:
    """A tree's creation time as a number (a time that cannot be read sorts first)."""
    try:
        when = datetime.fromisoformat(created_at)
    except ValueError:
        return float("-inf")
    return when.timestamp() if when.tzinfo is not None else float("-inf")
