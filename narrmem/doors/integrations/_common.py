"""What the bot integrations share: building messages, one ingest or edit per turn, the context for a
turn, and the texts of the ``forgetme`` and ``memory`` replies. Nothing here imports a bot library."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any, Generic, Literal, Protocol, TypedDict, TypeVar, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from narrmem import chat_moves, logs
from narrmem.doors.integrations.backlog import (
    MAX_WAITING,
    backlog_of,
    forget_messages_record,
    forget_person,
    forget_person_record,
    message_record,
)
from narrmem.errors import InputError, NarrmemError
from narrmem.host import hookimpl
from narrmem.ingest import platform_dated
from narrmem.memory import Memory
from narrmem.models import (
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    MAX_TEXT_CHARS,
    ContextPack,
    Hit,
    IngestResult,
    MemoryRecord,
    Message,
    Scope,
    TriggerEvent,
)
from narrmem.settling import MAX_UNSETTLED
from narrmem.text import added, character_end, token_counts, tokens_of

log = logs.logger("narrmem.doors.integrations")

ContextScope = Literal["auto", "user", "chat", "user_in_chat"]
"""Whose memories the context for a turn is drawn from: ``"auto"`` (the default) the person across
all their chats in a direct chat with the bot and the person in this chat only elsewhere (a group,
a server's channel), so nothing said in a direct chat or another group is put before a group;
``"user"`` the person across all their chats (in the tenant) wherever they speak; ``"chat"``
everyone in this chat; ``"user_in_chat"`` the person in this chat only."""

COMMANDS = ("forgetme", "memory")
DEFAULT_K = 8
DEFAULT_TOKEN_BUDGET = 400
# Messages whose trigger events may still come, per integration: those waiting in the backlog
# for the store to answer, and, with [storage] acknowledge "after_write" or "on_receipt", those
# whose hooks run a moment after their ingest answered (ingest holds back at most
# MAX_UNSETTLED). The oldest goes first, so nothing grows unbounded; at 4,096 the routes of a long
# outage's first messages went before those messages were made, and their events were not said.
AWAITED_MESSAGES = MAX_WAITING + MAX_UNSETTLED
# Trigger suggestions being sent at once, per integration: past it one is dropped (and logged), as
# a platform that keeps every send waiting (rate limits) would otherwise pile them up.
MAX_SENDING = 256
# A send that has not ended after this long is given up (logged): its chat's next ones wait for it.
SEND_TIMEOUT_S = 120.0
# How long a closing memory waits for the suggestions being sent.
CLOSE_WAIT_S = 10.0
# A message's meta key for the forum topic it was written in (Telegram's message_thread_id of a
# topic message): the backlog keeps the message whole, so a suggestion made after a restart finds it.
TOPIC_KEY = "topic_id"

T = TypeVar("T")
U = TypeVar("U")
"""Where a platform's trigger handler is told to speak: aiogram's and python-telegram-bot's ``Bot``,
discord.py's channel."""


class TurnArgs(TypedDict, Generic[T], total=False):
    """The keyword options every integration takes; their meaning and defaults: :class:`TurnOptions`."""

    tenant: str
    token_budget: int
    on_trigger: Callable[[T, TriggerEvent], Awaitable[None]] | None
    k: int
    context_scope: ContextScope
    time_zone: str | tzinfo | None
    remembered_commands: Collection[str]


@dataclass(frozen=True)
class TurnOptions(Generic[T]):
    """One options model for the three bot integrations: the ``tenant`` messages go to, the
    ``token_budget`` of a rendered context, ``on_trigger(target, event)`` awaited for every trigger
    event a message causes (see :class:`TriggerRoutes`), and how many memories (``k``) a turn's
    context holds and whose (``context_scope``). ``time_zone`` (an IANA name such as
    ``"Asia/Shanghai"``, or a ``tzinfo``) is where the bot's people live: the platforms date
    messages in UTC, so without it a scene's time, a weekly habit's day and "yesterday" in a
    question are UTC's (a Monday 7am in Shanghai was "Sunday 11pm"). ``remembered_commands``
    (``{"ask", "note"}``, names without the prefix) are the commands whose words after them are
    the person's own (a group bot with Telegram's privacy mode on is sent commands, replies and
    mentions only: ``/ask should I take the job in Porto?``): remembered without the command, as
    a message would be; every other command is the person working a bot, and is not."""

    tenant: str = "default"
    token_budget: int = DEFAULT_TOKEN_BUDGET
    on_trigger: Callable[[T, TriggerEvent], Awaitable[None]] | None = None
    k: int = DEFAULT_K
    context_scope: ContextScope = "auto"
    time_zone: str | tzinfo | None = None
    remembered_commands: Collection[str] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "time_zone", zone_of(self.time_zone))
        object.__setattr__(self, "remembered_commands", _command_names(self.remembered_commands))
        if not isinstance(self.tenant, str) or not self.tenant:
            raise InputError("must be a non-empty string", field="tenant")
        for name in ("token_budget", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError("must be a positive integer", field=name)
        if self.context_scope not in get_args(ContextScope):
            raise InputError(f"must be one of {', '.join(get_args(ContextScope))}", field="context_scope")

    async def context(
        self, memory: Memory, message: Message, *, private: bool, reinforce: bool = True
    ) -> ContextPack:
        """The context for answering ``message``; ``private``: it came in a direct chat with the
        bot (what ``"auto"`` scopes by); ``reinforce=False``: a context made whether or not an
        answer uses it (its hits are reinforced by :func:`mark_used`)."""
        return await turn_context(
            memory, message, k=self.k, scope=self.context_scope, private=private, reinforce=reinforce
        )

    def render(self, pack: ContextPack | None) -> str:
        """``pack`` rendered to the token budget (``""`` when nothing is remembered)."""
        return pack.render(token_budget=self.token_budget) if pack is not None else ""


def zone_of(time_zone: object) -> tzinfo | None:
    """``time_zone`` as a ``tzinfo``: a name is looked up in the system's (or ``tzdata``'s) zones."""
    if time_zone is None or isinstance(time_zone, tzinfo):
        return time_zone
    if not isinstance(time_zone, str) or not time_zone:
        raise InputError(
            "must be an IANA time zone name such as 'Europe/Lisbon', or a tzinfo", field="time_zone"
        )
    try:
        return ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InputError(f"no time zone named {time_zone!r}", field="time_zone") from exc


def build_message(
    *,
    text: str | None,
    user_id: object,
    chat_id: object,
    message_id: object,
    ts: datetime,
    tenant: str,
    speaker: str | None,
    meta: Mapping[str, Any] | None = None,
    zone: tzinfo | None = None,
) -> Message | None:
    """A narrmem ``Message``, or ``None`` when there is no text to remember (a sticker, a photo
    without a caption, a service message)."""
    if text is None or not text.strip():
        return None
    return Message(
        # Platforms allow less than narrmem does, but a limit raised there must not make ingest fail here.
        text=text[:MAX_TEXT_CHARS],
        user_id=str(user_id),
        chat_id=str(chat_id),
        message_id=str(message_id),
        ts=ts if zone is None else ts.astimezone(zone),
        tenant=tenant,
        speaker=speaker[:MAX_ID_CHARS] if speaker else None,
        meta={key: value for key, value in (meta or {}).items() if value is not None},
    )


class _TelegramChat(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def type(self) -> str: ...


class _TelegramEntity(Protocol):
    @property
    def type(self) -> str: ...
    @property
    def offset(self) -> int: ...


class TelegramMessage(Protocol):
    """What aiogram's and python-telegram-bot's messages both have (read-only)."""

    @property
    def text(self) -> str | None: ...
    @property
    def caption(self) -> str | None: ...
    @property
    def chat(self) -> _TelegramChat: ...
    @property
    def message_id(self) -> int: ...
    @property
    def date(self) -> datetime: ...
    @property
    def message_thread_id(self) -> int | None: ...
    @property
    def forward_origin(self) -> object | None: ...
    @property
    def is_automatic_forward(self) -> bool | None: ...
    @property
    def sender_chat(self) -> _TelegramChat | None: ...
    @property
    def is_topic_message(self) -> bool | None: ...
    @property
    def via_bot(self) -> object | None: ...
    @property
    def business_connection_id(self) -> str | None: ...
    @property
    def guest_query_id(self) -> str | None: ...
    @property
    def entities(self) -> Sequence[_TelegramEntity] | None: ...
    @property
    def caption_entities(self) -> Sequence[_TelegramEntity] | None: ...


def telegram_aliases(user_id: str) -> list[str]:
    """The other id a Telegram user has in the store: ``narrmem import-chat`` names the authors of
    a Telegram Desktop export by its ``from_id`` (``user123456``), the live bots by the number."""
    return [f"user{user_id}"]


def is_forward(message: TelegramMessage) -> bool:
    """Whether ``message`` forwards someone else's: their words, not the sender's to remember
    (stored as the forwarder's, "I was diagnosed with diabetes" forwarded by Bob became Bob's, and
    its author's forget never reached it). The bot's answer to it still gets the sender's context."""
    return message.forward_origin is not None or bool(message.is_automatic_forward)


def is_relayed(message: TelegramMessage) -> bool:
    """Whether ``message`` passes on words that are not the sender's: a forward (:func:`is_forward`)
    or an inline bot's result sent via that bot (``via_bot``: a search result, a horoscope, this
    bot's own inline answers), which were stored as what the sender said. Neither it nor an edit of
    it is remembered; the bot's answer to it still gets the sender's context."""
    return is_forward(message) or message.via_bot is not None


def starts_with_command(message: TelegramMessage) -> bool:
    """Whether ``message`` begins with a command (Telegram marks it ``bot_command``), to any bot:
    ``/start`` with a deep link's token, ``/help``, ``/settings``, ``/start@other_bot`` are the
    person working a bot, not something they said (each was stored as their words)."""
    entities = message.entities if message.text is not None else message.caption_entities
    return any(entity.type == "bot_command" and entity.offset == 0 for entity in entities or ())


def outside_the_bots_chats(message: TelegramMessage) -> bool:
    """Whether ``message`` is of a chat that is not the bot's though its type is ``"private"``: a
    business account's chat with a customer (``business_connection_id``: the bot answers for the
    account, its owner reads the answer) or a chat the bot was summoned to as a guest
    (``guest_query_id``: the bot is no member, the others there read the answer). Such a chat's id
    may be that of the bot's own chat with someone (a business chat's is the customer's), so
    narrmem neither remembers it nor gives it a context: whatever ``context_scope`` says, what the
    person told the bot in private would be read there by others."""
    # Read with getattr: the library versions narrmem takes (aiogram 3.4, python-telegram-bot 22.0)
    # predate these fields (a message of theirs has none).
    return bool(getattr(message, "business_connection_id", None)) or bool(
        getattr(message, "guest_query_id", None)
    )


def in_a_direct_chat(message: TelegramMessage) -> bool:
    """Whether ``message`` came in the bot's own direct chat with its sender (what the ``"auto"``
    context scope and ``memory``'s whole answer are for): a private chat that is the bot's."""
    return message.chat.type == "private" and not outside_the_bots_chats(message)


AS_THE_GROUP_REPLY = (
    "You are writing as the group (an anonymous admin): every anonymous admin is the group here, "
    "so this would be everyone's. Write as yourself to use this command."
)
AS_A_CHANNEL_REPLY = (
    "You are writing as a channel: everyone who posts as it is that channel here, "
    "so this would be everyone's. Write as yourself to use this command."
)


def as_the_group(message: TelegramMessage) -> bool:
    """Whether an anonymous admin sent ``message``: it speaks as the group, and every anonymous
    admin of it is one sender (a ``/forgetme`` took all their words, a ``/memory`` showed them)."""
    return message.sender_chat is not None and message.sender_chat.id == message.chat.id


def shared_sender_refusal(message: TelegramMessage) -> str | None:
    """The reply that refuses ``forgetme`` and ``memory`` to a sender several people are, or
    ``None`` for a person: an anonymous admin (the group, :func:`as_the_group`) or anyone posting
    as a chat (``sender_chat``: a channel, whose admins may all post as it). One of them showed, or
    forgot, what all of them wrote."""
    if message.sender_chat is None:
        return None
    return AS_THE_GROUP_REPLY if as_the_group(message) else AS_A_CHANNEL_REPLY


def telegram_message(
    message: TelegramMessage,
    who: tuple[str, str] | None,
    edited_at: datetime | None,
    tenant: str,
    zone: tzinfo | None = None,
) -> Message | None:
    """The narrmem ``Message`` for a Telegram message from either library, or ``None`` when there is
    nothing to remember (no text or caption, ``who`` is ``None``: sent by a bot, or a chat that is
    not the bot's: :func:`outside_the_bots_chats`). A forward, a message via an inline bot and a
    command are one (their context is the sender's), not to be stored: see :func:`is_relayed` and
    :func:`starts_with_command`."""
    if who is None or outside_the_bots_chats(message):
        return None
    return build_message(
        text=message.text if message.text is not None else message.caption,
        user_id=who[0],
        chat_id=message.chat.id,
        message_id=message.message_id,
        ts=message.date,
        tenant=tenant,
        speaker=who[1],
        meta={
            "platform": "telegram",
            "chat_type": message.chat.type,
            "thread_id": message.message_thread_id,
            # The forum topic, where a suggestion it raises is said; a thread of replies in a
            # group that is no forum has an id too, but it is no place to send to.
            TOPIC_KEY: message.message_thread_id if getattr(message, "is_topic_message", None) else None,
            "edited_at": edited_at.isoformat() if edited_at else None,
        },
        zone=zone,
    )


def command_name(text: str | None) -> str | None:
    """``"forgetme"`` for ``"/forgetme@my_bot please"`` (or ``"!forgetme"``); ``None`` if not a command."""
    if not text or text[0] not in "/!":
        return None
    head = text[1:].split(maxsplit=1)[0] if text[1:].strip() else ""
    return head.split("@", 1)[0].lower() or None


def _command_names(names: object) -> frozenset[str]:
    if isinstance(names, str) or not isinstance(names, Collection):
        raise InputError(
            "must be a collection of command names ('ask', not '/ask')", field="remembered_commands"
        )
    checked = set()
    for name in names:
        if not isinstance(name, str) or not name or name[0] in "/!" or any(c.isspace() for c in name):
            raise InputError(
                f"{name!r} is no command name (a word without its prefix: 'ask')", field="remembered_commands"
            )
        checked.add(name.lower())
    return frozenset(checked)


def words_after_command(
    message: Message,
    commands: Collection[str],
    *,
    head: str | None = None,
    name: str | None = None,
    bot_username: str | None = None,
) -> Message | None:
    """``message`` as the person's words after its command, when the command is one of
    ``commands`` (:attr:`TurnOptions.remembered_commands`) and words follow it; ``None``
    otherwise (the command is not remembered). ``head`` and ``name``: the command's text and name
    as the platform read them (a Discord bot's prefix and the word it invoked, ``"!ask"``, and
    its command's name); by default the message's first word (``/ask@my_bot``) and its name,
    which is ours only if addressed to no bot or to ``bot_username``."""
    text = message.text
    if head is None:
        head = text.split(maxsplit=1)[0] if text.strip() else ""
        name = command_name(head)
        addressed = head.partition("@")[2]
        if addressed and addressed.lower() != (bot_username or "").lower():
            return None  # a command to another bot (``/ask@other_bot``): its words are not ours
    if not head or name is None or name.lower() not in commands or not text.startswith(head):
        return None
    words = text[len(head) :].strip()
    return message.model_copy(update={"text": words}) if words else None


def is_own_command(text: str | None, commands: Collection[str] = COMMANDS) -> bool:
    """Our own commands are not remembered: "/memory" says nothing about the person, and a "/forgetme"
    stored just before the forget would be wasted work."""
    return command_name(text) in commands


class TopicTriggerEvent(TriggerEvent):
    """A trigger event of a message written in a forum topic (a Telegram forum's, or a bot's
    private chat with topics): ``message_thread_id`` is that topic, for the suggestion to be said
    there and not in the chat's General topic. ``on_trigger`` gets one instead of a plain
    :class:`TriggerEvent` for such a message."""

    message_thread_id: int


def topic_of(message: Message) -> int | None:
    """The forum topic ``message`` was written in (:data:`TOPIC_KEY`), ``None`` outside one (or a
    message a backlog kept before topics were noted)."""
    topic = message.meta.get(TOPIC_KEY)
    return topic if isinstance(topic, int) and not isinstance(topic, bool) else None


class TriggerRoutes(Generic[T]):
    """Says each trigger event where the message that caused it was sent: ``on_trigger(target,
    event)``, with the ``target`` the handler had for that message (a Telegram ``Bot``, a Discord
    channel).

    The events come through :meth:`Memory.on_trigger` when the message's after-store hooks run:
    before its ingest answers with ``[storage] acknowledge = "after_hooks"`` (the default), a moment
    after with ``"after_write"`` or ``"on_receipt"``. Each event names the message that caused it
    (``cause_message_id``), so it reaches that message's chat whenever it comes, and only events of
    messages this integration ingested are said (not those of an import, nor another worker's).

    ``on_trigger`` runs in a task of its own, one chat's in the order their events came: the hooks
    that made the event are part of the memory's writes (a forget waits for them), and a send that
    waits out a platform's rate limit held every write of the bot back meanwhile (a delete in
    another server waited 4.5 s for a 5 s wait). :meth:`sent` waits for the sends under way.
    """

    def __init__(
        self,
        memory: Memory,
        on_trigger: Callable[[T, TriggerEvent], Awaitable[None]] | None,
        *,
        by: str | None = None,
        target_of: Callable[[Message], T | None] | None = None,
    ) -> None:
        self._memory = memory
        self._on_trigger = on_trigger
        self._targets: OrderedDict[tuple[str, str, str], T] = OrderedDict()
        self._said_at: dict[tuple[str, str, str], datetime] = {}  # each routed message's time
        self._topics: dict[tuple[str, str, str], int] = {}  # the forum topic of those written in one
        self._sending: set[asyncio.Task[None]] = set()
        if on_trigger is not None:
            memory.host.register(_SendsAtShutdown(self), name=f"narrmem_bot_triggers_{id(self):x}")
        self._last_send: dict[tuple[str, str], asyncio.Task[None]] = {}  # per chat: order kept
        # The integration's name in the backlog's file, and where a message it holds is answered
        # once a later start makes it (the target it was sent to is gone with the stopped process).
        self.by = by if target_of is not None else None
        self._target_of = target_of
        if on_trigger is not None:
            memory.on_trigger(self._say)
            if by is not None and target_of is not None:
                backlog_of(memory).remakes_messages(by, self._remade)

    async def _remade(self, message: Message) -> IngestResult:
        """Ingest a message a stopped process left waiting, its events said where ``target_of`` says."""
        target = self._target_of(message) if self._target_of is not None else None
        expected = self.expect(message, target)
        result: IngestResult | None = None
        try:
            result = await platform_dated(self._memory.ingest(message))
            return result
        finally:
            self.ingested(message, result, expected=expected)

    def expect(self, message: Message, target: T | None) -> bool:
        """``message`` is about to be ingested; its events are to be said to ``target``. ``False``
        when they were expected already (a copy of the message on its way: a platform's retry)."""
        route = _route(message)
        if self._on_trigger is None or target is None or route in self._targets:
            return False
        self._targets[route] = target
        self._said_at[route] = message.ts
        topic = topic_of(message)
        if topic is not None:
            self._topics[route] = topic
        while len(self._targets) > AWAITED_MESSAGES:
            oldest, _ = self._targets.popitem(last=False)
            self._forget_route(oldest)
        return True

    def _forget_route(self, route: tuple[str, str, str]) -> None:
        self._said_at.pop(route, None)
        self._topics.pop(route, None)

    def ingested(self, message: Message, result: IngestResult | None, *, expected: bool) -> None:
        """No event of ``message`` comes any more once its hooks have run, or when it was not
        stored; a copy's answer (``expected`` is ``False``) leaves the first copy's route."""
        if expected and (result is None or result.settled or not result.stored):
            self._targets.pop(_route(message), None)
            self._forget_route(_route(message))

    async def _say(self, event: TriggerEvent) -> None:
        if self._on_trigger is None or event.chat_id is None or event.cause_message_id is None:
            return
        route = (event.tenant, event.chat_id, event.cause_message_id)
        target = self._targets.get(route)
        if target is None:
            return
        if len(self._sending) >= MAX_SENDING:
            log.warning(
                "%d trigger suggestions are being sent: a %s trigger's is dropped", MAX_SENDING, event.kind
            )
            return
        chat = (event.tenant, event.chat_id)
        # Measured from when the message was said: a forget asked after it (one made late, from a
        # bot's backlog, is dated when it was asked) takes the suggestion too.
        said = self._said_at.get(route)
        made = self._memory.clock.now() if said is None else min(said, self._memory.clock.now())
        topic = self._topics.get(route)
        if topic is not None:
            event = TopicTriggerEvent(**event.model_dump(), message_thread_id=topic)
        send = self._send(target, event, made, self._last_send.get(chat))
        task = asyncio.get_running_loop().create_task(send)
        self._sending.add(task)
        self._last_send[chat] = task
        task.add_done_callback(functools.partial(self._sent, chat))

    async def _send(
        self, target: T, event: TriggerEvent, made: datetime, after: asyncio.Task[None] | None
    ) -> None:
        assert self._on_trigger is not None
        if after is not None:
            await asyncio.wait([after])  # the chat's earlier event first (a cancel of this stays here)
        try:
            # A forget of the person, the chat or the message since the event was made (a send
            # waiting out a rate limit meanwhile) takes the suggestion too: it holds their words.
            if await self._memory.forgotten_after(_cause_of(event), made):
                return
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await self._on_trigger(target, event)
        except Exception:
            # No label, no id of a person: a log outlives a forget of them.
            log.exception("the trigger callback failed for a %s trigger", event.kind)

    def _sent(self, chat: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if self._last_send.get(chat) is task:
            del self._last_send[chat]

    async def sent(self) -> None:
        """Wait for the trigger suggestions being sent now (a bot's shutdown, a test)."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def close(self) -> None:
        """The memory closes: the sends under way get :data:`CLOSE_WAIT_S` to end, then are
        cancelled (they would ask the closed memory whether their person was forgotten since)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self.sent()
        if self._sending:
            log.warning("%d trigger suggestions not sent: the memory closed", len(self._sending))
            for task in list(self._sending):
                task.cancel()
            await asyncio.gather(*self._sending, return_exceptions=True)


class _SendsAtShutdown:
    """Ends a :class:`TriggerRoutes`' sends when its memory closes."""

    def __init__(self, routes: TriggerRoutes[Any]) -> None:
        self._routes = weakref.ref(routes)

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        routes = self._routes()
        if routes is not None:
            await routes.close()


def _cause_of(event: TriggerEvent) -> dict[str, Any]:
    """The message that caused ``event``, as far as a forget's marks name it."""
    return {
        "text": "-",
        "tenant": event.tenant,
        "user_id": event.user_id,
        "chat_id": event.chat_id,
        "message_id": event.cause_message_id,
        "ts": datetime.now(UTC).isoformat(),
    }


def _route(message: Message) -> tuple[str, str, str]:
    return message.tenant, message.chat_id, message.message_id


async def ingest(
    memory: Memory, message: Message, triggers: TriggerRoutes[T] | None = None, target: T | None = None
) -> IngestResult | None:
    """Ingest one message; the trigger events it causes are said to ``target`` by ``triggers``.

    Memory is an aid to the bot, never a reason for it to stop answering: a failure is logged and
    ``None`` returned. A message the store cannot take now (unreachable) waits in the memory's
    :mod:`~narrmem.doors.integrations.backlog` and is ingested once it answers (``None`` here);
    its trigger events are said then.
    """
    expected = triggers is not None and triggers.expect(message, target)

    async def once() -> IngestResult:
        result = await platform_dated(memory.ingest(message))
        if triggers is not None:
            triggers.ingested(message, result, expected=expected)
        return result

    try:
        by = None if triggers is None else triggers.by
        return await backlog_of(memory).run("message", once, message_record("message", message, by))
    except Exception:
        log.exception("narrmem could not ingest a message")
        if triggers is not None:
            triggers.ingested(message, None, expected=expected)
        return None


async def edit(memory: Memory, message: Message) -> IngestResult | None:
    """Replace what an edited message left (its earlier texts stay in the episode's history);
    made later, in order, when the store cannot be reached now."""
    try:
        record = message_record("edit", message)
        return await backlog_of(memory).run("edit", lambda: platform_dated(memory.edit(message)), record)
    except Exception:
        log.exception("narrmem could not apply the edit of a message")
        return None


async def forget_messages(memory: Memory, *, tenant: str, chat_id: str, message_ids: list[str]) -> int:
    """Forget what deleted messages left; returns how many memories went (0 when the forget waits
    for the store, which cannot be reached now: it is made once it answers, after what came before)."""
    if not message_ids:
        return 0

    async def once() -> dict[str, int]:
        return await memory.forget_messages(chat_id=chat_id, message_ids=message_ids, tenant=tenant)

    try:
        record = forget_messages_record(tenant, chat_id, message_ids)
        counts = await backlog_of(memory).run("forget of deleted messages", once, record)
    except Exception:
        log.exception("narrmem could not forget deleted messages of a chat")
        return 0
    return 0 if counts is None else counts.get("memories", 0)


async def retract(memory: Memory, message: Message) -> int:
    """Forget what ``message`` said before (edited into one of the bot's commands, its text taken
    away): :func:`forget_messages` of that one message."""
    return await forget_messages(
        memory, tenant=message.tenant, chat_id=message.chat_id, message_ids=[message.message_id]
    )


def scope_of(message: Message, scope: ContextScope, *, private: bool = False) -> Scope:
    if scope == "auto":
        scope = "user" if private else "user_in_chat"
    return Scope(
        tenant=message.tenant,
        user_id=None if scope == "chat" else message.user_id,
        chat_id=None if scope == "user" else message.chat_id,
    )


async def turn_context(
    memory: Memory,
    message: Message,
    *,
    k: int,
    scope: ContextScope,
    private: bool = False,
    reinforce: bool = True,
) -> ContextPack:
    """What narrmem knows that fits the answer to ``message``, leaving out the message itself;
    ``private``: ``message`` came in a direct chat with the bot (see :data:`ContextScope`).

    The message is usually stored already (ingest runs first, so it is kept even when no handler
    asks for context), and it would otherwise be its own best match. A chat that moved (a
    Telegram group that became a supergroup, :func:`chat_moved`) is asked with the chats it was
    before, each recall's hits taken in turn, best first, to ``k`` (scores are of one recall's
    ranking, not to be compared across recalls); those recalls reinforce nothing (what the answer
    used is, by :func:`mark_used`).
    """
    where = scope_of(message, scope, private=private)
    query = message.text[:MAX_QUERY_CHARS]
    try:
        chats: list[str | None] = [where.chat_id]
        if where.chat_id is not None:
            chats += await earlier_chats(memory, where.tenant, where.chat_id)
        found: list[list[Hit]] = []
        for chat_id in chats:
            found.append(
                await memory.recall(
                    query,
                    user_id=where.user_id,
                    chat_id=chat_id,
                    tenant=where.tenant,
                    k=k,
                    # Its own chat's only: a chat that moved numbers its messages anew.
                    exclude_message_ids=[message.message_id] if chat_id == where.chat_id else [],
                    asked_at=message.ts,  # "yesterday" in the question is a day of the asker's zone
                    reinforce=reinforce and len(chats) == 1,
                )
            )
        hits = [ranked[i] for i in range(k) for ranked in found if i < len(ranked)][:k]
    except Exception:
        log.exception("narrmem could not recall for a message")
        hits = []
    return ContextPack(query=query, scope=where, hits=hits)


async def telegram_moved(memory: Memory, tenant: str, message: Any) -> bool:
    """Note a Telegram group's move to a supergroup from either of its service messages (aiogram's
    and python-telegram-bot's alike: ``migrate_to_chat_id`` in the group, ``migrate_from_chat_id``
    in the supergroup); whether ``message`` was one."""
    chat = str(message.chat.id)
    kind = getattr(message.chat, "type", None)
    to_chat = getattr(message, "migrate_to_chat_id", None)
    from_chat = getattr(message, "migrate_from_chat_id", None)
    if to_chat is None and from_chat is None:
        return False
    # As only Telegram writes them: from a basic group (its id not -100...) to a supergroup. A
    # forged update (a webhook without its secret) would otherwise let one chat read another's.
    if to_chat is not None and kind == "group" and str(to_chat).startswith("-100"):
        moved = (chat, str(to_chat))
    elif from_chat is not None and kind == "supergroup" and not str(from_chat).startswith("-100"):
        moved = (str(from_chat), chat)
    else:
        log.warning("a chat's move not as Telegram tells it was left")
        return True
    try:
        await chat_moved(memory, tenant=tenant, from_chat=moved[0], to_chat=moved[1])
    except Exception:
        # Never a reason for the bot to stop; Telegram tells the move in the other chat too.
        log.exception("narrmem could not note a chat's move")
    return True


async def chat_moved(memory: Memory, *, tenant: str, from_chat: str, to_chat: str) -> None:
    """:func:`narrmem.chat_moves.chat_moved` in ``memory``'s store."""
    await chat_moves.chat_moved(memory.store, tenant=tenant, from_chat=from_chat, to_chat=to_chat)


async def earlier_chats(memory: Memory, tenant: str, chat_id: str) -> list[str]:
    """:func:`narrmem.chat_moves.earlier_chats` in ``memory``'s store."""
    return await chat_moves.earlier_chats(memory.store, tenant, chat_id)


async def mark_used(memory: Memory, pack: ContextPack, used: Iterable[Hit | int] | None = None) -> list[int]:
    """The bot's answer used these hits of ``pack`` (all of them when ``used`` is ``None``): they
    are reinforced, at most once a day each. Returns the ids reinforced."""
    ids = [h.id if isinstance(h, Hit) else int(h) for h in (pack.hits if used is None else used)]
    if not ids:
        return []
    where = pack.scope
    # A hit of a chat this one was before (see chat_moved) is marked in its own chat.
    chat_of = {hit.id: hit.chat_id for hit in pack.hits}
    by_chat: dict[str | None, list[int]] = {}
    for memory_id in ids:
        chat = where.chat_id if where.chat_id is None else chat_of.get(memory_id, where.chat_id)
        by_chat.setdefault(chat, []).append(memory_id)
    marked: list[int] = []
    try:
        for chat_id, chosen in by_chat.items():
            marked += await memory.mark_used(
                chosen, user_id=where.user_id, chat_id=chat_id, tenant=where.tenant
            )
    except Exception:
        log.exception("narrmem could not mark memories used")
    return sorted(marked)


class ForHandlers(Generic[U]):
    """What a bot's own handlers call, for a library whose incoming messages are ``U``: the
    integration says how one becomes a narrmem message (:meth:`incoming`)."""

    memory: Memory
    options: TurnOptions[Any]

    def incoming(self, source: U) -> Message | None:
        raise NotImplementedError

    def is_private(self, source: U) -> bool:
        """Whether ``source`` came in a direct chat with the bot (not a group or a server)."""
        raise NotImplementedError

    async def context_for(self, source: U) -> ContextPack | None:
        """The :class:`ContextPack` for answering ``source`` (``None`` without text). The message
        itself is left out, whether or not it is stored yet."""
        message = self.incoming(source)
        if message is None:
            return None
        return await self.options.context(self.memory, message, private=self.is_private(source))

    async def mark_used(self, pack: ContextPack, used: Iterable[Hit | int] | None = None) -> list[int]:
        """Tell memory which hits of ``pack`` your answer used (all by default): they are
        reinforced, at most once a day each."""
        return await mark_used(self.memory, pack, used)

    async def prompt_for(self, source: U) -> str:
        """:meth:`context_for` rendered to ``token_budget`` (``""`` when nothing is remembered)."""
        return self.options.render(await self.context_for(source))


class TelegramSender(Protocol):
    """What aiogram's and python-telegram-bot's ``Bot`` both have."""

    async def send_message(
        self, chat_id: int, text: str, *, parse_mode: str | None = ..., message_thread_id: int | None = ...
    ) -> Any: ...


async def say_suggestion_on_telegram(bot: TelegramSender, event: TriggerEvent) -> None:
    """An ``on_trigger``: say the event's suggestion in the chat where the pattern came up, in its
    forum topic (a :class:`TopicTriggerEvent`'s) when it came up in one."""
    if event.chat_id is None or not event.suggestion:
        return
    chat_id = int(event.chat_id)
    # Plain text whatever the bot's default parse mode: the label is the person's words.
    if isinstance(event, TopicTriggerEvent):
        await bot.send_message(
            chat_id=chat_id, text=event.suggestion, parse_mode=None, message_thread_id=event.message_thread_id
        )
    else:  # a sender that takes no topic (a bot's own, written before topics) still works
        await bot.send_message(chat_id=chat_id, text=event.suggestion, parse_mode=None)


def forget_reply(counts: Mapping[str, int]) -> str:
    """The answer to ``forgetme``: what was deleted, by kind. It says what a forget is: what the
    person said, not what others wrote about them (their messages are theirs, and a mention in
    them is kept as the name it showed)."""
    total = counts.get("memories", 0)
    if not total:
        return "I had nothing stored from you."
    kinds = {k: v for k, v in counts.items() if k not in ("memories", "keyword_rows", "vectors") and v}
    detail = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in sorted(kinds.items()))
    noun = "memory" if total == 1 else "memories"
    return (
        f"Done: I forgot what you told me, {total} {noun}"
        + (f" ({detail})." if detail else ".")
        + " What others wrote that mentions you is theirs, and stays."
    )


async def forget_user(
    memory: Memory,
    *,
    tenants: Collection[str] | Callable[[], Awaitable[Collection[str]]],
    user_id: str,
    aliases: Collection[str] = (),
    by: str | None = None,
) -> str:
    """Forget the person in every tenant the integration writes to (or that ``tenants()`` reads
    from the store when the forget is made), under their id and the ``aliases`` the same person
    has there (the id a chat import gave them); returns the reply. ``by``: the integration whose
    :meth:`Backlog.finds_tenants` reads them for a forget that waits past a restart."""

    async def every() -> Collection[str]:
        return await tenants() if callable(tenants) else tenants

    async def once() -> dict[str, int]:
        return await forget_person(memory, every, user_id, aliases)

    record = forget_person_record(user_id, aliases, None if callable(tenants) else tenants, by)
    try:
        total = await backlog_of(memory).run("forget of a person", once, record)
    except Exception:
        log.exception("narrmem could not forget a user who asked to be forgotten")
        return "Sorry, I could not forget you just now; please try again."
    if total is None:  # the store cannot be reached now: made, in order, once it answers
        return "My memory cannot be reached just now; I will forget you as soon as it is back."
    return forget_reply(total)


async def describe_user(
    memory: Memory,
    *,
    tenant: str,
    user_id: str,
    chat_id: str | None,
    token_budget: int,
    max_chars: int,
) -> str:
    """The answer to ``memory``: what is remembered about the person, in at most ``max_chars``.

    In a private chat (``chat_id=None``) it is everything, told by the user summary (the rtm
    plugin's retelling). In a group only what the person said in that group is listed, because the
    reply is read by everyone there.
    """
    try:
        text = await _describe(
            memory, tenant=tenant, user_id=user_id, chat_id=chat_id, token_budget=token_budget
        )
    except Exception:
        log.exception("narrmem could not describe a user")
        return "Sorry, I could not look that up just now."
    return clip(text, max_chars)


async def _describe(
    memory: Memory, *, tenant: str, user_id: str, chat_id: str | None, token_budget: int
) -> str:
    scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
    # What the person said just before asking is part of the answer, even on its way to the store.
    await memory.written(**scope.model_dump())
    records = await memory.store.recent(scope, limit=50)
    if chat_id is not None:  # and in the chats this one was before (see chat_moved)
        for earlier in await earlier_chats(memory, tenant, chat_id):
            records += await memory.store.recent(scope.model_copy(update={"chat_id": earlier}), limit=50)
        records = sorted(records, key=lambda r: r.created_at, reverse=True)[:50]
    if not records:
        return "I don't remember anything about you yet."
    where = "" if chat_id is None else " in this chat"
    if chat_id is None:
        retelling = await _retelling(memory, tenant=tenant, user_id=user_id, token_budget=token_budget)
        if retelling:
            return f"What I remember about you:\n{retelling}"
    return f"What I remember about you{where} (newest first):\n" + _listing(records, token_budget)


async def _retelling(memory: Memory, *, tenant: str, user_id: str, token_budget: int) -> str:
    try:
        summary = await memory.summary(user_id=user_id, tenant=tenant, token_budget=token_budget)
    except NarrmemError:
        # No plugin tells summaries (rtm disabled): the caller lists the memories instead.
        return ""
    # The retelling runs its clauses together; one line per unit reads better in a chat.
    units = [str(unit.get("text") or "").strip() for unit in summary.get("units") or []]
    lines = [f"- {' | '.join(part.strip() for part in u.splitlines() if part.strip())}" for u in units if u]
    return "\n".join(lines) or str(summary.get("retelling") or "").strip()


def _listing(records: list[MemoryRecord], token_budget: int) -> str:
    lines: list[str] = []
    used = token_counts("")
    for record in records:
        text = " | ".join(part.strip() for part in record.text.splitlines() if part.strip())
        line = f"- [{record.created_at:%Y-%m-%d}, {record.kind}] {text}"
        with_line = added(used, token_counts(f"\n{line}" if lines else line))
        if lines and tokens_of(with_line) > token_budget:
            break
        lines.append(line)
        used = with_line
    return "\n".join(lines)


def clip(text: str, max_chars: int) -> str:
    """Platforms reject longer messages outright (Telegram 4096 characters, Discord 2000).
    Counted in UTF-16 code units, as Telegram counts them (an emoji is two: a reply of emoji and
    accents that fit by code points was refused), and cut between characters as a reader sees
    them (:func:`narrmem.text.character_end`)."""
    if len(text.encode("utf-16-le")) // 2 <= max_chars:
        return text
    units = end = 0
    for index, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > max_chars - 1:
            break
        end = index + 1
    return text[: character_end(text, end)].rstrip() + "…"
