"""The bodies of the server's answers that the library has no model for, declared in the
OpenAPI document: a client generated from it (openapi-typescript, hey-api, openapi-python-client)
gets their fields typed, not ``unknown`` to be cast.

What narrmem makes itself (a context, a page of users) is checked against its model as it goes
out. What plugins make (a summary, a turn's context, a memory's decay figures, the figures of
stats) is declared, not checked: its required fields are those the hooks' contracts promise
(``narrmem/hookspecs.py``), the built-in plugins' other fields are declared optional, and a
plugin may add more (``additionalProperties``)."""

from __future__ import annotations

from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from narrmem.models import Hit, MemoryRecord, PatternCount, Scope


class _Reply(BaseModel):
    # Every field is sent, a default one too: required in the document (a generated client then
    # reads hits[0].sources without a check for undefined).
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


class _PluginReply(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContextReply(_Reply):
    """``POST /v1/context``: what narrmem knows that fits this turn, and the block to put in the prompt."""

    query: str
    scope: Scope
    hits: list[Hit]
    rendered: str = Field(description="the prompt block, best hits first, cut to token_budget if given")


class UserRow(_Reply):
    """One user of ``GET /v1/users``: counts only, no memory's text."""

    tenant: str
    user_id: str = Field(description="the next page's after is the last row's user_id")
    memories: int
    scenes: int
    chats: int
    first_at: AwareDatetime = Field(description="when their oldest memory was made")
    last_at: AwareDatetime = Field(description="when their newest memory was made")
    plugins_only: bool = Field(
        default=False,
        description="no memory: plugins alone keep something of them (a persona, facts or tasks a "
        "tool wrote); first_at and last_at are the plugins' latest write of them",
    )


class PatternFiring(_PluginReply):
    """A trigger that fired for a pattern (``narrmem_pattern_firings``)."""

    kind: str
    label: str
    count: int = Field(description="the count it fired at")
    fired_at: AwareDatetime


class PatternsReply(_Reply):
    """``GET /v1/patterns``: what keeps coming back for a user, and the triggers that fired."""

    counts: list[PatternCount]
    triggers: list[PatternFiring]


class TenantStats(_Reply):
    """``GET /v1/stats`` with a tenant's key: that tenant's counts only."""

    tenant: str
    users: int
    memories: int
    scenes: int


class StoreStats(_PluginReply):
    """``GET /v1/stats`` on a server without keys: the store's figures, each plugin's own (a
    plugin adds its keys; the SQLite and PostgreSQL stores differ in theirs) and what is loaded."""

    memories: int
    users: int
    chats: int
    tenants: int
    by_kind: dict[str, int] = Field(description="memories of each kind (episode, scene, ...)")
    schema_version: int
    data_dir: str
    embedder: dict[str, str] = Field(description="backend and model")
    plugins: list[str]
    tools: list[str]


class ImportanceEvent(_Reply):
    """A recorded change to a memory's importance."""

    at: AwareDatetime
    who: str
    why: str
    old: float | None
    new: float


class ProjectedImportance(_Reply):
    days: int
    importance: float


class StoredMemory(MemoryRecord):
    """A stored memory as a history shows it: without the texts it is indexed by (the turns
    before it are other messages')."""

    embed_text: str | None = Field(default=None, exclude=True)
    context_text: str | None = Field(default=None, exclude=True)


class HistoryReply(_PluginReply):
    """``GET /v1/memories/{memory_id}/history``: the stored memory, its recorded changes, and what
    the decay plugin (hippocampus) projects: the optional fields, present when it is loaded."""

    memory: StoredMemory
    events: list[ImportanceEvent]
    now: AwareDatetime = Field(description="the memory's clock when asked")
    importance_now: float | None = None
    permanent: bool | None = None
    decay_clock_started: AwareDatetime | None = None
    decay_starts: AwareDatetime | None = None
    projection: list[ProjectedImportance] | None = Field(
        default=None, description="importance after so many days without use"
    )


class SummaryUnit(_PluginReply):
    text: str
    memories: int
    from_: AwareDatetime = Field(alias="from")
    to: AwareDatetime


class SummaryReply(_PluginReply):
    """``GET /v1/summary``: who this person is at an abstraction level (``narrmem_user_summary``
    promises ``depth`` and ``retelling``; the other fields are the rtm plugin's)."""

    depth: int
    retelling: str
    tenant: str | None = None
    user_id: str | None = None
    # The rtm plugin's names.
    memoryCount: int | None = None
    newestMemoryId: int | None = None
    maxDepth: int | None = None
    tokens: int | None = None
    fits: bool | None = None
    compressionRatio: float | None = None
    tokenCompressionRatio: float | None = None
    recallSequence: list[str] | None = None
    units: list[SummaryUnit] | None = None


class TurnContextReply(_PluginReply):
    """``POST /v1/turn-context``: the per-turn flow (``narrmem_turn_context``; the graph plugin
    answers): the persona, the working memory chain, the user's facts and recalled memories, and
    ``rendered``, the prompt block. Persona, task and fact objects are the graph plugin's, as its
    tools return them (``GET /v1/tools`` gives their schemas)."""

    persona: dict[str, Any] | None
    refers_back: bool = Field(description="the message refers back (just now, last time): the chain is given")
    tasks: list[dict[str, Any]]
    task_facts: list[dict[str, Any]]
    facts: list[dict[str, Any]]
    memories: list[Hit]
    rendered: str


class ToolRow(_Reply):
    """One tool of ``GET /v1/tools``: call it with ``POST /v1/tools/{name}``."""

    name: str
    description: str
    input_schema: dict[str, Any] = Field(description="JSON Schema of its arguments")
    output_schema: dict[str, Any] = Field(description="JSON Schema of what it answers")
