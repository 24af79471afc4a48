"""Telegram and Discord updates that are not a person's own words in the bot's chat with them, on
the real libraries (the harnesses of ``test_integrations``): a business account's chat and a chat
the bot was summoned to as a guest, a message sent via an inline bot, a command to any bot, a
person posting as a channel, and a trigger suggestion in a forum topic."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from test_integrations import (
    ANN,
    BOB,
    GROUP,
    GUILD_ID,
    OTHER_GROUP,
    PHOTO,
    ROADMAP,
    AiogramHarness,
    DiscordHarness,
    TelegramHarness,
    episodes,
    everything,
    open_harness,
    telegram_payload,
)

from narrmem import ContextPack, InputError, ManualClock, Memory, StoreUnavailableError
from narrmem.doors.integrations import _common
from narrmem.doors.integrations.backlog import backlog_of
from narrmem.testing import open_memory

TELEGRAM = ["aiogram", "python-telegram-bot"]
CAROL = 1003
DM = {"user": ANN, "chat": ANN, "group": False, "name": "Ann"}
IN_GROUP = {"user": ANN, "chat": GROUP, "group": True, "name": "Ann"}


async def telegram_harness(library: str, memory: Memory, **options: Any) -> TelegramHarness:
    harness = await open_harness(library, memory, **options)
    assert isinstance(harness, TelegramHarness)
    return harness


def texts(records: list[Any]) -> list[str]:
    return [record.text for record in records if record.kind == "episode"]


# --- a chat that is not the bot's: a business account's, or one the bot is a guest in ---------


def business_update(update_id: int, n: int, text: str) -> dict[str, Any]:
    """Ann writes to a shop's business account, which this bot answers for (Business Mode): the
    chat's id is Ann's, as is that of the bot's own chat with her."""
    payload = telegram_payload(update_id, n, text, **DM)
    return {
        "update_id": update_id,
        "business_message": dict(payload["message"], business_connection_id="shop"),
    }


def guest_update(update_id: int, n: int, text: str) -> dict[str, Any]:
    """Ann summons the bot in her private chat with Carol, which the bot is no member of."""
    message = telegram_payload(update_id, n, text, **DM)["message"]
    message["chat"] = {"id": CAROL, "type": "private", "first_name": "Carol"}
    return {"update_id": update_id, "guest_message": dict(message, guest_query_id="q1")}


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_a_business_or_guest_chat_gets_nothing_of_the_bots_direct_chat(
    library: str, memory: Memory
) -> None:
    """A business account's chat and a chat the bot is summoned to as a guest are private chats,
    yet not the bot's: their answers are read by the shop's owner or by Carol. They were taken
    for the bot's direct chat, and the context put what Ann told the bot in private into them."""
    harness = await telegram_harness(library, memory)
    try:
        if isinstance(harness, AiogramHarness):
            from aiogram.types import Message as TgMessage

            contexts, middleware = harness.contexts, harness.middleware

            async def answer(message: TgMessage) -> None:  # the bot's own handler of these updates
                contexts[str(message.message_id)] = await middleware.context(message)

            harness.dispatcher.business_message.register(answer)
            harness.dispatcher.guest_message.register(answer)
        await harness.feed(telegram_payload(1, 1, "my locker code at the gym is 4417", **DM))
        await memory.settle()
        await harness.feed(business_update(2, 500, "what is my locker code at the gym?"))
        await harness.feed(guest_update(3, 600, "@test_bot what was my locker code at the gym?"))
        await memory.settle()
        assert set(harness.contexts) >= {"500", "600"}  # the bot's handler answered both
        assert harness.contexts["500"] is None
        assert harness.contexts["600"] is None
        assert texts(await everything(memory)) == ["my locker code at the gym is 4417"]
    finally:
        await harness.close()


# --- a message sent via an inline bot ------------------------------------------------------------


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_a_message_sent_via_an_inline_bot_is_not_remembered(
    library: str, memory: Memory
) -> None:
    """An inline bot's result is that bot's words (this bot's own, too), sent by the person: it was
    stored as what they said, and an edit of it stored it again. The answer to it still gets the
    sender's context, as a forward's does."""
    harness = await telegram_harness(library, memory)
    wiki = {"via_bot": {"id": 777, "is_bot": True, "first_name": "Wiki", "username": "wiki"}}
    itself = {"via_bot": {"id": 42, "is_bot": True, "first_name": "Bot", "username": "test_bot"}}
    try:
        await harness.feed(telegram_payload(1, 1, "I moved to Porto last spring", **IN_GROUP))
        wiki_text = "Barack Obama served as the 44th president; he was born in Honolulu"
        await harness.feed(telegram_payload(2, 2, wiki_text, **IN_GROUP, extra=wiki))
        horoscope = "I decided to move to Lisbon: your horoscope for today, Aries"
        await harness.feed(telegram_payload(3, 3, horoscope, **IN_GROUP, extra=itself))
        edited = "Barack Obama was born in Honolulu, Hawaii, and studied law at Harvard"
        await harness.feed(telegram_payload(4, 2, edited, **IN_GROUP, extra=wiki, edited=True))
        await memory.settle()
        assert texts(await everything(memory)) == ["I moved to Porto last spring"]
        for n in ("2", "3"):
            pack = harness.contexts[n]
            assert isinstance(pack, ContextPack) and pack.scope.user_id == str(ANN)
    finally:
        await harness.close()


# --- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_a_command_to_any_bot_is_not_remembered(library: str, memory: Memory) -> None:
    """Every command but narrmem's own was stored as what the person said: ``/start`` with a
    deep link's token, ``/help``, the bot's own commands and another bot's (``/start@other_bot``).
    A message that begins with a command is not; one that only mentions a command is; and a message
    edited into any command takes back what it said."""
    harness = await telegram_harness(library, memory)
    try:
        await harness.send(1, "my locker code at the gym is 4417", **DM)
        commands = [
            "/start",
            "/start c2hvcC1yZWY",
            "/help",
            "/settings language Portuguese",
            "/remind me tomorrow 9am to call my mother about her surgery",
            "/start@other_bot",
        ]
        for n, command in enumerate(commands, start=2):
            await harness.send(n, command, **DM)
        caption = {**PHOTO, "caption": "/setavatar my new profile photo from Porto"}
        caption["caption_entities"] = [{"type": "bot_command", "offset": 0, "length": 10}]
        await harness.feed(telegram_payload(20, 20, None, **DM, extra=caption))
        mention = {"entities": [{"type": "bot_command", "offset": 18, "length": 6}]}
        await harness.feed(
            telegram_payload(21, 21, "I always forget the /start command", **DM, extra=mention)
        )
        await harness.edit(1, "/remind me to change my locker code", **DM)
        await memory.settle()
        assert texts(await everything(memory)) == ["I always forget the /start command"]
        # The answer to a command still has the person's context.
        assert isinstance(harness.contexts["6"], ContextPack)
    finally:
        await harness.close()


async def test_discord_a_message_invoking_any_of_the_bots_commands_is_not_remembered(memory: Memory) -> None:
    """``!help`` and the bot's own prefix commands were stored as what the person said. A message
    that invokes a command of the bot is not (asked of discord.py, whatever the bot's prefixes); one
    that invokes none is the person's words; an edit into a command takes back what it said."""
    harness = await open_harness("discord.py", memory, guild_as="tenant")
    assert isinstance(harness, DiscordHarness)
    reminded: list[str] = []

    @harness.bot.command(name="remind")
    async def remind(ctx: Any, *, what: str) -> None:  # a command of the bot author's
        reminded.append(what)

    place = {"user": ANN, "chat": 7, "group": True}
    try:
        await harness.send(1, "my locker code at the gym is 4417", **place)
        await harness.send(2, "!help", **place)
        await harness.send(3, "!remind me tomorrow 9am to call my mother about her surgery", **place)
        await harness.send(4, "!memroy please", **place)  # no such command: said
        await harness.edit(1, "!remind me to change my locker code", **place)
        await memory.settle()
        # The bot ran its command (an edit runs none: discord.py's own rule).
        assert reminded == ["me tomorrow 9am to call my mother about her surgery"]
        assert texts(await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))) == ["!memroy please"]
    finally:
        await harness.close()


# --- a person posting as a channel -----------------------------------------------------------------


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_forgetme_and_memory_are_refused_to_a_channel_identity(
    library: str, memory: Memory
) -> None:
    """Several admins of a channel post in a group as that channel, one sender: one admin's
    ``/memory`` showed what the others posted as it, and a ``/forgetme`` took it all."""
    harness = await telegram_harness(library, memory)
    as_channel = {"sender_chat": {"id": -1009999, "type": "channel", "title": "Team News"}}
    # Telegram's placeholder sender of a message sent on behalf of a chat.
    placeholder = {"user": 136817688, "chat": GROUP, "group": True, "name": "Channel", "bot": True}
    try:
        said = ["I decided to leave the company next spring", "my daughter starts school in Lisbon"]
        for n, text in enumerate(said, start=1):
            await harness.feed(telegram_payload(n, n, text, **placeholder, extra=as_channel))
        await memory.settle()
        assert texts(await everything(memory)) == said
        before = len(harness.replies)
        await harness.feed(telegram_payload(3, 3, "/memory", **placeholder, extra=as_channel))
        await harness.feed(telegram_payload(4, 4, "/forgetme", **placeholder, extra=as_channel))
        await memory.settle()
        assert texts(await everything(memory)) == said
        assert [text for _, text in harness.replies[before:]] == [_common.AS_A_CHANNEL_REPLY] * 2
    finally:
        await harness.close()


# --- a trigger suggestion in a forum topic ---------------------------------------------------------


def in_topic(payload: dict[str, Any], topic: int | None, *, forum: bool) -> dict[str, Any]:
    """``payload``'s message written in forum topic ``topic`` (or, not a forum, in the thread of
    replies ``topic``: Telegram numbers it too, and a send there is not a topic's)."""
    message = payload["message"]
    message["chat"]["is_forum"] = forum
    if topic is not None:
        message["message_thread_id"] = topic
        if forum:
            message["is_topic_message"] = True
    return payload


def say_suggestion_of(library: str) -> Any:
    if library == "aiogram":
        from narrmem.integrations.aiogram import say_suggestion
    else:
        from narrmem.integrations.telegram import say_suggestion
    return say_suggestion


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_a_suggestion_is_said_in_the_forum_topic_it_came_up_in(
    library: str, memory: Memory
) -> None:
    """``say_suggestion`` sent only the chat's id: a pattern that came up in a forum topic was
    answered in the General topic. A thread of replies in a group that is not a forum is no topic."""
    harness = await telegram_harness(library, memory, on_trigger=say_suggestion_of(library))
    bob = {"user": BOB, "chat": OTHER_GROUP, "group": True, "name": "Bob"}
    try:
        for n, text in enumerate(ROADMAP, start=1):
            await harness.feed(in_topic(telegram_payload(n, 100 + n, text, **IN_GROUP), 77, forum=True))
            await harness.settle()
        for n, text in enumerate(ROADMAP, start=4):
            await harness.feed(in_topic(telegram_payload(n, 200 + n, text, **bob), 5, forum=False))
            await harness.settle()
        said = [(p["chat_id"], p.get("message_thread_id")) for p in harness.sent]
        assert said == [(GROUP, 77), (OTHER_GROUP, None)]
        assert all("3rd time" in p["text"] for p in harness.sent)
    finally:
        await harness.close()


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_a_suggestion_made_at_the_next_start_is_said_in_its_topic(
    library: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message that brings a topic up a third time waits for the store when the bot stops;
    the next start makes it, and says its suggestion in the forum topic it was written in."""
    clock = ManualClock(datetime.now(UTC))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        harness = await telegram_harness(library, memory, on_trigger=say_suggestion_of(library))
        try:
            for n, text in enumerate(ROADMAP[:2], start=1):
                await harness.feed(in_topic(telegram_payload(n, n, text, **IN_GROUP), 77, forum=True))
            ingest = memory.ingest

            async def away(message: Any, *args: Any, **kwargs: Any) -> Any:
                raise StoreUnavailableError("the database went away")

            monkeypatch.setattr(memory, "ingest", away)
            await harness.feed(in_topic(telegram_payload(3, 3, ROADMAP[2], **IN_GROUP), 77, forum=True))
            await harness.settle()
            assert len(backlog_of(memory)) == 1 and harness.sent == []
        finally:
            await harness.close()
        monkeypatch.setattr(memory, "ingest", ingest)
    async with open_memory(tmp_path / "m", clock=clock) as again:
        harness = await telegram_harness(library, again, on_trigger=say_suggestion_of(library))
        try:
            await asyncio.wait_for(backlog_of(again).drained(), 30)
            await again.settle()
            await harness.settle()
        finally:
            await harness.close()
    [suggestion] = harness.sent
    assert (suggestion["chat_id"], suggestion.get("message_thread_id")) == (GROUP, 77)
    assert "3rd time" in suggestion["text"]


@pytest.mark.parametrize("library", TELEGRAM)
async def test_telegram_the_words_after_a_command_named_remembered_are_the_persons(
    library: str, memory: Memory
) -> None:
    """A group bot with privacy mode on is sent commands, replies and mentions only: its people
    talk to it with ``/ask ...``. The words after a command the author names are remembered,
    without the command; any other command still is not."""
    harness = await telegram_harness(library, memory, remembered_commands={"ask", "Note"})
    group = {"user": ANN, "chat": GROUP, "group": True}
    try:
        await harness.send(1, "/ask should I take the job offer in Porto next spring?", **group)
        await harness.send(2, "/note@test_bot my daughter starts school in September", **group)
        await harness.send(3, "/ask", **group)  # nothing said
        await harness.send(4, "/start c2hvcC1yZWY", **group)
        await harness.send(5, "/memory", **group)
        await harness.send(6, "/ask@other_bot my sister lives in Oslo now", **group)  # another bot's
        await harness.edit(1, "/ask should I take the job offer in Lisbon next spring?", **group)
        await memory.settle()
        assert sorted(texts(await everything(memory))) == [
            "my daughter starts school in September",
            "should I take the job offer in Lisbon next spring?",
        ]
    finally:
        await harness.close()


async def test_discord_the_words_after_a_command_named_remembered_are_the_persons(memory: Memory) -> None:
    harness = await open_harness("discord.py", memory, guild_as="tenant", remembered_commands=["ask"])
    assert isinstance(harness, DiscordHarness)

    @harness.bot.command(name="ask")
    async def ask(ctx: Any, *, question: str) -> None:  # the bot author's own command
        return None

    @harness.bot.command(name="remind")
    async def remind(ctx: Any, *, what: str) -> None:
        return None

    place = {"user": ANN, "chat": 7, "group": True}
    try:
        await harness.send(1, "!ask should I adopt the greyhound from the shelter?", **place)
        await harness.send(2, "!remind me to call the shelter tomorrow", **place)
        await memory.settle()
        assert texts(await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))) == [
            "should I adopt the greyhound from the shelter?"
        ]
    finally:
        await harness.close()


async def test_a_remembered_command_is_named_as_a_word(memory: Memory) -> None:
    for wrong in ("/ask", ["!ask"], "ask", ["two words"], [""]):
        with pytest.raises(InputError) as raised:
            _common.TurnOptions[Any](remembered_commands=wrong)
        assert raised.value.field == "remembered_commands"
