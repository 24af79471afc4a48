"""Stated facts as a recall source: a question about where someone lives, what they like, work on or
plan is answered by the messages in which they said so.

The graph plugin keeps such statements as triplets with their provenance (the message ids) and
retires a fact when a later one contradicts it (a functional relation such as ``lives_in`` holds one
object at a time: "I moved to Porto" supersedes "I live in Lisbon"). This source reads the question's
relation words, takes the *active* triplets of those relations in the request's scope and proposes the
memories of the messages that stated them: the facts that hold now first (newest statement first),
so "where does she live now?" ranks the latest city above the earlier one, which no longer has an
active fact. Without the graph plugin (or on a store it cannot use) the source proposes nothing.

It answers questions about the present state only: one asking where someone lives, or one that
says "now" (currently, still, these days, "working on", 现在, 在做…). Proposing stated
preferences for every "would she like…" question was tried: it raised open-domain recall on the
LoCoMo validation conversations but lowered overall recall there, so it is not done (see the
README's Benchmarks).
"""

from __future__ import annotations

import re

import numpy as np
from narrmem_plugins.graph import GraphPlugin
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import Edge, EdgeQuery, select_edges
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import FUNCTIONAL
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.configured import Configured
from narrmem.errors import PluginError
from narrmem.models import Candidate, MemoryRecord, RecallRequest, Scope
from narrmem.view import MemoryView

NAME = "recall_facts"
SOURCE = "facts"

# The words that ask about each relation the fact extractor writes (English and Chinese).
RELATION_WORDS: dict[str, re.Pattern[str]] = {
    "lives_in": re.compile(
        r"\b(?:live|lives|living|lived|reside|resides|home|hometown|moved?)\b|住|搬", re.I
    ),
    "located_at": re.compile(
        r"\bwhere\b(?!.*\b(?:work|works|working|live|lives|living)\b)"
        r".*\b(?:now|currently|these days|at the moment)\b|现在在哪",
        re.I,
    ),
    # "Where does she work now?" is a workplace, not where she is; "working on" a project.
    "works_at": re.compile(
        r"\bwhere\b.*\b(?:works?|working)\b(?!\s+on\b)|\bwork(?:s|ing)?\s+(?:at|for)\b"
        r"|\b(?:company|employer|employed|workplace)\b"
        r"|在哪(?:工作|上班)|公司",
        re.I,
    ),
    "job": re.compile(r"\b(?:job|profession|occupation|for a living|work as)\b|职业|做什么工作", re.I),
    "partner": re.compile(
        r"\b(?:dating|partner|boyfriend|girlfriend|husband|wife|spouse|married|fianc[ée]e?|relationship)\b"
        r"|男朋友|女朋友|对象|老公|老婆",
        re.I,
    ),
    "age": re.compile(r"\bhow old\b|\bage\b|多大|几岁", re.I),
    "likes": re.compile(r"\b(?:like|likes|love|loves|enjoys?|favou?rite|prefers?|fan of)\b|喜欢|爱", re.I),
    "works_on": re.compile(r"\b(?:projects?|working on|works on|work on)\b|项目|在做", re.I),
    "plans": re.compile(r"\b(?:plans?|planning|going to)\b|打算|计划", re.I),
}


class FactsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidates: int = Field(default=5, ge=1, le=100, description="memories proposed per question")
    facts: int = Field(default=50, ge=1, le=10_000, description="active facts read per user and question")
    located_days: float = Field(
        default=3.0, ge=0, le=3650, description="days a 'located_at' fact answers where someone is now"
    )
    superseded_factor: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="score factor, for a question about the present, of a memory that stated a value "
        "since replaced (the job before, the city before) and no value that holds",
    )


# Words of the present state, the progressive included ("what is she working on?", 在做/正在).
NOW = re.compile(
    r"\b(?:now|currently|current|these days|at the moment|still|anymore|any more|latest|working on)\b"
    r"|现在|目前|最近|正在|在做",
    re.I,
)


# A question about what held before, read from its own verb ("Where did Kim work before Meta?"),
# not from any "was" in it ("Where does she work now that she was promoted?").
PAST = re.compile(
    r"\b(?:before|previous|previously|used to|former|formerly|back then)\b|\b(?:where|when|who)\s+did\b"
    r"|\bdid\s+\w+\s+(?:work|live|date|move)\b|\b(?:was|were)\s+\w+\s+(?:working|living|dating)\b"
    r"|以前|之前|原来|过去",
    re.I,
)


def relations_asked(query: str) -> list[str]:
    """The relations a question about the present state asks about (none for other questions)."""
    asked = [relation for relation, words in RELATION_WORDS.items() if words.search(query)]
    return asked if NOW.search(query) or any(r in FUNCTIONAL for r in asked) else []


class RecallFacts(Configured[FactsOptions], name=NAME, options=FactsOptions):
    @hookimpl
    async def narrmem_recall_candidates(
        self, memory: MemoryView, request: RecallRequest, query_vector: np.ndarray
    ) -> list[Candidate]:
        relations = relations_asked(request.query)
        if not relations:
            return []
        try:
            graph = memory.host.plugin(GraphPlugin).backend()
        except PluginError:
            return []
        async with graph.read() as db:
            edges = await _active_facts(db, request.scope, relations, self.options.facts)
        # Where someone is holds for a day or two: "at the hospital" is not where they are a year on.
        horizon = memory.clock.now().timestamp() - self.options.located_days * 86_400
        edges = [e for e in edges if e.relation != "located_at" or e.last_seen_ts >= horizon]
        ids = await _memories_of(memory, request.scope, edges)
        now = [mid for edge in edges if edge.relation in FUNCTIONAL for mid in ids.get(edge.id, [])]
        rest = [mid for edge in edges if edge.relation not in FUNCTIONAL for mid in ids.get(edge.id, [])]
        if rest:
            # Preferences and plans can be many: the ones closest to the question come first.
            vectors = await memory.store.vectors(sorted(set(rest)), request.scope)
            rest.sort(key=lambda mid: -float(np.dot(vectors[mid], query_vector)) if mid in vectors else 0.0)
        ranked = list(dict.fromkeys([*now, *rest]))[: self.options.candidates]
        return [
            Candidate(memory_id=mid, source=SOURCE, rank=rank, score=1.0) for rank, mid in enumerate(ranked)
        ]

    @hookimpl
    async def narrmem_weigh(
        self, memory: MemoryView, request: RecallRequest, records: dict[int, MemoryRecord]
    ) -> dict[int, float]:
        """For a question about the present of a one-value relation ("where does she work now?"):
        the memories that said a value since replaced are lowered. Proposing the current one was
        not enough: "I work at Google as an engineer…" matched the question's words and ranked
        above "I started a new job at Meta" a year later."""
        # Only a question that says "now" (currently, these days…), and none about the past: "Where
        # did I work before Meta?" is answered by the job replaced.
        if not NOW.search(request.query) or PAST.search(request.query):
            return {}
        relations = [r for r in relations_asked(request.query) if r in FUNCTIONAL]
        if not relations or self.options.superseded_factor >= 1 or not records:
            return {}
        try:
            graph = memory.host.plugin(GraphPlugin).backend()
        except PluginError:
            return {}
        async with graph.read() as db:
            active = await _facts(db, request.scope, relations, self.options.facts, status="active")
            replaced = await _facts(db, request.scope, relations, self.options.facts, status="superseded")
        holding = {mid for ids in (await _memories_of(memory, request.scope, active)).values() for mid in ids}
        stale = {mid for ids in (await _memories_of(memory, request.scope, replaced)).values() for mid in ids}
        return {mid: self.options.superseded_factor for mid in records if mid in stale - holding}


async def _active_facts(db: GraphSQL, scope: Scope, relations: list[str], limit: int) -> list[Edge]:
    """The active facts of these relations in the scope, newest statement first."""
    return await _facts(db, scope, relations, limit, status="active")


async def _facts(db: GraphSQL, scope: Scope, relations: list[str], limit: int, *, status: str) -> list[Edge]:
    """The facts of these relations in the scope with this status, newest statement first."""
    if scope.user_id is not None:
        users = [scope.user_id]
    else:
        rows = await db.fetchall(
            "SELECT DISTINCT user_id FROM graph_edges WHERE tenant = ? AND chat_id = ? AND status = ?",
            (scope.tenant, scope.chat_id, status),
        )
        users = [str(row[0]) for row in rows]
    found: list[Edge] = []
    for user in users:
        query = EdgeQuery().where("e.status = ?", status).names_in("e.relation", relations)
        found.extend(
            await select_edges(db, GraphScope(scope.tenant, user, scope.chat_id), query, limit=limit)
        )
    return sorted(found, key=lambda e: (-e.last_seen_ts, -e.id))


async def _memories_of(memory: MemoryView, scope: Scope, edges: list[Edge]) -> dict[int, list[int]]:
    """The memories of the messages that stated each fact (the host re-checks their scope)."""
    out: dict[int, list[int]] = {}
    for edge in edges:
        if edge.provenance:
            out[edge.id] = await memory.store.from_messages(scope.tenant, edge.chat_id, edge.provenance)
    return out
