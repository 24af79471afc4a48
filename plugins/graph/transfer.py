"""The graph in a full export (``narrmem export`` / ``narrmem import``): each of the plugin's tables is
a section (``graph.nodes``, ``graph.edges``, ``graph.purges``, ``graph.task_messages``), every
column of every row, ids included, so that supersessions, provenance, validity intervals and the
purge log come back as they were. Node vectors are exported as they are cached (base64), so an
import re-embeds nothing; those of another model (a migration that re-embeds) are left out, a
label's made again when a recall needs it and a task's topic replayed from its messages' new
vectors.

Both backends export the same records, so a graph moves between SQLite and PostgreSQL with
``narrmem migrate`` (which uses these hooks) as it is.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, overload

import numpy as np
from narrmem_plugins.graph.backend import GraphBackend
from narrmem_plugins.graph.nodes import chat_nodes, set_topic
from narrmem_plugins.graph.schema import TABLES as GRAPH_TABLES
from narrmem_plugins.graph.task_topics import CitingTask, messages_followed, remake

from narrmem import InputError, hookimpl
from narrmem.store import SQLCapable
from narrmem.table_transfer import RowsOf, TableSpec, TextFormat, export_tables, import_tables
from narrmem.view import MemoryView

# What the graph's text columns hold, as the graph reads them back (props with json.loads, a
# validity interval with datetime.fromisoformat): other text imported was met at a later recall.
_FORMATS: dict[str, dict[str, TextFormat]] = {
    "graph_nodes": {"props": "object", "created_at": "time"},
    "graph_edges": {"provenance": "strings", "valid_from": "time", "valid_to": "time", "last_seen": "time"},
    "graph_purges": {"filters": "object", "edges": "array", "at": "time"},
}
# Every table the schema creates, in creation order: a table others refer to comes first. A node's
# label vector is a cache (stores written before 2026-12-05 filled it when a recall first needed
# it), and a task's topic is made from its messages' vectors (a migration that re-embeds replays
# it): a later import does not conflict on either.
TABLES = [
    TableSpec(
        section=f"graph.{name.removeprefix('graph_')}",
        table=name,
        derived=("vector", "vector_text", "topic_vector") if name == "graph_nodes" else (),
        formats=_FORMATS.get(name, {}),
    )
    for name in GRAPH_TABLES
]
NODES, EDGES, TASK_MESSAGES = "graph.nodes", "graph.edges", "graph.task_messages"
VECTOR_COLUMNS = ("vector", "topic_vector")
SCOPE = ("tenant", "user_id", "chat_id")


class GraphTransfer:
    """The export hooks of :class:`~narrmem_plugins.graph.GraphPlugin` (a base class of it); idle
    when the plugin is (a store without the graph's tables)."""

    _graph: GraphBackend | None

    @hookimpl
    async def narrmem_export_records(
        self, memory: MemoryView
    ) -> dict[str, AsyncIterator[dict[str, Any]]] | None:
        if self._graph is None:
            return None
        # A store opened read-only may predate a table (made at its next writable open).
        return await export_tables(memory.store, [t for t in TABLES if t.table in self._graph.tables])

    @hookimpl
    async def narrmem_person_records(
        self, memory: MemoryView, tenant: str, user_id: str
    ) -> dict[str, AsyncIterator[dict[str, Any]]] | None:
        """The person's graph: every row of every table under their id, as a forget of them deletes."""
        if self._graph is None:
            return None
        mine = [t for t in TABLES if t.table in self._graph.tables]
        return await export_tables(memory.store, mine, rows_of=RowsOf(tenant, user_id))

    @hookimpl
    async def narrmem_people_held(
        self,
        memory: MemoryView,
        tenant: str | None,
        user_id: str | None,
        after: str | None,
        through: str | None,
        limit: int | None,
    ) -> list[tuple[str, str, datetime]] | None:
        """Each person with a node or a fact, and when one was last made or stated again."""
        if self._graph is None:
            return None
        clauses, values = [], []
        for condition, value in (
            ("tenant = ?", tenant),
            ("user_id = ?", user_id),
            ("user_id > ?", after),
            ("user_id <= ?", through),
        ):
            if value is not None:
                clauses.append(f"AND {condition} ")
                values.append(value)
        async with self._graph.read() as db:
            if limit is not None and tenant is not None and user_id is None:
                # The first of the range by the nodes' scope index (whoever has a fact has a node),
                # then their times alone: a page of the users list read a graph of 50,000 people
                # whole (0.85 s a page).
                firsts = await db.fetchall(
                    "SELECT DISTINCT user_id FROM graph_nodes WHERE user_id <> '' "
                    f"{''.join(clauses)}ORDER BY user_id LIMIT ?",
                    [*values, limit],
                )
                if not firsts:
                    return []
                clauses = [f"AND tenant = ? AND user_id IN ({', '.join('?' * len(firsts))}) "]
                values = [tenant, *(str(r[0]) for r in firsts)]
            only, params = "".join(clauses), values * 2
            rows = await db.fetchall(
                "SELECT tenant, user_id, MAX(at) FROM ("
                f"SELECT tenant, user_id, created_ts AS at FROM graph_nodes WHERE user_id <> '' {only}"
                "UNION ALL "
                f"SELECT tenant, user_id, last_seen_ts AS at FROM graph_edges WHERE user_id <> '' {only}"
                ") AS held GROUP BY tenant, user_id",
                params,
            )
        return [(str(t), str(u), datetime.fromtimestamp(float(at), UTC)) for t, u, at in rows]

    @hookimpl
    async def narrmem_import_records(
        self,
        memory: MemoryView,
        sections: Mapping[str, Sequence[dict[str, Any]]],
        dry_run: bool,
        vectors_of: str,
    ) -> dict[str, int] | None:
        if self._graph is None:
            return None
        another_model = vectors_of != memory.embedder.name and NODES in sections
        if another_model:
            sections = {**sections, NODES: WithoutVectors(sections[NODES])}
        await _check_edge_scopes(memory.store, sections)
        _check_node_vectors(sections, memory.embedder.dim)
        counts = await import_tables(memory.store, TABLES, sections, dry_run=dry_run)
        if counts and not dry_run:
            await _continue_ids(self._graph)
            if another_model:
                await _replay_topics(self._graph, memory, sections[NODES])
        return counts


async def _replay_topics(graph: GraphBackend, memory: MemoryView, nodes: Sequence[dict[str, Any]]) -> None:
    """Each imported task's topic made again from the vectors of the messages it followed, as the
    memory's model made them (a task the tools made starts from its description's, as it began):
    left to its label, a task of eight messages matched the next message by the label alone,
    weighted as eight."""
    chats = {
        (str(record["tenant"]), str(record["chat_id"])): True
        for record in nodes
        if isinstance(record, dict) and record.get("type") == "TaskNode"
    }
    for tenant, chat_id in chats:
        async with graph.read() as db:
            tasks = [
                CitingTask(node, await messages_followed(db, node))
                for node in await chat_nodes(db, tenant, chat_id, node_type="TaskNode")
                if node.topic() is None
            ]
        remade = [await remake(memory, tenant, chat_id, task, ()) for task in tasks]
        async with graph.transaction() as db:
            for task in remade:
                if task.topic is not None:
                    await set_topic(db, task.node.id, task.topic)


class WithoutVectors(Sequence[dict[str, Any]]):
    """Node records read without their vectors, which another model made: kept, every recall
    that met such a node scored a label against vectors of another model's space."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self._records = records

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [_without_vectors(record) for record in self._records[index]]
        return _without_vectors(self._records[index])


def _without_vectors(record: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(record, dict):
        return record  # left to the table checks, which name it
    return {**record, **dict.fromkeys((*VECTOR_COLUMNS, "vector_text"))}


def _check_node_vectors(sections: Mapping[str, Sequence[dict[str, Any]]], dim: int) -> None:
    """A node's label and topic vectors are the model's (``dim`` float32 values, finite): one of
    another size was imported and then failed every graph recall that met it, or an automatic
    task's topic match. A value that is not base64 text is left to the table checks."""
    for index, record in enumerate(sections.get(NODES, [])):
        if not isinstance(record, dict):
            continue
        for column in VECTOR_COLUMNS:
            text = record.get(column)
            if not isinstance(text, str):
                continue
            try:
                raw = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                continue
            values = np.frombuffer(raw, dtype=np.float32) if len(raw) % 4 == 0 else None
            if values is None or len(values) != dim or not np.isfinite(values).all():
                raise InputError(
                    f"must be {dim} finite float32 values (the model's vector), not {len(raw)} bytes",
                    field=f"{NODES}[{index}].{column}",
                )


# The records that name nodes, and the fields they name them by: each is of its nodes' scope.
NAMING_NODES = {EDGES: ("subject_id", "object_id"), TASK_MESSAGES: ("task_id",)}


async def _check_edge_scopes(store: object, sections: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    """An edge's tenant, user and chat are its nodes' (and a task's followed message's, its
    task's): every read joins the nodes within the edge's own scope, so an edge moved to another
    scope, still naming these nodes, was imported and then read as another user's fact. Nodes are
    looked up in the file, then in the store; a record whose fields are of the wrong type, or that
    names a node neither holds, is left to the table checks."""
    named = {
        record.get(end)
        for section, ends in NAMING_NODES.items()
        for record in sections.get(section, [])
        if isinstance(record, dict)
        for end in ends
    }
    scopes = _node_scopes(sections.get(NODES, []))
    missing = [i for i in named if isinstance(i, int) and not isinstance(i, bool) and i not in scopes]
    if missing and isinstance(store, SQLCapable):
        async with store.sql() as db:
            for start in range(0, len(missing), 400):  # under SQLite's bound-parameter limit
                part = missing[start : start + 400]
                marks = ", ".join("?" for _ in part)
                for row in await db.fetchall(
                    f"SELECT id, tenant, user_id, chat_id FROM graph_nodes WHERE id IN ({marks})", part
                ):
                    scopes.setdefault(int(row[0]), tuple(row[1:]))
    for section, ends in NAMING_NODES.items():
        for index, edge in enumerate(sections.get(section, [])):
            if not isinstance(edge, dict):
                continue
            for end in ends:
                node_id = edge.get(end)
                node = scopes.get(node_id) if isinstance(node_id, int) else None
                if node is None:
                    continue
                for column, held in zip(SCOPE, node, strict=True):
                    if edge.get(column) != held:
                        raise InputError(
                            f"is {edge.get(column)!r}, but its {end.removesuffix('_id')} (node "
                            f"{node_id}) has {held!r}: a record belongs to its nodes' scope",
                            field=f"{section}[{index}].{column}",
                        )


def _node_scopes(nodes: Sequence[dict[str, Any]]) -> dict[int, tuple[Any, ...]]:
    """Each node record's id with its (tenant, user, chat), as the file gives them. A scope is
    kept once, however many nodes have it: a file's nodes are read as they are asked for, and
    these are all that is held of them (about 100 bytes a node)."""
    scopes: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    found: dict[int, tuple[Any, ...]] = {}
    for record in nodes:
        if isinstance(record, dict) and isinstance(record.get("id"), int):
            scope = tuple(record.get(column) for column in SCOPE)
            found[record["id"]] = scopes.setdefault(scope, scope)
    return found


async def _continue_ids(graph: GraphBackend) -> None:
    """After rows came in with their ids, the ids PostgreSQL gives new rows continue after them
    (SQLite takes the largest id + 1 by itself)."""
    async with graph.transaction() as db:
        if db.dialect == "sqlite":
            return
        for table in GRAPH_TABLES:
            await db.fetchone(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false) "
                f"FROM {table}"
            )
