"""The working memory chain of a chat: TaskNodes linked ``NEXT_TASK`` in creation order, each with
one active ``HAS_STATE`` edge to a StateNode (earlier states stay as superseded edges, so a task's
state history is kept) and ``CONTAINS_INFO`` edges to the nodes it is about.

Task ids are case-insensitive, in every script: ids that differ only in case (``Task_A`` and
``task_a``, ``Задача`` and ``задача``) name one task, which keeps the spelling it was created with.
Otherwise they are exact: ``Task_a`` and ``Task_ab`` are different tasks, and nothing here matches by
substring. (Node names compare case-insensitively too, but fold ASCII letters only; task ids
are compared with :func:`task_key`, the full Unicode case fold, so the rule holds for every id.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import EdgeQuery, close_edges, select_edges
from narrmem_plugins.graph.nodes import (
    Node,
    ensure_node,
    find_node,
    node_columns,
    node_from_row,
    nodes_in_scope,
)
from narrmem_plugins.graph.schema import marks
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import (
    CONTAINS_INFO,
    HAS_STATE,
    NEXT_TASK,
    STATE_PREFIX,
    canonical_name,
    state_node,
)
from narrmem_plugins.graph.writer import TripletDraft, write_triplet

from narrmem.errors import InputError


@dataclass
class TaskView:
    task_id: str
    description: str
    state: str
    created_at: str
    info_nodes: list[str] = field(default_factory=list)
    node: Node | None = None

    def as_dict(self) -> dict[str, Any]:
        # The node is the graph's own row, not part of the task a caller sees.
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "node"}


TASKS_A_QUERY = 2_000
# A task purged whole keeps its node but no active triplet of the chain: it is not in the chain
# (as :func:`task_views` reads it).
_LINKED = (
    "EXISTS (SELECT 1 FROM graph_edges e WHERE e.status = 'active' "
    "AND e.relation IN ('HAS_STATE', 'CONTAINS_INFO', 'NEXT_TASK') "
    "AND (e.subject_id = n.id OR e.object_id = n.id))"
)
_HAS_STATE = (
    "EXISTS (SELECT 1 FROM graph_edges e WHERE e.subject_id = n.id AND e.relation = 'HAS_STATE' "
    "AND e.status = 'active'{state})"
)


async def load_tasks(
    db: GraphSQL, chat: GraphScope, *, state: str | None = None, limit: int | None = None
) -> list[TaskView]:
    """The chat's chain, newest first, with each task's current state and info nodes."""
    nodes = list(reversed(await nodes_in_scope(db, chat, node_type="TaskNode")))
    tasks = await task_views(db, chat, nodes)
    if state is not None:
        tasks = [t for t in tasks if t.state == state]
    return tasks if limit is None else tasks[:limit]


async def newest_tasks(
    db: GraphSQL, chat: GraphScope, *, state: str | None = None, limit: int = 1
) -> list[TaskView]:
    """The chat's newest ``limit`` tasks (in ``state`` if given), newest first, found by the
    database: what a message or a turn needs of a chain of thousands, without reading it whole. A
    task without a state (one a purge took it from, before purges kept states) counts as in
    progress, as :func:`load_tasks` shows it."""
    where, params = chat.clause("n")
    condition = _LINKED
    if state is not None:
        object_name = "(SELECT o.name FROM graph_nodes o WHERE o.id = e.object_id)"
        in_state = _HAS_STATE.format(state=f" AND {object_name} = ?")
        condition = in_state
        params = (*params, state_node(state))
        if state == "in_progress":
            condition = f"({in_state} OR (NOT {_HAS_STATE.format(state='')} AND {_LINKED}))"
    rows = await db.fetchall(
        f"SELECT {node_columns('n')} FROM graph_nodes n WHERE {where} AND n.type = 'TaskNode' "
        f"AND {condition} ORDER BY n.created_ts DESC, n.id DESC LIMIT ?",
        (*params, limit),
    )
    return await task_views(db, chat, [node_from_row(r) for r in rows])


async def task_views(db: GraphSQL, chat: GraphScope, nodes: Sequence[Node]) -> list[TaskView]:
    """``nodes`` (TaskNodes, in the order given) as tasks, each with its current state and info
    nodes; a task purged whole (no active triplet) is left out."""
    if not nodes:
        return []
    by_id = {n.id: n for n in nodes}
    ids = list(by_id)
    # A chunk of tasks a query: a chain of thousands (auto_tasks over months) went past SQLite's
    # limit of bound values, and every message of the chat failed the graph's hook.
    found: dict[int, Any] = {}
    for start in range(0, len(ids), TASKS_A_QUERY):
        part = ids[start : start + TASKS_A_QUERY]
        q = (
            EdgeQuery()
            .where("e.status = 'active'")
            .names_in("e.relation", [HAS_STATE, CONTAINS_INFO, NEXT_TASK])
        )
        q.where(f"e.subject_id IN ({marks(part)}) OR e.object_id IN ({marks(part)})", *part, *part)
        for edge in await select_edges(db, chat, q, order="e.id"):
            found[edge.id] = edge
    states: dict[int, str] = {}
    info: dict[int, list[str]] = {}
    linked: set[int] = set()
    for edge in (found[i] for i in sorted(found)):
        linked.update((edge.subject_id, edge.object_id))
        if edge.relation == HAS_STATE:
            states[edge.subject_id] = edge.object.removeprefix(STATE_PREFIX)
        elif edge.relation == CONTAINS_INFO:
            info.setdefault(edge.subject_id, []).append(edge.object)
    # A task purged whole (memory_purge with whole_tasks) keeps its node but no active triplet: it
    # is gone. One that lost only its state (a purge before purges kept states) still counts, in
    # progress, as it always showed.
    return [
        TaskView(
            task_id=n.name,
            description=str(n.props.get("description", "")),
            state=states.get(n.id, "in_progress"),
            created_at=n.created_at,
            info_nodes=info.get(n.id, []),
            node=n,
        )
        for n in nodes
        if n.id in linked
    ]


async def linked_task_count(db: GraphSQL, chat: GraphScope) -> int:
    """How many tasks the chat's chain holds."""
    where, params = chat.clause("n")
    row = await db.fetchone(
        f"SELECT COUNT(*) FROM graph_nodes n WHERE {where} AND n.type = 'TaskNode' AND {_LINKED}", params
    )
    return int(row[0]) if row else 0


async def tasks_keyed(db: GraphSQL, chat: GraphScope, task_id: str) -> list[TaskView]:
    """The chain's tasks whose id is ``task_id`` as :func:`task_key` compares ids (the full Unicode
    case fold, which SQL cannot do): the names alone are read, then the one or two that match."""
    where, params = chat.clause()
    rows = await db.fetchall(
        f"SELECT id, name FROM graph_nodes WHERE {where} AND type = 'TaskNode' "
        "ORDER BY created_ts DESC, id DESC",
        params,
    )
    ids = tuple(int(r[0]) for r in rows if task_key(str(r[1])) == task_key(task_id))
    if not ids:
        return []
    rows = await db.fetchall(
        f"SELECT {node_columns('n')} FROM graph_nodes n WHERE n.id IN ({marks(ids)}) "
        "ORDER BY n.created_ts DESC, n.id DESC",
        ids,
    )
    return await task_views(db, chat, [node_from_row(r) for r in rows])


async def create_task(
    db: GraphSQL,
    chat: GraphScope,
    task_id: str,
    description: str,
    info_nodes: Sequence[str],
    at: datetime,
    *,
    source: str = "tool",
    provenance: Sequence[str] = ("tool",),
    actor: str = "task_create",
    props: dict[str, Any] | None = None,
) -> tuple[TaskView, str | None]:
    """Create ``task_id`` after the chat's newest task, in progress; returns it and its predecessor."""
    existing = await find_node(db, chat, task_id)
    same = await tasks_keyed(db, chat, task_id)
    if existing is None and same:
        existing = same[0].node
    purged = existing is not None and existing.type == "TaskNode" and not same
    if existing is not None and not purged:
        what = "task" if existing.type == "TaskNode" else f"node ({existing.type})"
        raise InputError(f"a {what} named '{existing.name}' already exists in this chat", field="task_id")
    if existing is not None:
        # A task purged whole keeps its node (and the history of its triplets): its id is free again,
        # and the task made with it is the newest of the chain.
        await renew_task_node(db, existing, {"description": description, **(props or {})}, at)
    newest = await newest_tasks(db, chat)
    previous = newest[0].task_id if newest else None
    node = await ensure_node(
        db,
        chat,
        task_id,
        "TaskNode",
        at,
        field_name="task_id",
        props={"description": description, **(props or {})},
    )
    drafts = [TripletDraft(task_id, HAS_STATE, state_node("in_progress"), "TaskNode", "StateNode")]
    if previous is not None:
        drafts.append(TripletDraft(previous, NEXT_TASK, task_id, "TaskNode", "TaskNode"))
    for raw in info_nodes:
        # A name nobody wrote yet becomes an InfoNode; an existing node keeps its type.
        name = canonical_name(raw, chat.user_id)
        known = await find_node(db, chat, name)
        drafts.append(TripletDraft(task_id, CONTAINS_INFO, name, "TaskNode", None if known else "InfoNode"))
    for draft in drafts:
        await write_triplet(db, chat, draft, source=source, provenance=provenance, at=at, actor=actor)
    return await find_task(db, chat, node.name), previous


async def renew_task_node(db: GraphSQL, node: Node, props: dict[str, Any], at: datetime) -> None:
    await db.execute(
        "UPDATE graph_nodes SET props = ?, created_at = ?, created_ts = ? WHERE id = ?",
        (json.dumps(props, ensure_ascii=False, sort_keys=True), at.isoformat(), at.timestamp(), node.id),
    )
    # The task made again follows no message yet: those of the one purged are not its, nor is
    # their topic.
    await db.execute("DELETE FROM graph_task_messages WHERE task_id = ?", (node.id,))
    await db.execute("UPDATE graph_nodes SET topic_vector = NULL WHERE id = ?", (node.id,))


async def find_task(db: GraphSQL, chat: GraphScope, task_id: str) -> TaskView:
    """The task ``task_id`` names in the chat (case-insensitively), or an InputError on ``task_id``."""
    for task in await tasks_keyed(db, chat, task_id):
        return task
    raise InputError(f"no task '{task_id}' in this chat", field="task_id")


def task_key(task_id: str) -> str:
    """What two task ids must share to name one task: the id, case-folded."""
    return task_id.casefold()


async def set_state(
    db: GraphSQL,
    chat: GraphScope,
    task_id: str,
    state: str,
    at: datetime,
    *,
    source: str = "tool",
    provenance: Sequence[str] = ("tool",),
) -> tuple[TaskView, str, bool]:
    """Move exactly ``task_id`` to ``state``: the old HAS_STATE edge is superseded by the new one."""
    task = await find_task(db, chat, task_id)
    return await move_task(db, chat, task, state, at, source=source, provenance=provenance)


async def move_task(
    db: GraphSQL,
    chat: GraphScope,
    task: TaskView,
    state: str,
    at: datetime,
    *,
    source: str = "tool",
    provenance: Sequence[str] = ("tool",),
) -> tuple[TaskView, str, bool]:
    """:func:`set_state` of a task already read."""
    previous = task.state
    if previous == state:
        return task, previous, False
    assert task.node is not None
    q = EdgeQuery().where("e.status = 'active'").where("e.relation = ?", HAS_STATE)
    q.where("e.subject_id = ?", task.node.id)
    old = await select_edges(db, chat, q)
    outcome = await write_triplet(
        db,
        chat,
        TripletDraft(task.node.name, HAS_STATE, state_node(state), "TaskNode", "StateNode"),
        source=source,
        provenance=provenance,
        at=at,
        actor="task_set_state",
    )
    await close_edges(db, [e.id for e in old if e.id != outcome.edge.id], "superseded", at, outcome.edge.id)
    task.state = state
    return task, previous, True
