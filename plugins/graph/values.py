"""The value a one-value relation holds now, and the values it held before.

A functional relation (``lives_in``, ``works_at``, ``job``, ``partner``, ``age``, ``located_at``, and
``[plugin.graph] functional_relations``) holds one object at a time: each new value supersedes the
old one, which stays as history with the time it stopped holding (``superseded_at``). Code that
answers "now" questions (where does the user live now?) asks :func:`current_value`; code that
shows history asks :func:`value_history`. Both only read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from narrmem_plugins.graph.edges import Edge, EdgeQuery, select_edges
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import USER, canonical_name

from narrmem.checks import text_argument
from narrmem.models import MAX_ID_CHARS
from narrmem.view import MemoryView

if TYPE_CHECKING:
    from narrmem_plugins.graph import GraphPlugin


@dataclass(frozen=True)
class FactValue:
    """One value of a relation: since when it was stated, and until when it held (``None``: it
    holds now)."""

    subject: str
    relation: str
    object: str
    since: datetime
    superseded_at: datetime | None
    speculative: bool
    chat_id: str
    edge_id: int

    @property
    def current(self) -> bool:
        return self.superseded_at is None

    @classmethod
    def of(cls, edge: Edge) -> FactValue:
        ended = edge.superseded_at
        return cls(
            subject=edge.subject,
            relation=edge.relation,
            object=edge.object,
            since=datetime.fromisoformat(edge.valid_from),
            superseded_at=datetime.fromisoformat(ended) if ended else None,
            speculative=edge.speculative,
            chat_id=edge.chat_id,
            edge_id=edge.id,
        )


def is_functional(memory: MemoryView, relation: str) -> bool:
    """Whether ``relation`` holds one value at a time in this memory's graph."""
    return relation in _plugin(memory).options.functional


async def value_history(
    memory: MemoryView,
    *,
    user_id: str,
    relation: str,
    subject: str = USER,
    tenant: str = "default",
    chat_id: str | None = None,
) -> list[FactValue]:
    """Every value ``subject relation ?`` held, newest first (the current one, if any, first);
    deleted triplets are left out. ``chat_id`` narrows to one chat (default: all the user's chats)."""
    for name, value in (("user_id", user_id), ("tenant", tenant), ("relation", relation)):
        text_argument(value, name, max_chars=MAX_ID_CHARS)
    scope = GraphScope(tenant, user_id, chat_id)
    q = EdgeQuery().where("e.status IN ('active', 'superseded')").where("e.relation = ?", relation)
    q.where("nocase(s.name) = nocase(?)", canonical_name(subject, user_id))
    async with _plugin(memory).backend().read() as db:
        edges = await select_edges(db, scope, q, order="e.valid_from_ts DESC, e.id DESC")
    # What holds first (a plain statement before a guess), then the past, latest ended first.
    edges.sort(key=lambda e: (e.status != "active", e.speculative, -(_ended(e) or e.valid_from_ts)))
    return [FactValue.of(e) for e in edges]


async def current_value(memory: MemoryView, **where: Any) -> FactValue | None:
    """The value ``subject relation ?`` holds now (a stated one before a guess), or ``None``; takes
    :func:`value_history`'s arguments (``user_id``, ``relation``, ``subject``, ``tenant``, ``chat_id``)."""
    history = await value_history(memory, **where)
    return history[0] if history and history[0].current else None


def _ended(edge: Edge) -> float | None:
    ended = edge.superseded_at
    return datetime.fromisoformat(ended).timestamp() if ended else None


def _plugin(memory: MemoryView) -> GraphPlugin:
    from narrmem_plugins.graph import plugin_of  # the package imports this module

    return plugin_of(memory)
