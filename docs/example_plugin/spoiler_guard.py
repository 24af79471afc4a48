"""spoiler_guard: a complete third-party narrmem plugin, as ``docs/plugins.md`` walks through it.

It never remembers messages marked as spoilers (``||like this||``), counts what it refused per
user in its own state namespace, offers a tool that reports the count, and forgets its count when
the user is forgotten. Install it with an entry point in your package's ``pyproject.toml``::

    [project.entry-points.narrmem]
    spoiler_guard = "spoiler_guard:SpoilerGuard"
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from narrmem import Message, TriageDecision, hookimpl
from narrmem.configured import Configured
from narrmem.tools import Tool
from narrmem.view import MemoryView

NAME = "spoiler_guard"  # the entry-point name: its [plugin.spoiler_guard] table and state namespace


class SpoilerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error naming it
    marker: str = Field(default="||", min_length=1, max_length=8, description="opens and closes a spoiler")


class SpoilerCountInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=200)
    tenant: str = Field(default="default", min_length=1, max_length=200)


class SpoilerCountOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    refused: int


class SpoilerGuard(Configured[SpoilerOptions], name=NAME, options=SpoilerOptions):
    """A class is instantiated once per Memory, so its state is never shared between memories."""

    @hookimpl(tryfirst=True)
    async def narrmem_triage(self, memory: MemoryView, message: Message) -> TriageDecision | None:
        marker = self.options.marker
        text = message.text.strip()
        if not (len(text) > 2 * len(marker) and text.startswith(marker) and text.endswith(marker)):
            return None  # not ours: the next triage (the built-in one) decides
        key = _key(message.tenant, message.user_id)
        # Compare-and-set: workers sharing a store count the same user at once, and a read then
        # a write would lose one another's counts. A few tries: a count is not worth holding the
        # message up for.
        for _ in range(8):
            state = await memory.store.state_get(NAME, key)
            counted = {"refused": int(state["refused"]) + 1 if state else 1}
            if await memory.store.state_put_if(NAME, key, counted, state):
                break
        return TriageDecision(layer="ignore", reason="spoiler")

    @hookimpl
    def narrmem_register_tools(self, register: Callable[[Tool], None]) -> None:
        register(
            Tool(
                name="spoiler_count",
                description="How many of a user's messages were not remembered because they were spoilers.",
                input_model=SpoilerCountInput,
                output_model=SpoilerCountOutput,
                handler=count,
            )
        )

    @hookimpl
    async def narrmem_after_forget(self, memory: MemoryView, tenant: str, user_id: str | None) -> None:
        # Forget means gone: the count is about the user, so it goes with them.
        if user_id is not None:
            await memory.store.state_delete(NAME, _key(tenant, user_id))  # by prefix: see _key


async def count(memory: MemoryView, args: SpoilerCountInput) -> SpoilerCountOutput:
    state = await memory.store.state_get(NAME, _key(args.tenant, args.user_id))
    return SpoilerCountOutput(refused=int(state["refused"]) if state else 0)


def _key(tenant: str, user_id: str) -> str:
    # state_delete deletes by key prefix. No id holds a NUL, so with each part ended by one, no
    # user's key starts with another's: forgetting "ann" spares "anna", and a tenant's name cannot
    # run on into a user id.
    return f"{tenant}\0{user_id}\0"
