"""What a task of the working memory chain holds of the messages it followed.

``auto_tasks`` records them in order, a row each of ``graph_task_messages`` (a task of a store
from before 2026-12-07 may still name its first ones in its props, ``message_ids``, until it
follows one more), and for a task it started, the one whose opening is the description
(``described_by``, in its props). The topic is the running
mean of their vectors. When some of them are deleted, :func:`remake` works the description and the
topic out again from the messages left (read back from the store), so no word or vector of a
deleted message stays in the task; a task ``auto_tasks`` started with no message left goes whole.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from narrmem_plugins.graph import citing
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.nodes import Node, chat_nodes
from narrmem_plugins.graph.schema import chunks, marks
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import HAS_STATE, label

from narrmem.models import Scope
from narrmem.store import Store
from narrmem.view import MemoryView

MAX_WEIGHT = 20  # the topic follows the last ~20 messages rather than freezing on the first ones
DESCRIPTION_CHARS = 80


def unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm else vector


def continued(topic: np.ndarray, messages: int, vector: np.ndarray) -> tuple[np.ndarray, int]:
    """A task's topic and message count once one more message (``vector``) follows it."""
    weight = min(messages, MAX_WEIGHT)
    return unit(topic * weight + vector), weight + 1


def opening(text: str) -> str:
    """The description a task started from a message gets: the message's opening words."""
    return " ".join(text.split())[:DESCRIPTION_CHARS]


def followed(props: dict[str, Any]) -> list[str]:
    """The messages a task's props still name (a task whose messages were recorded there, before
    ``graph_task_messages``), oldest first."""
    return [str(mid) for mid in props.get("message_ids", [])]


async def messages_followed(db: GraphSQL, node: Node) -> list[str]:
    """The messages whose vectors are in a task's topic, oldest first: those its props still
    name, then its rows of ``graph_task_messages``."""
    rows = await db.fetchall(
        "SELECT message_id FROM graph_task_messages WHERE task_id = ? ORDER BY id", (node.id,)
    )
    return [*followed(node.props), *(str(r[0]) for r in rows)]


async def follow(db: GraphSQL, node: Node, scope: GraphScope, message_ids: Sequence[str]) -> None:
    """Record that the task ``node`` followed ``message_ids`` (after those it followed before): a
    row each. A list its props still hold moves into the rows first, once."""
    earlier = followed(node.props)
    if "message_ids" in node.props:
        node.props = {k: v for k, v in node.props.items() if k != "message_ids"}
        await db.execute(
            "UPDATE graph_nodes SET props = ? WHERE id = ?",
            (json.dumps(node.props, ensure_ascii=False, sort_keys=True), node.id),
        )
    await db.executemany(
        "INSERT INTO graph_task_messages (tenant, user_id, chat_id, task_id, message_id) "
        "VALUES (?, ?, ?, ?, ?)",
        [(scope.tenant, scope.user_id, scope.write_chat, node.id, mid) for mid in [*earlier, *message_ids]],
    )


@dataclass
class CitingTask:
    """A task that followed some deleted messages, with every message it followed."""

    node: Node
    followed: list[str]


@dataclass
class TaskRemake:
    """A task some of whose messages are deleted, as it is without them."""

    node: Node
    props: dict[str, Any]
    topic: np.ndarray | None  # None: worked out from the label when next needed
    left: list[str]  # the messages it followed that are not deleted, oldest first

    @property
    def gone(self) -> bool:
        """Started from messages that are all deleted: nothing is left to say what it is about."""
        return "described_by" in self.node.props and not self.left

    @property
    def new_describer(self) -> tuple[str, str] | None:
        """(the deleted message the description came from, the message it comes from now)."""
        old, new = self.node.props.get("described_by"), self.props.get("described_by")
        return (str(old), str(new)) if old and new and old != new else None


async def tasks_citing(
    db: GraphSQL, tenant: str, chat_id: str, messages: Collection[str]
) -> list[CitingTask]:
    """The chat's tasks that followed any of ``messages``."""
    gone = set(messages)
    found = []
    for node in await _tasks_naming(db, tenant, chat_id, gone):
        every = await messages_followed(db, node)
        if not every and "messages" in node.props and "message_ids" not in node.props:
            every = await _recorded_start(db, node)
        if gone.intersection(every):
            found.append(CitingTask(node, every))
    return found


async def _tasks_naming(db: GraphSQL, tenant: str, chat_id: str, messages: set[str]) -> list[Node]:
    """The chat's tasks with a row of ``graph_task_messages`` for one of ``messages``, those whose
    props name one of them (recorded there before the rows), and those ``auto_tasks`` started
    before tasks recorded their messages (:func:`_recorded_start`); every task of the chat
    that has no rows when a message id is one the text search could miss
    (:func:`.citing.searchable`)."""
    found: dict[int, Node] = {}
    for part in chunks(sorted(messages)):
        rows = await db.fetchall(
            "SELECT DISTINCT task_id FROM graph_task_messages WHERE tenant = ? AND chat_id = ? "
            f"AND message_id IN ({marks(part)})",
            (tenant, chat_id, *part),
        )
        ids = tuple(int(r[0]) for r in rows)
        if ids:
            for node in await chat_nodes(
                db, tenant, chat_id, node_type="TaskNode", where=(f"id IN ({marks(ids)})", ids)
            ):
                found[node.id] = node
    # Tasks with no rows: from before the rows, where the props told the messages, if any.
    rowless = "NOT EXISTS (SELECT 1 FROM graph_task_messages m WHERE m.task_id = graph_nodes.id)"
    if not citing.searchable(messages):
        for node in await chat_nodes(db, tenant, chat_id, node_type="TaskNode", where=(rowless, ())):
            found.setdefault(node.id, node)
        return list(found.values())
    # A task from before tasks recorded their messages counts them ("messages") and names none.
    unrecorded = "(instr(props, '\"messages\"') > 0 AND instr(props, '\"message_ids\"') = 0)"
    for clause, texts in citing.any_text("props", citing.quoted(messages)):
        for node in await chat_nodes(
            db,
            tenant,
            chat_id,
            node_type="TaskNode",
            where=(f"{rowless} AND ({clause} OR {unrecorded})", texts),
        ):
            found.setdefault(node.id, node)
    return list(found.values())


async def _recorded_start(db: GraphSQL, node: Node) -> list[str]:
    """A task ``auto_tasks`` started before tasks recorded their messages: the message that
    started it is the provenance of its first state, the only one known. That message becomes
    what it is described by."""
    row = await db.fetchone(
        "SELECT provenance FROM graph_edges WHERE subject_id = ? AND relation = ? AND source = 'auto' "
        "ORDER BY valid_from_ts, id LIMIT 1",
        (node.id, HAS_STATE),
    )
    if row is None:
        return []
    started = [str(mid) for mid in json.loads(row[0])][:1]
    if started:
        node.props = {**node.props, "described_by": started[0]}
    return started


async def remake(
    memory: MemoryView, tenant: str, chat_id: str, task: CitingTask, messages: Collection[str]
) -> TaskRemake:
    """The task without ``messages``: its topic replayed from the messages left, and, when its
    description was the opening of a deleted message, the opening of the first one left."""
    node = task.node
    left = [mid for mid in task.followed if mid not in messages]
    texts, vectors = await _episodes(memory.store, tenant, chat_id, left)
    props: dict[str, Any] = {k: v for k, v in node.props.items() if k != "message_ids"}
    topic: np.ndarray | None = None
    count = 0
    if "described_by" not in node.props:
        # A task the tools made: its topic began as its description's embedding.
        [base] = await memory.embedder.embed([label(node.name, node.props)])
        topic, count = unit(np.asarray(base, dtype=np.float32)), 1
    for mid in left:
        if mid in vectors:
            vector = unit(vectors[mid])
            topic, count = (vector, 1) if topic is None else continued(topic, count, vector)
    props["messages"] = max(count, 1)
    if not left:
        # Says the task's messages are recorded (none left), unlike one from before tasks recorded
        # them, whose first message is looked up (:func:`_recorded_start`): a task the tools made
        # and auto_tasks followed was taken for one, and a later forget deleted it whole.
        props["message_ids"] = []
    if "described_by" in node.props and node.props["described_by"] in messages:
        describer = next((mid for mid in left if mid in texts), left[0] if left else None)
        props["described_by"] = describer
        props["description"] = opening(texts.get(describer, "")) if describer else ""
    return TaskRemake(node, props, topic, left)


async def _episodes(
    store: Store, tenant: str, chat_id: str, messages: Sequence[str]
) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The text and the vector of each message's episode, by message id (a message whose episode
    is no longer stored is absent)."""
    if not messages:
        return {}, {}
    records = await store.get(await store.from_messages(tenant, chat_id, messages), None)
    episodes = {
        r.message_ids[0]: r.id
        for r in records.values()
        if r.kind == "episode" and len(r.message_ids) == 1 and r.id is not None
    }
    texts = {mid: records[rid].text for mid, rid in episodes.items()}
    stored = await store.vectors(list(episodes.values()), Scope(tenant=tenant, chat_id=chat_id))
    vectors = {
        mid: np.asarray(stored[rid], dtype=np.float32) for mid, rid in episodes.items() if rid in stored
    }
    return texts, vectors
