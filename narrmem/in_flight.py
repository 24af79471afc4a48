"""The messages of ingest calls under way, so that a forget drops the ones it came before.

A bot hands a message to ``ingest`` and, a moment later, the person deletes it, edits it or asks
to be forgotten. The message's call may still be triaging, running before-store hooks or waiting
for its embedding: its write has not begun, so the forget (which waits for writes begun before it,
see :mod:`narrmem.fence`) found nothing of it, and the write came after the forget had returned.
With the real model this took a gap of a millisecond or two.

Each call is registered with its messages when it starts and dropped when it ends (an edit's
new text from the edit's start: its own forget of the old text spares it). A forget marks
the messages of its scope, or the message ids it names, in every call registered before it; the
call leaves them out inside its write's unit of the fence, so a message is either written before
the forget (which then deletes it) or not at all. A message sent after the forget began is kept.
This covers the calls of this process; between processes sharing a store, the entries received
and not yet written are checked in the store (:mod:`narrmem.inbox`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from narrmem.models import Message

# (tenant, chat_id, message_id): a message, as a forget of messages names it.
MessageKey = tuple[str, str, str]


class HasMessage(Protocol):
    @property
    def message(self) -> Message: ...


T = TypeVar("T", bound=HasMessage)


class Call:
    """One call's messages, and the ones a forget has dropped since the call began."""

    __slots__ = ("dropped", "messages")

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = messages
        self.dropped: set[MessageKey] = set()

    def kept(self, items: Iterable[T]) -> list[T]:
        """``items`` but those whose message a forget dropped."""
        if not self.dropped:
            return list(items)
        return [item for item in items if _key(item.message) not in self.dropped]

    def was_dropped(self, message: Message) -> bool:
        return _key(message) in self.dropped


class CallsUnderWay:
    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._calls: dict[int, Call] = {}

    @contextlib.contextmanager
    def under_way(self, messages: Sequence[Message]) -> Iterator[Call]:
        """Register a call's messages for as long as the block runs."""
        number = next(self._numbers)
        call = self._calls[number] = Call(messages)
        try:
            yield call
        finally:
            del self._calls[number]

    def drop_scope(self, tenant: str, user_id: str | None, chat_id: str | None) -> int:
        """Drop the messages of a user, a chat, or a user in a chat; returns how many."""
        dropped = 0
        for call, message in self._of_scope(tenant, user_id, chat_id):
            call.dropped.add(_key(message))
            dropped += 1
        return dropped

    def holds_scope(self, tenant: str, user_id: str | None, chat_id: str | None) -> bool:
        """Whether a call under way holds a message of the scope (one it has not dropped)."""
        return any(
            _key(message) not in call.dropped for call, message in self._of_scope(tenant, user_id, chat_id)
        )

    def _of_scope(
        self, tenant: str, user_id: str | None, chat_id: str | None
    ) -> Iterator[tuple[Call, Message]]:
        for call in self._calls.values():
            for message in call.messages:
                if (
                    message.tenant == tenant
                    and user_id in (None, message.user_id)
                    and chat_id in (None, message.chat_id)
                ):
                    yield call, message

    def drop_messages(
        self, tenant: str, chat_id: str, message_ids: Iterable[str], *, sparing: Call | None = None
    ) -> int:
        """Drop the messages of these ids in a chat, but in ``sparing`` (an edit's own call, whose
        forget of the old text this is); returns how many."""
        named = set(message_ids)
        dropped = 0
        for call in self._calls.values():
            if call is sparing:
                continue
            for message in call.messages:
                if message.tenant == tenant and message.chat_id == chat_id and message.message_id in named:
                    call.dropped.add(_key(message))
                    dropped += 1
        return dropped


def _key(message: Message) -> MessageKey:
    return (message.tenant, message.chat_id, message.message_id)
