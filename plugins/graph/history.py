"""The purge history: every purge and every supersession leaves a row saying who, when, with which
filters, and which triplets it touched. A hard purge records ids only, since its point is to erase;
a deleted message takes out of it what the message stated (:func:`forget_statements`)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.citing import any_text
from narrmem_plugins.graph.edges import Edge
from narrmem_plugins.graph.schema import chunks, marks
from narrmem_plugins.graph.scope import GraphScope


async def record(
    db: GraphSQL,
    scope: GraphScope,
    *,
    mode: str,
    actor: str,
    filters: dict[str, Any],
    edges: Sequence[Edge],
    at: datetime,
    new_edge_id: int | None = None,
) -> int:
    touched: list[Any]
    if mode == "hard":
        touched = [e.id for e in edges]
        # The filters' values are the words erased ("object": "rock"): the record keeps their keys.
        filters = dict.fromkeys(filters)
    else:
        touched = [
            {
                "id": e.id,
                "chat_id": e.chat_id,
                "subject": e.subject,
                "relation": e.relation,
                "object": e.object,
            }
            for e in edges
        ]
    return await db.insert(
        "INSERT INTO graph_purges (tenant, user_id, chat_id, mode, actor, filters, edges, new_edge_id, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            scope.tenant,
            scope.user_id,
            scope.chat_id,
            mode,
            actor,
            json.dumps(filters, ensure_ascii=False, sort_keys=True),
            json.dumps(touched, ensure_ascii=False),
            new_edge_id,
            at.isoformat(),
        ),
    )


async def forget_statements(
    db: GraphSQL,
    tenant: str,
    chat_id: str,
    users: Collection[str],
    *,
    erased: Collection[int],
    messages: Collection[str],
    chat_edges: Collection[int],
) -> None:
    """Take what deleted ``messages`` of ``chat_id`` stated out of the history: a supersession
    their triplet made goes (its filters are that triplet), the triplets ``erased`` leave the rows
    that name them (a row naming nothing else goes), and a row they wrote no longer names them."""
    # ``users`` may be none (no triplet names the messages any more, a hard purge took it): the
    # chat's records they wrote still name them.
    erased, chat_edges = set(erased), set(chat_edges)
    actors = {f"message:{mid}" for mid in messages}
    rows = await _records_naming(db, tenant, chat_id, sorted(users), sorted(erased), sorted(actors))
    for purge_id, row_chat, actor, edges, new_edge_id in rows:
        kept = await _without(db, purge_id, edges, new_edge_id, erased)
        if kept is None:
            continue
        # A supersession across the user's chats is recorded without a chat: its new triplet says
        # whether the message it names is of this chat.
        ours = row_chat == chat_id or (new_edge_id is not None and int(new_edge_id) in chat_edges)
        by = "message" if actor in actors and ours else actor
        if kept != json.loads(edges) or by != actor:
            await db.execute(
                "UPDATE graph_purges SET actor = ?, edges = ? WHERE id = ?",
                (by, json.dumps(kept, ensure_ascii=False), purge_id),
            )


async def forget_triplets(db: GraphSQL, tenant: str, user_id: str, erased: Collection[int]) -> None:
    """Take the triplets a hard purge erased out of their user's history records: the supersession
    that made one goes (its filters are that triplet's words), and the rows that name one no
    longer do (a row naming nothing else goes). A hard purge is there to erase: before, the
    records of earlier purges and supersessions kept the erased triplets' words."""
    gone = sorted(set(erased))
    probes = [(f"new_edge_id IN ({marks(part)})", tuple(part)) for part in chunks(gone)]
    probes += list(any_text("edges", [str(edge_id) for edge_id in gone]))
    found: dict[int, tuple[Any, ...]] = {}
    for clause, values in probes:
        for row in await db.fetchall(f"{_RECORDS}user_id = ? AND {clause}", (tenant, user_id, *values)):
            found[int(row[0])] = row
    for purge_id, _, _, edges, new_edge_id in (found[i] for i in sorted(found)):
        kept = await _without(db, purge_id, edges, new_edge_id, set(gone))
        if kept is not None and kept != json.loads(edges):
            await db.execute(
                "UPDATE graph_purges SET edges = ? WHERE id = ?",
                (json.dumps(kept, ensure_ascii=False), purge_id),
            )


async def _without(
    db: GraphSQL, purge_id: int, edges: str, new_edge_id: int | None, erased: set[int]
) -> list[Any] | None:
    """A record's triplets without ``erased``; ``None`` when the record went instead: its new
    triplet is erased, or it named nothing else."""
    touched = json.loads(edges)
    # A hard purge's row holds bare ids: the triplets it erased, never these.
    kept = [e for e in touched if not (isinstance(e, dict) and int(e.get("id", 0)) in erased)]
    if (new_edge_id is not None and int(new_edge_id) in erased) or (touched and not kept):
        await db.execute("DELETE FROM graph_purges WHERE id = ?", (purge_id,))
        return None
    return kept


_RECORDS = "SELECT id, chat_id, actor, edges, new_edge_id FROM graph_purges WHERE tenant = ? AND "


async def _records_naming(
    db: GraphSQL, tenant: str, chat_id: str, users: list[str], erased: list[int], actors: list[str]
) -> list[tuple[Any, ...]]:
    """The records of the chat, and the chatless ones of ``users``, that one of ``actors`` wrote,
    whose new triplet is ``erased`` or that may name an ``erased`` triplet (the database finds the
    id's digits in the record's text; the caller reads the record to be sure). A group chat's
    other records, everyone's supersessions, are not read."""
    probes: list[tuple[str, tuple[Any, ...]]] = [
        (f"actor IN ({marks(part)})", tuple(part)) for part in chunks(actors)
    ]
    probes += [(f"new_edge_id IN ({marks(part)})", tuple(part)) for part in chunks(erased)]
    probes += list(any_text("edges", [str(edge_id) for edge_id in erased]))
    found: dict[int, tuple[Any, ...]] = {}
    for clause, values in probes:
        for row in await db.fetchall(f"{_RECORDS}chat_id = ? AND {clause}", (tenant, chat_id, *values)):
            found[int(row[0])] = row
        # Two reads, not one with OR: SQLite then read every row of the tenant.
        for part in chunks(users):
            for row in await db.fetchall(
                f"{_RECORDS}chat_id IS NULL AND user_id IN ({marks(part)}) AND {clause}",
                (tenant, *part, *values),
            ):
                found[int(row[0])] = row
    return [found[i] for i in sorted(found)]
