"""What a forget voids among the trigger events the server has not delivered yet.

An event carries the user's own words (its label) and the ids of the messages it counted, so one
queued for a stream or the webhook when its user, chat or messages are forgotten must not be sent
afterwards. The hub hears of every forget through the public ``narrmem_after_forget`` hook, so a
forget made through the Python API, a tool, a bot or a hook voids its events as the routes' do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from narrmem import hookimpl
from narrmem.doors.server.events import TriggerHub
from narrmem.models import MemoryRecord, TriggerEvent


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
