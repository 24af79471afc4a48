"""The bot integrations in a bot's real life, on the real libraries (the harnesses of
``test_integrations``): a trigger send that waits out a rate limit, a bot-wide parse mode on
Telegram, aiogram handlers of photos, a context nobody answered, Discord's cache missing a
channel or a server, and a stored "@everyone" read back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_integrations import (
    ANN,
    BOB,
    GUILD_ID,
    PHOTO,
    ROADMAP,
    TG_TENANT,
    DiscordHarness,
    aiogram_session,
    everything,
    open_harness,
    ptb_request,
    telegram_payload,
    when,
)

from narrmem import ManualClock, Memory, Message, Scope, StoreUnavailableError, TriggerEvent
from narrmem.testing import open_memory

DM = {"user": ANN, "chat": ANN, "group": False, "name": "Ann Lee"}


async def say_for(routes: Any, who: int, n: int, *, chat: str = "7", label: str = "product roadmap") -> None:
    """A trigger event of message ``m<n>`` of ``who`` in ``chat``, routed as an ingest through the
    integration routes it (said at ``when(n)``), then made by its hooks."""
    message = Message(
        text=f"the {label} again",
        user_id=str(who),
        chat_id=chat,
        tenant=str(GUILD_ID),
        message_id=f"m{n}",
        ts=when(n),
    )
    assert routes.expect(message, object())
    await routes._say(
        TriggerEvent(
            kind="topic",
            label=label,
            count=3,
            tenant=str(GUILD_ID),
            user_id=str(who),
            chat_id=chat,
            cause_message_id=f"m{n}",
            suggestion=label,
        )
    )


async def test_a_trigger_send_waiting_out_a_rate_limit_holds_no_write_back(memory: Memory) -> None:
    """The bot's callback ran inside the hooks that made the event, which are part of memory's
    writes: a send sleeping out a 429 held a delete and a message in another channel back."""
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    gate = asyncio.Event()
    said: list[str] = []

    async def slow(channel: Any, event: TriggerEvent) -> None:
        await gate.wait()  # discord.py's HTTP client sleeping out a rate limit
        said.append(event.suggestion)

    bot.cog.triggers._on_trigger = slow
    try:
        await bot.send(1, "my gym locker code is 4417", user=BOB, chat=8, group=True)
        for n, text in enumerate(ROADMAP[:2], start=2):
            await bot.send(n, text, user=ANN, chat=7, group=True)
        state = bot.bot._connection
        state.parse_message_create(
            bot._payload(bot._snowflake(4), ROADMAP[2], user=ANN, chat=7, group=True, name="Ann")
        )
        for _ in range(100):  # the third mention's trigger is being sent
            if bot.cog.triggers._sending:
                break
            await asyncio.sleep(0.02)
        assert bot.cog.triggers._sending and not said
        await asyncio.wait_for(
            memory.forget_messages(chat_id="8", message_ids=[bot.message_id(1)], tenant=str(GUILD_ID)), 5
        )
        stored = await asyncio.wait_for(
            memory.ingest(
                {
                    "text": "I moved to Porto last spring",
                    "user_id": str(BOB),
                    "chat_id": "8",
                    "tenant": str(GUILD_ID),
                    "message_id": "5",
                    "ts": "2026-05-04T10:00:00+00:00",
                }
            ),
            5,
        )
        assert stored.stored and not said
        assert "4417" not in " ".join(r.text for r in await everything(memory))
    finally:
        gate.set()
        await bot.settle()
        await bot.close()
    assert len(said) == 1 and "product roadmap" in said[0]


async def test_one_chats_suggestions_are_sent_in_the_order_they_came(memory: Memory) -> None:
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    order: list[str] = []

    async def send(channel: Any, event: TriggerEvent) -> None:
        if not order and event.label == "first":
            await asyncio.sleep(0.2)  # the first is slow to send: the others wait for it
        order.append(event.label)

    routes = bot.cog.triggers
    routes._on_trigger = send
    try:
        for n, label in enumerate(["first", "second", "third"]):
            await say_for(routes, ANN, n, label=label)
        await routes.sent()
    finally:
        await bot.close()
    assert order == ["first", "second", "third"]


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_telegram_replies_are_plain_text_whatever_the_bots_default_parse_mode(
    library: str, memory: Memory
) -> None:
    """With a bot-wide default parse mode (aiogram's DefaultBotProperties, PTB's Defaults), the
    replies carried it, and Telegram refuses "x < y & my kids <3" as HTML, or MarkdownV2's
    unescaped "(" and "." in every reply: the forget was made, and its answer never came."""
    sent: list[dict[str, Any]] = []
    text = "I think x < y & my kids <3 Porto (finally!)"
    if library == "aiogram":
        from aiogram import Bot, Dispatcher
        from aiogram.client.default import Default, DefaultBotProperties
        from aiogram.types import Update

        from narrmem.doors.integrations.aiogram import setup

        session = aiogram_session([])
        make_request = session.make_request

        async def recording(bot: Any, method: Any, timeout: Any = None) -> Any:  # noqa: ASYNC109 (aiogram's signature)
            if method.__api_method__ == "sendMessage":
                mode = method.parse_mode
                # What goes on the wire: a Default is the bot's default, None is no parse mode.
                sent.append({"parse_mode": bot.default["parse_mode"] if isinstance(mode, Default) else mode})
            return await make_request(bot, method, timeout)

        session.make_request = recording  # type: ignore[method-assign]
        tg = Bot("42:TEST", session=session, default=DefaultBotProperties(parse_mode="MarkdownV2"))
        dispatcher = Dispatcher()
        setup(dispatcher, memory, tenant=TG_TENANT)
        await dispatcher.emit_startup(bot=tg)
        for update_id, words in [(1, text), (2, "/memory"), (3, "/forgetme")]:
            await dispatcher.feed_update(
                tg, Update.model_validate(telegram_payload(update_id, update_id, words, **DM))
            )
        await tg.session.close()
    else:
        from telegram import Update
        from telegram.constants import ParseMode
        from telegram.ext import Application, Defaults

        from narrmem.doors.integrations.telegram import install

        application = (
            Application.builder()
            .token("42:TEST")
            .request(ptb_request([], sent))
            .get_updates_request(ptb_request([], sent))
            .updater(None)
            .defaults(Defaults(parse_mode=ParseMode.HTML))
            .build()
        )
        install(application, memory, tenant=TG_TENANT)
        await application.initialize()
        for update_id, words in [(1, text), (2, "/memory"), (3, "/forgetme")]:
            payload = telegram_payload(update_id, update_id, words, **DM)
            await application.process_update(Update.de_json(payload, application.bot))
        await application.shutdown()
    assert len(sent) == 2
    assert all(reply.get("parse_mode") is None for reply in sent)


async def test_say_suggestion_on_telegram_is_plain_text() -> None:
    from narrmem.doors.integrations._common import say_suggestion_on_telegram

    calls: list[dict[str, Any]] = []

    class Sender:
        async def send_message(self, chat_id: int, text: str, *, parse_mode: Any = "HTML") -> None:
            calls.append({"chat_id": chat_id, "text": text, "parse_mode": parse_mode})

    event = TriggerEvent(
        kind="topic", label="x < y", count=3, user_id="1", chat_id="-5", suggestion="x < y again?"
    )
    await say_suggestion_on_telegram(Sender(), event)
    assert calls == [{"chat_id": -5, "text": "x < y again?", "parse_mode": None}]


async def test_aiogram_handlers_of_a_photo_or_sticker_get_memory_mark_used(memory: Memory) -> None:
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message as TgMessage
    from aiogram.types import Update

    from narrmem.doors.integrations.aiogram import setup

    tg = Bot("42:TEST", session=aiogram_session([]))
    dispatcher = Dispatcher()
    setup(dispatcher, memory, tenant=TG_TENANT)
    handled: list[tuple[int, list[int]]] = []

    @dispatcher.message()
    async def answer(message: TgMessage, memory_context: Any, memory_mark_used: Any) -> None:
        handled.append((message.message_id, await memory_mark_used()))

    await dispatcher.emit_startup(bot=tg)
    sticker = {
        "sticker": {
            "file_id": "s",
            "file_unique_id": "s",
            "type": "regular",
            "width": 1,
            "height": 1,
            "is_animated": False,
            "is_video": False,
        }
    }
    for n, extra in [(1, PHOTO), (2, sticker)]:
        await dispatcher.feed_update(
            tg, Update.model_validate(telegram_payload(n, n, None, **DM, extra=extra))
        )
    await tg.session.close()
    assert handled == [(1, []), (2, [])]


async def test_aiogram_reinforces_what_the_handler_says_it_used_not_every_message(tmp_path: Any) -> None:
    """aiogram's middleware makes the context for every message, answered or not (a group where
    the bot answers only mentions): it reinforced its hits each time."""
    from aiogram import Bot, Dispatcher
    from aiogram.types import Message as TgMessage
    from aiogram.types import Update

    from narrmem.doors.integrations.aiogram import setup

    reinforcing = {"hippocampus": {"reinforce": True}}
    clock = ManualClock(when(1))
    async with open_memory(tmp_path / "m", plugin=reinforcing, clock=clock) as memory:
        tg = Bot("42:TEST", session=aiogram_session([]))
        dispatcher = Dispatcher()
        setup(dispatcher, memory, tenant=TG_TENANT)
        packs: dict[int, Any] = {}

        @dispatcher.message()
        async def answer(message: TgMessage, memory_context: Any) -> None:
            packs[message.message_id] = memory_context

        await dispatcher.emit_startup(bot=tg)
        said = "I keep bees on the roof of our flat in Porto"
        await dispatcher.feed_update(tg, Update.model_validate(telegram_payload(1, 1, said, **DM)))
        clock.advance(days=3)  # past the spacing between two reinforcements
        await dispatcher.feed_update(
            tg,
            Update.model_validate(
                telegram_payload(
                    2, 2, "do you remember the bees I keep on the roof of our flat in Porto?", **DM
                )
            ),
        )
        await tg.session.close()
        [bees] = [r for r in await everything(memory) if "bees on the roof of" in r.text]
        assert bees.id in [hit.id for hit in packs[2].hits]
        assert not [row for row in (await memory.history(bees.id))["events"] if row["who"] == "recall"]
        from narrmem.doors.integrations import _common

        assert bees.id in await _common.mark_used(memory, packs[2])


async def test_discord_a_suggestion_reaches_a_channel_the_cache_does_not_hold(memory: Memory) -> None:
    """After a restart the backlog's messages are made before the servers' channels reach the
    bot's cache (and a DM channel is cached only once a message comes in it): their suggestions
    went nowhere."""
    from narrmem.doors.integrations.discord import say_suggestion

    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    try:
        message = bot.cog.to_message(
            bot.discord.Message(
                state=bot.bot._connection,
                channel=bot.bot.get_partial_messageable(777),
                data=bot._payload(
                    bot._snowflake(1), "hello there", user=ANN, chat=777, group=False, name="Ann"
                ),
            )
        )
        assert message is not None
        channel = bot.cog._channel_of(message)
        assert channel is not None
        event = TriggerEvent(
            kind="topic", label="x", count=3, user_id=str(ANN), chat_id="777", suggestion="again?"
        )
        await say_suggestion(channel, event)
    finally:
        await bot.close()
    assert bot.replies == [("777", "again?")]


async def test_discord_a_message_of_a_server_the_cache_does_not_hold_is_the_servers(memory: Memory) -> None:
    """Without the guilds intent a server message has no ``guild``: it was stored as a direct
    message (the tenant of DMs), its context drew on the person's DMs, and the server's delete
    event missed it."""
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    try:
        await bot.send(1, "I told my therapist about my divorce", user=ANN, chat=ANN, group=False)
        payload = bot._payload(
            bot._snowflake(2),
            "what should I do about my divorce?",
            user=ANN,
            chat=555,
            group=False,
            name="Ann",
        )
        payload["guild_id"] = "999"  # a server not in the cache
        bot.bot._connection.parse_message_create(payload)
        await bot.settle()
        [stored] = [r for r in await everything(memory) if r.chat_id == "555"]
        assert stored.tenant == "999"
        pack = bot.contexts[payload["id"]]
        assert pack is not None and pack.scope == Scope(tenant="999", user_id=str(ANN), chat_id="555")
        assert not [hit for hit in pack.hits if "therapist" in hit.text]
        bot.bot._connection.parse_message_delete(
            {"id": payload["id"], "channel_id": "555", "guild_id": "999"}
        )
        await bot.settle()
        await memory.settle()
        assert not [r for r in await everything(memory) if r.chat_id == "555"]
    finally:
        await bot.close()


async def test_discord_narrmems_messages_ping_no_one(memory: Memory) -> None:
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    sent: list[dict[str, Any]] = []
    request = bot.bot.http.request

    async def recording(route: Any, **kwargs: Any) -> Any:
        if route.method == "POST":
            sent.append(kwargs["json"])
        return await request(route, **kwargs)

    bot.bot.http.request = recording  # type: ignore[method-assign]
    try:
        await bot.send(1, "@everyone the server is moving to Porto next week", user=ANN, chat=9, group=True)
        reply = await bot.command(2, "memory", user=ANN, chat=9, group=True)
        assert "everyone" in reply  # clean_content breaks the mention; the reply allows none either
    finally:
        await bot.close()
    assert sent and all(body.get("allowed_mentions", {}).get("parse") == [] for body in sent)


@pytest.mark.parametrize("guild_as", ["tenant", "chat"])
async def test_discord_a_channel_deleted_while_the_store_is_away_is_forgotten_once_it_answers(
    guild_as: str, memory: Memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deleted thread's forget was dropped (logged) when the store could not be reached, while a
    deleted message's waited in the backlog: the thread's words stayed for good."""
    from narrmem.doors.integrations import backlog

    monkeypatch.setattr(backlog, "RETRY_DELAYS", (0.05,))
    bot = await open_harness("discord.py", memory, guild_as=guild_as)
    assert isinstance(bot, DiscordHarness)
    try:
        await bot.send(1, "my locker code at the gym is 4417", user=ANN, chat=77, group=True)
        await bot.send(2, "my bank PIN is on a sticky note", user=ANN, chat=78, group=True)
        await memory.settle()
        saved = memory.forget, memory.forget_messages, memory.store.recent

        async def away(*args: Any, **kwargs: Any) -> Any:
            raise StoreUnavailableError("PostgreSQL restarting")

        monkeypatch.setattr(memory, "forget", away)
        monkeypatch.setattr(memory, "forget_messages", away)
        monkeypatch.setattr(memory.store, "recent", away)
        bot.bot._connection.parse_thread_delete(
            {"id": "77", "guild_id": str(GUILD_ID), "parent_id": "7", "type": 11}
        )
        await bot.delete([2], chat=78, group=True)
        await bot.settle()
        assert [w.kind for w in backlog.backlog_of(memory)._waiting] == [
            "forget of a chat",
            "forget of deleted messages",
        ]
        monkeypatch.setattr(memory, "forget", saved[0])
        monkeypatch.setattr(memory, "forget_messages", saved[1])
        monkeypatch.setattr(memory.store, "recent", saved[2])
        await asyncio.wait_for(backlog.backlog_of(memory).drained(), 30)
        await memory.settle()
        assert [r.text for r in await everything(memory)] == []
    finally:
        await bot.close()


async def test_history_imported_as_the_bot_is_in_the_live_bots_context(memory: Memory) -> None:
    """``import-chat --as-bot``: the group's history is recalled for a live message of the same
    person in the same group (imported under its own ids it never was)."""
    from pathlib import Path

    from narrmem.doors.chat_import import read_chat

    export = Path(__file__).parent / "data" / "chat_exports" / "telegram_result.json"
    batch = read_chat(export, "telegram", tenant=TG_TENANT, as_bot=True)
    await memory.ingest_many(batch.messages)
    bot = await open_harness("aiogram", memory)
    try:
        carla = int(next(m.user_id for m in batch.messages if "Carla" in m.text))
        await bot.send(
            900,
            "what should I bring for my bee sting allergy on the hike?",
            user=carla,
            chat=-1001765432109,
            group=True,
            name="Carla",
        )
    finally:
        await bot.close()
    pack = bot.contexts["900"]
    assert pack is not None and any("allergic to bee stings" in hit.text for hit in pack.hits)


async def test_a_suggestion_waiting_to_be_sent_is_dropped_by_a_forget_of_the_person(memory: Memory) -> None:
    """Sent by a task of its own, a suggestion waiting behind its chat's earlier send (a rate
    limit) went out after the person's forgetme had deleted what it was about."""
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    gate = asyncio.Event()
    said: list[str] = []
    routes = bot.cog.triggers

    async def rate_limited(channel: Any, event: TriggerEvent) -> None:
        if event.user_id == str(BOB):
            await gate.wait()  # the chat's first send waits out a rate limit
        said.append(event.user_id)

    routes._on_trigger = rate_limited
    try:
        for n, who in enumerate([BOB, ANN]):
            await say_for(routes, who, n)
        await asyncio.sleep(0.05)
        await memory.forget(user_id=str(ANN), tenant=str(GUILD_ID))
        gate.set()
        await routes.sent()
    finally:
        await bot.close()
    assert said == [str(BOB)]


async def test_a_waiting_suggestion_is_measured_from_when_its_message_was_said(tmp_path: Any) -> None:
    """A forget at the very time the event was made (a clock that has not moved), or one replayed
    from a bot's backlog and dated when it was asked, let a waiting suggestion through."""
    clock = ManualClock(when(5))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        bot = await open_harness("discord.py", memory, guild_as="tenant")
        assert isinstance(bot, DiscordHarness)
        routes = bot.cog.triggers
        gate = asyncio.Event()
        said: list[str] = []

        async def rate_limited(channel: Any, event: TriggerEvent) -> None:
            if event.user_id == str(BOB):
                await gate.wait()
            said.append(event.user_id)

        routes._on_trigger = rate_limited
        try:
            for n, who in enumerate([BOB, ANN]):
                await say_for(routes, who, n)
            await asyncio.sleep(0.05)
            await memory.forget(user_id=str(ANN), tenant=str(GUILD_ID))  # at the clock's same now
            gate.set()
            await routes.sent()
        finally:
            await bot.close()
    assert said == [str(BOB)]


async def test_closing_the_memory_ends_the_suggestions_being_sent(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send under way when the memory closes gets a while to end, then is cancelled: it went on
    after the close and asked the closed memory about forgets (an error logged for each)."""
    from narrmem.doors.integrations import _common as common

    monkeypatch.setattr(common, "CLOSE_WAIT_S", 0.2)
    memory = await open_memory(tmp_path / "m")
    bot = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(bot, DiscordHarness)
    routes = bot.cog.triggers
    ended: list[str] = []

    async def send(channel: Any, event: TriggerEvent) -> None:
        try:
            if event.user_id == str(BOB):
                await asyncio.sleep(3600)  # a send that never ends
        finally:
            ended.append(event.user_id)

    routes._on_trigger = send
    try:
        for n, who in enumerate([ANN, BOB]):
            await say_for(routes, who, n, chat=f"c{n}")
        await asyncio.sleep(0.05)
        await asyncio.wait_for(memory.close(), 5)
    finally:
        await bot.close()
    assert sorted(ended) == sorted([str(ANN), str(BOB)]) and not routes._sending
