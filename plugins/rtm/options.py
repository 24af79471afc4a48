"""The ``[plugin.rtm]`` table."""

from __future__ import annotations

from narrmem_plugins.rtm.partition import DEFAULT_BALANCE
from narrmem_plugins.rtm.store import DEFAULT_KEPT
from pydantic import BaseModel, ConfigDict, Field


class RTMOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    branching: int = Field(
        default=4, ge=2, le=10, description="K when a call gives none (working-memory chunk)"
    )
    compression: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="share of units a level keeps; suggests K and D for user summaries",
    )
    summary_tokens: int = Field(default=48, ge=4, le=4000, description="budget of one extractive summary")
    summary_clauses: int = Field(
        default=2, ge=1, le=20, description="clauses one extractive summary may quote"
    )
    balance: float = Field(
        default=DEFAULT_BALANCE, ge=0, le=10, description="pull of the semantic split towards even parts"
    )
    max_clauses: int = Field(default=50_000, ge=1, le=1_000_000, description="longest text, in clauses")
    trees_kept: int = Field(
        default=DEFAULT_KEPT,
        ge=1,
        le=1_000_000,
        description="narrative trees the tools' store keeps per tenant; the oldest written goes first "
        "(a tree is built again from its text)",
    )
    user_memory_limit: int = Field(
        default=1000, ge=1, le=100_000, description="newest memories a user summary covers"
    )
    user_summaries_kept: int = Field(
        default=128,
        ge=0,
        le=100_000,
        description="users whose summary tree stays in memory between calls; the least recently asked "
        "goes first (0: none)",
    )
    user_kinds: list[str] = Field(default_factory=lambda: ["episode", "scene"])
    user_token_budget: int = Field(
        default=400,
        ge=16,
        le=100_000,
        description="budget when a user summary is asked for neither depth nor budget",
    )
