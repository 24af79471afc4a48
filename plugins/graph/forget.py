"""What a forget removes from the graph: a user's or a chat's whole graph, or only what some
deleted messages stated (their edges lose those messages as provenance, and an edge no message
supports any more goes, with the nodes nothing links to then)."""

from __future__ import annotations

import json

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.schema import chunks, marks

GRAPH_TABLES = ("graph_edges", "graph_nodes", "graph_purges")
# Nodes the task chain and persona keep on purpose, whether or not an edge links them.
KEPT_WHEN_UNLINKED = ("PersonaNode", "TaskNode", "StateNode")


async def forget_scope(db: GraphSQL, tenant: str, user_id: str | None, chat_id: str | None) -> None:
    clauses, params = ["tenant = ?"], [tenant]
    for column, value in (("user_id", user_id), ("chat_id", chat_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = " AND ".join(clauses)
    for table in GRAPH_TABLES:
        await db.execute(f"DELETE FROM {table} WHERE {where}", params)
    if user_id is None and chat_id is not None:
        # A supersession across the user's chats is recorded without a chat; its record still
        # names the triplets of this chat, so it goes too.
        await db.execute(
            "DELETE FROM graph_purges WHERE tenant = ? AND chat_id IS NULL AND instr(edges, ?) > 0",
            (tenant, _chat_mention(chat_id)),
        )


async def forget_messages(db: GraphSQL, tenant: str, chat_id: str, messages: list[str]) -> None:
    gone = set(messages)
    rows = await db.fetchall(
        "SELECT id, provenance, source, user_id FROM graph_edges WHERE tenant = ? AND chat_id = ?",
        (tenant, chat_id),
    )
    dropped: list[int] = []
    for edge_id, provenance, source, _ in rows:
        cited = list(json.loads(provenance))
        kept = [mid for mid in cited if mid not in gone]
        if len(kept) == len(cited):
            continue
        if not kept and source == "message":
            dropped.append(int(edge_id))
        else:
            await db.execute(
                "UPDATE graph_edges SET provenance = ? WHERE id = ?",
                (json.dumps(kept, ensure_ascii=False), edge_id),
            )
    for part in chunks(dropped):
        await db.execute(f"DELETE FROM graph_edges WHERE id IN ({marks(part)})", tuple(part))
    if dropped:
        await db.execute(
            "DELETE FROM graph_nodes WHERE tenant = ? AND chat_id = ? "
            f"AND type NOT IN ({marks(KEPT_WHEN_UNLINKED)}) AND NOT EXISTS (SELECT 1 FROM graph_edges e "
            "WHERE e.subject_id = graph_nodes.id OR e.object_id = graph_nodes.id)",
            (tenant, chat_id, *KEPT_WHEN_UNLINKED),
        )


def _chat_mention(chat_id: str) -> str:
    return json.dumps({"chat_id": chat_id}, ensure_ascii=False)[1:-1]
