"""A forget against ingest calls still on their way to their write (triage, before-store hooks,
the embedding): what a call holds of the forget's scope is never written, a message sent after the
forget began is; an edit that arrives while its original is on its way wins; a caller that gives
up does not cut an edit or a message's hooks short; and one plugin failing to scrub does not stop
the others, nor the next open."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _helpers import forget_begun, msg

from narrmem import hookimpl
from narrmem.errors import PluginError
from narrmem.memory import Memory
from narrmem.models import MemoryRecord, Message
from narrmem.testing import open_memory

MODES = ["after_hooks", "after_write", "on_receipt"]
WAIT = 10.0


class HeldTriage:
    """Holds the call of a message whose text has ``word`` in triage until released (a slow
    triage plugin, or a busy loop), then lets the built-in triage decide."""

    narrmem_name = "held_triage"

    def __init__(self, word: str) -> None:
        self.word = word
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @hookimpl
    async def narrmem_triage(self, message: Message) -> None:
        if self.word in message.text:
            self.entered.set()
            await self.release.wait()


class Facts:
    narrmem_name = "facts"

    @hookimpl
    async def narrmem_extract_facts(self, message: Message) -> list[dict[str, str]]:
        return [{"relation": "works_at", "object": "Acme Bank"}] if "Acme" in message.text else []


def ann(message_id: str, text: str, chat: str = "dm") -> dict[str, Any]:
    return msg(message_id, text, user="ann", chat=chat, tenant="t", speaker="Ann")


async def everything(memory: Memory) -> list[MemoryRecord]:
    return [record async for record, _ in memory.store.export()]


async def held_while(memory: Memory, held: HeldTriage, message: dict[str, Any]) -> asyncio.Future[Any]:
    call = asyncio.ensure_future(memory.ingest(message))
    await asyncio.wait_for(held.entered.wait(), WAIT)
    return call


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_users_forget_drops_her_message_still_on_its_way(tmp_path: Path, acknowledge: str) -> None:
    held = HeldTriage("Acme")
    plugins = [held, Facts()]
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=plugins) as memory:
        await memory.ingest(
            msg("b1", "Bob here, I moved to Lisbon last spring", user="bob", chat="dm", tenant="t")
        )
        call = await held_while(memory, held, ann("1", "I work at Acme Bank and I am leaving my wife."))
        counts = await asyncio.wait_for(memory.forget(user_id="ann", tenant="t"), WAIT)
        held.release.set()
        result = await asyncio.wait_for(call, WAIT)
        await memory.settle()
        assert counts["memories"] == 0
        assert not result.stored and "forgotten before it was written" in result.reason
        assert [r.user_id for r in await everything(memory)] == ["bob"]
        assert (await memory.stats())["graph"]["nodes"] == 0
        # Sent again after the forget, it is a new message and is kept.
        again = await memory.ingest(ann("1", "I work at Acme Bank and I am leaving my wife."))
        await memory.settle()
        assert again.stored or not again.written


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_deleted_message_still_on_its_way_is_never_stored(tmp_path: Path, acknowledge: str) -> None:
    held = HeldTriage("password")
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[held]) as memory:
        others = asyncio.ensure_future(memory.ingest(ann("0", "I adopted a greyhound named Pixel.")))
        call = await held_while(memory, held, ann("1", "oops my password is hunter2, I decided to share it"))
        counts = await memory.forget_messages(chat_id="dm", message_ids=["1"], tenant="t")
        held.release.set()
        result = await asyncio.wait_for(call, WAIT)
        await asyncio.wait_for(others, WAIT)
        await memory.settle()
        assert counts == {"memories": 0}
        assert not result.stored
        assert [r.message_ids for r in await everything(memory)] == [["0"]]
        hits = await memory.recall("password hunter2", user_id="ann", tenant="t", reinforce=False)
        assert hits == []


class HeldBeforeStore:
    """Holds each message whose text has one of the words past triage and its duplicate check,
    before its write (a before-store hook that calls a service, or a long embedding)."""

    narrmem_name = "held_before_store"

    def __init__(self, *words: str) -> None:
        self.entered = {word: asyncio.Event() for word in words}
        self.release = {word: asyncio.Event() for word in words}

    @hookimpl
    async def narrmem_before_store(self, message: Message) -> None:
        for word, entered in self.entered.items():
            if word in message.text:
                entered.set()
                await self.release[word].wait()


@pytest.mark.parametrize("acknowledge", ["after_hooks", "after_write"])
async def test_an_edit_while_its_original_is_on_its_way_keeps_the_edited_text(
    tmp_path: Path, acknowledge: str
) -> None:
    """The original is past its duplicate check when the edit comes, and the edit's new text past
    its own when the original is written: the edit was a duplicate, and the old text stayed."""
    held = HeldBeforeStore("Monday", "Tuesday")
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[held]) as memory:
        call = asyncio.ensure_future(memory.ingest(ann("1", "I decided the bank meeting is on Monday at 10")))
        await asyncio.wait_for(held.entered["Monday"].wait(), WAIT)
        edited = asyncio.ensure_future(
            memory.edit(ann("1", "I decided the bank meeting is on Tuesday at 10"))
        )
        await asyncio.wait_for(held.entered["Tuesday"].wait(), WAIT)
        held.release["Monday"].set()
        original = await asyncio.wait_for(call, WAIT)
        held.release["Tuesday"].set()
        edit = await asyncio.wait_for(edited, WAIT)
        await memory.settle()
        assert not original.stored and edit.stored
        assert [r.text for r in await everything(memory)] == [
            "I decided the bank meeting is on Tuesday at 10"
        ]


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_message_begun_after_the_forget_is_kept(tmp_path: Path, acknowledge: str) -> None:
    held = HeldTriage("Acme")
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[held]) as memory:
        await memory.ingest(ann("0", "I adopted a greyhound named Pixel."))
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(forget_begun(memory), WAIT)
        call = asyncio.ensure_future(memory.ingest(ann("1", "I decided to join Acme Bank next month.")))
        await asyncio.wait_for(held.entered.wait(), WAIT)
        await asyncio.wait_for(forget, WAIT)
        held.release.set()
        await asyncio.wait_for(call, WAIT)
        await memory.settle()
        assert [r.message_ids for r in await everything(memory)] == [["1"]]


class SlowFacts:
    narrmem_name = "slow_facts"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    @hookimpl
    async def narrmem_extract_facts(self, message: Message) -> list[dict[str, str]]:
        self.started.set()
        await asyncio.sleep(0.2)
        return [{"relation": "works_at", "object": "Globex Corp"}]


async def test_a_caller_that_gives_up_leaves_the_hooks_of_its_written_message_running(tmp_path: Path) -> None:
    facts = SlowFacts()
    async with open_memory(tmp_path / "m", plugins=[facts]) as memory:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(memory.ingest(ann("1", "I work at Globex Corp now")), 0.1)
        assert facts.started.is_set()
        await asyncio.sleep(0.3)
        await memory.settle()
        context = await memory.turn_context("where do I work?", user_id="ann", chat_id="dm", tenant="t")
        assert [f["object"] for f in context["facts"]] == ["Globex Corp"]


async def test_an_edit_whose_caller_gives_up_still_replaces_the_text(tmp_path: Path) -> None:
    held = HeldTriage("Tuesday")
    async with open_memory(tmp_path / "m", plugins=[held]) as memory:
        await memory.ingest(ann("1", "I decided the bank meeting is on Monday at 10"))
        edit = asyncio.ensure_future(memory.edit(ann("1", "I decided the bank meeting is on Tuesday at 10")))
        await asyncio.wait_for(held.entered.wait(), WAIT)  # the old text is forgotten by now
        edit.cancel()
        held.release.set()
        await asyncio.sleep(0.1)
        await memory.settle()
        assert [r.text for r in await everything(memory)] == [
            "I decided the bank meeting is on Tuesday at 10"
        ]


class DownService:
    """A plugin that mirrors memories to a service of its own, which is down."""

    narrmem_name = "crm_sync"

    def __init__(self) -> None:
        self.down = True

    @hookimpl
    async def narrmem_after_forget(self) -> None:
        if self.down:
            raise ConnectionError("CRM unreachable")


async def test_a_plugin_that_fails_to_scrub_stops_neither_the_others_nor_the_next_open(
    tmp_path: Path,
) -> None:
    service = DownService()
    async with open_memory(tmp_path / "m", plugins=[service, Facts()]) as memory:
        await memory.ingest(ann("1", "I work at Acme Bank as a teller"))
        await memory.settle()
        with pytest.raises(PluginError, match=r"crm_sync.*CRM unreachable.*next open"):
            await memory.forget(user_id="ann", tenant="t")
        assert await everything(memory) == []
        # The graph scrubbed its facts though the service's plugin ran first and failed.
        assert (await memory.stats())["graph"]["nodes"] == 0
        assert len(await memory.store.pending_forgets()) == 1
    async with open_memory(tmp_path / "m", plugins=[service, Facts()]) as memory:
        assert len(await memory.store.pending_forgets()) == 1  # opened all the same, still owed
    service.down = False
    async with open_memory(tmp_path / "m", plugins=[service, Facts()]) as memory:
        assert await memory.store.pending_forgets() == []
