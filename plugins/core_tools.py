"""The first tools: ``narrmem_ingest`` and ``narrmem_recall``."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.models import MAX_QUERY_CHARS, Hit, IncomingMessage, Layer, Scope
from narrmem.tools import Tool
from narrmem.view import MemoryView


class IngestOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message_id: str
    layer: Layer
    stored: bool
    duplicate: bool
    reason: str
    memory_ids: list[int]
    written: bool = Field(
        default=True,
        description="false when acknowledged on receipt: kept as it came, written a moment later (no ids)",
    )


class RecallInput(Scope):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="what to remember about")
    k: int = Field(default=5, ge=1, le=50, description="how many memories to return")
    reinforce: bool = Field(
        default=True,
        description="strengthen the relevant hits, as a recall to answer does; false for a look that "
        "changes nothing (an inspector's)",
    )


class RecallOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hits: list[Hit]


async def ingest(memory: MemoryView, args: IncomingMessage) -> IngestOutput:
    # A tool caller may leave ts out: the message is taken as said now, by the memory's clock.
    result = await memory.ingest(args.at(memory.clock.now()))
    return IngestOutput.model_validate(result, from_attributes=True)


async def recall(memory: MemoryView, args: RecallInput) -> RecallOutput:
    # An agent recalls to answer: the relevant hits may be reinforced, noted as the tool's doing.
    scope = args.model_dump(include=set(Scope.model_fields))
    hits = await memory.recall(
        args.query, **scope, k=args.k, reinforce=args.reinforce, reinforce_reason="tool"
    )
    return RecallOutput(hits=hits)


TOOLS = [
    Tool(
        name="narrmem_ingest",
        description=(
            "Hand one chat message to memory. Call it for every message the user sends; memory "
            "decides whether it is worth keeping. Arguments: text, user_id (who wrote it), chat_id "
            "(where), ts (ISO-8601 with timezone; default: now), message_id (unique in the chat), "
            "optional tenant, speaker and meta."
        ),
        input_model=IncomingMessage,
        output_model=IngestOutput,
        handler=ingest,
    ),
    Tool(
        name="narrmem_recall",
        description=(
            "Find what memory holds that answers a question about a user or a chat, best first. "
            "Give query and user_id (that person's memories) and/or chat_id (that chat's); k is how "
            "many memories to return; reinforce=false only looks (nothing is strengthened). Each "
            "hit has text, kind, score, importance, created_at and the message_ids it came from."
        ),
        input_model=RecallInput,
        output_model=RecallOutput,
        handler=recall,
    ),
]


@hookimpl
def narrmem_register_tools(register: Callable[[Tool], None]) -> None:
    for tool in TOOLS:
        register(tool)
