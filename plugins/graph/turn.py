"""The per-turn flow as one call (``narrmem_turn_context``): what a bot must know before it answers.

1. The persona: the chat's own, else the user's default.
2. The working memory chain: every task in progress, in chain order (oldest first, so a task resumed
   after another started is there too), or, when the message refers back ("just now", "last time",
   刚才, 上次…), the chat's chain newest first; each task with the triplets of its info nodes (the
   seed's "query info node" step).
3. The relevant facts: what the user's graph says about the user (every chat, merged), the ones sharing
   words with the message first, plus ``memory.recall(text)`` hits; a recap question ("What did we
   talk about?", 我们聊过什么) gets the chat's recent narrative instead, oldest first (see :mod:`.refer`).

``rendered`` is the prompt block with all three.
"""

from __future__ import annotations

from typing import Any

from narrmem_plugins.graph.backend import GraphBackend, GraphSQL
from narrmem_plugins.graph.edges import Edge, EdgeQuery, select_edges
from narrmem_plugins.graph.options import GraphOptions
from narrmem_plugins.graph.persona import persona_for
from narrmem_plugins.graph.refer import asks_for_recap, refers_back
from narrmem_plugins.graph.render import merged, persona_text, task_line, triplet_line
from narrmem_plugins.graph.schemas import triplet_out
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.tasks import TaskView, newest_tasks
from narrmem_plugins.graph.vocabulary import FUNCTIONAL, STRUCTURAL, USER

from narrmem.models import MAX_QUERY_CHARS, Hit, Scope
from narrmem.text import keyword_terms
from narrmem.view import MemoryView

NO_PERSONA = "No persona is set: answer as your default identity."
# Where someone is, or has just left: true for a day or two, not for the rest of the year.
PASSING = frozenset({"located_at", "left"})


def _facts_query(include_speculative: bool) -> EdgeQuery:
    q = EdgeQuery().where("e.status = 'active'")
    q.where(f"e.relation NOT IN ({', '.join('?' for _ in STRUCTURAL)})", *sorted(STRUCTURAL))
    if not include_speculative:
        q.where("e.speculative = 0")
    return q


async def user_facts(
    db: GraphSQL, scope: GraphScope, text: str, options: GraphOptions, now: float | None = None
) -> list[Edge]:
    """The user's facts in ``scope`` (a chat, or every chat of theirs): where they live, work, who
    their partner is (one value each) first, then those sharing words with ``text``, then the
    newest, then the most confirmed. Where someone *is* ("I'm at the airport right now") holds for
    ``options.located_days`` after it was last said (``now``: the clock's, as a timestamp).

    Before 2026-12-08 twenty likes said twice each pushed a new city, job and partner out of the
    block, and "at the airport" was the user's place a year later."""
    if options.context_facts == 0:
        return []
    q = _facts_query(options.context_speculative).where("nocase(s.name) = nocase(?)", USER)
    edges = merged(await select_edges(db, scope, q, limit=5000))
    if now is not None:
        horizon = now - options.located_days * 86_400
        edges = [e for e in edges if e.relation not in PASSING or e.last_seen_ts >= horizon]
    words = set(keyword_terms(text))

    def rank(edge: Edge) -> tuple[bool, int, int, float, int]:
        overlap = len(words & set(keyword_terms(edge.object)))
        return (
            edge.relation not in FUNCTIONAL,
            -overlap,
            int(edge.speculative),
            -edge.last_seen_ts,
            -edge.count,
        )

    return sorted(edges, key=rank)[: options.context_facts]


async def info_facts(
    db: GraphSQL, scope: GraphScope, tasks: list[TaskView], options: GraphOptions
) -> list[Edge]:
    names = sorted({name for task in tasks for name in task.info_nodes})
    if not names:
        return []
    q = _facts_query(options.context_speculative).node_names_in("s.name", names)
    return list(merged(await select_edges(db, scope, q, limit=500)))


async def build(
    memory: MemoryView,
    graph: GraphBackend,
    options: GraphOptions,
    *,
    tenant: str,
    user_id: str,
    chat_id: str,
    text: str,
    private: bool = False,
) -> dict[str, Any]:
    scope = GraphScope(tenant, user_id, chat_id)
    # What the person said elsewhere (a direct chat, another group) only in their own direct chat:
    # a group's answer is read by everyone in it.
    said = scope.user_wide() if private else scope
    back = refers_back(text, options.reference_phrases)
    async with graph.read() as db:
        persona = await persona_for(db, scope)
        # The newest few, found by the database: a chain of months is not read whole each turn.
        if back:
            tasks = await newest_tasks(db, scope, limit=options.chain_limit)
        else:
            # Every task in progress (a resumed one too), in chain order: the chain runs oldest first.
            in_progress = await newest_tasks(db, scope, state="in_progress", limit=options.chain_limit)
            tasks = list(reversed(in_progress))
        task_facts = await info_facts(db, scope, tasks, options)
        facts = await user_facts(db, said, text, options, memory.clock.now().timestamp())
    query = text.strip()[:MAX_QUERY_CHARS]
    hits: list[Hit] = []
    recap = asks_for_recap(text)
    if options.context_memories and recap:
        hits = await recent_narrative(memory, scope, query, options.context_memories)
    elif options.context_memories and query:
        hits = await memory.recall(
            query, user_id=user_id, chat_id=said.chat_id, tenant=tenant, k=options.context_memories
        )
    return {
        "persona": persona.as_dict() if persona else None,
        "refers_back": back,
        "tasks": [t.as_dict() for t in tasks],
        "task_facts": [triplet_out(e).model_dump(mode="json") for e in task_facts],
        "facts": [triplet_out(e).model_dump(mode="json") for e in facts],
        "memories": [h.model_dump(mode="json") for h in hits],
        "rendered": render(persona_text(persona), tasks, task_facts, facts, hits, recap=recap),
    }


async def recent_narrative(memory: MemoryView, scope: GraphScope, question: str, limit: int) -> list[Hit]:
    """The chat's last ``limit`` memories, oldest first, for a recap question: scenes, and episodes
    no fetched scene already tells; the question itself (if already stored) left out. They are not
    ranked, so each has score 1 and ``sources = {"recent": its place in time}``."""
    where = Scope(tenant=scope.tenant, user_id=scope.user_id, chat_id=scope.write_chat)
    records = await memory.store.recent(where, kinds=["scene", "episode"], limit=limit * 3)
    told = {m for r in records if r.kind == "scene" for m in r.message_ids}
    kept = [
        r
        for r in records
        if r.id is not None
        and question not in r.text
        and (r.kind == "scene" or not r.message_ids or not set(r.message_ids) <= told)
    ][:limit]
    return [
        Hit.from_record(r, text=r.text, score=1.0, importance=r.importance, sources={"recent": rank})
        for rank, r in enumerate(reversed(kept), start=1)
    ]


def render(
    persona: str,
    tasks: list[TaskView],
    task_facts: list[Edge],
    facts: list[Edge],
    hits: list[Any],
    *,
    recap: bool = False,
) -> str:
    sections = [f"[Persona]\n{persona or NO_PERSONA}"]
    if tasks:
        lines = []
        for task in tasks:
            lines.append(task_line(task))
            own = {n.lower() for n in task.info_nodes}
            lines += [f"  - {triplet_line(e)}" for e in task_facts if e.subject.lower() in own]
        sections.append("[Working memory]\n" + "\n".join(lines))
    else:
        sections.append("[Working memory]\nNo task in progress.")
    if facts:
        # Dated as the memories are: "age 30" said two years ago, a plan for a May gone by.
        lines = [f"- {triplet_line(e)} (said {e.last_seen[:10]})" for e in facts]
        sections.append("[About the user]\n" + "\n".join(lines))
    if hits:
        lines = []
        for hit in hits:
            text = " | ".join(part.strip() for part in hit.text.splitlines() if part.strip())
            lines.append(f"- [{hit.created_at.strftime('%Y-%m-%d')}, {hit.kind}] {text}")
        title = "[Recent conversation, oldest first]" if recap else "[Memories]"
        sections.append(title + "\n" + "\n".join(lines))
    return "\n\n".join(sections)
