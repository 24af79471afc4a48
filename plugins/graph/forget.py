"""What a forget removes from the graph: a user's or a chat's whole graph, or only what some
deleted messages stated. Their edges lose those messages as provenance, and an edge no message
supports any more goes, with the nodes nothing links to then and what the purge history says of
it. A task the messages started goes with them, the chain joined around it; one they only
followed keeps the rest (:mod:`.task_topics`); a task whose state they set is back as it was."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from narrmem_plugins.graph import citing, history
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import delete_edges
from narrmem_plugins.graph.nodes import set_props, set_topic
from narrmem_plugins.graph.schema import chunks, marks
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.task_topics import TaskRemake
from narrmem_plugins.graph.tasks import set_state
from narrmem_plugins.graph.vocabulary import HAS_STATE, NEXT_TASK, state_node

GRAPH_TABLES = ("graph_task_messages", "graph_edges", "graph_nodes", "graph_purges")
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


@dataclass
class _EdgeRow:
    id: int
    user_id: str
    relation: str
    status: str
    source: str
    provenance: list[str]
    subject_id: int
    object_id: int


async def forget_messages(
    db: GraphSQL, tenant: str, chat_id: str, messages: list[str], tasks: Sequence[TaskRemake] = ()
) -> None:
    """What ``messages`` stated goes: their triplets, what the history says of them, and the tasks
    ``tasks`` (made by :func:`.task_topics.remake` beforehand: it reads the store) without them."""
    gone = set(messages)
    doomed = {t.node.id for t in tasks if t.gone}
    # A task that stays, started from a deleted message, stands on the message it is described by
    # now: so do the automatic triplets that started it (its state, its link in the chain).
    restarted = dict(t.new_describer for t in tasks if t.new_describer is not None)
    edges = await _edges_concerned(db, tenant, chat_id, gone, doomed)
    relinked = _chain_around(edges, doomed)
    erased: list[_EdgeRow] = []
    for edge in edges:
        if edge.id not in relinked and (edge.subject_id in doomed or edge.object_id in doomed):
            erased.append(edge)
            continue
        kept = _provenance_without(edge, gone, restarted if edge.source == "auto" else {})
        if kept == edge.provenance:
            continue
        if not kept and edge.source in ("message", "auto"):
            erased.append(edge)
        else:
            await db.execute(
                "UPDATE graph_edges SET provenance = ? WHERE id = ?",
                (json.dumps(kept, ensure_ascii=False), edge.id),
            )
    for edge_id, subject_id in relinked.items():
        await db.execute("UPDATE graph_edges SET subject_id = ? WHERE id = ?", (subject_id, edge_id))
    await delete_edges(db, [e.id for e in erased])
    await _restore_states(db, {e.subject_id for e in erased if _was_state(e)} - doomed)
    await _remake_tasks(db, [t for t in tasks if not t.gone], gone)
    for part in chunks(sorted(doomed)):
        await db.execute(f"DELETE FROM graph_nodes WHERE id IN ({marks(part)})", tuple(part))
    await history.forget_statements(
        db,
        tenant,
        chat_id,
        sorted({e.user_id for e in edges}),
        erased=[e.id for e in erased],
        messages=gone,
        chat_edges=[e.id for e in edges],
    )
    # Only an erased triplet's ends can have lost their last link.
    ends = sorted({end for e in erased for end in (e.subject_id, e.object_id)} - doomed)
    for part in chunks(ends):
        await db.execute(
            f"DELETE FROM graph_nodes WHERE id IN ({marks(part)}) "
            f"AND type NOT IN ({marks(KEPT_WHEN_UNLINKED)}) AND NOT EXISTS (SELECT 1 FROM graph_edges e "
            "WHERE e.subject_id = graph_nodes.id OR e.object_id = graph_nodes.id)",
            (*part, *KEPT_WHEN_UNLINKED),
        )


_EDGE_COLUMNS = (
    "SELECT id, user_id, relation, status, source, provenance, subject_id, object_id "
    "FROM graph_edges WHERE tenant = ? AND chat_id = ?"
)


async def _edges_concerned(
    db: GraphSQL, tenant: str, chat_id: str, gone: set[str], doomed: set[int]
) -> list[_EdgeRow]:
    """The chat's triplets that cite a message of ``gone`` or link a task of ``doomed``: the only
    ones a forget of these messages changes (the chat's other triplets, in a group everyone's, are
    not read). With a message id the text search could miss (:func:`.citing.searchable`), all the
    chat's triplets."""
    if not citing.searchable(gone):
        rows = await db.fetchall(_EDGE_COLUMNS, (tenant, chat_id))
    else:
        rows = []
        for clause, texts in citing.any_text("provenance", citing.quoted(gone)):
            rows += await db.fetchall(f"{_EDGE_COLUMNS} AND {clause}", (tenant, chat_id, *texts))
        for part in chunks(sorted(doomed)):
            ids = tuple(part)
            rows += await db.fetchall(
                f"{_EDGE_COLUMNS} AND (subject_id IN ({marks(ids)}) OR object_id IN ({marks(ids)}))",
                (tenant, chat_id, *ids, *ids),
            )
    found = {
        int(r[0]): _EdgeRow(int(r[0]), r[1], r[2], r[3], r[4], list(json.loads(r[5])), int(r[6]), int(r[7]))
        for r in rows
    }
    return [found[i] for i in sorted(found)]


def _provenance_without(edge: _EdgeRow, gone: set[str], restarted: dict[str, str]) -> list[str]:
    kept: list[str] = []
    for cited in edge.provenance:
        mid = restarted.get(cited, cited)
        if mid not in gone and mid not in kept:
            kept.append(mid)
    return kept


def _chain_around(edges: Sequence[_EdgeRow], doomed: set[int]) -> dict[int, int]:
    """The chain joined around the tasks that go: A → B → C without B becomes A → C, the link into
    C kept (C's start made it) with A as its subject. Returns link id → its new subject."""
    links = [e for e in edges if e.relation == NEXT_TASK and e.status == "active"]
    into = {e.object_id: e for e in links}
    relinked: dict[int, int] = {}
    for link in links:
        if link.subject_id not in doomed or link.object_id in doomed:
            continue
        before, seen = link.subject_id, set()
        while before in doomed and before in into and before not in seen:
            seen.add(before)
            before = into[before].subject_id
        if before not in doomed:
            relinked[link.id] = before
    return relinked


def _was_state(edge: _EdgeRow) -> bool:
    return edge.relation == HAS_STATE and edge.status == "active"


async def _restore_states(db: GraphSQL, task_ids: set[int]) -> None:
    """A task whose state a deleted message set is back in the state it had before (a message that
    started another task paused it; one that resumed it had it in progress), paused by the task in
    progress now if there is one, as that task's start would have paused it."""
    for task_id in sorted(task_ids):
        if await db.fetchone(
            "SELECT 1 FROM graph_edges WHERE subject_id = ? AND relation = ? AND status = 'active'",
            (task_id, HAS_STATE),
        ):
            continue
        before = await db.fetchone(
            "SELECT e.id, o.name FROM graph_edges e JOIN graph_nodes o ON o.id = e.object_id "
            "WHERE e.subject_id = ? AND e.relation = ? AND e.status = 'superseded' "
            "ORDER BY e.valid_to_ts DESC, e.id DESC LIMIT 1",
            (task_id, HAS_STATE),
        )
        if before is None:
            continue
        await db.execute(
            "UPDATE graph_edges SET status = 'active', valid_to = NULL, valid_to_ts = NULL, "
            "superseded_by = NULL WHERE id = ?",
            (before[0],),
        )
        if before[1] == state_node("in_progress"):
            await _pause_beside_current(db, task_id)


async def _pause_beside_current(db: GraphSQL, task_id: int) -> None:
    task = await db.fetchone(
        "SELECT tenant, user_id, chat_id, name FROM graph_nodes WHERE id = ?", (task_id,)
    )
    assert task is not None
    tenant, user_id, chat_id, name = task
    current = await db.fetchone(
        "SELECT e.provenance, e.valid_from FROM graph_edges e JOIN graph_nodes o ON o.id = e.object_id "
        "WHERE e.tenant = ? AND e.user_id = ? AND e.chat_id = ? AND e.relation = ? "
        "AND e.status = 'active' AND o.name = ? AND e.subject_id <> ? LIMIT 1",
        (tenant, user_id, chat_id, HAS_STATE, state_node("in_progress"), task_id),
    )
    if current is None:
        return
    provenance, since = current
    chat = GraphScope(tenant, user_id, chat_id)
    at = datetime.fromisoformat(since)
    await set_state(db, chat, name, "paused", at, source="auto", provenance=json.loads(provenance))


async def _remake_tasks(db: GraphSQL, tasks: Sequence[TaskRemake], gone: set[str]) -> None:
    for task in tasks:
        listed = "message_ids" in task.node.props
        await set_props(db, task.node, task.props)
        if listed:
            # Its messages were a list in its props (a store from before the rows): the ones
            # left become its rows (the props keep none).
            await db.executemany(
                "INSERT INTO graph_task_messages (tenant, user_id, chat_id, task_id, message_id) "
                "SELECT tenant, user_id, chat_id, id, ? FROM graph_nodes WHERE id = ?",
                [(mid, task.node.id) for mid in task.left],
            )
        else:
            # Only the deleted messages' rows: a message another worker's task followed since the
            # task was read keeps its row.
            for part in chunks(sorted(gone)):
                await db.execute(
                    f"DELETE FROM graph_task_messages WHERE task_id = ? AND message_id IN ({marks(part)})",
                    (task.node.id, *part),
                )
        if task.topic is None:
            await db.execute("UPDATE graph_nodes SET topic_vector = NULL WHERE id = ?", (task.node.id,))
        else:
            await set_topic(db, task.node.id, task.topic)


def _chat_mention(chat_id: str) -> str:
    return json.dumps({"chat_id": chat_id}, ensure_ascii=False)[1:-1]
