"""A Telegram group upgraded to a supergroup (more than 200 members, a public link, some settings)
goes on under a new chat id. Before, the bot's context in the group and its ``/memory`` there read
the new id alone: everything said in the group before the upgrade was out of reach, as if the bot
had forgotten the group. Now the move (Telegram's service message in either chat) is noted in the
store, and the new chat is read with the chats it was, by every worker and after a restart."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from test_integrations import ANN, TG_TENANT, open_harness, telegram_payload

from narrmem import Memory, PluginError, hookimpl
from narrmem.doors.integrations import _common

OLD, NEW = -4001, -1009001
SAID = [
    "my sister Lucia moved to Porto, she teaches violin at the conservatory",
    "I adopted a greyhound named Pixel from the shelter last spring",
]


def service(update_id: int, n: int, chat: int, kind: str, **moved: int) -> dict[str, Any]:
    payload = telegram_payload(
        update_id, n, None, user=ANN, chat=chat, group=True, name="Ann Lee", extra=moved
    )
    payload["message"]["chat"]["type"] = kind
    return payload


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
@pytest.mark.parametrize("told_in", ["old", "new"])
async def test_a_group_that_became_a_supergroup_is_read_with_what_it_said_before(
    library: str, told_in: str, memory: Memory
) -> None:
    bot = await open_harness(library, memory)
    try:
        for n, text in enumerate(SAID, start=1):
            await bot.send(n, text, user=ANN, chat=OLD, group=True)
        # Telegram tells the move in both chats; either is enough.
        if told_in == "old":
            await bot.feed(service(100, 10, OLD, "group", migrate_to_chat_id=NEW))  # type: ignore[attr-defined]
        else:
            await bot.feed(service(100, 1, NEW, "supergroup", migrate_from_chat_id=OLD))  # type: ignore[attr-defined]
        await bot.send(1, "where does my sister Lucia live these days?", user=ANN, chat=NEW, group=True)
        pack = bot.contexts["1"]
        assert pack is not None and any("Lucia" in hit.text for hit in pack.hits)
        assert {hit.chat_id for hit in pack.hits} == {str(OLD)}
        # The supergroup numbers its messages anew: its message 2 hides nothing of the group's.
        await bot.send(2, "how is Pixel the greyhound doing?", user=ANN, chat=NEW, group=True)
        pack = bot.contexts["2"]
        assert pack is not None and any("Pixel" in hit.text for hit in pack.hits)
        reply = await bot.command(3, "memory", user=ANN, chat=NEW, group=True)
        assert "Lucia" in reply and "Pixel" in reply
    finally:
        await bot.close()
    assert await _common.earlier_chats(memory, TG_TENANT, str(NEW)) == [str(OLD)]


async def test_a_move_told_twice_is_noted_once_and_chains_are_followed(memory: Memory) -> None:
    for _ in range(2):
        await _common.chat_moved(memory, tenant="t", from_chat="a", to_chat="b")
    await _common.chat_moved(memory, tenant="t", from_chat="b", to_chat="c")
    await _common.chat_moved(memory, tenant="t", from_chat="c", to_chat="c")
    assert await _common.earlier_chats(memory, "t", "b") == ["a"]
    assert await _common.earlier_chats(memory, "t", "c") == ["b", "a"]
    assert await _common.earlier_chats(memory, "other", "c") == []


@pytest.mark.parametrize("library", ["aiogram", "python-telegram-bot"])
async def test_a_move_not_as_telegram_tells_it_is_left(library: str, memory: Memory) -> None:
    bot = await open_harness(library, memory)
    try:
        # A supergroup "moving" to another, and a group claiming to come from a supergroup.
        await bot.feed(service(100, 10, NEW, "supergroup", migrate_to_chat_id=-1007777))  # type: ignore[attr-defined]
        await bot.feed(service(101, 11, OLD, "group", migrate_from_chat_id=-1008888))  # type: ignore[attr-defined]
    finally:
        await bot.close()
    assert await _common.earlier_chats(memory, TG_TENANT, "-1007777") == []
    assert await _common.earlier_chats(memory, TG_TENANT, str(OLD)) == []


async def test_a_chats_forget_takes_the_chats_it_was_and_the_note(memory: Memory) -> None:
    from narrmem import Scope
    from narrmem.chat_moves import MOVED

    for n, text in enumerate(SAID, start=1):
        await memory.ingest(
            {
                "text": text,
                "user_id": str(ANN),
                "chat_id": str(OLD),
                "tenant": TG_TENANT,
                "message_id": str(n),
                "ts": "2026-05-01T10:00:00+00:00",
            }
        )
    await memory.ingest(
        {
            "text": "the supergroup's first plan: a picnic by the river",
            "user_id": str(ANN),
            "chat_id": str(NEW),
            "tenant": TG_TENANT,
            "message_id": "1",
            "ts": "2026-05-02T10:00:00+00:00",
        }
    )
    await _common.chat_moved(memory, tenant=TG_TENANT, from_chat=str(OLD), to_chat=str(NEW))
    counts = await memory.forget(chat_id=str(NEW), tenant=TG_TENANT)
    assert counts["memories"] >= 3
    for chat in (OLD, NEW):
        assert await memory.store.recent(Scope(tenant=TG_TENANT, chat_id=str(chat)), limit=10) == []
    assert await memory.store.state_items(MOVED) == []


class FailsOnTheNewChat:
    narrmem_name = "fails_on_the_new_chat"

    @hookimpl(tryfirst=True)
    def narrmem_after_forget(self, chat_id: str | None) -> None:
        if chat_id == "new":
            raise RuntimeError("scrub service down")


class SlowOnTheNewChat:
    narrmem_name = "slow_on_the_new_chat"

    @hookimpl(tryfirst=True)
    async def narrmem_after_forget(self, chat_id: str | None) -> None:
        if chat_id == "new":
            await asyncio.sleep(0.3)


async def _seeded(memory: Memory) -> None:
    from _helpers import msg

    await memory.ingest(msg("1", "my locker code is zqold77 at the gym", user="ann", chat="old"))
    await memory.ingest(msg("1", "hello everyone in the supergroup", user="ann", chat="new"))
    await _common.chat_moved(memory, tenant="default", from_chat="old", to_chat="new")


@pytest.mark.parametrize("stop", ["a plugin fails", "the caller gives up"])
async def test_a_chats_forget_that_stops_midway_still_takes_the_chats_it_was(
    stop: str, tmp_path: Path
) -> None:
    from narrmem import Scope
    from narrmem.testing import open_memory

    plugin = FailsOnTheNewChat() if stop == "a plugin fails" else SlowOnTheNewChat()
    async with open_memory(tmp_path / "m", plugins=[plugin]) as memory:
        await _seeded(memory)
        with contextlib.suppress(PluginError, TimeoutError):
            await asyncio.wait_for(memory.forget(chat_id="new"), 0.1 if stop != "a plugin fails" else 10)
        await memory.settle()
        assert await memory.store.recent(Scope(chat_id="old"), limit=10) == []


async def test_a_forgotten_chats_id_leaves_the_note_of_the_chat_it_became(memory: Memory) -> None:
    await _seeded(memory)
    await memory.forget(chat_id="old")
    assert await _common.earlier_chats(memory, "default", "new") == []
