"""What a forget voids among the trigger events the server has not delivered yet.

An event carries the user's own words (its label) and the ids of the messages it counted, so one
queued for a stream or the webhook when its user, chat or messages are forgotten must not be sent
afterwards. The hub hears of every forget of its process through the public
``narrmem_after_forget`` hook, so a forget made through the Python API, a tool, a bot or a hook
voids its events as the routes' do. A forget made by another process (another worker of the same
store) is not heard: :class:`StillStored` reads, before each delivery, whether the memories the
event cites are still stored, as they were when it was published.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from narrmem import hookimpl
from narrmem.doors.server.events import TriggerHub
from narrmem.memory import Memory
from narrmem.models import MemoryRecord, Scope, TriggerEvent
from narrmem.store import Store


@dataclass(frozen=True)
class Forgotten:
    """One forget as the events it voids see it: a user's and/or a chat's (``messages`` is
    ``None``), or what ``messages`` of ``chat_id`` left."""

    tenant: str
    user_id: str | None
    chat_id: str | None
    messages: frozenset[str] | None
    # The message ids of chat_id it took, and whose memories of that chat went: a user's count
    # spans the user's chats, so an event made in another chat may cite (and word) them.
    chat_message_ids: frozenset[str]
    chat_users: frozenset[str]

    @classmethod
    def of(
        cls,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        removed: Iterable[MemoryRecord],
        sources: dict[str, list[str]],
        messages: list[str] | None,
    ) -> Forgotten:
        # A message's deletion names its messages; sources would name the others a deleted
        # scene was built from too, which stay.
        in_chat = messages if messages is not None else sources.get(chat_id or "", [])
        return cls(
            tenant=tenant,
            user_id=user_id,
            chat_id=chat_id,
            messages=None if messages is None else frozenset(messages),
            chat_message_ids=frozenset(in_chat),
            chat_users=frozenset(r.user_id for r in removed if r.chat_id == chat_id),
        )

    def voids(self, event: TriggerEvent) -> bool:
        if event.tenant != self.tenant:
            return False
        if self.user_id is not None and event.user_id != self.user_id:
            return False
        in_chat = self.chat_id is None or event.chat_id == self.chat_id
        if self.messages is None and in_chat:
            return True
        cited = set(event.message_ids)
        if in_chat and event.cause_message_id is not None:
            cited.add(event.cause_message_id)
        if cited.isdisjoint(self.chat_message_ids):
            return False
        # Message ids repeat across chats: one elsewhere counts only for a user of this chat.
        return in_chat or self.user_id is not None or event.user_id in self.chat_users


class ForgetsVoidEvents:
    """The plugin object the server registers on its memory: each forget drops the hub's
    undelivered events of what it forgot (queued, or being delivered to the webhook)."""

    def __init__(self, hub: TriggerHub) -> None:
        self.hub = hub

    @hookimpl
    def narrmem_after_forget(
        self,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        removed: list[MemoryRecord],
        sources: dict[str, list[str]],
        messages: list[str] | None,
    ) -> None:
        forgotten = Forgotten.of(tenant, user_id, chat_id, removed, sources, messages)
        self.hub.drop(forgotten.voids)


class StillStored:
    """Whether an event still stands, read from the store: what it cites (the messages it counted
    and the one that made it, all in its chat) is stored for its user under the memory ids it had
    when the event was published. A forget of the user, the chat or a cited message, made by any
    process, deletes them; an edit too (its new text is stored under new ids). An event that cites
    nothing stored stands while its user holds anything in its chat."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    @property
    def store(self) -> Store:
        return self.memory.store

    async def cited(self, event: TriggerEvent) -> tuple[int, ...]:
        """The memory ids behind ``event`` now (when it is published)."""
        messages = sorted({*event.message_ids, *filter(None, [event.cause_message_id])})
        if event.chat_id is None or not messages:
            return ()
        ids = await self.store.from_messages(event.tenant, event.chat_id, messages)
        return tuple(sorted(await self.store.get(ids, _scope(event))))

    async def stands(self, event: TriggerEvent, cited: tuple[int, ...]) -> bool:
        scope = _scope(event)
        if cited:
            return len(await self.store.get(list(cited), scope)) == len(cited)
        return bool(await self.store.recent(scope, limit=1))


def _scope(event: TriggerEvent) -> Scope:
    return Scope(tenant=event.tenant, user_id=event.user_id, chat_id=event.chat_id)
