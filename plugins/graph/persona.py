"""The bot's persona in a user's graph: ``AI -HAS_PERSONA-> persona:vN`` (a PersonaNode holding the
description, traits and tone), with ``has_trait`` and ``has_tone`` edges from the persona node.

Replacing a persona supersedes exactly the old persona's edges, found by node id: the ``AI`` node's
``HAS_PERSONA`` edge and the old persona node's own edges. No name matching is involved, so a subject
such as "AI assistant fan" (or anything else "AI" says or is said about it) is never touched. Old
persona nodes stay, with their superseded edges, as history. A persona set again as it is (the same
description, traits and tone, its edges whole) writes nothing: each call made a version of its own,
a node, its edges and a record of the supersession, for good.

A persona belongs to a chat; one set without a chat is the user's default, which a chat without its
own persona falls back to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from narrmem_plugins.graph import history
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import EdgeQuery, close_edges, select_edges
from narrmem_plugins.graph.nodes import ensure_node, find_node
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import AI, DIRECT_CHAT, HAS_PERSONA, HAS_TONE, HAS_TRAIT, PERSONA_PREFIX
from narrmem_plugins.graph.writer import TripletDraft, write_triplet


@dataclass
class PersonaView:
    version: int
    description: str
    traits: list[str]
    tone: str | None
    chat_id: str
    set_at: str
    node_id: int

    def as_dict(self) -> dict[str, Any]:
        # The node id is the graph's own key, not part of the persona a caller sees.
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "node_id"}


async def current_persona(db: GraphSQL, chat: GraphScope) -> PersonaView | None:
    """The active persona of exactly this chat (``chat.write_chat``)."""
    q = (
        EdgeQuery()
        .where("e.status = 'active'")
        .where("e.relation = ?", HAS_PERSONA)
        .where("nocase(s.name) = nocase(?)", AI)
    )
    edges = await select_edges(db, chat.writing(), q, order="e.valid_from_ts DESC, e.id DESC", limit=1)
    if not edges:
        return None
    edge = edges[0]
    node = await find_node(db, chat.writing(), edge.object)
    if node is None:
        return None
    props = node.props
    return PersonaView(
        version=int(props.get("version", 0)),
        description=str(props.get("description", "")),
        traits=[str(t) for t in props.get("traits", [])],
        tone=props.get("tone"),
        chat_id=edge.chat_id,
        set_at=edge.valid_from,
        node_id=node.id,
    )


CHAT_PERSONAS_SHOWN = 100  # of a user's chats with a persona of their own, see chat_personas


async def chat_personas(db: GraphSQL, scope: GraphScope) -> list[PersonaView]:
    """The personas set for particular chats of ``scope``'s user (their default left out), by
    chat, at most :data:`CHAT_PERSONAS_SHOWN`: what the bot is given there instead of the default."""
    q = (
        EdgeQuery()
        .where("e.status = 'active'")
        .where("e.relation = ?", HAS_PERSONA)
        .where("nocase(s.name) = nocase(?)", AI)
        .where("e.chat_id <> ?", DIRECT_CHAT)
    )
    edges = await select_edges(db, scope.user_wide(), q, order="e.chat_id, e.id", limit=CHAT_PERSONAS_SHOWN)
    found = []
    for chat_id in dict.fromkeys(edge.chat_id for edge in edges):
        persona = await current_persona(db, GraphScope(scope.tenant, scope.user_id, chat_id))
        if persona is not None:
            found.append(persona)
    return found


async def persona_for(db: GraphSQL, scope: GraphScope) -> PersonaView | None:
    """The chat's own persona, else the user's default (set without a chat)."""
    found = await current_persona(db, scope.writing())
    if found is None and scope.write_chat != DIRECT_CHAT:
        found = await current_persona(db, GraphScope(scope.tenant, scope.user_id, DIRECT_CHAT))
    return found


async def set_persona(
    db: GraphSQL,
    scope: GraphScope,
    description: str,
    traits: Sequence[str],
    tone: str | None,
    at: datetime,
) -> tuple[PersonaView, PersonaView | None, int]:
    """Write a new persona version; returns it, the one it replaced, and how many edges were
    superseded. The current persona unchanged is returned as it is, replacing none."""
    chat = scope.writing()
    old = await current_persona(db, chat)
    if old is not None and await _unchanged(db, chat, old, description, traits, tone):
        return old, None, 0
    where, params = chat.clause()
    [(count,)] = await db.fetchall(
        f"SELECT COUNT(*) FROM graph_nodes WHERE {where} AND type = 'PersonaNode'", params
    )
    version = int(count) + 1
    while await find_node(db, chat, f"{PERSONA_PREFIX}{version}") is not None:
        version += 1
    name = f"{PERSONA_PREFIX}{version}"
    props = {"version": version, "description": description, "traits": list(traits), "tone": tone}
    await ensure_node(db, chat, name, "PersonaNode", at, field_name="description", props=props)
    ai = await ensure_node(db, chat, AI, None, at, field_name="description")
    drafts = [TripletDraft(AI, HAS_PERSONA, name, None, "PersonaNode")]
    drafts += [TripletDraft(name, HAS_TRAIT, trait, "PersonaNode") for trait in traits]
    if tone:
        drafts.append(TripletDraft(name, HAS_TONE, tone, "PersonaNode"))
    written = [
        await write_triplet(db, chat, d, source="tool", provenance=["tool"], at=at, actor="persona_set")
        for d in drafts
    ]
    link = written[0].edge
    superseded = 0
    if old is not None:
        q = EdgeQuery().where("e.status = 'active'").where("e.id <> ?", link.id)
        q.where("(e.subject_id = ? AND e.relation = ?) OR e.subject_id = ?", ai.id, HAS_PERSONA, old.node_id)
        stale = await select_edges(db, chat, q)
        await close_edges(db, [e.id for e in stale], "superseded", at, superseded_by=link.id)
        await history.record(
            db,
            chat,
            mode="supersede",
            actor="persona_set",
            filters={"persona_node": f"{PERSONA_PREFIX}{old.version}"},
            edges=stale,
            at=at,
            new_edge_id=link.id,
        )
        superseded = len(stale)
    current = await current_persona(db, chat)
    assert current is not None
    return current, old, superseded


async def _unchanged(
    db: GraphSQL,
    chat: GraphScope,
    current: PersonaView,
    description: str,
    traits: Sequence[str],
    tone: str | None,
) -> bool:
    """Whether ``current`` is this persona, its trait and tone edges all active (one taken away by
    a purge is written again by a new version)."""
    if (current.description, current.traits, current.tone) != (description, list(traits), tone):
        return False
    q = EdgeQuery().where("e.status = 'active'").where("e.subject_id = ?", current.node_id)
    have = {(e.relation, e.object.lower()) for e in await select_edges(db, chat, q)}
    wanted = {(HAS_TRAIT, trait.lower()) for trait in traits}
    if tone:
        wanted.add((HAS_TONE, tone.lower()))
    return have == wanted
