"""Prompt text: triplets, tasks and personas as short lines. Speculation is always marked
``[speculation]`` on the subject, as the seed writes it ("user[speculation] likes music")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from narrmem_plugins.graph.edges import Edge
from narrmem_plugins.graph.persona import PersonaView
from narrmem_plugins.graph.recall import GraphView
from narrmem_plugins.graph.tasks import TaskView

from narrmem.person import fact_line

SPECULATION = "[speculation]"


def triplet_line(edge: Edge, now: str | None = None) -> str:
    """``user likes rock``; a superseded triplet says it is past, since when, and (``now``) what
    holds instead: ``user lives_in Berlin (past: until 2026-05-04; now: Paris)``."""
    mark = SPECULATION if edge.speculative else ""
    line = fact_line(f"{edge.subject}{mark}", edge.relation, edge.object)
    if edge.superseded_at is not None:
        instead = f"; now: {now}" if now else ""
        line += f" (past: until {edge.superseded_at[:10]}{instead})"
    return line


def merged(edges: Iterable[Edge]) -> list[Edge]:
    """One edge per triplet: the same triplet stated in several chats is one line (the newest row,
    speculative only if every row is)."""
    best: dict[tuple[str, str, str], Edge] = {}
    plain: dict[tuple[str, str, str], bool] = {}
    for edge in edges:
        key = edge.key
        plain[key] = plain.get(key, False) or not edge.speculative
        if key not in best or edge.last_seen_ts > best[key].last_seen_ts:
            best[key] = edge
    out = []
    for key, edge in best.items():
        if plain[key] and edge.speculative:
            edge = Edge(**{**edge.__dict__, "speculative": False})
        out.append(edge)
    return out


def triplet_block(title: str, edges: Sequence[Edge]) -> str:
    lines = [f"- {triplet_line(e)}" for e in merged(edges)]
    return "\n".join([title, *lines]) if lines else ""


def task_line(task: TaskView) -> str:
    info = f" (info: {', '.join(task.info_nodes)})" if task.info_nodes else ""
    return f"- {task.task_id} [{task.state}] {task.description}{info}"


def persona_text(persona: PersonaView | None) -> str:
    if persona is None:
        return ""
    parts = [f"Persona: {persona.description}"]
    if persona.traits:
        parts.append(f"Traits: {', '.join(persona.traits)}")
    if persona.tone:
        parts.append(f"Tone: {persona.tone}")
    return "\n".join(parts)


def recall_text(view: GraphView) -> str:
    """``memory_recall``'s text: the triplets that hold, then the past values that touch the query."""
    text = triplet_block(f"Memory graph ({', '.join(view.keywords)}):", view.edges)
    if view.past:
        lines = [f"- {triplet_line(e, view.now.get(e.id))}" for e in view.past]
        text = "\n".join(filter(None, [text, "No longer true:", *lines]))
    return text
