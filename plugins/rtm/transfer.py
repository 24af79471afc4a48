"""RTM trees in a full export (``narrmem export`` / ``narrmem import``): the ``rtm_trees`` table as the
section ``rtm.trees``, every stored tree with its parameters, its text digest and the tree itself, in
the order the trees were written (which tells apart trees built in the same instant), so that a
stored tree id opens the same tree after an import. Cached user retellings are derived and stay out.
A file exported before trees kept whose words they hold (no ``user_id``, ``chat_id``) imports its
trees as naming no one: they go with any forget of their tenant.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from narrmem_plugins.rtm.store import OWNER_COLUMNS, WRITE_ORDER, TreeStore
from narrmem_plugins.rtm.tree import Tree

from narrmem import InputError, hookimpl
from narrmem.store import SQLCapable
from narrmem.table_transfer import RowsOf, TableSpec, export_tables, import_tables, table_columns
from narrmem.view import MemoryView

SECTION = "rtm.trees"


async def _tables(memory: MemoryView) -> list[TableSpec]:
    store = memory.store
    dialect = "sqlite"
    if isinstance(store, SQLCapable):
        async with store.sql() as db:
            dialect = db.dialect
    order, _ = WRITE_ORDER.get(dialect, WRITE_ORDER["postgres"])
    # PostgreSQL numbers the rows itself (``written``): they are imported in order, not with it.
    return [
        TableSpec(
            section=SECTION,
            table="rtm_trees",
            key=("tree_id",),
            order_by=order,
            exclude=("written",),
            page_rows=20,  # a tree is one row, of up to 10,000 clauses
            # Read back with json.loads when the tree is opened: other text broke its traversal.
            formats={"params": "object", "tree": "object", "created_at": "time"},
        )
    ]


class RTMTransfer:
    """The export hooks of :class:`~narrmem_plugins.rtm.RTMPlugin` (a base class of it); idle when
    trees live in this process only (a store that lends no tables)."""

    trees: TreeStore

    @hookimpl
    async def narrmem_export_records(
        self, memory: MemoryView
    ) -> dict[str, AsyncIterator[dict[str, Any]]] | None:
        if not self.trees.persistent:
            return None
        return await export_tables(memory.store, await _tables(memory))

    @hookimpl
    async def narrmem_person_records(
        self, memory: MemoryView, tenant: str, user_id: str
    ) -> dict[str, AsyncIterator[dict[str, Any]]] | None:
        """The trees of the person's words (those a forget of them deletes by their name; a tree
        that names no one may hold anyone's words, and is not given to one person)."""
        if not self.trees.persistent:
            return None
        return await export_tables(memory.store, await _tables(memory), rows_of=RowsOf(tenant, user_id))

    @hookimpl
    async def narrmem_people_held(
        self,
        memory: MemoryView,
        tenant: str | None,
        user_id: str | None,
        after: str | None,
        through: str | None,
        limit: int | None,  # the trees are few (trees_kept a tenant): read whole
    ) -> list[tuple[str, str, datetime]] | None:
        """Each person a tree of whose words is kept, and when the latest was built (the trees are
        few, at most ``trees_kept`` a tenant: their times are read and compared here, as the tree
        store reads them; one it cannot read says nothing)."""
        if not self.trees.persistent or not isinstance(memory.store, SQLCapable):
            return None
        clauses, params = [], []
        for condition, value in (
            ("tenant = ?", tenant),
            ("user_id = ?", user_id),
            ("user_id > ?", after),
            ("user_id <= ?", through),
        ):
            if value is not None:
                clauses.append(f" AND {condition}")
                params.append(value)
        only = "".join(clauses)
        async with memory.store.sql() as db:
            columns = {c.name for c in await table_columns(db, "rtm_trees", ())}
            if "user_id" not in columns:  # a store not migrated yet (opened read-only): no owners
                return None
            rows = await db.fetchall(
                f"SELECT tenant, user_id, created_at FROM rtm_trees WHERE user_id IS NOT NULL{only}", params
            )
        latest: dict[tuple[str, str], datetime] = {}
        for tenant_of, owner, created_at in rows:
            try:
                at = datetime.fromisoformat(str(created_at))
            except ValueError:
                continue
            if at.tzinfo is None:
                continue
            key = (str(tenant_of), str(owner))
            latest[key] = max(at, latest.get(key, at))
        return [(t, u, at) for (t, u), at in sorted(latest.items())]

    @hookimpl
    async def narrmem_import_records(
        self, memory: MemoryView, sections: Mapping[str, Sequence[dict[str, Any]]], dry_run: bool
    ) -> dict[str, int] | None:
        if SECTION not in sections or not self.trees.persistent:
            return None
        records = OwnedRecords(sections[SECTION])
        _check_trees(records)
        return await import_tables(memory.store, await _tables(memory), {SECTION: records}, dry_run=dry_run)


class OwnedRecords(Sequence[Any]):
    """The section's records, each with the owner columns (``None`` for a record of a file exported
    before them), read as they are asked for."""

    def __init__(self, records: Sequence[Any]) -> None:
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [_owned(record) for record in self._records[index]]
        return _owned(self._records[index])


def _owned(record: Any) -> Any:
    if not isinstance(record, dict) or all(name in record for name in OWNER_COLUMNS):
        return record
    return {**record, **{name: record.get(name) for name in OWNER_COLUMNS}}


def _check_trees(records: Sequence[Any]) -> None:
    """Each tree opens as a tree: an object without its nodes, or with node lists of different
    lengths, was imported and then failed every traversal of it. Text that is not a JSON object is
    left to the table checks (``formats``)."""
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("tree"), str):
            continue
        try:
            data = json.loads(record["tree"])
            params = json.loads(record["params"]) if isinstance(record.get("params"), str) else {}
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(params, dict):
            continue
        try:
            tree = Tree.from_json(data, params)
            sizes = {
                len(tree.shape.start),
                len(tree.shape.end),
                len(tree.shape.depth),
                len(tree.shape.parent),
            }
            whole = len(sizes) == 1 and len(tree.summaries) in sizes and len(tree.clauses) > 0
        except (KeyError, TypeError, ValueError):
            whole = False
        if not whole:
            raise InputError(
                "is not a narrative tree (its clauses and nodes, each node list as long as the others)",
                field=f"{SECTION}[{index}].tree",
            )
