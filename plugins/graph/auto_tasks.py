"""``auto_tasks``: the working memory chain kept from the messages, for bots whose LLM calls no tools.

Each chat has one task per topic. A stored message whose embedding is within ``topic_similarity``
(cosine) of the in-progress task's topic continues it (the topic is the running mean of its
messages); otherwise the closest paused task within reach is resumed, or a new ``Task_auto_<n>`` is
started with the message's opening as its description. Either way the task that was in progress is
paused. Tasks made by the tools take part too: their topic is their description's embedding.
The task records the messages its topic and description come from (:mod:`.task_topics`, a row
each), so that a deleted message leaves it.
"""

from __future__ import annotations

import numpy as np
from narrmem_plugins.graph.backend import GraphBackend, GraphSQL
from narrmem_plugins.graph.nodes import set_props, set_topic
from narrmem_plugins.graph.options import GraphOptions
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.task_topics import continued, follow, opening, unit
from narrmem_plugins.graph.tasks import (
    TaskView,
    create_task,
    linked_task_count,
    move_task,
    newest_tasks,
    tasks_keyed,
)
from narrmem_plugins.graph.vocabulary import label

from narrmem.models import Message
from narrmem.view import MemoryView


def _label(task: TaskView) -> str:
    return label(task.task_id, {"description": task.description})


async def _topics(memory: MemoryView, tasks: list[TaskView], labels: dict[int, str]) -> dict[int, np.ndarray]:
    """Each task's topic: stored, or its label's embedding (the label noted in ``labels``)."""
    topics: dict[int, np.ndarray] = {}
    missing = []
    for task in tasks:
        assert task.node is not None
        topic = task.node.topic()
        if topic is not None and topic.shape == (memory.embedder.dim,):
            topics[task.node.id] = topic
        else:
            missing.append(task)
    if missing:
        vectors = await memory.embedder.embed([_label(t) for t in missing])
        for task, vector in zip(missing, vectors, strict=True):
            assert task.node is not None
            topics[task.node.id] = unit(np.asarray(vector, dtype=np.float32))
            labels[task.node.id] = _label(task)
    return topics


async def _current(db: GraphSQL, chat: GraphScope) -> TaskView | None:
    """The task in progress (the newest, if the tools put several in progress)."""
    return next(iter(await newest_tasks(db, chat, state="in_progress")), None)


async def follow_topic(
    memory: MemoryView, graph: GraphBackend, options: GraphOptions, message: Message, vector: np.ndarray
) -> list[str]:
    """Move the chat's chain along with ``message``; returns notes for the ingest result.

    What is read of the chain is bounded, however long it grows: the task in progress, and only
    when the message leaves its topic, the newest ``resume_window`` paused tasks (a chat of 2,000
    tasks read whole cost each message 106 ms against 5 with none)."""
    chat = GraphScope(message.tenant, message.user_id, message.chat_id)
    v = unit(np.asarray(vector, dtype=np.float32))
    topics: dict[int, np.ndarray] = {}
    labels: dict[int, str] = {}  # of the topics worked out from labels

    def similarity(task: TaskView) -> float:
        assert task.node is not None
        topic = topics.get(task.node.id)
        return -1.0 if topic is None else float(topic @ v)

    # Embed outside the write transaction: it would hold every other writer up meanwhile.
    async with graph.read() as db:
        current = await _current(db, chat)
    topics.update(await _topics(memory, [current] if current else [], labels))
    if current is None or similarity(current) < options.topic_similarity:
        async with graph.read() as db:
            paused = await newest_tasks(db, chat, state="paused", limit=options.resume_window)
        topics.update(await _topics(memory, paused, labels))
    at, provenance = message.ts, [message.message_id]
    async with graph.transaction() as db:
        # Read again: another worker may have moved the chain meanwhile (a task whose topic was
        # not worked out above is not a match).
        current = await _current(db, chat)
        if current is not None and similarity(current) >= options.topic_similarity:
            node = current.node
            assert node is not None
            topic, count = continued(topics[node.id], int(node.props.get("messages", 1)), v)
            await set_topic(db, node.id, topic)
            # A row for the message: the list kept in the props was written whole again at each
            # message (half a megabyte a message once a task had followed 20,000).
            await follow(db, node, chat, [message.message_id])
            await set_props(db, node, {**node.props, "messages": count})
            return []
        # The paused tasks as they were before this message paused the current one.
        paused = await newest_tasks(db, chat, state="paused", limit=options.resume_window)
        await _keep_topics(db, paused, topics, labels)
        notes = []
        if current is not None:
            await move_task(db, chat, current, "paused", at, source="auto", provenance=provenance)
            notes.append(f"task paused: {current.task_id}")
        best = max(paused, key=similarity, default=None)
        if best is not None and similarity(best) >= options.topic_similarity:
            await move_task(db, chat, best, "in_progress", at, source="auto", provenance=provenance)
            return [*notes, f"task resumed: {best.task_id}"]
        number = await linked_task_count(db, chat) + 1
        while await tasks_keyed(db, chat, f"task_auto_{number}"):
            number += 1
        task, _ = await create_task(
            db,
            chat,
            f"Task_auto_{number}",
            opening(message.text),
            [],
            at,
            source="auto",
            provenance=provenance,
            actor="auto_tasks",
            props={"messages": 1, "described_by": message.message_id},
        )
        assert task.node is not None
        await set_topic(db, task.node.id, v)
        await follow(db, task.node, chat, provenance)
        return [*notes, f"task started: {task.task_id}"]


async def _keep_topics(
    db: GraphSQL, tasks: list[TaskView], topics: dict[int, np.ndarray], labels: dict[int, str]
) -> None:
    """Store the topics worked out from the labels of tasks that had none (made by the tools): each
    was embedded again at every message that left the current topic. Not one whose label changed
    since it was embedded (a forget remade the task meanwhile)."""
    for task in tasks:
        node = task.node
        if node is not None and node.topic() is None and labels.get(node.id) == _label(task):
            await set_topic(db, node.id, topics[node.id])
