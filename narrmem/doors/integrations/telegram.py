"""narrmem for python-telegram-bot 22: handlers in an early group that remember every message.

::

    from narrmem.doors.integrations.telegram import install

    application = Application.builder().token(TOKEN).build()
    narrmem = install(application, memory, tenant="telegram", on_trigger=send_suggestion)

    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        pack = await narrmem.context_for(update)
        prompt = pack.render(token_budget=400) if pack else ""
        ...

    application.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, answer))

``install`` adds, in ``group`` (default -1, before the bot's handlers in group 0, which still see
every update: each group gives an update to at most one handler, and every group is tried), the
``/forgetme`` and ``/memory`` commands and a ``MessageHandler`` that ingests new messages and applies
edits.

In groups a bot sees every message only with privacy mode off (BotFather, ``/setprivacy``);
otherwise Telegram sends it commands, replies to it and mentions only: the replies and mentions are
remembered (a command is not: it is working a bot, not something said).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from datetime import tzinfo
from typing import Any, TypeAlias

import telegram
from telegram.ext import Application, BaseHandler, CallbackContext, CommandHandler, MessageHandler, filters
from typing_extensions import Unpack

from narrmem.doors.integrations import _common
from narrmem.doors.integrations._common import COMMANDS, TurnArgs, TurnOptions
from narrmem.memory import Memory
from narrmem.models import Message, TriggerEvent

__all__ = [
    "NarrmemTelegram",
    "TopicTriggerEvent",
    "TriggerHandler",
    "install",
    "say_suggestion",
    "sender",
    "to_message",
]

TriggerHandler = Callable[[telegram.Bot, TriggerEvent], Awaitable[None]]
"""``await on_trigger(bot, event)``: ``event.chat_id`` is the Telegram chat the trigger came from;
a :class:`TopicTriggerEvent`'s ``message_thread_id`` the forum topic in it."""

TELEGRAM_MAX_CHARS = 4096
# Explicit aliases: they stay valid types for mypy even where the library is not installed.
AnyContext: TypeAlias = "CallbackContext[Any, Any, Any, Any]"
AnyApplication: TypeAlias = "Application[Any, Any, Any, Any, Any, Any]"


say_suggestion = _common.say_suggestion_on_telegram
TopicTriggerEvent = _common.TopicTriggerEvent


def sender(message: telegram.Message) -> tuple[str, str] | None:
    """Who said it, as (user id, display name); ``None`` for a bot's message."""
    if message.sender_chat is not None:
        # Anonymous group admins and channel posts: the chat speaks, from_user is a placeholder bot.
        chat = message.sender_chat
        return str(chat.id), chat.effective_name or str(chat.id)
    if message.from_user is not None and not message.from_user.is_bot:
        return str(message.from_user.id), message.from_user.full_name
    return None


def to_message(
    message: telegram.Message, *, tenant: str = "default", time_zone: str | tzinfo | None = None
) -> Message | None:
    """The narrmem ``Message`` for a Telegram message, or ``None`` when there is nothing to remember
    (no text or caption, or sent by a bot); its time in ``time_zone`` (Telegram's is UTC)."""
    zone = _common.zone_of(time_zone)
    return _common.telegram_message(message, sender(message), message.edit_date, tenant, zone)


class NarrmemTelegram(_common.ForHandlers[telegram.Update]):
    """The installed integration: its handlers, and :meth:`context_for` for the bot's own handlers."""

    def __init__(
        self,
        memory: Memory,
        *,
        commands: Collection[str] = COMMANDS,
        bot: telegram.Bot | None = None,
        **options: Unpack[TurnArgs[telegram.Bot]],
    ) -> None:
        self.memory = memory
        self.options = TurnOptions[telegram.Bot](**options)
        # Where the suggestions of a message a stopped process left waiting are sent once a later
        # start makes it (a Telegram bot answers every chat): the application's bot, or that of
        # the latest update.
        self._bot: telegram.Bot | None = bot
        self.triggers = _common.TriggerRoutes[telegram.Bot](
            memory, self.options.on_trigger, by="python-telegram-bot", target_of=lambda _: self._bot
        )
        self.commands = commands

    def handlers(self) -> list[BaseHandler[Any, Any, Any]]:
        """The handlers, in the order they must be added to one group (commands first: a group gives
        an update to its first matching handler, and our commands are not to be remembered)."""
        found: list[BaseHandler[Any, Any, Any]] = []
        # Only new messages: an edited "/forgetme" must not forget a second time.
        new_only = filters.UpdateType.MESSAGE
        if "forgetme" in self.commands:
            found.append(CommandHandler("forgetme", self.forgetme, filters=new_only))
        if "memory" in self.commands:
            found.append(CommandHandler("memory", self.show_memory, filters=new_only))
        messages = filters.UpdateType.MESSAGE | filters.UpdateType.EDITED_MESSAGE
        found.append(MessageHandler((filters.TEXT | filters.CAPTION) & messages, self.remember))
        retracted = filters.UpdateType.EDITED_MESSAGE & ~(filters.TEXT | filters.CAPTION)
        found.append(MessageHandler(retracted, self.retract))
        found.append(MessageHandler(filters.StatusUpdate.MIGRATE, self.moved))
        return found

    async def moved(self, update: telegram.Update, context: AnyContext) -> None:
        """A group became a supergroup (a new chat id): its earlier messages are read with it."""
        if update.effective_message is not None:
            await _common.telegram_moved(self.memory, self.options.tenant, update.effective_message)

    async def retract(self, update: telegram.Update, context: AnyContext) -> None:
        """An edit that took a message's text or caption away: what it said goes."""
        source = update.edited_message
        if source is None or sender(source) is None or source.location is not None:
            # A live location is an edited message every few seconds, with no text to take back:
            # each one was a forget (a gate for every worker's writes, a mark) for nothing.
            return
        if _common.is_relayed(source):  # never stored
            return
        await _common.forget_messages(
            self.memory,
            tenant=self.options.tenant,
            chat_id=str(source.chat.id),
            message_ids=[str(source.message_id)],
        )

    async def remember(self, update: telegram.Update, context: AnyContext) -> None:
        """Ingest a new message, or apply an edit to the stored one."""
        edited = update.edited_message is not None
        source = update.edited_message or update.message
        message = (
            to_message(source, tenant=self.options.tenant, time_zone=self.options.time_zone)
            if source is not None
            else None
        )
        if message is None or source is None or _common.is_relayed(source):
            return
        self._bot = context.bot
        said: Message | None = message
        if _common.is_own_command(message.text, self.commands):
            said = None
        elif _common.starts_with_command(source):
            said = _common.words_after_command(
                message, self.options.remembered_commands, bot_username=context.bot.username
            )
        if said is None:
            if edited:  # a message edited into a command: what it said before goes
                await _common.retract(self.memory, message)
            return
        if edited:
            await _common.edit(self.memory, said)
        else:
            await _common.ingest(self.memory, said, self.triggers, context.bot)

    def incoming(self, source: telegram.Update) -> Message | None:
        message = source.effective_message
        if message is None:
            return None
        return to_message(message, tenant=self.options.tenant, time_zone=self.options.time_zone)

    def is_private(self, source: telegram.Update) -> bool:
        # Not a business account's chat, nor one the bot is a guest in, though they are "private".
        message = source.effective_message
        return message is not None and _common.in_a_direct_chat(message)

    async def forgetme(self, update: telegram.Update, context: AnyContext) -> None:
        message = update.effective_message
        who = sender(message) if message is not None else None
        if message is None or who is None:
            return
        refusal = _common.shared_sender_refusal(message)
        if refusal is not None:
            await message.reply_text(refusal, parse_mode=None)
            return
        reply = await _common.forget_user(
            self.memory,
            tenants=[self.options.tenant],
            user_id=who[0],
            aliases=_common.telegram_aliases(who[0]),
        )
        await message.reply_text(reply, parse_mode=None)

    async def show_memory(self, update: telegram.Update, context: AnyContext) -> None:
        message = update.effective_message
        who = sender(message) if message is not None else None
        if message is None or who is None:
            return
        refusal = _common.shared_sender_refusal(message)
        if refusal is not None:
            await message.reply_text(refusal, parse_mode=None)
            return
        # Outside a private chat the reply is read by the whole group: only this chat's memories.
        chat_id = None if _common.in_a_direct_chat(message) else str(message.chat.id)
        text = await _common.describe_user(
            self.memory,
            tenant=self.options.tenant,
            user_id=who[0],
            chat_id=chat_id,
            token_budget=self.options.token_budget,
            max_chars=TELEGRAM_MAX_CHARS,
        )
        await message.reply_text(text, parse_mode=None)


def install(
    application: AnyApplication,
    memory: Memory,
    *,
    commands: Collection[str] = COMMANDS,
    group: int = -1,
    **options: Unpack[TurnArgs[telegram.Bot]],
) -> NarrmemTelegram:
    """Add the integration's handlers to ``application`` in ``group``; returns the integration
    (keep it for :meth:`NarrmemTelegram.context_for`). ``commands=()`` leaves the commands out."""
    integration = NarrmemTelegram(memory, commands=commands, bot=application.bot, **options)
    application.add_handlers(integration.handlers(), group=group)
    return integration
