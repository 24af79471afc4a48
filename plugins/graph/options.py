"""The ``[plugin.graph]`` table."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GraphOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    extract_facts: bool = Field(default=True, description="write the facts stored messages state")
    seed_similarity: float = Field(
        default=0.5, ge=0, le=1, description="cosine that makes a node a memory_recall seed by meaning"
    )
    seed_limit: int = Field(default=8, ge=0, le=200, description="most nodes seeded by meaning per recall")
    context_facts: int = Field(default=20, ge=0, le=500, description="user facts in a turn context")
    context_memories: int = Field(
        default=5, ge=0, le=50, description="recalled memories in a turn context (0: none)"
    )
    context_speculative: bool = Field(
        default=True, description="show speculative facts (marked [speculation]) in a turn context"
    )
    chain_limit: int = Field(
        default=10, ge=1, le=200, description="tasks of the chain shown when the user refers back"
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
