"""The ``[plugin.graph]`` table."""

from __future__ import annotations

from narrmem_plugins.graph.vocabulary import FUNCTIONAL, check_relation
from pydantic import BaseModel, ConfigDict, Field, field_validator


class GraphOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    extract_facts: bool = Field(default=True, description="write the facts stored messages state")
    seed_similarity: float = Field(
        default=0.5, ge=0, le=1, description="cosine that makes a node a memory_recall seed by meaning"
    )
    seed_limit: int = Field(default=8, ge=0, le=200, description="most nodes seeded by meaning per recall")
    context_facts: int = Field(default=20, ge=0, le=500, description="user facts in a turn context")
    located_days: float = Field(
        default=3.0,
        ge=0,
        le=3650,
        description="days a 'located_at' fact ('I'm at the airport right now') stays in a turn context",
    )
    context_memories: int = Field(
        default=5, ge=0, le=50, description="recalled memories in a turn context (0: none)"
    )
    context_speculative: bool = Field(
        default=True, description="show speculative facts (marked [speculation]) in a turn context"
    )
    chain_limit: int = Field(
        default=10,
        ge=1,
        le=200,
        description="most tasks in a turn context (those in progress, or the chain when the user "
        "refers back)",
    )
    reference_phrases: list[str] = Field(
        default_factory=list, description="more phrases that refer back to earlier conversation"
    )
    auto_tasks: bool = Field(
        default=False, description="keep the task chain from the messages (for bots without tool calls)"
    )
    topic_similarity: float = Field(
        default=0.35, ge=0, le=1, description="auto_tasks: cosine at which a message stays on a task's topic"
    )
    resume_window: int = Field(
        default=200,
        ge=1,
        le=10_000,
        description="auto_tasks: the newest paused tasks a message that leaves the current topic may "
        "resume (older ones stay in the chain; a topic that comes back after them starts a new task)",
    )
    functional_relations: list[str] = Field(
        default_factory=list,
        description="more relations that hold one value at a time (a new value supersedes the old), "
        "besides " + ", ".join(sorted(FUNCTIONAL)),
    )

    @field_validator("functional_relations")
    @classmethod
    def _relation_names(cls, names: list[str]) -> list[str]:
        return [check_relation(name) for name in names]

    @property
    def functional(self) -> frozenset[str]:
        """Every relation that holds one value at a time."""
        return FUNCTIONAL | frozenset(self.functional_relations)
