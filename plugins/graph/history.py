"""The purge history: every purge and every supersession leaves a row saying who, when, with which
filters, and which triplets it touched. A hard purge records ids only, since its point is to erase."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import Edge
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
