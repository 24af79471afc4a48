"""The tools' inputs and outputs: strict pydantic models (unknown fields are errors, every string and
list is bounded) and the typed JSON results."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from narrmem_plugins.graph.edges import Edge
from narrmem_plugins.graph.vocabulary import (
    MAX_NAME_CHARS,
    NodeType,
    TaskState,
    check_name,
    check_relation,
)
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from narrmem.models import MAX_ID_CHARS, no_nul

NodeName = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(check_name),
]
RelationName = Annotated[str, AfterValidator(check_relation)]
TaskId = Annotated[str, StringConstraints(pattern=r"^[\w.:\-]{1,128}$")]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)]
# A trait and the tone are graph nodes' names, held to what memory_commit holds a name to.
Trait = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100), AfterValidator(check_name)
]
MAX_TRIPLETS = 50


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class ScopeArgs(_Strict):
    """Whose graph: a user (required), optionally one of their chats, in a tenant."""

    user_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="whose graph")
    chat_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description="reads: only this chat (default: all of the user's chats); writes: this chat "
        "(default: '_direct')",
    )
    tenant: str = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)

    _ids_without_nul = field_validator("user_id", "chat_id", "tenant")(no_nul)


class ChatScopeArgs(ScopeArgs):
    """The task chain belongs to one chat, so task tools need it."""

    chat_id: str = Field(min_length=1, max_length=MAX_ID_CHARS, description="the chat whose task chain")


# --- triplets -----------------------------------------------------------------------------


class TripletIn(_Strict):
    subject: NodeName = Field(description="a node name; 'user' is the user whose graph it is")
    relation: RelationName = Field(description="lower_snake (likes, works_on) or UPPER_SNAKE (RELATES_TO)")
    object: NodeName
    subject_type: NodeType | None = Field(default=None, description="default EntityNode")
    object_type: NodeType | None = Field(default=None, description="default EntityNode")
    confidence: float | None = Field(
        default=None, ge=0.0, le=1.0, description="default 1.0, or 0.5 when speculative"
    )


class TripletOut(_Strict):
    id: int
    subject: str
    subject_type: str
    relation: str
    object: str
    object_type: str
    chat_id: str
    speculative: bool
    confidence: float
    status: Literal["active", "deleted", "superseded"]
    source: Literal["message", "tool", "auto"]
    provenance: list[str] = Field(description="message ids it was stated in, or ['tool']")
    count: int = Field(description="how many times it was stated")
    valid_from: AwareDatetime
    valid_to: AwareDatetime | None
    last_seen: AwareDatetime
    superseded_by: int | None
    superseded_at: AwareDatetime | None = Field(
        default=None, description="when a newer value or a contradiction replaced it (it is past since)"
    )


def triplet_out(edge: Edge) -> TripletOut:
    # The output's fields are the edge's own attributes (``superseded_at`` is its property).
    return TripletOut.model_validate(edge, from_attributes=True)


class CommitInput(ScopeArgs):
    triplets: list[TripletIn] = Field(min_length=1, max_length=MAX_TRIPLETS)
    speculative: bool = Field(
        default=False, description="true for anything inferred rather than said (shown as [speculation])"
    )


class CommitOutput(_Strict):
    triplets: list[TripletOut]
    created: int
    confirmed: int
    superseded: list[TripletOut] = Field(description="active triplets these contradicted")


# --- purge --------------------------------------------------------------------------------


class PurgeFilters(_Strict):
    """Exact by default (names compare case-insensitively); substring only through the *_contains keys.
    All given filters must hold. At least one is required."""

    subject: NodeName | None = None
    relation: RelationName | None = None
    object: NodeName | None = None
    subject_contains: NodeName | None = None
    relation_contains: NodeName | None = None
    object_contains: NodeName | None = None
    speculative: bool | None = Field(default=None, description="only speculative (true) or stated (false)")

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class PurgeInput(ScopeArgs):
    filters: PurgeFilters
    mode: Literal["soft", "hard", "supersede"] = Field(
        default="soft",
        description="soft: mark deleted (kept as history); hard: erase the rows; supersede: mark "
        "superseded by new_triplet",
    )
    new_triplet: TripletIn | None = Field(default=None, description="supersede only: what replaces them")
    dry_run: bool = Field(default=False, description="say what would be affected, change nothing")
    max_affected: int = Field(default=100, ge=1, le=10_000, description="refuse to touch more than this")
    whole_tasks: bool = Field(
        default=False,
        description="when the filters reach a task's state, purge the task whole (state, info, chain "
        "links) instead of refusing",
    )


class PurgeOutput(_Strict):
    mode: str
    dry_run: bool
    matched: int
    triplets: list[TripletOut] = Field(description="the affected triplets as they were before the purge")
    new_triplet: TripletOut | None
    purge_id: int | None
    tasks: list[str] = Field(
        default_factory=list, description="tasks whose state the filters reach (purged whole, or refused)"
    )
    refused: str | None = Field(default=None, description="dry run: why the purge itself would be refused")


# --- recall -------------------------------------------------------------------------------


class TimeRange(_Strict):
    from_: AwareDatetime | None = Field(default=None, alias="from")
    to: AwareDatetime | None = None

    @model_validator(mode="after")
    def _ordered(self) -> TimeRange:
        if self.from_ is None and self.to is None:
            raise ValueError("give from, to or both")
        if self.from_ is not None and self.to is not None and self.from_ > self.to:
            raise ValueError("from must not be after to")
        return self


class RecallInput(ScopeArgs):
    query_intent: str = Field(
        min_length=1, max_length=1000, description="comma-separated keywords, e.g. 'persona,tone'"
    )
    depth: int = Field(default=2, ge=1, le=5, description="hops walked from the matching nodes")
    time_range: TimeRange | None = Field(
        default=None, description="only triplets stated within {from, to} (ISO-8601 with timezone)"
    )
    include_speculative: bool = True
    limit: int = Field(default=100, ge=1, le=1000, description="most triplets returned")

    @field_validator("query_intent")
    @classmethod
    def _has_keywords(cls, value: str) -> str:
        if not split_keywords(value):
            raise ValueError("needs at least one keyword")
        return value


def split_keywords(text: str) -> list[str]:
    """The keywords of a ``query_intent`` ("a,b,c"; Chinese commas too), without repeats, at most 20."""
    seen: list[str] = []
    for part in re.split(r"[,，、;；\n]+", text):
        word = part.strip()
        if word and word.lower() not in (w.lower() for w in seen):
            seen.append(word)
    return seen[:20]


class NodeOut(_Strict):
    name: str
    type: str
    distance: int = Field(description="hops from the nearest matching node (0 = it matched)")
    description: str | None = None


class RecallOutput(_Strict):
    keywords: list[str]
    seeds: list[str]
    nodes: list[NodeOut]
    edges: list[TripletOut]
    past: list[TripletOut] = Field(
        default_factory=list,
        description="earlier values of one-value relations (lives_in, works_at…) touching the matched "
        "nodes: no longer true, each with superseded_at",
    )
    rendered: str
    truncated: bool


# --- tasks ------------------------------------------------------------------------------


class TaskCreateInput(ChatScopeArgs):
    task_id: TaskId = Field(
        description="unique in the chat, ignoring case (Task_A and task_a are one task): letters, "
        "digits, _ . : -"
    )
    description: Text
    info_nodes: list[NodeName] = Field(default_factory=list, max_length=20)


class TaskOut(_Strict):
    task_id: str
    description: str
    state: TaskState
    created_at: AwareDatetime
    info_nodes: list[str]


class TaskCreateOutput(_Strict):
    task: TaskOut
    previous_task: str | None = Field(description="the task this one follows (NEXT_TASK)")


class TaskSetStateInput(ChatScopeArgs):
    task_id: TaskId
    state: TaskState


class TaskSetStateOutput(_Strict):
    task: TaskOut
    previous_state: TaskState
    changed: bool


class TaskQueryInput(ChatScopeArgs):
    state: TaskState | None = None
    limit: int = Field(default=20, ge=1, le=200)


class TaskQueryOutput(_Strict):
    tasks: list[TaskOut]


class FactsInput(ScopeArgs):
    before_id: int | None = Field(
        default=None, ge=1, description="the next page: the facts older than this id (the last one given)"
    )
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many facts")
    include_speculative: bool = True


class FactsOutput(_Strict):
    facts: list[TripletOut] = Field(description="active facts, newest first (by id)")
    more: bool = Field(description="older facts follow (read them with before_id)")


class TaskChainsInput(ScopeArgs):
    limit: int = Field(default=20, ge=1, le=200, description="at most this many tasks of each chain")


class TaskChainOut(_Strict):
    chat_id: str
    tasks: list[TaskOut] = Field(description="the chain, newest first, at most limit")
    total: int = Field(description="how many tasks the chain holds (more than tasks: cut at limit)")


class TaskChainsOutput(_Strict):
    chains: list[TaskChainOut] = Field(description="every chat of the user with tasks, newest task first")


# --- persona ------------------------------------------------------------------------------


class PersonaSetInput(ScopeArgs):
    description: Text
    traits: list[Trait] = Field(default_factory=list, max_length=20)
    tone: NodeName | None = None


class PersonaOut(_Strict):
    version: int
    description: str
    traits: list[str]
    tone: str | None
    chat_id: str
    set_at: AwareDatetime


class PersonaSetOutput(_Strict):
    persona: PersonaOut
    replaced: PersonaOut | None
    superseded_edges: int


class PersonaGetInput(ScopeArgs):
    pass


class PersonaGetOutput(_Strict):
    persona: PersonaOut | None
    rendered: str
    chats: list[PersonaOut] = Field(
        default_factory=list,
        description="asked without chat_id: the personas set for particular chats of the user, which "
        "the bot is given there instead of the default above (at most 100, by chat)",
    )


# --- context rewrite --------------------------------------------------------------------------


class FunctionCall(_Strict):
    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    arguments: str | dict[str, Any] = Field(default="{}", description="JSON text, as OpenAI sends it")


class ToolCall(_Strict):
    id: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(default=None, max_length=200_000)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=100)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=200)
    name: str | None = Field(default=None, min_length=1, max_length=64)


class RewriteInput(_Strict):
    messages: list[ChatMessage] = Field(min_length=2, max_length=1000)
    summary: str = Field(min_length=1, max_length=8000)


class RewriteOutput(_Strict):
    messages: list[ChatMessage] = Field(description="[the user message, the summary as an assistant message]")
    tool_calls: int
    tools: list[str]
    replaced: int = Field(description="messages the summary replaces")
