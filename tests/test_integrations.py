"""The bot integrations, driven through the real libraries with no token and no network.

Each library gets the updates a platform would send, parsed by the library itself: aiogram through
``Dispatcher.feed_update`` with a fake ``BaseSession``, python-telegram-bot through
``Application.process_update`` with a fake ``BaseRequest``, discord.py through its gateway parsers
(``ConnectionState.parse_message_create`` and friends) with a fake HTTP ``request``. The fakes
record what the bot sends (replies, trigger suggestions) and answer as the platform would.

The behaviour every integration shares runs against all three through a small :class:`Harness`;
what only one platform has (Discord's deletions, Telegram captions) is tested on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from narrmem import ContextPack, InputError, Memory, MemoryRecord, Scope, TriggerEvent, forget_marks
from narrmem.doors.integrations import _common
from narrmem.testing import open_memory

if TYPE_CHECKING:
    import discord

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
TG_TENANT = "tg"
DC_TENANT = "dc"
GUILD_ID = 100
ANN, BOB = 1001, 1002
GROUP = -500  # a Telegram group id; for Discord, a channel of the guild
OTHER_GROUP = -501


def when(n: int) -> datetime:
    """Message ``n`` is sent ``n`` seconds after T0 (Discord derives the time from the id)."""
    return T0 + timedelta(seconds=n)


async def episodes(memory: Memory, *, tenant: str, user_id: str) -> list[MemoryRecord]:
    """A person's stored episodes, oldest first."""
    scope = Scope(tenant=tenant, user_id=user_id)
    return list(reversed(await memory.store.recent(scope, kinds=["episode"], limit=10_000)))


async def everything(memory: Memory) -> list[MemoryRecord]:
    """Every stored record, from the store's export (the one way to list across scopes)."""
    return [record async for record, _ in memory.store.export()]


# --- the harnesses ---------------------------------------------------------------------------


class Harness:
    """One bot, built on one library, wired to narrmem; it delivers messages as the platform would."""

    name = ""
    prefix = "/"

    def __init__(self) -> None:
        self.replies: list[tuple[str, str]] = []  # (platform chat id, text) of everything sent
        self.contexts: dict[str, ContextPack | None] = {}  # message id -> what the bot's handler got

    def where(self, chat: int, group: bool) -> tuple[str, str]:
        """(tenant, chat id) narrmem stores a message of this chat under."""
        return TG_TENANT, str(chat)

    def message_id(self, n: int) -> str:
        return str(n)

    async def send(
        self,
        n: int,
        text: str,
        *,
        user: int,
        chat: int,
        group: bool,
        name: str = "Ann Lee",
        bot: bool = False,
    ) -> None:
        await self.deliver(n, text, edited=False, user=user, chat=chat, group=group, name=name, bot=bot)

    async def edit(
        self, n: int, text: str, *, user: int, chat: int, group: bool, name: str = "Ann Lee"
    ) -> None:
        await self.deliver(n, text, edited=True, user=user, chat=chat, group=group, name=name)

    async def deliver(self, n: int, text: str, *, edited: bool, **sender: Any) -> None:
        """Deliver message ``n`` (or its edit) as the platform would; ``sender`` as ``send`` takes it."""
        raise NotImplementedError

    async def start(self) -> None:
        return None

    async def settle(self) -> None:
        """Wait for what the bot is still doing (discord.py runs each event as a task)."""
        return None

    async def close(self) -> None:
        return None

    async def command(self, n: int, command: str, *, user: int, chat: int, group: bool) -> str:
        """Send ``command`` and return the reply it got in that chat."""
        before = len(self.replies)
        await self.send(n, self.prefix + command, user=user, chat=chat, group=group)
        replies = self.replies[before:]
        assert len(replies) == 1, replies
        return replies[0][1]


async def suggest_telegram(bot: Any, event: TriggerEvent) -> None:
    """What a bot does with a trigger: say the suggestion in the chat it came from."""
    assert event.chat_id is not None
    await bot.send_message(chat_id=int(event.chat_id), text=event.suggestion)


def telegram_payload(
    update_id: int,
    n: int,
    text: str | None,
    *,
    user: int,
    chat: int,
    group: bool,
    name: str,
    bot: bool = False,
    edited: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Bot API update carrying message ``n``, as Telegram sends it."""
    first, _, last = name.partition(" ")
    sender: dict[str, Any] = {"id": user, "is_bot": bot, "first_name": first}
    if last:
        sender["last_name"] = last
    chat_data: dict[str, Any] = (
        {"id": chat, "type": "supergroup", "title": "Team"}
        if group
        else {"id": chat, "type": "private", "first_name": first}
    )
    message: dict[str, Any] = {
        "message_id": n,
        "date": int(when(n).timestamp()),
        "chat": chat_data,
        "from": sender,
        **(extra or {}),
    }
    if text is not None:
        message["text"] = text
        if text.startswith("/"):
            message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    if edited:
        message["edit_date"] = int(when(n).timestamp()) + 60
    return {"update_id": update_id, "edited_message" if edited else "message": message}


def bot_api(replies: list[tuple[str, str]], endpoint: str, params: dict[str, Any]) -> str:
    """Telegram's answer to a Bot API call, as the JSON body it sends: who the bot is, or the
    message the bot sent (recorded in ``replies`` as (chat id, text))."""
    result: dict[str, Any]
    if endpoint == "getMe":
        result = {"id": 42, "is_bot": True, "first_name": "Bot", "username": "test_bot"}
    elif endpoint == "sendMessage":
        replies.append((str(params["chat_id"]), str(params["text"])))
        chat = {"id": int(params["chat_id"]), "type": "private", "first_name": "x"}
        result = {"message_id": 10**6 + len(replies), "date": 0, "chat": chat, "text": params["text"]}
    else:
        raise AssertionError(f"unexpected Bot API call {endpoint}")
    return json.dumps({"ok": True, "result": result})


def aiogram_session(replies: list[tuple[str, str]], sent: list[dict[str, Any]] | None = None) -> Any:
    """An aiogram session answering the Bot API as Telegram would (aiogram's own tests mock it so);
    ``sent``: each sendMessage's parameters as they went."""
    from aiogram import Bot
    from aiogram.client.session.base import BaseSession
    from aiogram.methods import TelegramMethod

    class RecordingSession(BaseSession):
        async def make_request(
            self,
            bot: Bot,
            method: TelegramMethod[Any],
            timeout: int | None = None,  # noqa: ASYNC109 (aiogram's signature)
        ) -> Any:
            params = method.model_dump()
            if sent is not None and method.__api_method__ == "sendMessage":
                sent.append(params)
            body = bot_api(replies, method.__api_method__, params)
            return self.check_response(bot=bot, method=method, status_code=200, content=body).result

        async def close(self) -> None:
            return None

        async def stream_content(self, *args: Any, **kwargs: Any) -> AsyncIterator[bytes]:
            raise AssertionError("no downloads")
            yield b""

    return RecordingSession()


def ptb_request(replies: list[tuple[str, str]], sent: list[dict[str, Any]] | None = None) -> Any:
    """A python-telegram-bot transport answering the Bot API as Telegram would (PTB's supported seam
    for a custom transport); ``sent``: each sendMessage's parameters as they went."""
    from telegram.request import BaseRequest, RequestData

    class RecordingRequest(BaseRequest):
        @property
        def read_timeout(self) -> float | None:
            return None

        async def initialize(self) -> None:
            return None

        async def shutdown(self) -> None:
            return None

        async def do_request(
            self, url: str, method: str, request_data: RequestData | None = None, **timeouts: Any
        ) -> tuple[int, bytes]:
            params = request_data.parameters if request_data is not None else {}
            if sent is not None and url.endswith("sendMessage"):
                sent.append(dict(params))
            return 200, bot_api(replies, url.rsplit("/", 1)[-1], params).encode()

    return RecordingRequest()


class TelegramHarness(Harness):
    """A Telegram bot: messages arrive as Bot API updates, each with the next update id."""

    def __init__(self) -> None:
        super().__init__()
        self.update_ids = iter(range(1, 10**9))
        self.sent: list[dict[str, Any]] = []  # each sendMessage's parameters (a topic's id among them)

    async def feed(self, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    async def deliver(self, n: int, text: str, *, edited: bool, **sender: Any) -> None:
        await self.feed(telegram_payload(next(self.update_ids), n, text, edited=edited, **sender))
        await self.settle()


class AiogramHarness(TelegramHarness):
    name = "aiogram"

    def __init__(self, memory: Memory, **options: Any) -> None:
        super().__init__()
        from aiogram import Bot, Dispatcher
        from aiogram.types import Message as TgMessage

        from narrmem.doors.integrations.aiogram import setup

        self.bot = Bot("42:TEST", session=aiogram_session(self.replies, self.sent))
        self.dispatcher = Dispatcher()
        options.setdefault("on_trigger", suggest_telegram)
        self.middleware = setup(self.dispatcher, memory, tenant=TG_TENANT, **options)
        contexts = self.contexts

        # The bot's own handler, registered after setup() as the integration asks.
        @self.dispatcher.message()
        async def answer(message: TgMessage, memory_context: ContextPack | None, memory_prompt: str) -> None:
            contexts[str(message.message_id)] = memory_context
            assert memory_prompt == (memory_context.render(token_budget=400) if memory_context else "")

    async def start(self) -> None:
        await self.dispatcher.emit_startup(bot=self.bot)  # as start_polling(bot) does first

    async def feed(self, payload: dict[str, Any]) -> None:
        from aiogram.types import Update

        await self.dispatcher.feed_update(self.bot, Update.model_validate(payload))

    async def settle(self) -> None:
        await self.middleware.triggers.sent()  # suggestions are sent by tasks of their own

    async def close(self) -> None:
        await self.bot.session.close()


class PtbHarness(TelegramHarness):
    name = "python-telegram-bot"

    def __init__(self, memory: Memory, **options: Any) -> None:
        super().__init__()
        from telegram import Update
        from telegram.ext import Application, ContextTypes, MessageHandler, filters

        from narrmem.doors.integrations.telegram import install

        self.application = (
            Application.builder()
            .token("42:TEST")
            .request(ptb_request(self.replies, self.sent))
            .get_updates_request(ptb_request(self.replies))
            .updater(None)
            .build()
        )
        options.setdefault("on_trigger", suggest_telegram)
        self.integration = install(self.application, memory, tenant=TG_TENANT, **options)
        contexts = self.contexts

        async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
            assert update.effective_message is not None
            contexts[str(update.effective_message.message_id)] = await self.integration.context_for(update)

        # The bot's own handler in the default group 0: it still sees what group -1 ingested.
        self.application.add_handler(MessageHandler(filters.ALL, answer))
        self.update_class = Update

    async def start(self) -> None:
        await self.application.initialize()  # calls getMe: answered by the fake request

    async def feed(self, payload: dict[str, Any]) -> None:
        update = self.update_class.de_json(payload, self.application.bot)
        await self.application.process_update(update)

    async def settle(self) -> None:
        await self.integration.triggers.sent()

    async def close(self) -> None:
        await self.application.shutdown()


class DiscordHarness(Harness):
    """A ``commands.Bot`` that never logs in: gateway payloads go straight to its state's parsers,
    which build real ``discord.Message`` objects and dispatch the events to the cog."""

    name = "discord.py"
    prefix = "!"

    def __init__(self, memory: Memory, *, guild_as: str = "chat", **options: Any) -> None:
        super().__init__()
        import discord
        from discord.ext import commands

        from narrmem.doors.integrations.discord import NarrmemCog

        class OfflineBot(commands.Bot):
            """Keeps the tasks of dispatched events, so a test can wait for every listener."""

            pending: list[asyncio.Task[Any]]

            def _schedule_event(  # type: ignore[override]
                self, coro: Callable[..., Awaitable[Any]], event_name: str, *args: Any, **kwargs: Any
            ) -> asyncio.Task[Any]:
                task = super()._schedule_event(coro, event_name, *args, **kwargs)
                self.pending.append(task)
                return task

        intents = discord.Intents.default()
        intents.message_content = True
        self.bot = OfflineBot(command_prefix="!", intents=intents)
        self.bot.pending = []
        self.bot.http.request = self._request  # type: ignore[method-assign]
        self.guild_as = guild_as
        self.cog = NarrmemCog(
            self.bot,
            memory,
            guild_as=guild_as,
            tenant=DC_TENANT,
            on_trigger=self._suggest,  # type: ignore[arg-type]
            **options,
        )
        self.discord = discord
        self.commands = commands
        self.authors: dict[int, bool] = {}

    async def start(self) -> None:
        await self.bot.__aenter__()  # binds the loop, as login would; nothing connects
        state = self.bot._connection
        me = {"id": "42", "username": "bot", "discriminator": "0", "avatar": None, "bot": True}
        state.user = self.discord.ClientUser(state=state, data=me)  # type: ignore[arg-type]
        guild = {"id": str(GUILD_ID), "name": "Team", "channels": [], "roles": [], "members": []}
        self.guild = state._add_guild_from_data(guild)  # type: ignore[arg-type]
        await self.bot.add_cog(self.cog)
        contexts = self.contexts

        @self.bot.listen("on_message")
        async def answer(message: discord.Message) -> None:
            contexts[str(message.id)] = await self.cog.context_for(message)

    def know_channel(self, channel_id: int) -> None:
        """A text channel of the guild in the bot's cache, as the gateway's guild data puts it."""
        data = {"id": str(channel_id), "type": 0, "name": "general", "position": 0, "guild_id": str(GUILD_ID)}
        channel = self.discord.TextChannel(state=self.bot._connection, guild=self.guild, data=data)  # type: ignore[arg-type]
        self.guild._add_channel(channel)

    async def close(self) -> None:
        await self.bot.close()

    async def _suggest(self, channel: discord.abc.Messageable, event: TriggerEvent) -> None:
        await channel.send(event.suggestion)

    async def _request(self, route: Any, **kwargs: Any) -> Any:
        if route.method == "POST" and route.path == "/channels/{channel_id}/messages":
            content = kwargs["json"]["content"]
            self.replies.append((str(route.channel_id), content))
            return self._payload(
                10**6 + len(self.replies), content, user=42, chat=route.channel_id, group=False, name="x"
            )
        raise AssertionError(f"unexpected Discord API call {route.method} {route.path}")

    def where(self, chat: int, group: bool) -> tuple[str, str]:
        if not group:
            return DC_TENANT, str(chat)
        if self.guild_as == "tenant":
            return str(GUILD_ID), str(chat)
        return DC_TENANT, str(GUILD_ID)

    def message_id(self, n: int) -> str:
        return str(self._snowflake(n))

    def _snowflake(self, n: int) -> int:
        return int(self.discord.utils.time_snowflake(when(n)))

    def _payload(
        self, snowflake: int, text: str, *, user: int, chat: int, group: bool, name: str, bot: bool = False
    ) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(snowflake),
            "channel_id": str(chat),
            "content": text,
            "author": {
                "id": str(user),
                "username": name.lower().replace(" ", "_"),
                "global_name": name,
                "discriminator": "0",
                "avatar": None,
                "bot": bot,
            },
            "timestamp": self.discord.utils.snowflake_time(snowflake).isoformat(),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "type": 0,
        }
        if group:
            self._ensure_channel(chat)
            data["guild_id"] = str(GUILD_ID)
            member = {"roles": [], "joined_at": T0.isoformat(), "deaf": False, "mute": False, "flags": 0}
            data["member"] = member
        return data

    def know_thread(self, thread_id: int, parent_id: int, *, forum: bool = False) -> Any:
        """A thread of ``parent_id`` (a post of a forum channel), active: in the bot's cache."""
        self._ensure_channel(parent_id, forum=forum)
        data = {
            "id": str(thread_id),
            "guild_id": str(GUILD_ID),
            "parent_id": str(parent_id),
            "owner_id": str(ANN),
            "name": f"t{thread_id}",
            "type": 11,
            "message_count": 0,
            "member_count": 1,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": T0.isoformat(),
                "locked": False,
            },
        }
        thread = self.discord.Thread(guild=self.guild, state=self.bot._connection, data=data)  # type: ignore[arg-type]
        self.guild._add_thread(thread)
        return thread

    def _ensure_channel(self, chat: int, *, forum: bool = False) -> None:
        if self.guild.get_channel_or_thread(chat) is None:
            channel = {
                "id": str(chat),
                "type": 15 if forum else 0,
                "name": f"c{chat}",
                "position": 0,
                "permission_overwrites": [],
            }
            kind = self.discord.ForumChannel if forum else self.discord.TextChannel
            made = kind(state=self.bot._connection, guild=self.guild, data=channel)  # type: ignore[arg-type]
            self.guild._add_channel(made)

    async def settle(self) -> None:
        while self.bot.pending or self.cog.triggers._sending:
            tasks, self.bot.pending = self.bot.pending, []
            await asyncio.gather(*tasks)
            await self.cog.triggers.sent()

    async def deliver(self, n: int, text: str, *, edited: bool, **sender: Any) -> None:
        payload = self._payload(self._snowflake(n), text, **sender)
        if edited:
            payload["edited_timestamp"] = (when(n) + timedelta(minutes=1)).isoformat()
            self.bot._connection.parse_message_update(payload)  # type: ignore[arg-type]
        else:
            self.bot._connection.parse_message_create(payload)  # type: ignore[arg-type]
        await self.settle()

    async def delete(self, ns: list[int], *, chat: int, group: bool) -> None:
        data: dict[str, Any] = {"channel_id": str(chat)}
        if group:
            data["guild_id"] = str(GUILD_ID)
        if len(ns) == 1:
            self.bot._connection.parse_message_delete({**data, "id": str(self._snowflake(ns[0]))})  # type: ignore[arg-type]
        else:
            ids = [str(self._snowflake(n)) for n in ns]
            self.bot._connection.parse_message_delete_bulk({**data, "ids": ids})  # type: ignore[arg-type]
        await self.settle()


LIBRARIES = ["aiogram", "python-telegram-bot", "discord.py"]
IMPORTS = {"aiogram": "aiogram", "python-telegram-bot": "telegram", "discord.py": "discord"}


async def open_harness(name: str, memory: Memory, **options: Any) -> Harness:
    pytest.importorskip(IMPORTS[name])
    harness: Harness
    if name == "aiogram":
        harness = AiogramHarness(memory, **options)
    elif name == "python-telegram-bot":
        harness = PtbHarness(memory, **options)
    else:
        harness = DiscordHarness(memory, **options)
    await harness.start()
    return harness


@pytest_asyncio.fixture(params=LIBRARIES)
async def bot(request: pytest.FixtureRequest, memory: Memory) -> AsyncIterator[Harness]:
    harness = await open_harness(request.param, memory)
    yield harness
    await harness.close()


@pytest_asyncio.fixture
async def discord_bot(memory: Memory) -> AsyncIterator[DiscordHarness]:
    harness = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(harness, DiscordHarness)
    yield harness
    await harness.close()


# --- what every integration does ---------------------------------------------------------------


async def test_a_private_message_is_stored_with_the_platform_identity(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)

    tenant, chat_id = bot.where(ANN, group=False)
    [episode] = await episodes(memory, tenant=tenant, user_id=str(ANN))
    assert episode.text == "I decided to quit my job at the bank"
    assert (episode.tenant, episode.chat_id, episode.user_id) == (tenant, chat_id, str(ANN))
    assert episode.message_ids == [bot.message_id(1)]
    assert episode.speaker == "Ann Lee"
    assert episode.created_at == when(1)


async def test_the_handler_gets_the_context_for_the_turn_without_the_message_itself(
    bot: Harness, memory: Memory
) -> None:
    await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)
    await bot.send(2, "should I quit my job at the bank or stay?", user=ANN, chat=ANN, group=False)

    first, second = bot.contexts[bot.message_id(1)], bot.contexts[bot.message_id(2)]
    assert first is not None and second is not None
    # Each message is stored before the handler runs, yet never offered as its own context.
    assert first.hits == []
    assert second.scope == Scope(tenant=bot.where(ANN, False)[0], user_id=str(ANN))
    assert second.query == "should I quit my job at the bank or stay?"
    assert {h.message_ids[0] for h in second.hits} == {bot.message_id(1)}
    assert "I decided to quit my job at the bank" in second.render(token_budget=400)


async def test_in_a_group_each_person_keeps_their_own_memories(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I love hiking in the mountains", user=ANN, chat=GROUP, group=True, name="Ann Lee")
    await bot.send(2, "I love sailing on the lake", user=BOB, chat=GROUP, group=True, name="Bob Stone")
    await bot.send(3, "I love hiking and sailing", user=BOB, chat=GROUP, group=True, name="Bob Stone")

    tenant, chat_id = bot.where(GROUP, group=True)
    ann = await episodes(memory, tenant=tenant, user_id=str(ANN))
    bob = await episodes(memory, tenant=tenant, user_id=str(BOB))
    assert [(r.text, r.speaker, r.chat_id) for r in ann] == [
        ("I love hiking in the mountains", "Ann Lee", chat_id)
    ]
    assert {r.speaker for r in bob} == {"Bob Stone"} and len(bob) == 2
    # Bob's context mentions hiking, but Ann's hiking is hers: a user scope never crosses people.
    pack = bot.contexts[bot.message_id(3)]
    assert pack is not None and pack.hits
    assert {h.user_id for h in pack.hits} == {str(BOB)}


async def test_a_groups_context_holds_nothing_said_in_a_direct_chat_or_another_group(
    bot: Harness, memory: Memory
) -> None:
    """The default context (``"auto"``): in a group, the person's words in that group only; in a
    direct chat, the person's words anywhere. Before 2026-12-06 a group's context held what the
    person had told the bot in private and in other groups, rendered into the answer's prompt."""
    await bot.send(1, "I decided to quit my job at the bank secretly", user=ANN, chat=ANN, group=False)
    await bot.send(2, "my job at the bank is driving me mad", user=ANN, chat=OTHER_GROUP, group=True)
    await bot.send(3, "the bank job again, ugh", user=ANN, chat=GROUP, group=True)
    await bot.send(4, "what about my job at the bank?", user=ANN, chat=GROUP, group=True)
    await bot.send(5, "what should I do about my job at the bank?", user=ANN, chat=ANN, group=False)

    in_group = bot.contexts[bot.message_id(4)]
    assert in_group is not None
    tenant, chat_id = bot.where(GROUP, group=True)
    assert in_group.scope == Scope(tenant=tenant, user_id=str(ANN), chat_id=chat_id)
    # Discord's guild_as="chat" (the harness's default) makes a server one chat: its channels share it.
    same_chat = bot.where(OTHER_GROUP, group=True) == (tenant, chat_id)
    said_here = {bot.message_id(3), *([bot.message_id(2)] if same_chat else [])}
    assert {h.message_ids[0] for h in in_group.hits} == said_here
    rendered = in_group.render(token_budget=400)
    assert "secretly" not in rendered and ("driving me mad" in rendered) == same_chat
    in_private = bot.contexts[bot.message_id(5)]
    assert in_private is not None
    assert bot.message_id(1) in {h.message_ids[0] for h in in_private.hits}


async def test_an_edit_replaces_the_text_and_keeps_its_history(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I love hiking in the mountains", user=ANN, chat=GROUP, group=True)
    await bot.edit(1, "I love climbing in the mountains", user=ANN, chat=GROUP, group=True)

    tenant, _ = bot.where(GROUP, group=True)
    [episode] = await episodes(memory, tenant=tenant, user_id=str(ANN))
    assert episode.text == "I love climbing in the mountains"
    assert episode.message_ids == [bot.message_id(1)]
    assert episode.created_at == when(1)  # when it was said, not when it was corrected
    assert [e["text"] for e in episode.meta["edits"]] == ["I love hiking in the mountains"]


async def test_messages_from_bots_are_not_remembered(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I decided to quit my job at the bank", user=77, chat=GROUP, group=True, bot=True)
    assert await everything(memory) == []


async def test_memory_and_forgetme_commands(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)
    await bot.send(2, "I love hiking in the mountains", user=ANN, chat=GROUP, group=True)
    await bot.send(3, "I adopted a cat named Miso last spring", user=BOB, chat=GROUP, group=True, name="Bob")

    private = await bot.command(10, "memory", user=ANN, chat=ANN, group=False)
    assert private.startswith("What I remember about you")
    assert "quit my job" in private and "hiking" in private and "Miso" not in private
    # In the group everyone reads the answer: what Ann said in private stays out of it.
    in_group = await bot.command(11, "memory", user=ANN, chat=GROUP, group=True)
    assert "hiking" in in_group and "quit my job" not in in_group and "Miso" not in in_group
    assert bot.replies[-1][0] == str(GROUP)

    tenant, _ = bot.where(ANN, group=False)
    anns = await memory.store.recent(Scope(tenant=tenant, user_id=str(ANN)), limit=100)
    assert len(anns) == 3  # the decision is an episode and a scene, the hike an episode
    reply = await bot.command(12, "forgetme", user=ANN, chat=GROUP, group=True)
    assert reply.startswith("Done: I forgot what you told me, 3 memories")
    assert await memory.store.recent(Scope(tenant=tenant, user_id=str(ANN)), limit=100) == []
    assert [r.text for r in await everything(memory)] == ["I adopted a cat named Miso last spring"]

    assert await bot.command(13, "memory", user=ANN, chat=ANN, group=False) == (
        "I don't remember anything about you yet."
    )
    assert (
        await bot.command(14, "forgetme", user=ANN, chat=ANN, group=False) == "I had nothing stored from you."
    )
    # The commands themselves were never remembered.
    assert [r.text for r in await everything(memory)] == ["I adopted a cat named Miso last spring"]


@pytest.mark.parametrize("library", LIBRARIES)
async def test_the_memory_command_lists_what_was_just_said_on_its_way_to_the_store(
    library: str, memory_factory: Callable[..., Awaitable[Memory]]
) -> None:
    """Answered on receipt, a message may not be written yet when the person asks what is
    remembered: the answer waits for it."""
    memory = await memory_factory(storage={"acknowledge": "on_receipt"})
    bot = await open_harness(library, memory)
    try:
        await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)
        private = await bot.command(10, "memory", user=ANN, chat=ANN, group=False)
        assert "quit my job" in private
    finally:
        await bot.close()


ROADMAP = [
    "I keep thinking about the product roadmap",
    "the product roadmap worries me again",
    "product roadmap meeting again, I hate the product roadmap",
]


async def test_a_trigger_suggestion_is_sent_to_the_chat_it_came_from(bot: Harness, memory: Memory) -> None:
    for n, text in enumerate(ROADMAP, start=1):
        await bot.send(n, text, user=ANN, chat=GROUP, group=True)

    platform_chat = str(GROUP)
    [(chat, suggestion)] = bot.replies
    assert chat == platform_chat
    assert "product roadmap" in suggestion and "3rd time" in suggestion


@pytest.mark.parametrize("acknowledge", ["after_write", "on_receipt"])
@pytest.mark.parametrize("library", LIBRARIES)
async def test_a_trigger_that_comes_after_the_answer_reaches_the_chat_it_came_from(
    library: str, acknowledge: str, memory_factory: Callable[..., Awaitable[Memory]]
) -> None:
    """With the hooks run after ingest answered, the event still reaches the chat of the message
    that caused it, once, and a message of another chat or a bulk import says nothing in any chat."""
    memory = await memory_factory(storage={"acknowledge": acknowledge})
    bot = await open_harness(library, memory)
    try:
        for n, text in enumerate(ROADMAP[:2], start=1):
            await bot.send(n, text, user=ANN, chat=GROUP, group=True)
        # The third mention, in another group: the event is said there, once, though the
        # platform delivers the message again before its hooks have run.
        await bot.send(3, ROADMAP[2], user=ANN, chat=OTHER_GROUP, group=True)
        await bot.send(3, ROADMAP[2], user=ANN, chat=OTHER_GROUP, group=True)
        await memory.settle()
        await bot.settle()
        [(chat, suggestion)] = bot.replies
        assert chat == str(OTHER_GROUP)
        assert "product roadmap" in suggestion and "3rd time" in suggestion

        # Counted by an import (not through the bot), another topic's trigger says nothing in a chat.
        tenant, chat_id = bot.where(GROUP, True)
        imported = [
            {
                "text": text,
                "user_id": str(ANN),
                "chat_id": chat_id,
                "message_id": f"import-{i}",
                "tenant": tenant,
                "ts": when(10 + i).isoformat(),
                "speaker": "Ann Lee",
            }
            for i, text in enumerate(
                [
                    "I keep thinking about the garden shed",
                    "the garden shed leaks again",
                    "garden shed repairs again, I hate that garden shed",
                ]
            )
        ]
        heard: list[TriggerEvent] = []

        async def hear(event: TriggerEvent) -> None:
            heard.append(event)

        memory.on_trigger(hear)
        await memory.ingest_many(imported)
        await memory.settle()
        await bot.settle()
        assert heard, "the import made no trigger event: nothing was tested"
        assert len(bot.replies) == 1
    finally:
        await bot.close()


async def test_many_people_at_once_are_never_mixed_up(bot: Harness, memory: Memory) -> None:
    """200 messages from 50 people, half in one shared group, delivered concurrently."""
    users = [5000 + u for u in range(50)]
    sent: list[tuple[int, int, bool, str]] = []  # (n, user, group, text)
    for u, user in enumerate(users):
        for i in range(4):
            group = i % 2 == 0
            text = f"I really enjoy hobby{u} and practise it with friend{u}x{i} every week"
            sent.append((1 + u * 4 + i, user, group, text))

    await asyncio.gather(
        *(
            bot.send(n, text, user=user, chat=GROUP if group else user, group=group, name=f"User {user}")
            for n, user, group, text in sent
        )
    )

    stored = {(r.user_id, r.chat_id, r.message_ids[0], r.text) for r in await everything(memory)}
    expected = {
        (str(user), bot.where(GROUP if group else user, group)[1], bot.message_id(n), text)
        for n, user, group, text in sent
    }
    assert stored == expected
    for u, user in enumerate(users):
        tenant = bot.where(user, group=False)[0]
        hits = await memory.recall(f"hobby{u} friend{u}x0", user_id=str(user), tenant=tenant, k=10)
        assert len(hits) == 4 and {h.user_id for h in hits} == {str(user)}
        assert all(f"hobby{u} " in h.text for h in hits)
    # And every handler got a context drawn from its own sender only.
    assert len(bot.contexts) == len(sent)
    for n, user, _, _ in sent:
        pack = bot.contexts[bot.message_id(n)]
        assert pack is not None and pack.scope.user_id == str(user)
        assert {h.user_id for h in pack.hits} <= {str(user)}
        assert bot.message_id(n) not in {m for h in pack.hits for m in h.message_ids}


# --- Telegram only -------------------------------------------------------------------------


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_captions_are_remembered_and_photos_alone_are_not(
    library: str, memory: Memory
) -> None:
    harness = await open_harness(library, memory)
    assert isinstance(harness, AiogramHarness | PtbHarness)
    try:
        photo = {"photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]}
        caption = {**photo, "caption": "my first marathon finish, I finally did it"}
        for n, extra in [(1, photo), (2, caption)]:
            payload = telegram_payload(n, n, None, user=ANN, chat=ANN, group=False, name="Ann", extra=extra)
            await harness.feed(payload)
    finally:
        await harness.close()

    assert [r.text for r in await episodes(memory, tenant=TG_TENANT, user_id=str(ANN))] == [
        "my first marathon finish, I finally did it"
    ]
    # The bot's handler still ran for the photo: memory is there, with no context to give.
    assert harness.contexts["1"] is None
    assert harness.contexts["2"] is not None


async def test_aiogram_commands_answer_before_a_catch_all_handler(memory: Memory) -> None:
    harness = await open_harness("aiogram", memory)
    assert isinstance(harness, AiogramHarness)
    try:
        reply = await harness.command(1, "memory@test_bot", user=ANN, chat=ANN, group=False)
    finally:
        await harness.close()
    assert reply == "I don't remember anything about you yet."
    assert "1" not in harness.contexts  # the command was answered, not passed on


async def test_aiogram_polling_asks_for_edits_and_the_bots_edit_handler_still_runs(memory: Memory) -> None:
    harness = await open_harness("aiogram", memory)
    assert isinstance(harness, AiogramHarness)
    seen: list[str | None] = []

    @harness.dispatcher.edited_message()
    async def on_edit(message: Any) -> None:
        seen.append(message.text)

    try:
        # start_polling's default allowed_updates: edits must be among them or Telegram never sends any.
        assert "edited_message" in harness.dispatcher.resolve_used_update_types()
        await harness.send(1, "I love hiking in the mountains", user=ANN, chat=ANN, group=False)
        await harness.edit(1, "I love climbing in the mountains", user=ANN, chat=ANN, group=False)
    finally:
        await harness.close()
    assert seen == ["I love climbing in the mountains"]
    [episode] = await episodes(memory, tenant=TG_TENANT, user_id=str(ANN))
    assert episode.text == "I love climbing in the mountains"


# --- Discord only --------------------------------------------------------------------------


async def test_discord_deleted_messages_are_forgotten(discord_bot: DiscordHarness, memory: Memory) -> None:
    for n in range(1, 6):
        await discord_bot.send(
            n, f"I love hiking trail number {n} in the mountains", user=ANN, chat=7, group=True
        )
    # Message 2 drops out of discord.py's cache: only the raw event reports its deletion.
    state = discord_bot.bot._connection
    assert state._messages is not None
    state._messages.remove(next(m for m in state._messages if m.id == discord_bot._snowflake(2)))

    await discord_bot.delete([1], chat=7, group=True)
    await discord_bot.delete([2], chat=7, group=True)
    await discord_bot.delete([3, 4], chat=7, group=True)

    left = await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
    assert [r.message_ids for r in left] == [[discord_bot.message_id(5)]]


async def test_discord_maps_guilds_to_tenants_and_forgets_everywhere(
    discord_bot: DiscordHarness, memory: Memory
) -> None:
    await discord_bot.send(1, "I love hiking in the mountains", user=ANN, chat=7, group=True)
    await discord_bot.send(2, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)

    by_place = sorted((r.tenant, r.chat_id, r.kind) for r in await everything(memory))
    assert by_place == [
        (str(GUILD_ID), "7", "episode"),
        (DC_TENANT, str(ANN), "episode"),
        (DC_TENANT, str(ANN), "scene"),
    ]
    # A server is a tenant of its own: its memories never reach a direct message's context.
    await discord_bot.send(3, "should I go hiking in the mountains?", user=ANN, chat=ANN, group=False)
    pack = discord_bot.contexts[discord_bot.message_id(3)]
    assert pack is not None and all(h.tenant == DC_TENANT for h in pack.hits)

    reply = await discord_bot.command(4, "forgetme", user=ANN, chat=ANN, group=False)
    assert reply.startswith("Done: I forgot what you told me, 4 memories")
    assert await everything(memory) == []


def _imported_history(path: Path, fmt: str, export: dict[str, Any], tenant: str | None = None) -> list[Any]:
    """The messages ``narrmem import-chat`` makes of ``export`` (written to ``path``)."""
    from narrmem.doors.chat_import import read_chat

    path.write_text(json.dumps(export), encoding="utf-8")
    return read_chat(path, fmt, tenant=tenant).messages


@pytest.mark.parametrize("guild_as", ["tenant", "chat"])
async def test_discord_forgetme_reaches_a_servers_imported_history(
    guild_as: str, memory: Memory, tmp_path: Path
) -> None:
    """An imported server's history is under ``discord:<server id>`` with the live Discord ids:
    the same person, whom forgetme left there (its reply said it had forgotten them)."""
    author = {"id": str(ANN), "name": "ann", "isBot": False}
    export = {
        "guild": {"id": str(GUILD_ID), "name": "Team"},
        "channel": {"id": "7", "name": "general"},
        "messages": [
            {
                "id": "5001",
                "type": "Default",
                "timestamp": "2026-01-01T10:00:00+00:00",
                "author": author,
                "content": "I decided to quit my job at Vellamire bank",
            },
        ],
    }
    await memory.ingest_many(_imported_history(tmp_path / "general.json", "discord", export))
    bot = await open_harness("discord.py", memory, guild_as=guild_as)
    try:
        await bot.send(1, "I love hiking in the mountains", user=ANN, chat=7, group=True)
        reply = await bot.command(2, "forgetme", user=ANN, chat=ANN, group=False)
    finally:
        await bot.close()
    assert reply.startswith("Done: I forgot")
    assert await everything(memory) == []


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_forgetme_reaches_history_imported_into_the_bots_tenant(
    library: str, memory: Memory, tmp_path: Path
) -> None:
    """A Telegram export names its authors ``user<id>``; the bot, by the number. Before, forgetme
    left the imported history and answered that nothing was stored."""
    export = {
        "name": "Ann",
        "type": "personal_chat",
        "id": ANN,
        "messages": [
            {
                "id": 9001,
                "type": "message",
                "date": "2026-01-01T10:00:00",
                "date_unixtime": "1767261600",
                "from": "Ann Lee",
                "from_id": f"user{ANN}",
                "text": "I decided to quit my job at Vellamire bank",
            },
        ],
    }
    bot = await open_harness(library, memory)
    try:
        tenant, _ = bot.where(ANN, group=False)
        await memory.ingest_many(_imported_history(tmp_path / "result.json", "telegram", export, tenant))
        assert {r.user_id for r in await everything(memory)} == {f"user{ANN}"}
        reply = await bot.command(1, "forgetme", user=ANN, chat=ANN, group=False)
    finally:
        await bot.close()
    assert reply.startswith("Done: I forgot")
    assert await everything(memory) == []


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_a_command_in_other_case_is_answered_as_it_is_recognised(library: str, memory: Memory) -> None:
    """``/ForgetMe`` is one of narrmem's commands on Telegram (so it is not stored); on aiogram it
    was then not answered, and the person was not forgotten. (discord.py's own rules say whether
    a command's case matters: ``commands.Bot(case_insensitive=...)``.)"""
    bot = await open_harness(library, memory)
    try:
        await _forget_in_other_case(bot, memory)
    finally:
        await bot.close()


async def _forget_in_other_case(bot: Harness, memory: Memory) -> None:
    await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)
    reply = await bot.command(2, "ForgetMe", user=ANN, chat=ANN, group=False)
    assert reply.startswith("Done: I forgot")
    assert await everything(memory) == []


async def test_discord_forgetme_reaches_a_server_that_removed_the_bot(
    discord_bot: DiscordHarness, memory: Memory
) -> None:
    """The store keeps a server's tenant after the bot leaves it: "in every server" includes it
    (before, only the servers the bot was in were forgotten, and the reply said all was)."""
    await discord_bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=7, group=True)
    await discord_bot.send(2, "I love hiking in the mountains", user=ANN, chat=ANN, group=False)
    await discord_bot.send(3, "my brother lives in Porto", user=BOB, chat=7, group=True)
    discord_bot.bot._connection.parse_guild_delete({"id": str(GUILD_ID)})  # the bot is removed
    assert str(GUILD_ID) not in discord_bot.cog.tenants()
    reply = await discord_bot.command(4, "forgetme", user=ANN, chat=ANN, group=False)
    assert reply.startswith("Done: I forgot")
    left = await everything(memory)
    assert {r.user_id for r in left} == {str(BOB)}  # Bob's memories in that server stay


async def test_discord_an_update_with_the_same_text_is_not_an_edit(
    discord_bot: DiscordHarness, memory: Memory
) -> None:
    await discord_bot.send(1, "I love hiking https://example.org/trail", user=ANN, chat=7, group=True)
    # Discord sends an update when it adds the link preview; the text is unchanged.
    await discord_bot.edit(1, "I love hiking https://example.org/trail", user=ANN, chat=7, group=True)

    [episode] = await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
    assert "edits" not in episode.meta


async def test_discord_mentions_are_stored_as_names(discord_bot: DiscordHarness, memory: Memory) -> None:
    bob_id = 412345678901234567  # real ids are snowflakes; discord.py resolves only those
    text = f"<@{bob_id}> and I decided to run a marathon"
    payload = discord_bot._payload(discord_bot._snowflake(1), text, user=ANN, chat=7, group=True, name="x")
    bob = {"id": str(bob_id), "username": "bob", "global_name": "Bob", "discriminator": "0", "avatar": None}
    payload["mentions"] = [bob]
    discord_bot.bot._connection.parse_message_create(payload)  # type: ignore[arg-type]
    await discord_bot.settle()

    [episode] = await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
    assert episode.text == "@Bob and I decided to run a marathon"


# --- the examples ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "library", "variable"),
    [
        ("aiogram_bot", "aiogram", "TELEGRAM_BOT_TOKEN"),
        ("ptb_bot", "telegram", "TELEGRAM_BOT_TOKEN"),
        ("discord_bot", "discord", "DISCORD_BOT_TOKEN"),
    ],
)
async def test_examples_import_and_ask_for_a_token(
    example: str, library: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util
    import inspect

    pytest.importorskip(library)
    path = Path(__file__).parent.parent / "examples" / f"{example}.py"
    spec = importlib.util.spec_from_file_location(f"narrmem_example_{example}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # importing runs nothing: main() is behind __name__ == "__main__"
    monkeypatch.delenv(variable, raising=False)
    with pytest.raises(SystemExit, match=variable):
        result = module.main()
        if inspect.isawaitable(result):
            await result


# --- the shared pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("/forgetme", "forgetme"),
        ("/Memory@my_bot please", "memory"),
        ("!memory", "memory"),
        ("/", None),
        ("hello /memory", None),
        ("", None),
        (None, None),
    ],
)
def test_command_name(text: str | None, name: str | None) -> None:
    assert _common.command_name(text) == name


def test_forget_reply_counts_by_kind() -> None:
    counts = {"memories": 3, "keyword_rows": 3, "vectors": 3, "episode": 2, "scene": 1}
    assert _common.forget_reply(counts) == (
        "Done: I forgot what you told me, 3 memories (2 episodes, 1 scene). "
        "What others wrote that mentions you is theirs, and stays."
    )
    assert _common.forget_reply({"memories": 0}) == "I had nothing stored from you."


def test_clip_keeps_replies_within_the_platform_limit() -> None:
    assert _common.clip("x" * 5000, 4096) == "x" * 4095 + "…"
    assert _common.clip("short", 2000) == "short"


def test_importing_narrmem_needs_no_bot_library() -> None:
    import subprocess
    import sys

    libraries = "{'aiogram', 'discord', 'telegram'}"
    code = f"import sys, narrmem, narrmem.doors.integrations; print(sorted({libraries} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the ready-made trigger handlers -----------------------------------------------------------


async def test_say_suggestion_speaks_where_the_pattern_came_up_and_only_with_a_suggestion() -> None:
    from aiogram import Bot as AiogramBot
    from telegram import Bot as PtbBot

    from narrmem.integrations import aiogram as narrmem_aiogram
    from narrmem.integrations import telegram as narrmem_telegram

    sent: list[tuple[str, int, str]] = []

    class AiogramRecorder(AiogramBot):
        async def send_message(self, chat_id: int | str, text: str, **_: Any) -> Any:  # type: ignore[override]
            sent.append(("aiogram", int(chat_id), text))

    class PtbRecorder(PtbBot):
        async def send_message(self, chat_id: int | str, text: str, **_: Any) -> Any:  # type: ignore[override]
            sent.append(("ptb", int(chat_id), text))

    event = TriggerEvent(
        kind="topic", label="running", count=3, user_id="7", chat_id="-1001", suggestion="Running again?"
    )
    silent = event.model_copy(update={"suggestion": ""})
    aiogram_bot = AiogramRecorder("123456:" + "A" * 35)
    await narrmem_aiogram.say_suggestion(aiogram_bot, event)
    await narrmem_aiogram.say_suggestion(aiogram_bot, silent)
    await narrmem_telegram.say_suggestion(PtbRecorder("123456:ABC"), event)
    await narrmem_telegram.say_suggestion(PtbRecorder("123456:ABC"), silent)
    await aiogram_bot.session.close()
    assert sent == [("aiogram", -1001, "Running again?"), ("ptb", -1001, "Running again?")]


PHOTO = {"photo": [{"file_id": "f", "file_unique_id": "u", "width": 1, "height": 1}]}


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_a_caption_edited_away_takes_its_words_with_it(library: str, memory: Memory) -> None:
    """An edit that takes a photo's caption away: what the caption said is no longer remembered
    (before, no handler saw the edit and the old caption stayed the stored text)."""
    harness = await open_harness(library, memory)
    assert isinstance(harness, TelegramHarness)
    try:
        caption = {**PHOTO, "caption": "my new home address is 12 Elm Street, flat 4"}
        ann = {"user": ANN, "chat": ANN, "group": False, "name": "Ann"}
        await harness.feed(telegram_payload(1, 1, None, **ann, extra=caption))
        await memory.settle()
        assert any("Elm Street" in r.text for r in await everything(memory))
        await harness.feed(telegram_payload(2, 1, None, **ann, extra=PHOTO, edited=True))
        await memory.settle()
        assert await everything(memory) == []
        # A caption written anew is new words: stored (the first retraction's forget does not hold
        # the message back, as a forget of its person would).
        anew = {**PHOTO, "caption": "we finally moved to Lisbon"}
        await harness.feed(telegram_payload(3, 1, None, **ann, extra=anew, edited=True))
        await memory.settle()
        assert [r.text for r in await everything(memory) if r.kind == "episode"] == [
            "we finally moved to Lisbon"
        ]
    finally:
        await harness.close()


async def test_discord_text_taken_out_of_a_message_that_keeps_its_attachment(
    discord_bot: DiscordHarness, memory: Memory
) -> None:
    """The text removed, the attachment kept: what the text said goes. An update whose text reads
    empty with nothing shown (the message content intent off) is not taken for that."""
    attachment = [
        {"id": "9", "filename": "p.png", "size": 10, "url": "https://x/p.png", "proxy_url": "https://x/p.png"}
    ]
    place = {"user": ANN, "chat": 7, "group": True, "name": "Ann"}
    kept = discord_bot._payload(discord_bot._snowflake(1), "I keep bees on the roof", **place)
    discord_bot.bot._connection.parse_message_create(kept)
    said = discord_bot._payload(discord_bot._snowflake(2), "my locker code is 4417", **place)
    said["attachments"] = attachment
    discord_bot.bot._connection.parse_message_create(said)
    await discord_bot.settle()
    await memory.settle()
    assert len(await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))) == 2
    blank = dict(kept, content="", edited_timestamp=when(3).isoformat())  # nothing shown: not a retraction
    discord_bot.bot._connection.parse_message_update(blank)
    retracted = dict(said, content="", attachments=attachment, edited_timestamp=when(4).isoformat())
    discord_bot.bot._connection.parse_message_update(retracted)
    await discord_bot.settle()
    await memory.settle()
    assert [r.text for r in await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))] == [
        "I keep bees on the roof"
    ]


@pytest.mark.parametrize("library", LIBRARIES)
async def test_a_bots_time_zone_dates_its_peoples_messages(library: str, memory: Memory) -> None:
    """The platforms date messages in UTC: a Monday 7am in Shanghai was stored, and its scene
    told, as Sunday 11pm, and a weekly habit counted on Sundays."""
    bot = await open_harness(library, memory, time_zone="Asia/Shanghai")
    try:
        await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=ANN, group=False)
        await bot.settle()
        tenant, _ = bot.where(ANN, group=False)
        [episode] = await episodes(memory, tenant=tenant, user_id=str(ANN))
        assert episode.created_at == when(1)  # the same instant
        assert episode.created_at.utcoffset() == timedelta(hours=8)
    finally:
        await bot.close()


def test_a_time_zone_that_is_none_is_named() -> None:
    from narrmem.doors.integrations._common import TurnOptions

    for wrong in ("Mars/Olympus_Mons", "", 8):
        with pytest.raises(InputError) as refused:
            TurnOptions(time_zone=wrong)  # type: ignore[arg-type]
        assert refused.value.field == "time_zone"


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_forwards_live_locations_and_anonymous_admins(library: str, memory: Memory) -> None:
    """A forward is someone else's words: stored as the forwarder's (Ann's diagnosis forwarded by
    Bob became Bob's, and her forget never reached it). A live location is an edited message
    every few seconds with no text: each was a forget for nothing. An anonymous admin writes as
    the group, which every anonymous admin is: their /forgetme took all of their words."""
    harness = await open_harness(library, memory)
    assert isinstance(harness, TelegramHarness)
    bob = {"user": BOB, "chat": GROUP, "group": True, "name": "Bob"}
    try:
        origin = {"type": "user", "date": 1, "sender_user": {"id": ANN, "is_bot": False, "first_name": "Ann"}}
        forwarded = {"forward_origin": origin}
        await harness.feed(
            telegram_payload(1, 1, "I was just diagnosed with diabetes", **bob, extra=forwarded)
        )
        await harness.feed(telegram_payload(2, 2, "I moved to Porto last spring", **bob))
        spot = {"location": {"latitude": 41.15, "longitude": -8.61, "live_period": 3600}}
        for update in range(3, 6):
            await harness.feed(telegram_payload(update, 3, None, **bob, extra=spot, edited=True))
        await memory.settle()
        assert [r.text for r in await everything(memory)] == ["I moved to Porto last spring"]
        assert await memory.store.state_items(forget_marks.NAMESPACE) == []  # no forget was made
        assert harness.contexts["1"] is not None  # the answer to the forward has Bob's context

        group = {"id": GROUP, "type": "supergroup", "title": "Team"}
        as_group = {"sender_chat": group}
        before = len(harness.replies)
        await harness.feed(telegram_payload(6, 6, "/forgetme", **bob, extra=as_group))
        await harness.feed(telegram_payload(7, 7, "/memory", **bob, extra=as_group))
        assert [text for _, text in harness.replies[before:]] == [_common.AS_THE_GROUP_REPLY] * 2
        assert [r.text for r in await everything(memory)] == ["I moved to Porto last spring"]
    finally:
        await harness.close()


@pytest.mark.parametrize("guild_as", ["tenant", "chat"])
async def test_discord_a_deleted_thread_takes_what_was_said_in_it(memory: Memory, guild_as: str) -> None:
    """Discord sends no delete of each message when a thread, forum post or channel is deleted:
    what was said there stayed, recalled (with ``guild_as="chat"``, across the whole server)."""
    harness = await open_harness("discord.py", memory, guild_as=guild_as)
    assert isinstance(harness, DiscordHarness)
    try:
        await harness.send(1, "I keep bees on the roof", user=ANN, chat=7, group=True)
        await harness.send(2, "my locker code at the gym is 4417", user=ANN, chat=77, group=True)
        await harness.send(3, "I am training for the Porto marathon", user=BOB, chat=77, group=True)
        await memory.settle()
        assert len(await everything(memory)) == 3
        thread = {"id": "77", "guild_id": str(GUILD_ID), "parent_id": "7", "type": 11}
        harness.bot._connection.parse_thread_delete(thread)  # type: ignore[arg-type]
        await harness.settle()
        await memory.settle()
        assert [r.text for r in await everything(memory)] == ["I keep bees on the roof"]
    finally:
        await harness.close()


@pytest.mark.parametrize("guild_as", ["tenant", "chat"])
async def test_discord_a_deleted_forum_takes_its_posts_archived_ones_too(
    memory: Memory, guild_as: str
) -> None:
    """A forum's posts are threads, most of them archived, which the bot's cache does not hold;
    Discord deletes them with the forum and sends no delete of any: what was said in them stayed,
    recalled, out of reach (the cached ones' too)."""
    harness = await open_harness("discord.py", memory, guild_as=guild_as)
    assert isinstance(harness, DiscordHarness)
    try:
        for thread in (71, 72):
            harness.know_thread(thread, 7, forum=True)
        harness.know_thread(81, 8)  # another channel's thread
        await harness.send(1, "my locker code at the gym is 4417", user=ANN, chat=71, group=True)
        await harness.send(2, "I am training for the Porto marathon", user=BOB, chat=72, group=True)
        await harness.send(3, "I keep bees on the roof", user=ANN, chat=81, group=True)
        await harness.send(4, "the summer party is at the harbour bar", user=BOB, chat=9, group=True)
        await memory.settle()
        assert len(await everything(memory)) == 4
        archived = harness.guild.get_thread(71)
        harness.guild._remove_thread(archived)  # archived: out of the cache
        forum = {"id": "7", "guild_id": str(GUILD_ID), "type": 15, "name": "c7", "position": 0}
        harness.bot._connection.parse_channel_delete(forum)  # type: ignore[arg-type]
        await harness.settle()
        await memory.settle()
        left = sorted(r.text for r in await everything(memory))
        assert left == ["I keep bees on the roof", "the summer party is at the harbour bar"]
        from narrmem.doors.integrations.backlog import THREADS_NAMESPACE

        # The notes of the forum's threads went with it (ids only, kept where a thread is a chat).
        noted = [key.split("\0")[1:3] for key, _ in await memory.store.state_items(THREADS_NAMESPACE)]
        assert noted == ([["8", "81"]] if guild_as == "tenant" else [])
    finally:
        await harness.close()


async def test_discord_an_edited_command_is_not_remembered(
    discord_bot: DiscordHarness, memory: Memory
) -> None:
    """A command whose typo is fixed by an edit: the update was taken for a message and stored."""
    await discord_bot.send(1, "!memroy please", user=ANN, chat=7, group=True)  # no such command: said
    await memory.settle()
    assert [r.text for r in await everything(memory)] == ["!memroy please"]
    await discord_bot.edit(1, "!memory please", user=ANN, chat=7, group=True)
    await discord_bot.settle()
    await memory.settle()
    assert await everything(memory) == []  # neither the command nor the typo it replaced


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_a_message_edited_into_a_command_leaves_nothing_of_it(
    library: str, memory: Memory
) -> None:
    harness = await open_harness(library, memory)
    assert isinstance(harness, TelegramHarness)
    try:
        await harness.send(1, "my locker code at the gym is 4417", user=ANN, chat=ANN, group=False)
        await memory.settle()
        assert [r.text for r in await everything(memory)] == ["my locker code at the gym is 4417"]
        await harness.edit(1, "/memory", user=ANN, chat=ANN, group=False)
        await memory.settle()
        assert await everything(memory) == []
    finally:
        await harness.close()


async def test_discord_a_thread_that_fails_to_be_forgotten_leaves_the_others_to_go(memory: Memory) -> None:
    """One thread's forget failing (a plugin that cannot scrub) stopped the channel's: the
    threads after it stayed, and nothing tried them again."""
    harness = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(harness, DiscordHarness)
    forget = memory.forget

    async def fails_for_one(**scope: Any) -> Any:
        if scope.get("chat_id") == "71":
            raise RuntimeError("a plugin could not scrub")
        return await forget(**scope)

    try:
        for thread in (71, 72, 73):
            harness.know_thread(thread, 7, forum=True)
            await harness.send(
                thread, f"a secret of post {thread}: my code is {thread}17", user=ANN, chat=thread, group=True
            )
        await memory.settle()
        memory.forget = fails_for_one  # type: ignore[method-assign]
        for thread in (71, 72, 73):
            harness.guild._remove_thread(harness.guild.get_thread(thread))  # archived
        harness.bot._connection.parse_channel_delete(
            {"id": "7", "guild_id": str(GUILD_ID), "type": 15, "name": "c7", "position": 0}
        )  # type: ignore[arg-type]
        await harness.settle()
        await memory.settle()
        assert [r.chat_id for r in await everything(memory)] == ["71"]
        from narrmem.doors.integrations.backlog import THREADS_NAMESPACE

        # Its note stays for the channel's forget made again (a restart's replay, a retry).
        noted = [key.split("\0")[2] for key, _ in await memory.store.state_items(THREADS_NAMESPACE)]
        assert noted == ["71"]
    finally:
        memory.forget = forget  # type: ignore[method-assign]
        await harness.close()


async def test_discord_a_thread_noted_when_the_store_could_not_take_it_at_first(
    memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The note of a thread failed with its first message (a store's blip) and was tried with a
    later one only: a forum post of one message was never noted, and outlived its forum."""
    from narrmem.doors.integrations import discord as discord_integration
    from narrmem.doors.integrations.backlog import THREADS_NAMESPACE

    monkeypatch.setattr(discord_integration, "RETRY_DELAYS", (0.05,))
    harness = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(harness, DiscordHarness)
    put = memory.store.state_put
    failed: list[str] = []

    async def blips_once(namespace: str, key: str, value: dict[str, Any]) -> None:
        if namespace == THREADS_NAMESPACE and not failed:
            failed.append(key)
            raise OSError("the store blinked")
        await put(namespace, key, value)

    monkeypatch.setattr(memory.store, "state_put", blips_once)
    try:
        harness.know_thread(71, 7, forum=True)
        await harness.send(1, "my passport number is X1234567", user=ANN, chat=71, group=True)
        await memory.settle()
        for _ in range(100):
            if await memory.store.state_items(THREADS_NAMESPACE):
                break
            await asyncio.sleep(0.02)
        assert failed and len(await memory.store.state_items(THREADS_NAMESPACE)) == 1
        harness.guild._remove_thread(harness.guild.get_thread(71))
        harness.bot._connection.parse_channel_delete(
            {"id": "7", "guild_id": str(GUILD_ID), "type": 15, "name": "c7", "position": 0}
        )  # type: ignore[arg-type]
        await harness.settle()
        await memory.settle()
        assert await everything(memory) == []
    finally:
        await harness.close()


async def test_a_forgetme_after_guild_as_was_switched_reaches_what_was_stored_before(tmp_path: Path) -> None:
    """A bot run with ``guild_as="tenant"``, switched to ``"chat"`` and restarted: ``!forgetme``
    said "Done" and left everything stored under the server's tenant."""
    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        bot = DiscordHarness(memory, guild_as="tenant")
        await bot.start()
        try:
            await bot.send(1, "I decided to quit my job at the bank", user=ANN, chat=GROUP, group=True)
            await bot.settle()
        finally:
            await bot.close()
        assert await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
    async with open_memory(folder) as memory:
        bot = DiscordHarness(memory, guild_as="chat")
        await bot.start()
        try:
            await bot.command(11, "forgetme", user=ANN, chat=ANN, group=False)
            await bot.settle()
        finally:
            await bot.close()
        assert [r for r in await everything(memory) if r.user_id == str(ANN)] == []
