"""Nodes: find, create and refine them inside one scope. Callers hold the write transaction for the
writing functions (``db`` is the connection it yields)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.schema import from_row
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import DEFAULT_NODE_TYPE, label

from narrmem.errors import InputError

NODE_COLUMNS = "id, chat_id, name, type, props, created_at, vector, vector_text, topic_vector"
# How the columns the database does not hand back as the field's type are read.
_CONVERT: dict[str, Callable[[Any], Any]] = {"id": int, "props": lambda text: dict(json.loads(text or "{}"))}


@dataclass
class Node:
    id: int
    chat_id: str
    name: str
    type: str
    props: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    vector: bytes | None = None
    vector_text: str | None = None
    topic_vector: bytes | None = None

    def topic(self) -> np.ndarray | None:
        return None if self.topic_vector is None else np.frombuffer(self.topic_vector, dtype=np.float32)


def node_columns(alias: str) -> str:
    """:data:`NODE_COLUMNS` of table ``alias``."""
    return ", ".join(f"{alias}.{column.strip()}" for column in NODE_COLUMNS.split(","))


def node_from_row(row: Sequence[Any]) -> Node:
    """A row of :data:`NODE_COLUMNS` as a node."""
    return from_row(Node, row, _CONVERT)


async def find_node(db: GraphSQL, scope: GraphScope, name: str) -> Node | None:
    """The node called ``name`` in the write chat of ``scope`` (names compare case-insensitively,
    in every script, and composed: "Маша" is "маша", a decomposed "Jürgen" is "Jürgen")."""
    name = unicodedata.normalize("NFC", name)
    row = await db.fetchone(
        f"SELECT {NODE_COLUMNS} FROM graph_nodes "
        "WHERE tenant = ? AND user_id = ? AND chat_id = ? AND nocase(name) = nocase(?)",
        (scope.tenant, scope.user_id, scope.write_chat, name),
    )
    if row is None and not name.isascii():
        # SQLite's NOCASE (and the graph's SQL on PostgreSQL) folds ASCII alone: "Маша" and
        # "маша" were two people. The chat's names of the same length, read alone (no vector),
        # are compared folded here: a scan of the chat's nodes' names, 3 ms at 10,000.
        alike = await spelled_alike(db, scope.tenant, scope.user_id, name, chat_id=scope.write_chat)
        if alike:
            row = await db.fetchone(
                f"SELECT {NODE_COLUMNS} FROM graph_nodes "
                "WHERE tenant = ? AND user_id = ? AND chat_id = ? AND name = ?",
                (scope.tenant, scope.user_id, scope.write_chat, alike[0]),
            )
    return from_row(Node, row, _CONVERT) if row else None


async def spelled_alike(
    db: GraphSQL, tenant: str, user_id: str, name: str, *, chat_id: str | None = None
) -> list[str]:
    """The node names of a person's graph (of one chat, given ``chat_id``) that are ``name``
    written otherwise: other capitals in any script, composed or not."""
    folded = _folded(name)
    clause, values = ("AND chat_id = ? ", [chat_id]) if chat_id is not None else ("", [])
    rows = await db.fetchall(
        "SELECT DISTINCT name FROM graph_nodes "
        f"WHERE tenant = ? AND user_id = ? {clause}AND length(name) = ?",
        (tenant, user_id, *values, len(unicodedata.normalize("NFC", name))),
    )
    return sorted(str(r[0]) for r in rows if _folded(str(r[0])) == folded)


def _folded(name: str) -> str:
    # Turkish İ folds to i and a dot above: İpek is ipek.
    return unicodedata.normalize("NFC", name).casefold().replace("i\u0307", "i")


async def ensure_node(
    db: GraphSQL,
    scope: GraphScope,
    name: str,
    node_type: str | None,
    at: datetime,
    *,
    field_name: str,
    props: dict[str, Any] | None = None,
) -> Node:
    """The node ``name`` in the write chat, created with ``node_type`` (default ``EntityNode``) if new.

    An explicit type refines a node still typed ``EntityNode``; any other disagreement is an
    :class:`InputError` on ``field_name`` (a node has one type, or edges would mean different things).
    """
    name = unicodedata.normalize("NFC", name)
    found = await find_node(db, scope, name)
    if found is not None:
        if node_type is None or node_type == found.type:
            return found
        if found.type != DEFAULT_NODE_TYPE:
            raise InputError(f"node '{found.name}' is a {found.type}, not a {node_type}", field=field_name)
        await db.execute("UPDATE graph_nodes SET type = ? WHERE id = ?", (node_type, found.id))
        found.type = node_type
        return found
    node_id = await db.insert(
        "INSERT INTO graph_nodes (tenant, user_id, chat_id, name, type, props, created_at, created_ts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            scope.tenant,
            scope.user_id,
            scope.write_chat,
            name,
            node_type or DEFAULT_NODE_TYPE,
            json.dumps(props or {}, ensure_ascii=False, sort_keys=True),
            at.isoformat(),
            at.timestamp(),
        ),
    )
    return Node(
        id=node_id,
        chat_id=scope.write_chat,
        name=name,
        type=node_type or DEFAULT_NODE_TYPE,
        props=dict(props or {}),
        created_at=at.isoformat(),
    )


async def set_props(db: GraphSQL, node: Node, props: dict[str, Any]) -> None:
    # The cached embedding is of the label, so it goes only when the label changes.
    stale = label(node.name, props) != label(node.name, node.props)
    await db.execute(
        "UPDATE graph_nodes SET props = ? WHERE id = ?",
        (json.dumps(props, ensure_ascii=False, sort_keys=True), node.id),
    )
    if stale:
        await db.execute("UPDATE graph_nodes SET vector = NULL, vector_text = NULL WHERE id = ?", (node.id,))
        node.vector = node.vector_text = None
    node.props = props


async def set_topic(db: GraphSQL, node_id: int, vector: np.ndarray) -> None:
    await db.execute(
        "UPDATE graph_nodes SET topic_vector = ? WHERE id = ?",
        (np.asarray(vector, dtype=np.float32).tobytes(), node_id),
    )


async def nodes_in_scope(db: GraphSQL, scope: GraphScope, *, node_type: str | None = None) -> list[Node]:
    where, params = scope.clause()
    sql = f"SELECT {NODE_COLUMNS} FROM graph_nodes WHERE {where}"
    if node_type is not None:
        sql += " AND type = ?"
        params = (*params, node_type)
    rows = await db.fetchall(sql + " ORDER BY created_ts, id", params)
    return [from_row(Node, r, _CONVERT) for r in rows]


async def chat_nodes(
    db: GraphSQL,
    tenant: str,
    chat_id: str,
    *,
    node_type: str,
    where: tuple[str, Sequence[Any]] | None = None,
) -> list[Node]:
    """The nodes of ``node_type`` written in one chat, whoever's graph they are in (a forget of some
    of the chat's messages knows the chat, not the users), that meet ``where`` (a condition and its
    values) if given."""
    condition, values = where or ("1 = 1", ())
    rows = await db.fetchall(
        f"SELECT {NODE_COLUMNS} FROM graph_nodes WHERE tenant = ? AND chat_id = ? AND type = ? "
        f"AND {condition} ORDER BY created_ts, id",
        (tenant, chat_id, node_type, *values),
    )
    return [from_row(Node, r, _CONVERT) for r in rows]


async def delete_orphans(db: GraphSQL, scope: GraphScope) -> int:
    """Delete nodes of ``scope`` that no edge touches any more (after a hard purge)."""
    where, params = scope.clause()
    return await db.execute(
        f"DELETE FROM graph_nodes WHERE {where} AND NOT EXISTS (SELECT 1 FROM graph_edges e "
        "WHERE e.subject_id = graph_nodes.id OR e.object_id = graph_nodes.id)",
        params,
    )
