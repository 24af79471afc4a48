"""Facts from stored messages (``narrmem_after_store``): ask ``narrmem_extract_facts`` (an LLM plugin
may answer), else the built-in rules of :mod:`.extract`; write them on the user's node in the message's
chat with the message id as provenance, and say what happened in ``result.notes``."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from datetime import timedelta

from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.extract import extract
from narrmem_plugins.graph.render import triplet_line
from narrmem_plugins.graph.schemas import NodeName, RelationName
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import FUNCTIONAL, STRUCTURAL, USER, NodeType
from narrmem_plugins.graph.writer import TripletDraft, WriteOutcome, write_triplet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narrmem import logs
from narrmem.models import Message, TriageDecision
from narrmem.view import MemoryView

log = logs.logger("narrmem.graph")
HOOK = "narrmem_extract_facts"


class FactIn(BaseModel):
    """One fact as ``narrmem_extract_facts`` returns it (a dict or an object with these attributes)."""

    model_config = ConfigDict(extra="forbid")
    subject: NodeName = USER
    relation: RelationName
    object: NodeName
    speculative: bool = False
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    subject_type: NodeType | None = None
    object_type: NodeType | None = None

    @field_validator("relation")
    @classmethod
    def _not_structural(cls, relation: str) -> str:
        if relation in STRUCTURAL:
            raise ValueError(f"{relation} is written by the task and persona tools only")
        return relation


async def drafts_for(
    memory: MemoryView, message: Message, decision: TriageDecision, notes: list[str]
) -> list[TripletDraft]:
    """The message's facts: from the hook when an implementation answers, else from the rules."""
    answer = None
    if hasattr(memory.host.pm.hook, HOOK):
        answer = await memory.host.call_first(HOOK, memory=memory, message=message, decision=decision)
    if answer is None:
        return [
            TripletDraft(
                f.subject,
                f.relation,
                f.object,
                confidence=f.confidence,
                speculative=f.speculative,
                said_at=message.ts - timedelta(days=365.25 * f.years_ago) if f.years_ago else None,
            )
            for f in extract(message.text)
        ]
    if not isinstance(answer, list | tuple):
        notes.append(f"graph: {HOOK} returned {type(answer).__name__}, not a list; no facts written")
        return []
    drafts = []
    for index, item in enumerate(answer):
        if isinstance(item, dict):
            raw = item
        elif hasattr(item, "model_dump"):
            raw = item.model_dump()
        else:
            raw = getattr(item, "__dict__", item)
        try:
            fact = FactIn.model_validate(raw)
        except ValidationError as exc:
            notes.append(
                f"graph: fact {index} from {HOOK} is invalid and was skipped: {exc.errors()[0]['msg']}"
            )
            continue
        drafts.append(
            TripletDraft(
                fact.subject,
                fact.relation,
                fact.object,
                fact.subject_type,
                fact.object_type,
                fact.confidence,
                fact.speculative,
            )
        )
    return drafts


async def store_facts(
    memory: MemoryView,
    transaction: Callable[[], AbstractAsyncContextManager[GraphSQL]],
    message: Message,
    drafts: list[TripletDraft],
    functional: Collection[str] = FUNCTIONAL,
) -> list[WriteOutcome]:
    scope = GraphScope(message.tenant, message.user_id, message.chat_id)
    async with transaction() as db:
        return [
            await write_triplet(
                db,
                scope,
                draft,
                source="message",
                provenance=[message.message_id],
                at=draft.said_at or message.ts,
                actor=f"message:{message.message_id}",
                functional=functional,
            )
            for draft in drafts
        ]


def notes_for(outcomes: list[WriteOutcome]) -> list[str]:
    notes = []
    for outcome in outcomes:
        line = triplet_line(outcome.edge)
        if outcome.edge.status != "active":
            notes.append(f"fact (already outdated, kept as history): {line}")
        elif outcome.created:
            notes.append(f"fact: {line}")
        else:
            notes.append(f"fact confirmed ({outcome.edge.count}x): {line}")
        for old in outcome.superseded:
            notes.append(f"fact superseded: {triplet_line(old)} -> {line}")
    return notes
