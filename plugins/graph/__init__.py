"""A memory graph (after TrulyMEM): typed nodes and triplets per user, facts taken from messages,
a working memory chain of tasks per chat, a persona, and the per-turn flow.

* :mod:`.vocabulary`: node and edge types, relation names, contradicting relations.
* :mod:`.schema`, :mod:`.backend`: the plugin's tables in the store's database (SQLite or PostgreSQL).
* :mod:`.nodes`, :mod:`.edges`, :mod:`.writer`, :mod:`.history`: storage; every write goes through
  :func:`.writer.write_triplet` (no duplicates, contradictions supersede).
* :mod:`.extract`, :mod:`.facts`: facts from messages without an LLM (or from ``narrmem_extract_facts``).
* :mod:`.recall`, :mod:`.purge`, :mod:`.tasks`, :mod:`.persona`, :mod:`.rewrite`: what the tools do;
  :mod:`.schemas` and :mod:`.tools` expose them.
* :mod:`.values`: what a one-value relation (lives_in, works_at…) holds now, and held before.
* :mod:`.turn`, :mod:`.refer`, :mod:`.render`: ``narrmem_turn_context``; :mod:`.auto_tasks`: the chain
  kept from messages when ``auto_tasks`` is on.

Options live in ``[plugin.graph]`` (:class:`~narrmem_plugins.graph.options.GraphOptions`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from narrmem_plugins.graph import auto_tasks, facts, forget, task_topics, turn
from narrmem_plugins.graph.backend import GraphBackend
from narrmem_plugins.graph.options import GraphOptions
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.tools import TOOLS
from narrmem_plugins.graph.transfer import GraphTransfer
from narrmem_plugins.graph.values import FactValue, current_value, is_functional, value_history
from narrmem_plugins.graph.version import check_graph_schema

from narrmem import hookimpl, logs
from narrmem.config import Settings, plugin_options
from narrmem.errors import PluginError, StoreError
from narrmem.models import IngestResult, Message, TriageDecision
from narrmem.store import SQLCapable
from narrmem.tools import ToolTable
from narrmem.view import MemoryView

NAME = "graph"
log = logs.logger("narrmem.graph")

__all__ = [
    "FactValue",
    "GraphOptions",
    "GraphPlugin",
    "GraphScope",
    "current_value",
    "is_functional",
    "plugin_of",
    "turn_context",
    "value_history",
]


class GraphPlugin(GraphTransfer, ToolTable):
    """One instance per ``Memory``."""

    narrmem_name = NAME
    tool_specs = TOOLS

    def __init__(self) -> None:
        self.options = GraphOptions()
        self._graph: GraphBackend | None = None

    def backend(self) -> GraphBackend:
        if self._graph is None:
            raise PluginError(
                "the graph plugin is not started, or its store has no SQL tables to hold the graph"
            )
        return self._graph

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = plugin_options(settings, NAME, GraphOptions)

    @hookimpl
    async def narrmem_startup(self, memory: MemoryView) -> None:
        store = memory.store
        if not isinstance(store, SQLCapable):
            log.warning("graph plugin idle: store %s lends no SQL tables (sql())", type(store).__name__)
            return
        await check_graph_schema(memory.store, read_only=memory.read_only)
        graph = GraphBackend(store, memory.clock)
        try:
            await graph.setup(read_only=memory.read_only)
        except StoreError:
            if not memory.read_only:
                raise
            # Opened read-only on a database that never held a graph (one written before the graph
            # ran on PostgreSQL): there is no graph to read, and none can be made.
            log.warning("graph plugin idle: the read-only store has no graph tables")
            return
        self._graph = graph

    @hookimpl
    async def narrmem_after_store(
        self,
        memory: MemoryView,
        message: Message,
        decision: TriageDecision,
        vectors: np.ndarray,
        result: IngestResult,
    ) -> None:
        if self._graph is None:
            return
        if self.options.extract_facts:
            drafts = await facts.drafts_for(memory, message, decision, result.notes)
            if drafts:
                outcomes = await facts.store_facts(
                    memory, self._graph.transaction, message, drafts, self.options.functional
                )
                result.notes.extend(facts.notes_for(outcomes))
        if self.options.auto_tasks and len(vectors):
            # Row 0 is the episode: the message itself.
            result.notes.extend(
                await auto_tasks.follow_topic(memory, self._graph, self.options, message, vectors[0])
            )

    # Optional until narrmem/hookspecs.py declares it; then it is an ordinary firstresult hook.
    @hookimpl
    async def narrmem_turn_context(
        self, memory: MemoryView, tenant: str, user_id: str, chat_id: str, text: str, private: bool
    ) -> dict[str, Any] | None:
        if self._graph is None:
            return None
        return await turn.build(
            memory,
            self._graph,
            self.options,
            tenant=tenant,
            user_id=user_id,
            chat_id=chat_id,
            text=text,
            private=private,
        )

    @hookimpl
    def narrmem_forgotten_elsewhere(self) -> None:
        """Another worker's forget: labels are people's words, and this process's copies go."""
        if self._graph is not None:
            self._graph.label_vectors.clear()

    @hookimpl
    async def narrmem_after_forget(
        self,
        memory: MemoryView,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        messages: list[str] | None,
    ) -> None:
        """Forgetting a user (or a chat) erases their graph and its purge history too; a deleted
        message takes only what it stated, and what the tasks it followed hold of it."""
        if self._graph is None:
            return
        self._graph.label_vectors.clear()
        if messages is not None and chat_id is not None:
            # The tasks are remade from the messages left, read from the store before the graph's
            # write transaction (which holds the store's writer).
            async with self._graph.read() as db:
                citing = await task_topics.tasks_citing(db, tenant, chat_id, messages)
            gone = set(messages)
            tasks = [await task_topics.remake(memory, tenant, chat_id, task, gone) for task in citing]
            async with self._graph.transaction() as db:
                await forget.forget_messages(db, tenant, chat_id, messages, tasks)
            return
        async with self._graph.transaction() as db:
            await forget.forget_scope(db, tenant, user_id, chat_id)

    @hookimpl
    async def narrmem_stats(self) -> dict[str, Any] | None:
        if self._graph is None:
            return None
        async with self._graph.read() as db:
            [(nodes,)] = await db.fetchall("SELECT COUNT(*) FROM graph_nodes")
            by_status = dict(await db.fetchall("SELECT status, COUNT(*) FROM graph_edges GROUP BY status"))
            [(purges,)] = await db.fetchall("SELECT COUNT(*) FROM graph_purges")
        return {
            "graph": {
                "nodes": int(nodes),
                "edges": {k: int(v) for k, v in by_status.items()},
                "purges": int(purges),
            }
        }


def plugin_of(memory: MemoryView) -> GraphPlugin:
    """The :class:`GraphPlugin` registered with ``memory``."""
    return memory.host.plugin(GraphPlugin)


async def turn_context(
    memory: MemoryView,
    text: str,
    *,
    user_id: str,
    chat_id: str,
    tenant: str = "default",
    private: bool = False,
) -> dict[str, Any]:
    """The per-turn context (persona, working memory chain, facts, ``rendered``) straight from the
    plugin, for code that cannot wait for ``Memory.turn_context`` (``private`` as there)."""
    plugin = plugin_of(memory)
    return await turn.build(
        memory,
        plugin.backend(),
        plugin.options,
        tenant=tenant,
        user_id=user_id,
        chat_id=chat_id,
        text=text,
        private=private,
    )
