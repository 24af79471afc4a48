"""``memory_recall``: find the nodes a query is about, then walk the graph around them.

Seeds, from the comma-separated keywords:

1. by name: a node whose label (name in words, plus its description) contains every word of a keyword
   (Chinese: every character pair, or the keyword as a substring);
2. by type: a keyword naming a node type ("TaskNode", "persona", "working_memory") seeds those nodes;
3. by meaning: the nodes whose label embedding is closest to a keyword's, above
   ``[plugin.graph] seed_similarity`` (at most ``seed_limit``).

The walk follows active edges in both directions, ``depth`` hops from the seeds, inside the caller's
scope only, keeping triplets stated within ``time_range`` (the span from a triplet's first to its last
statement must overlap it). StateNodes are shared by every task in a state, so the walk does not pass
through them (reaching "paused" would otherwise pull in every paused task).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from narrmem_plugins.graph.backend import GraphBackend, GraphSQL
from narrmem_plugins.graph.edges import Edge, EdgeQuery, select_edges, touching
from narrmem_plugins.graph.nodes import Node, nodes_in_scope
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vectors import LabelVectors, node_vectors
from narrmem_plugins.graph.vocabulary import FUNCTIONAL, label
from narrmem_plugins.triage.language import has_cjk

from narrmem.text import keyword_terms
from narrmem.view import MemoryView

TYPE_WORDS = {
    "persona": "PersonaNode",
    "role": "PersonaNode",
    "character": "PersonaNode",
    "personality": "PersonaNode",
    "task": "TaskNode",
    "tasks": "TaskNode",
    "taskchain": "TaskNode",
    "workingmemory": "TaskNode",
    "state": "StateNode",
    "info": "InfoNode",
    "entity": "EntityNode",
}


@dataclass
class RecallParams:
    keywords: list[str]
    depth: int
    since: datetime | None = None
    until: datetime | None = None
    include_speculative: bool = True
    limit: int = 100
    seed_similarity: float = 0.5
    seed_limit: int = 8
    functional: frozenset[str] = FUNCTIONAL


@dataclass
class GraphView:
    keywords: list[str]
    seeds: list[str] = field(default_factory=list)
    distance: dict[str, int] = field(default_factory=dict)  # lower-cased name -> hops
    nodes: dict[str, Node] = field(default_factory=dict)  # lower-cased name -> a node of that name
    edges: list[Edge] = field(default_factory=list)
    truncated: bool = False
    past: list[Edge] = field(default_factory=list)  # earlier values of functional relations
    now: dict[int, str] = field(default_factory=dict)  # past edge id -> the value that holds now


def edge_filter(params: RecallParams, status: str = "active") -> EdgeQuery:
    q = EdgeQuery().where("e.status = ?", status)
    if params.until is not None:
        q.where("e.valid_from_ts <= ?", params.until.timestamp())
    if params.since is not None:
        q.where("e.last_seen_ts >= ?", params.since.timestamp())
    if not params.include_speculative:
        q.where("e.speculative = 0")
    return q


def name_matches(keyword: str, node: Node) -> bool:
    text = label(node.name, node.props)
    wanted = set(keyword_terms(keyword))
    if wanted and wanted <= set(keyword_terms(text)):
        return True
    return has_cjk(keyword) and keyword.lower() in text.lower()


def type_of_keyword(keyword: str) -> str | None:
    word = keyword.lower().replace("_", "").replace(" ", "").replace("-", "")
    if word.endswith("node") and len(word) > 4:
        word = word[:-4]
    return TYPE_WORDS.get(word)


async def seeds(
    memory: MemoryView, kept: LabelVectors, nodes: Sequence[Node], params: RecallParams
) -> list[Node]:
    chosen: dict[int, Node] = {}
    types = {t for t in map(type_of_keyword, params.keywords) if t}
    for node in nodes:
        if node.type in types or any(name_matches(k, node) for k in params.keywords):
            chosen[node.id] = node
    if nodes and params.seed_limit > 0:
        vectors = await node_vectors(memory, kept, nodes)
        query = np.asarray(await memory.embedder.embed(params.keywords), dtype=np.float32)
        query /= np.maximum(np.linalg.norm(query, axis=1, keepdims=True), 1e-12)
        best = (vectors @ query.T).max(axis=1)
        order = np.argsort(-best, kind="stable")[: params.seed_limit]
        for i in order:
            if best[i] >= params.seed_similarity:
                chosen.setdefault(nodes[int(i)].id, nodes[int(i)])
    return list(chosen.values())


async def recall_graph(
    memory: MemoryView, graph: GraphBackend, scope: GraphScope, params: RecallParams
) -> GraphView:
    async with graph.read() as db:
        nodes = await nodes_in_scope(db, scope)
    view = GraphView(keywords=params.keywords)
    by_name: dict[str, Node] = {}
    for node in nodes:
        by_name.setdefault(node.name.lower(), node)
    found = await seeds(memory, graph.label_vectors, nodes, params)
    for node in found:
        key = node.name.lower()
        if key not in view.distance:
            view.seeds.append(node.name)
            view.distance[key] = 0
            view.nodes[key] = node
    async with graph.read() as db:
        await _walk(db, scope, found, by_name, params, view)
        await _past_values(db, scope, [n.name for n in found], params, view)
    # A node no visible triplet touches (all of its triplets purged, or outside the time range) says
    # nothing, and showing it would leak what was purged.
    shown = {name.lower() for e in [*view.edges, *view.past] for name in (e.subject, e.object)}
    view.seeds = [s for s in view.seeds if s.lower() in shown]
    view.nodes = {k: v for k, v in view.nodes.items() if k in shown}
    view.distance = {k: v for k, v in view.distance.items() if k in shown}
    return view


async def _walk(
    db: GraphSQL,
    scope: GraphScope,
    found: Sequence[Node],
    by_name: dict[str, Node],
    params: RecallParams,
    view: GraphView,
) -> None:
    """Follow active edges from the seeds, ``params.depth`` hops, into ``view``."""
    frontier = [n.name for n in found if n.type != "StateNode"]
    seen_edges: set[int] = set()
    query = edge_filter(params)
    for hop in range(1, params.depth + 1):
        if not frontier:
            break
        budget = params.limit + 1 - len(view.edges)
        batch = [e for e in await touching(db, scope, frontier, query, budget) if e.id not in seen_edges]
        next_frontier: list[str] = []
        for edge in batch:
            if len(view.edges) == params.limit:
                view.truncated = True
                break
            seen_edges.add(edge.id)
            view.edges.append(edge)
            for name, node_type in ((edge.subject, edge.subject_type), (edge.object, edge.object_type)):
                key = name.lower()
                if key in view.distance:
                    continue
                view.distance[key] = hop
                view.nodes[key] = by_name.get(key) or Node(
                    id=0, chat_id=edge.chat_id, name=name, type=node_type
                )
                if node_type != "StateNode":
                    next_frontier.append(name)
        if view.truncated:
            break
        frontier = next_frontier


async def _past_values(
    db: GraphSQL, scope: GraphScope, names: Sequence[str], params: RecallParams, view: GraphView
) -> None:
    """Earlier values of functional relations touching the seeds ("Berlin" after a move to Paris),
    each with what holds now, so that recall of an old value says it is past."""
    if not names or not params.functional:
        return
    q = edge_filter(params, "superseded").names_in("e.relation", sorted(params.functional))
    past = await touching(db, scope, names, q, params.limit)
    for edge in past:
        view.distance.setdefault(edge.subject.lower(), 1)
        view.distance.setdefault(edge.object.lower(), 1)
        for name, node_type in ((edge.subject, edge.subject_type), (edge.object, edge.object_type)):
            view.nodes.setdefault(name.lower(), Node(id=0, chat_id=edge.chat_id, name=name, type=node_type))
    view.past = past
    subjects = sorted({e.subject_id for e in past})
    if subjects:
        current = EdgeQuery().where("e.status = 'active'").names_in("e.subject_id", subjects)
        current.names_in("e.relation", sorted({e.relation for e in past}))
        holding = {(e.subject_id, e.relation): e.object for e in await select_edges(db, scope, current)}
        view.now = {
            e.id: holding[(e.subject_id, e.relation)] for e in past if (e.subject_id, e.relation) in holding
        }
