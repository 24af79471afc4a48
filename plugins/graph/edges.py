"""Edges (triplets): select them through a scope with filters, insert, confirm and close them.

Every select joins both nodes *within the edge's own scope* and filters the edge by the caller's
scope, so no statement here can return another user's triplet.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.nodes import Node
from narrmem_plugins.graph.schema import chunks, from_row, marks, name_marks
from narrmem_plugins.graph.scope import GraphScope

MAX_PROVENANCE = 20  # message ids kept per triplet: the first ones and the latest

_SELECT = (
    "SELECT e.id, e.chat_id, s.name, s.type, e.relation, o.name, o.type, e.confidence, e.speculative, "
    "e.status, e.source, e.provenance, e.valid_from, e.valid_to, e.superseded_by, e.count, e.last_seen, "
    "e.valid_from_ts, e.last_seen_ts, e.subject_id, e.object_id "
    "FROM graph_edges e "
    "JOIN graph_nodes s ON s.id = e.subject_id AND s.tenant = e.tenant AND s.user_id = e.user_id "
    "AND s.chat_id = e.chat_id "
    "JOIN graph_nodes o ON o.id = e.object_id AND o.tenant = e.tenant AND o.user_id = e.user_id "
    "AND o.chat_id = e.chat_id"
)


# How the columns of ``_SELECT`` the database does not hand back as the field's type are read
# (the others are taken as they come).
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "id": int,
    "confidence": float,
    "speculative": bool,
    "provenance": lambda text: list(json.loads(text)),
    "count": int,
    "valid_from_ts": float,
    "last_seen_ts": float,
    "subject_id": int,
    "object_id": int,
}


@dataclass
class Edge:
    id: int
    chat_id: str
    subject: str
    subject_type: str
    relation: str
    object: str
    object_type: str
    confidence: float
    speculative: bool
    status: str
    source: str
    provenance: list[str]
    valid_from: str
    valid_to: str | None
    superseded_by: int | None
    count: int
    last_seen: str
    valid_from_ts: float = 0.0
    last_seen_ts: float = 0.0
    subject_id: int = 0
    object_id: int = 0

    @property
    def superseded_at(self) -> str | None:
        """When a newer statement replaced this one (a new value of a functional relation, or a
        contradiction); ``None`` while it holds or when it was deleted instead."""
        return self.valid_to if self.status == "superseded" else None

    @property
    def key(self) -> tuple[str, str, str]:
        """What a triplet says, whatever chat it was said in (names compare case-insensitively)."""
        return (self.subject.lower(), self.relation, self.object.lower())


@dataclass
class EdgeQuery:
    """Conditions on edges, joined with AND: an empty condition list would select the whole scope,
    so callers that must not widen (purge) check for that themselves."""

    conditions: list[str] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)

    def where(self, sql: str, *params: Any) -> EdgeQuery:
        self.conditions.append(sql)
        self.params.extend(params)
        return self

    def names_in(self, column: str, names: Sequence[str | int]) -> EdgeQuery:
        return self.where(f"{column} IN ({marks(names)})", *names)

    def node_names_in(self, column: str, names: Sequence[str]) -> EdgeQuery:
        """``column`` (a node's name) is one of ``names``, compared as names compare."""
        return self.where(f"nocase({column}) IN ({name_marks(names)})", *names)


async def select_edges(
    db: GraphSQL,
    scope: GraphScope,
    query: EdgeQuery | None = None,
    *,
    order: str = "e.last_seen_ts DESC, e.id DESC",
    limit: int | None = None,
) -> list[Edge]:
    where, params = scope.clause("e")
    conditions = [where, *(query.conditions if query else [])]
    values: list[Any] = [*params, *(query.params if query else [])]
    sql = f"{_SELECT} WHERE {' AND '.join(f'({c})' for c in conditions)} ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT ?"
        values.append(limit)
    return [from_row(Edge, r, _CONVERT) for r in await db.fetchall(sql, values)]


async def touching(
    db: GraphSQL, scope: GraphScope, names: Sequence[str], query: EdgeQuery, limit: int
) -> list[Edge]:
    """Edges matching ``query`` whose subject or object is one of ``names``, newest first."""
    found: dict[int, Edge] = {}
    for part in chunks(list(names)):
        q = EdgeQuery(list(query.conditions), list(query.params))
        q.where(
            f"nocase(s.name) IN ({name_marks(part)}) OR nocase(o.name) IN ({name_marks(part)})", *part, *part
        )
        for edge in await select_edges(db, scope, q, limit=limit):
            found[edge.id] = edge
    return sorted(found.values(), key=lambda e: (-e.last_seen_ts, -e.id))[:limit]


async def active_between(
    db: GraphSQL, scope: GraphScope, subject: Node, relation: str, obj: Node
) -> Edge | None:
    q = EdgeQuery().where("e.status = 'active'").where("e.subject_id = ?", subject.id)
    q.where("e.relation = ?", relation).where("e.object_id = ?", obj.id)
    found = await select_edges(db, scope.writing(), q, limit=1)
    return found[0] if found else None


async def insert_edge(
    db: GraphSQL,
    scope: GraphScope,
    subject: Node,
    relation: str,
    obj: Node,
    *,
    confidence: float,
    speculative: bool,
    source: str,
    provenance: Sequence[str],
    at: datetime,
) -> Edge:
    """Write a new active triplet; returns it as :func:`select_edges` would read it."""
    edge = Edge(
        id=0,
        chat_id=scope.write_chat,
        subject=subject.name,
        subject_type=subject.type,
        relation=relation,
        object=obj.name,
        object_type=obj.type,
        confidence=float(confidence),
        speculative=speculative,
        status="active",
        source=source,
        provenance=list(provenance),
        valid_from=at.isoformat(),
        valid_to=None,
        superseded_by=None,
        count=1,
        last_seen=at.isoformat(),
        valid_from_ts=at.timestamp(),
        last_seen_ts=at.timestamp(),
        subject_id=subject.id,
        object_id=obj.id,
    )
    edge.id = await db.insert(
        "INSERT INTO graph_edges (tenant, user_id, chat_id, subject_id, relation, object_id, confidence, "
        "speculative, status, source, provenance, valid_from, valid_from_ts, last_seen, last_seen_ts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            scope.tenant,
            scope.user_id,
            edge.chat_id,
            edge.subject_id,
            relation,
            edge.object_id,
            edge.confidence,
            int(speculative),
            edge.status,
            source,
            json.dumps(edge.provenance, ensure_ascii=False),
            edge.valid_from,
            edge.valid_from_ts,
            edge.last_seen,
            edge.last_seen_ts,
        ),
    )
    return edge


async def confirm_edge(
    db: GraphSQL, edge: Edge, *, confidence: float, speculative: bool, provenance: Sequence[str], at: datetime
) -> None:
    """Stating a triplet again: one more count, seen now; said plainly it stops being speculation.
    A message that stated it already does not count again: its hooks run a second time after a
    crash (or its write is retried), and the fact would read as confirmed by it twice."""
    # ``edge`` was read in this transaction, and graph writes take turns: its values are current.
    messages = [item for item in provenance if item != TOOL_PROVENANCE]
    again = 0 if messages and all(item in edge.provenance for item in messages) else 1
    merged = _merge_provenance(edge.provenance, provenance)
    seen = max(edge.last_seen_ts, at.timestamp())
    edge.confidence = max(edge.confidence, confidence)
    edge.speculative = edge.speculative and speculative
    await db.execute(
        "UPDATE graph_edges SET count = count + ?, confidence = ?, speculative = ?, provenance = ?, "
        "last_seen = ?, last_seen_ts = ? WHERE id = ?",
        (
            again,
            edge.confidence,
            int(edge.speculative),
            json.dumps(merged, ensure_ascii=False),
            at.isoformat() if seen == at.timestamp() else edge.last_seen,
            seen,
            edge.id,
        ),
    )
    edge.count += again
    edge.provenance = merged
    if seen == at.timestamp():
        edge.last_seen, edge.last_seen_ts = at.isoformat(), seen


async def close_edges(
    db: GraphSQL, ids: Sequence[int], status: str, at: datetime, superseded_by: int | None = None
) -> None:
    """Mark active edges deleted or superseded as of ``at`` (they stay, with their history)."""
    for part in chunks(list(ids)):
        await db.execute(
            f"UPDATE graph_edges SET status = ?, valid_to = ?, valid_to_ts = ?, superseded_by = ? "
            f"WHERE status = 'active' AND id IN ({marks(part)})",
            (status, at.isoformat(), at.timestamp(), superseded_by, *part),
        )


async def set_superseded_by(db: GraphSQL, ids: Sequence[int], new_id: int) -> None:
    for part in chunks(list(ids)):
        await db.execute(
            f"UPDATE graph_edges SET superseded_by = ? WHERE id IN ({marks(part)})", (new_id, *part)
        )


async def delete_edges(db: GraphSQL, ids: Sequence[int]) -> int:
    deleted = 0
    for part in chunks(list(ids)):
        deleted += await db.execute(f"DELETE FROM graph_edges WHERE id IN ({marks(part)})", tuple(part))
    return deleted


# What a triplet written through a tool (not stated by a message) has for provenance.
TOOL_PROVENANCE = "tool"


def _merge_provenance(old: Sequence[str], new: Sequence[str]) -> list[str]:
    merged = list(old)
    for item in new:
        if item not in merged:
            merged.append(item)
    if len(merged) > MAX_PROVENANCE:
        # Keep where it came from first and what confirmed it last.
        merged = merged[: MAX_PROVENANCE // 2] + merged[-(MAX_PROVENANCE // 2) :]
    return merged
