"""narrmem for aiogram 3: a middleware that remembers every message and hands handlers the context.

::

    from narrmem.doors.integrations.aiogram import setup

    dp = Dispatcher()
    setup(dp, memory, tenant="telegram", on_trigger=send_suggestion)

    @dp.message()
    async def answer(message: Message, memory_context: ContextPack | None) -> None:
        prompt = memory_context.render(token_budget=400) if memory_context else ""
        ...

``setup`` registers :class:`NarrmemMiddleware` as an outer middleware for ``message`` and
``edited_message`` (outer, so a message is remembered even when no handler matches it) and the
``/forgetme`` and ``/memory`` commands (:func:`register_commands`).

In groups a bot sees every message only with privacy mode off (BotFather, ``/setprivacy``);
otherwise Telegram sends it commands, replies to it and mentions only: the replies and mentions are
remembered (a command is not: it is working a bot, not something said).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, tzinfo
from typing import Any

import aiogram
from aiogram import Bot, Router
from aiogram.filters import Command
from aiogram.types import Message as TgMessage
from aiogram.types import TelegramObject, Update
from typing_extensions import Unpack

from narrmem.doors.integrations import _common
from narrmem.doors.integrations._common import COMMANDS, DEFAULT_TOKEN_BUDGET, TurnArgs, TurnOptions
from narrmem.memory import Memory
from narrmem.models import ContextPack, Message, TriggerEvent

__all__ = [
    "NarrmemMiddleware",
    "TopicTriggerEvent",
    "TriggerHandler",
    "register_commands",
    "say_suggestion",
    "sender",
    "setup",
    "to_message",
]

TriggerHandler = Callable[[Bot, TriggerEvent], Awaitable[None]]
"""``await on_trigger(bot, event)``: ``event.chat_id`` is the Telegram chat the trigger came from;
a :class:`TopicTriggerEvent`'s ``message_thread_id`` the forum topic in it."""

TELEGRAM_MAX_CHARS = 4096
Handler = Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]]


say_suggestion = _common.say_suggestion_on_telegram
TopicTriggerEvent = _common.TopicTriggerEvent


def sender(message: TgMessage) -> tuple[str, str] | None:
    """Who said it, as (user id, display name); ``None`` for a bot's message."""
    if message.sender_chat is not None:
        # Anonymous group admins and channel posts: the chat speaks, from_user is a placeholder bot.
        chat = message.sender_chat
        return str(chat.id), chat.title or chat.full_name
    if message.from_user is not None and not message.from_user.is_bot:
        return str(message.from_user.id), message.from_user.full_name
    return None


def to_message(
    message: TgMessage, *, tenant: str = "default", time_zone: str | tzinfo | None = None
) -> Message | None:
    """The narrmem ``Message`` for a Telegram message, or ``None`` when there is nothing to remember
    (no text or caption, or sent by a bot); its time in ``time_zone`` (Telegram's is UTC)."""
    edited_at = datetime.fromtimestamp(message.edit_date, tz=UTC) if message.edit_date else None
    zone = _common.zone_of(time_zone)
    return _common.telegram_message(message, sender(message), edited_at, tenant, zone)


class NarrmemMiddleware(aiogram.BaseMiddleware):
    """Remembers every message and edit, and gives handlers ``memory`` (the :class:`Memory`),
    ``memory_context`` (the :class:`ContextPack` for this turn, ``None`` for a message without text),
    ``memory_prompt`` (that pack rendered to ``token_budget``, ``""`` when there is nothing) and
    ``memory_mark_used`` (``await memory_mark_used()`` or ``(hits)``: the answer used them, so they
    are reinforced).

    Register it on the dispatcher for both ``message`` and ``edited_message`` (:func:`setup` does).
    ``on_trigger(bot, event)`` is awaited for every trigger event a message causes.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        skip_commands: Collection[str] = COMMANDS,
        bot: Bot | None = None,
        **options: Unpack[TurnArgs[Bot]],
    ) -> None:
        self.memory = memory
        self.options = TurnOptions[Bot](**options)
        # Where the suggestions of a message a stopped process left waiting are sent once a later
        # start makes it (a Telegram bot answers every chat): the bot given, then the one the
        # dispatcher starts with, then that of the latest update.
        self._bot: Bot | None = bot
        self.triggers = _common.TriggerRoutes[Bot](
            memory, self.options.on_trigger, by="aiogram", target_of=lambda _: self._bot
        )
        self.skip_commands = skip_commands

    async def started(self, bot: Bot) -> None:
        """The dispatcher's startup: the bot it polls for."""
        self._bot = bot

    async def __call__(self, handler: Handler, event: TelegramObject, data: dict[str, Any]) -> Any:
        data["memory"] = self.memory
        data["memory_context"] = None
        data["memory_prompt"] = ""
        # Every handler can take it, whatever came (a photo, a sticker): nothing to mark then.
        data["memory_mark_used"] = _nothing_used
        if not isinstance(event, TgMessage):
            return await handler(event, data)
        # A group became a supergroup (a new chat id): its earlier messages are read with it.
        if await _common.telegram_moved(self.memory, self.options.tenant, event):
            return await handler(event, data)
        message = to_message(event, tenant=self.options.tenant, time_zone=self.options.time_zone)
        update = data.get("event_update")
        edited = isinstance(update, Update) and update.edited_message is not None
        # A live location is an edited message every few seconds, with no text to take back; a
        # relayed message was never stored.
        took_back = edited and sender(event) is not None and not _common.is_relayed(event)
        if message is None and took_back and event.location is None:
            # A caption taken off a photo (or a text off a message): what it said goes.
            await _common.forget_messages(
                self.memory,
                tenant=self.options.tenant,
                chat_id=str(event.chat.id),
                message_ids=[str(event.message_id)],
            )
        if message is None:
            return await handler(event, data)
        if _common.is_own_command(message.text, self.skip_commands):
            if edited:  # a message edited into a command: what it said before goes
                await _common.retract(self.memory, message)
            return await handler(event, data)
        bot = data.get("bot")
        if isinstance(bot, Bot):
            self._bot = bot
        said: Message | None = message
        if _common.starts_with_command(event):
            # aiogram asks Telegram once for the bot's name and keeps it (bot.me()).
            me = await bot.me() if isinstance(bot, Bot) and self.options.remembered_commands else None
            said = _common.words_after_command(
                message, self.options.remembered_commands, bot_username=me.username if me else None
            )
        if _common.is_relayed(event):
            pass  # the sender's context for the answer, nothing stored
        elif said is None:
            if edited:  # a message edited into a command: what it said before goes
                await _common.retract(self.memory, message)
        elif edited:
            await _common.edit(self.memory, said)
        else:
            await _common.ingest(self.memory, said, self.triggers, bot)
        # Made for every message, answered or not: what an answer uses is reinforced when the
        # handler says so (memory_mark_used), not every time a message passes.
        pack = await self.options.context(
            self.memory, message, private=_common.in_a_direct_chat(event), reinforce=False
        )
        data["memory_context"] = pack
        data["memory_prompt"] = self.options.render(pack)
        data["memory_mark_used"] = functools.partial(_common.mark_used, self.memory, pack)
        return await handler(event, data)

    async def context(self, message: TgMessage) -> ContextPack | None:
        """The context for a message outside a handler (the middleware already gives it inside);
        ``None`` for one of a chat that is not the bot's, a business account's or one the bot is
        a guest in (:func:`~narrmem.doors.integrations._common.outside_the_bots_chats`)."""
        converted = to_message(message, tenant=self.options.tenant, time_zone=self.options.time_zone)
        if converted is None:
            return None
        return await self.options.context(self.memory, converted, private=_common.in_a_direct_chat(message))


def register_commands(
    router: Router,
    memory: Memory,
    *,
    tenant: str = "default",
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    forget_command: str = "forgetme",
    memory_command: str = "memory",
) -> Router:
    """Register ``/forgetme`` (forget everything about the sender in ``tenant``, reply with counts)
    and ``/memory`` (reply with what is remembered about the sender) on ``router``.

    Register them before any catch-all message handler of the same router: aiogram stops at the
    first handler whose filters match.
    """

    async def forgetme(message: TgMessage) -> None:
        who = sender(message)
        if who is None:
            return
        refusal = _common.shared_sender_refusal(message)
        if refusal is not None:
            await message.answer(refusal, parse_mode=None)
            return
        reply = await _common.forget_user(
            memory, tenants=[tenant], user_id=who[0], aliases=_common.telegram_aliases(who[0])
        )
        await message.answer(reply, parse_mode=None)

    async def show_memory(message: TgMessage) -> None:
        who = sender(message)
        if who is None:
            return
        refusal = _common.shared_sender_refusal(message)
        if refusal is not None:
            await message.answer(refusal, parse_mode=None)
            return
        # Outside a private chat the reply is read by the whole group: only this chat's memories.
        chat_id = None if _common.in_a_direct_chat(message) else str(message.chat.id)
        text = await _common.describe_user(
            memory,
            tenant=tenant,
            user_id=who[0],
            chat_id=chat_id,
            token_budget=token_budget,
            max_chars=TELEGRAM_MAX_CHARS,
        )
        await message.answer(text, parse_mode=None)

    # Case as command_name reads it: "/ForgetMe" was not stored (a command) yet not answered either.
    router.message.register(forgetme, Command(forget_command, ignore_case=True))
    router.message.register(show_memory, Command(memory_command, ignore_case=True))
    return router


def setup(
    router: Router,
    memory: Memory,
    *,
    commands: bool = True,
    bot: Bot | None = None,
    **options: Unpack[TurnArgs[Bot]],
) -> NarrmemMiddleware:
    """Register the middleware on ``router`` (the dispatcher, to see every message) and, with
    ``commands``, the two commands on it too. Call it before registering the bot's own handlers:
    aiogram tries a router's handlers in order and those of included routers only after them.
    ``bot``: where the trigger suggestions of messages a stopped process left waiting are sent
    when this start makes them (without it, the bot the dispatcher starts with, once it has)."""
    middleware = NarrmemMiddleware(memory, bot=bot, **options)
    router.startup.register(middleware.started)
    router.message.outer_middleware(middleware)
    router.edited_message.outer_middleware(middleware)
    # start_polling asks Telegram only for the update types that have handlers
    # (resolve_used_update_types), and a middleware alone does not count: without a handler edits
    # would never arrive. This one never matches, so the bot's own edit handlers still get every edit.
    router.edited_message.register(_never_called, _never)
    if commands:
        given = middleware.options
        register_commands(router, memory, tenant=given.tenant, token_budget=given.token_budget)
    return middleware


async def _never(event: TelegramObject) -> bool:
    return False


async def _never_called(event: TelegramObject) -> None:
    return None


async def _nothing_used(used: object = None) -> list[int]:
    """``memory_mark_used`` for an event with no context (no text): nothing to reinforce."""
    return []
