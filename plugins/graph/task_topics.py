"""What a task of the working memory chain holds of the messages it followed.

``auto_tasks`` records them on the task's node, in order (``message_ids``), and for a task it
started, the one whose opening is the description (``described_by``). The topic is the running
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
    """The messages whose vectors are in a task's topic (from its node's props), oldest first."""
    return [str(mid) for mid in props.get("message_ids", [])]


@dataclass
class TaskRemake:
    """A task some of whose messages are deleted, as it is without them."""

    node: Node
    props: dict[str, Any]
    topic: np.ndarray | None  # None: worked out from the label when next needed

    @property
    def gone(self) -> bool:
        """Started from messages that are all deleted: nothing is left to say what it is about."""
        return "described_by" in self.node.props and not followed(self.props)

    @property
    def new_describer(self) -> tuple[str, str] | None:
        """(the deleted message the description came from, the message it comes from now)."""
        old, new = self.node.props.get("described_by"), self.props.get("described_by")
        return (str(old), str(new)) if old and new and old != new else None


async def tasks_citing(db: GraphSQL, tenant: str, chat_id: str, messages: Collection[str]) -> list[Node]:
    """The chat's tasks that followed any of ``messages``."""
    gone = set(messages)
    found = []
    for node in await _tasks_naming(db, tenant, chat_id, gone):
        if "message_ids" not in node.props and "messages" in node.props:
            await _recorded_start(db, node)
        if gone.intersection(followed(node.props)):
            found.append(node)
    return found


async def _tasks_naming(db: GraphSQL, tenant: str, chat_id: str, messages: set[str]) -> list[Node]:
    """The chat's tasks whose props name one of ``messages``, and those ``auto_tasks`` started before
    tasks recorded their messages (:func:`_recorded_start`); every task of the chat when a message
    id is one the text search could miss (:func:`.citing.searchable`)."""
    if not citing.searchable(messages):
        return await chat_nodes(db, tenant, chat_id, node_type="TaskNode")
    # A task from before tasks recorded their messages counts them ("messages") and names none.
    unrecorded = "(instr(props, '\"messages\"') > 0 AND instr(props, '\"message_ids\"') = 0)"
    found: dict[int, Node] = {}
    for clause, texts in citing.any_text("props", citing.quoted(messages)):
        for node in await chat_nodes(
            db, tenant, chat_id, node_type="TaskNode", where=(f"({clause} OR {unrecorded})", texts)
        ):
            found[node.id] = node
    return list(found.values())


async def _recorded_start(db: GraphSQL, node: Node) -> None:
    """A task ``auto_tasks`` started before tasks recorded their messages: the message that
    started it is the provenance of its first state, the only one known."""
    row = await db.fetchone(
        "SELECT provenance FROM graph_edges WHERE subject_id = ? AND relation = ? AND source = 'auto' "
        "ORDER BY valid_from_ts, id LIMIT 1",
        (node.id, HAS_STATE),
    )
    if row is None:
        return
    started = [str(mid) for mid in json.loads(row[0])][:1]
    if started:
        node.props = {**node.props, "message_ids": started, "described_by": started[0]}


async def remake(
    memory: MemoryView, tenant: str, chat_id: str, node: Node, messages: Collection[str]
) -> TaskRemake:
    """``node`` without ``messages``: its topic replayed from the messages left, and, when its
    description was the opening of a deleted message, the opening of the first one left."""
    left = [mid for mid in followed(node.props) if mid not in messages]
    texts, vectors = await _episodes(memory.store, tenant, chat_id, left)
    props: dict[str, Any] = {**node.props, "message_ids": left}
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
    if "described_by" in node.props and node.props["described_by"] in messages:
        describer = next((mid for mid in left if mid in texts), left[0] if left else None)
        props["described_by"] = describer
        props["description"] = opening(texts.get(describer, "")) if describer else ""
    return TaskRemake(node, props, topic)


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
