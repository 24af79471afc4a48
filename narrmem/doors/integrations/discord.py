"""narrmem for discord.py 2: a Cog that remembers what people say, follows edits and deletions.

::

    from narrmem.doors.integrations.discord import NarrmemCog

    bot = commands.Bot(command_prefix="!", intents=intents)  # intents.message_content = True
    cog = NarrmemCog(bot, memory, on_trigger=send_suggestion)
    await bot.add_cog(cog)

    @bot.listen("on_message")
    async def answer(message: discord.Message) -> None:
        pack = await cog.context_for(message)
        ...

The cog listens to ``on_message`` (bots, the bot itself, system messages and a message that
invokes one of the bot's commands are skipped),
``on_raw_message_edit`` and ``on_raw_message_delete`` / ``on_raw_bulk_message_delete`` (the raw
events fire whether or not the message is in discord.py's cache; the cached ones would miss
everything older than the cache), and adds the prefix commands ``forgetme`` and ``memory``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeAlias

import discord
from discord.ext import commands
from typing_extensions import Unpack

from narrmem import logs
from narrmem.doors.integrations import _common
from narrmem.doors.integrations._common import TurnArgs, TurnOptions
from narrmem.doors.integrations.backlog import (
    PARENT_KEY,
    backlog_of,
    forget_chat,
    forget_chat_record,
    forget_thread_note,
    note_thread,
    tenants_holding,
)
from narrmem.errors import ClosedError
from narrmem.memory import Memory
from narrmem.models import Message, TriggerEvent
from narrmem.trying_again import RETRY_DELAYS

__all__ = ["GuildAs", "NarrmemCog", "TriggerHandler", "say_suggestion"]

GuildAs = Literal["tenant", "chat"]
TriggerHandler = Callable[[discord.abc.Messageable, TriggerEvent], Awaitable[None]]
"""``await on_trigger(channel, event)``: the channel is where the triggering message was sent."""

DISCORD_MAX_CHARS = 2000
IMPORTED_PREFIX = "discord:"  # narrmem import-chat's tenant for a server: discord:<server id>
log = logs.logger("narrmem.doors.integrations")

FINDER = "discord"  # the name this integration's forgets that wait give who reads their tenants
# How long a deleted channel's forget waits for the notes of its threads being written.
NOTES_WAIT_S = 10.0
# Explicit alias: it stays a valid type for mypy even where discord.py is not installed.
AnyContext: TypeAlias = "commands.Context[Any]"


# narrmem's own messages ping no one: a stored "@everyone" read back by `memory` or a trigger's label
# would ping the whole server with the bot's rights.
NO_MENTIONS = discord.AllowedMentions.none()


def _guild_id(message: discord.Message) -> int | None:
    """The server of ``message`` (None in a DM), whether or not the bot caches the server (without
    the guilds intent it does not: the channel still says its server)."""
    if message.guild is not None:
        return message.guild.id
    guild_id = getattr(message.channel, "guild_id", None)
    return guild_id if isinstance(guild_id, int) else None


async def say_suggestion(channel: discord.abc.Messageable, event: TriggerEvent) -> None:
    """An ``on_trigger``: say the event's suggestion in the channel where the pattern came up."""
    if event.suggestion:
        await channel.send(event.suggestion, allowed_mentions=NO_MENTIONS)


class NarrmemCog(commands.Cog, _common.ForHandlers[discord.Message]):
    """Remembers every human message the bot can read.

    ``guild_as="tenant"`` (the default) makes each server a tenant of its own (nothing said in one
    server is recalled in another; direct messages go to ``tenant``) and each channel a chat.
    ``guild_as="chat"`` keeps everything in ``tenant`` and makes each server one chat (the channel id
    is kept in the memory's ``meta``), so what a person said in one channel is in context in another.
    """

    def __init__(
        self,
        bot: commands.Bot,
        memory: Memory,
        *,
        guild_as: GuildAs = "tenant",
        **options: Unpack[TurnArgs[discord.abc.Messageable]],
    ) -> None:
        if guild_as not in ("tenant", "chat"):
            raise ValueError(f"guild_as must be 'tenant' or 'chat', not {guild_as!r}")
        self.bot = bot
        self.memory = memory
        self.guild_as: GuildAs = guild_as
        self.options = TurnOptions[discord.abc.Messageable](**options)
        self.triggers = _common.TriggerRoutes[discord.abc.Messageable](
            memory, self.options.on_trigger, by=FINDER, target_of=self._channel_of
        )
        # A forgetme that waits for the store, past a restart too, reads the servers as this does.
        backlog_of(memory).finds_tenants(FINDER, self.tenants_of)
        self._threads_noted: set[int] = set()  # by this process, under their channel (see on_message)
        self._noting: set[asyncio.Task[None]] = set()  # those notes being written (tried until they are)

    def _channel_of(self, message: Message) -> discord.abc.Messageable | None:
        """The channel a message was sent in, found by its id (the bot's cache: one the bot no
        longer sees is none)."""
        channel_id = message.meta.get("channel_id")
        if not isinstance(channel_id, str) or not channel_id.isdigit():
            return None
        channel = self.bot.get_channel(int(channel_id))
        if isinstance(channel, discord.abc.Messageable):
            return channel
        # Not cached (yet): a backlog made at a start comes before the guilds' channels, and a DM
        # channel is cached only once one of its messages comes. Sending needs the id alone.
        return self.bot.get_partial_messageable(int(channel_id))

    # --- mapping ---------------------------------------------------------------------------

    def place(self, guild_id: int | None, channel_id: int) -> tuple[str, str]:
        """(tenant, chat id) for a message in ``channel_id`` of ``guild_id`` (``None`` for a DM)."""
        if guild_id is None:
            return self.options.tenant, str(channel_id)
        if self.guild_as == "tenant":
            return str(guild_id), str(channel_id)
        return self.options.tenant, str(guild_id)

    def incoming(self, source: discord.Message) -> Message | None:
        return self.to_message(source)

    def is_private(self, source: discord.Message) -> bool:
        return _guild_id(source) is None

    def to_message(self, message: discord.Message) -> Message | None:
        """The narrmem ``Message`` for a Discord message, or ``None`` when there is nothing to
        remember (no text: an attachment alone, or the message content intent is off)."""
        guild_id = _guild_id(message)
        tenant, chat_id = self.place(guild_id, message.channel.id)
        return _common.build_message(
            # Mentions as "@name", not "<@1234>": the id means nothing to an embedding or a reader.
            text=message.clean_content,
            user_id=message.author.id,
            chat_id=chat_id,
            message_id=message.id,
            ts=message.created_at,
            tenant=tenant,
            speaker=message.author.display_name,
            zone=_common.zone_of(self.options.time_zone),
            meta={
                "platform": "discord",
                "guild_id": str(guild_id) if guild_id is not None else None,
                "channel_id": str(message.channel.id),
                "edited_at": message.edited_at.isoformat() if message.edited_at else None,
                # A thread's (a forum post's) channel: deleted, it takes its threads, archived
                # ones too, which the bot's cache does not hold (see backlog.forget_chat).
                **(
                    {PARENT_KEY: str(message.channel.parent_id)}
                    if isinstance(message.channel, discord.Thread)
                    else {}
                ),
            },
        )

    def _ignored(self, message: discord.Message) -> bool:
        me = self.bot.user
        return (
            message.author.bot
            or (me is not None and message.author.id == me.id)
            # Joins, pins, boosts: Discord's words, not the person's.
            or message.is_system()
        )

    async def _command(self, message: discord.Message) -> AnyContext | None:
        """The context of the bot's command ``message`` invokes (``!help``, the bot's own, this
        cog's), or ``None``: a command is the person working the bot, not something they said
        (each was stored as their words), but for :attr:`remembered_commands`' words after it. A
        message that only begins with the prefix (``!!``, ``!memroy``) invokes none."""
        # Asking the bot (not a string test) follows whatever prefixes and case rules it has.
        ctx: AnyContext = await self.bot.get_context(message)
        return ctx if ctx.valid else None

    def _remembered(self, converted: Message | None, ctx: AnyContext | None) -> Message | None:
        """What of a message is remembered: all of it, or of a command only the words after one
        of :attr:`remembered_commands`."""
        if converted is None or ctx is None:
            return converted
        assert ctx.command is not None
        if ctx.command.name.lower() not in self.options.remembered_commands:
            return None
        # The words after where discord.py's parser stopped (a mention prefix, a space after the
        # prefix), read from the raw text; the people mentioned in them by name, as the stored
        # text names them.
        words = ctx.message.content[ctx.view.index :]
        for user in ctx.message.mentions:
            for mention in (f"<@{user.id}>", f"<@!{user.id}>"):
                words = words.replace(mention, f"@{user.display_name}")
        words = words.strip()
        return converted.model_copy(update={"text": words}) if words else None

    # --- listeners ---------------------------------------------------------------------------

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        if self._ignored(message):
            return
        said = self._remembered(self.to_message(message), await self._command(message))
        if said is not None:
            self._note_thread(message.channel)
            await _common.ingest(self.memory, said, self.triggers, message.channel)

    def _note_thread(self, channel: object) -> None:
        """A thread's (a forum post's) place under its channel, noted in the store once a
        process: deleted, the channel takes its threads with it, the archived ones too, which the
        bot's cache does not hold and Discord tells nothing of (see ``backlog.forget_chat``).
        Beside the message, not before it (a store that hangs holds the note, not the message),
        and tried again in the background until it is written."""
        if self.guild_as != "tenant" or not isinstance(channel, discord.Thread):
            return  # one chat for the server: its messages name their channel (PARENT_KEY)
        if channel.id in self._threads_noted:
            return
        self._threads_noted.add(channel.id)
        tenant, _ = self.place(channel.guild.id, channel.id)
        work = functools.partial(note_thread, self.memory, tenant, str(channel.parent_id), str(channel.id))
        task = asyncio.get_running_loop().create_task(self._note(work))
        self._noting.add(task)
        task.add_done_callback(self._noting.discard)

    async def _note(self, work: Callable[[], Awaitable[None]]) -> None:
        for attempt in itertools.count():
            try:
                await work()
                return
            except ClosedError:
                return
            except Exception as exc:
                if attempt == 0:  # once a thread: a long outage would say it every minute
                    log.warning("a thread could not be noted under its channel now (%s)", type(exc).__name__)
            await asyncio.sleep(RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)])

    async def cog_unload(self) -> None:
        for task in self._noting:
            task.cancel()

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        message = payload.message
        before = payload.cached_message
        # Discord also sends an update when it adds a link preview: same text, nothing to re-remember.
        if before is not None and before.content == message.content:
            return
        if self._ignored(message):
            return
        command = await self._command(message)
        converted = self._remembered(self.to_message(message), command)
        if command is not None and converted is None:
            # Edited into a command (a typo fixed): the bot's business, and what it said before,
            # stored as the person's words, goes.
            guild_id = _guild_id(message)
            tenant, chat_id = self.place(guild_id, message.channel.id)
            await _common.forget_messages(
                self.memory, tenant=tenant, chat_id=chat_id, message_ids=[str(message.id)]
            )
            return
        if converted is not None:
            await _common.edit(self.memory, converted)
        elif not message.content.strip() and (message.attachments or message.embeds or message.stickers):
            # The text taken out of a message that keeps what it shows: what it said goes. (With
            # the message content intent off every text reads empty, and nothing shown is sent
            # either: that is not taken for a retraction.)
            guild_id = _guild_id(message)
            tenant, chat_id = self.place(guild_id, message.channel.id)
            gone = [str(message.id)]
            await _common.forget_messages(self.memory, tenant=tenant, chat_id=chat_id, message_ids=gone)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        tenant, chat_id = self.place(payload.guild_id, payload.channel_id)
        await _common.forget_messages(
            self.memory, tenant=tenant, chat_id=chat_id, message_ids=[str(payload.message_id)]
        )

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        tenant, chat_id = self.place(payload.guild_id, payload.channel_id)
        ids = [str(i) for i in sorted(payload.message_ids)]
        await _common.forget_messages(self.memory, tenant=tenant, chat_id=chat_id, message_ids=ids)

    @commands.Cog.listener()
    async def on_raw_thread_delete(self, payload: discord.RawThreadDeleteEvent) -> None:
        await self._forget_channel(payload.guild_id, payload.thread_id)
        if self.guild_as == "tenant":
            tenant, _ = self.place(payload.guild_id, payload.thread_id)
            try:
                await forget_thread_note(self.memory, tenant, str(payload.parent_id), str(payload.thread_id))
            except Exception as exc:
                # Left, it names a chat with nothing in it: the channel's forget finds it empty.
                log.warning("a deleted thread's note could not be deleted now (%s)", type(exc).__name__)

    @commands.Cog.listener()
    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        await self._forget_channel(channel.guild.id, channel.id)

    async def _forget_channel(self, guild_id: int | None, channel_id: int) -> None:
        """A channel, thread or forum post deleted: Discord sends no delete of its messages, and
        what they said stayed, recalled (with ``guild_as="chat"``, across the whole server)."""
        tenant, chat_id = self.place(guild_id, channel_id)
        # The notes of threads begun a moment ago are written first (or tried a while, the store
        # away): the forget reads them.
        if self._noting:
            await asyncio.wait(set(self._noting), timeout=NOTES_WAIT_S)
        # The channel is a chat of its own (its forget takes everything of it, in flight too), or,
        # with guild_as="chat", part of the server's chat: its messages are named in meta. Made in
        # order after what waits for the store, or made later itself when the store is away.
        channel = None if self.guild_as == "tenant" else str(channel_id)
        try:
            await backlog_of(self.memory).run(
                "forget of a chat",
                functools.partial(forget_chat, self.memory, tenant, chat_id, channel),
                forget_chat_record(tenant, chat_id, channel),
            )
        except Exception:
            log.exception("narrmem could not forget a deleted channel")

    # --- commands (context_for, mark_used and prompt_for come from ForHandlers) ------------

    def tenants(self) -> set[str]:
        """Every tenant this cog writes to: ``tenant`` and, with ``guild_as="tenant"``, each server
        the bot is in."""
        if self.guild_as == "chat":
            return {self.options.tenant}
        return {self.options.tenant, *(str(guild.id) for guild in self.bot.guilds)}

    async def tenants_of(self, user_id: str) -> set[str]:
        """Every tenant that may hold ``user_id``'s memories: :meth:`tenants`; with
        ``guild_as="tenant"`` each server the store holds them under, the bot in it or not any
        longer (a server that removed the bot keeps its tenant in the store); and each server's
        imported history (``narrmem import-chat`` puts it in ``discord:<server id>``). A Discord
        id is the same person in every server."""
        tenants = self.tenants()
        held = await tenants_holding(self.memory, [user_id])
        return tenants | {tenant for tenant in held if self._discords(tenant)}

    def _discords(self, tenant: str) -> bool:
        """Whether ``tenant`` is one a Discord server's messages go to (live or imported), with
        ``guild_as="tenant"`` now or before: a bot switched to ``"chat"`` left what it had stored
        under each server, and a ``forgetme`` after the switch said "Done" and left it."""
        return tenant.removeprefix(IMPORTED_PREFIX).isdigit()

    @commands.command(name="forgetme", help="Forget everything I remember about you, in every server.")
    async def forgetme(self, ctx: AnyContext) -> None:
        # Everywhere, not just here: someone who asks to be forgotten means it.
        user_id = str(ctx.author.id)
        # Read as the forget is made: one that waits for the store reads them once it answers.
        reply = await _common.forget_user(
            self.memory, tenants=functools.partial(self.tenants_of, user_id), user_id=user_id, by=FINDER
        )
        await ctx.reply(reply, mention_author=False, allowed_mentions=NO_MENTIONS)

    @commands.command(name="memory", help="Show what I remember about you.")
    async def show_memory(self, ctx: AnyContext) -> None:
        guild_id = _guild_id(ctx.message)
        tenant, chat_id = self.place(guild_id, ctx.channel.id)
        text = await _common.describe_user(
            self.memory,
            tenant=tenant,
            user_id=str(ctx.author.id),
            # In a server the reply is read by everyone there: only what was said in this chat.
            chat_id=chat_id if guild_id is not None else None,
            token_budget=self.options.token_budget,
            max_chars=DISCORD_MAX_CHARS,
        )
        await ctx.reply(text, mention_author=False, allowed_mentions=NO_MENTIONS)
