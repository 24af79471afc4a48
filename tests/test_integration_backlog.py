"""A bot's messages, edits and deletions while its PostgreSQL cannot be reached wait and are made,
in order, once it answers: before, each was logged and dropped, so a chat's messages of an outage
were never remembered, and a message deleted during it stayed stored for good (its forget failed
and nobody asked again). A real discord.py bot (real ``discord.Message`` objects from gateway
payloads) on a real server behind a proxy that cuts it; the order and room rules with plain calls."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from _pgproxy import behind_proxy
from test_integrations import ANN, BOB, GUILD_ID, LIBRARIES, ROADMAP, DiscordHarness, episodes, open_harness

from narrmem import ManualClock, Message, Scope, StoreUnavailableError, TriggerEvent
from narrmem.doors.integrations import backlog as backlog_module
from narrmem.doors.integrations import spool as spool_module
from narrmem.doors.integrations._common import TriggerRoutes
from narrmem.doors.integrations.backlog import MAX_WAITING, Backlog, backlog_of
from narrmem.errors import ClosedError
from narrmem.settling import MAX_UNSETTLED
from narrmem.testing import open_memory


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog_module, "RETRY_DELAYS", (0.05, 0.1))
    monkeypatch.setattr(backlog_module, "RETRY_EVERY", 0.2)


async def test_a_bots_messages_edits_and_deletions_during_an_outage_are_made_once_it_is_back(
    tmp_path: Any,
) -> None:
    async with behind_proxy(tmp_path, timeout_s=2.0) as (memory, proxy):
        bot = await open_harness("discord.py", memory, guild_as="tenant")
        assert isinstance(bot, DiscordHarness)
        try:
            await bot.send(11, "I play the violin in an orchestra", user=ANN, chat=7, group=True)
            proxy.cut()
            await bot.send(12, "I moved to Lisbon in March", user=ANN, chat=7, group=True)
            await bot.send(13, "My bank card PIN is written on a note", user=ANN, chat=7, group=True)
            await bot.edit(12, "I moved to Porto in March", user=ANN, chat=7, group=True)
            await bot.delete([13], chat=7, group=True)  # the person took it back during the outage
            backlog = backlog_of(memory)
            assert len(backlog) == 4
            await bot.send(14, "I adopted a cat called Miso", user=ANN, chat=7, group=True)
            assert len(backlog) == 5  # behind the others, though it came after nothing failed for it
            await bot.send(15, "I work night shifts at the hospital", user=BOB, chat=7, group=True)
            reply = await bot.command(16, "forgetme", user=BOB, chat=7, group=True)
            assert "as soon as it is back" in reply  # not "please try again": it will be done

            proxy.mode = "pass"
            await asyncio.wait_for(backlog.drained(), 60)
            await memory.settle()
        finally:
            await bot.close()
        assert not await episodes(memory, tenant=str(GUILD_ID), user_id=str(BOB))
        texts = {
            r.message_ids[0]: r.text for r in await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
        }
    assert texts == {
        bot.message_id(11): "I play the violin in an orchestra",
        bot.message_id(12): "I moved to Porto in March",
        bot.message_id(14): "I adopted a cat called Miso",
    }


class Calls:
    """Plain calls that fail with the store unreachable while ``away`` is set."""

    def __init__(self) -> None:
        self.away = True
        self.made: list[str] = []

    def call(self, name: str) -> Any:
        async def once() -> str:
            if self.away:
                raise StoreUnavailableError("away")
            self.made.append(name)
            return name

        return once


async def test_calls_wait_in_order_and_new_calls_go_behind_them() -> None:
    calls = Calls()
    backlog = Backlog()
    assert await backlog.run("message", calls.call("m1")) is None
    calls.away = False
    assert await backlog.run("forget of deleted messages", calls.call("f1")) is None  # m1 waits: behind it
    await asyncio.wait_for(backlog.drained(), 10)
    assert calls.made == ["m1", "f1"] and len(backlog) == 0
    assert await backlog.run("message", calls.call("m2")) == "m2"  # nothing waits: made at once


async def test_a_full_backlog_drops_the_oldest_message_and_keeps_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backlog_module, "MAX_WAITING", 4)
    calls = Calls()
    backlog = Backlog()
    for name, kind in [
        ("m1", "message"),
        ("f1", "forget of deleted messages"),
        ("m2", "message"),
        ("e1", "edit"),
    ]:
        await backlog.run(kind, calls.call(name))  # type: ignore[arg-type]
    await backlog.run("message", calls.call("m3"))  # full: m2, the oldest after the one being tried, goes
    assert backlog.dropped == 1 and len(backlog) == 4
    calls.away = False
    await asyncio.wait_for(backlog.drained(), 10)
    assert calls.made == ["m1", "f1", "e1", "m3"]


async def test_a_refused_call_is_dropped_and_a_closed_memory_ends_the_wait() -> None:
    backlog = Backlog()
    made: list[str] = []
    state = {"away": True}

    async def refused() -> None:
        if state["away"]:
            raise StoreUnavailableError("away")
        raise ValueError("refused once the store answered")

    async def fine() -> None:
        made.append("fine")

    await backlog.run("message", refused)
    await backlog.run("message", fine)
    state["away"] = False
    await asyncio.wait_for(backlog.drained(), 10)
    assert made == ["fine"]

    closing = {"closed": False}

    async def until_closed() -> None:
        if closing["closed"]:
            raise ClosedError("the memory is closed")
        raise StoreUnavailableError("away")

    async def never() -> None:
        made.append("never")

    await backlog.run("message", until_closed)
    await backlog.run("message", never)
    closing["closed"] = True  # the memory closed while both waited: neither is made, the wait ends
    await asyncio.wait_for(backlog.drained(), 10)
    assert len(backlog) == 0 and made == ["fine"]


def _spooled(data_dir: Path) -> list[Path]:
    return sorted((data_dir / spool_module.FOLDER).glob("*"))


async def test_what_waits_when_the_bot_stops_is_made_at_its_next_start(tmp_path: Path) -> None:
    """The bot is stopped (a deploy, a crash, a container moved) while PostgreSQL is away: what
    waited was only in its process and was lost, a ``forgetme`` included, though the person had
    been told it would be done. It now waits in a file of the data folder (the person's words
    readable by the bot's user alone), and the next start makes it once the store answers."""
    data_dir = tmp_path / "m"
    async with behind_proxy(tmp_path, timeout_s=2.0) as (memory, proxy):
        dsn = memory.settings.storage.dsn
        assert dsn is not None
        bot = await open_harness("discord.py", memory, guild_as="tenant")
        assert isinstance(bot, DiscordHarness)
        try:
            proxy.cut()
            await bot.send(21, "I play the cello on Sundays", user=ANN, chat=7, group=True)
            await bot.send(22, "I work night shifts at the hospital", user=BOB, chat=7, group=True)
            reply = await bot.command(23, "forgetme", user=BOB, chat=7, group=True)
            assert "as soon as it is back" in reply
            [spool, lock] = _spooled(data_dir)
            assert "cello" in spool.read_text() and spool.stat().st_mode & 0o777 == 0o600
            assert lock.suffix == ".lock"
        finally:
            await bot.close()
        proxy.mode = "pass"
        await memory.close()  # the bot stops before its backlog's next try
        assert len(_spooled(data_dir)) == 2  # kept for the next start

        storage = {"backend": "postgres", "dsn": dsn.get_secret_value(), "timeout_s": 2.0}
        async with open_memory(data_dir, storage=storage) as again:
            bot = await open_harness("discord.py", again, guild_as="tenant")
            try:
                await asyncio.wait_for(backlog_of(again).drained(), 60)
                await again.settle()
            finally:
                await bot.close()
            texts = [r.text for r in await episodes(again, tenant=str(GUILD_ID), user_id=str(ANN))]
            assert texts == ["I play the cello on Sundays"]
            assert not await episodes(again, tenant=str(GUILD_ID), user_id=str(BOB))
    assert _spooled(data_dir) == []


async def test_a_forget_made_meanwhile_by_another_door_takes_what_waits_of_the_person(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's messages wait for the store; once it answers, and before the backlog's next
    try, they are forgotten by another door (the HTTP API, a script). The messages were then
    stored after the forget, and stayed; now the forget takes them, from the file too."""
    monkeypatch.setattr(backlog_module, "RETRY_DELAYS", (3.0, 0.1))
    async with behind_proxy(tmp_path, timeout_s=2.0) as (memory, proxy):
        bot = await open_harness("discord.py", memory, guild_as="tenant")
        try:
            proxy.cut()
            await bot.send(31, "My new phone number is 555 0199", user=ANN, chat=7, group=True)
            await bot.send(32, "I adopted a cat called Miso", user=BOB, chat=7, group=True)
            backlog = backlog_of(memory)
            assert len(backlog) == 2
            proxy.mode = "pass"
            await memory.forget(user_id=str(ANN), tenant=str(GUILD_ID))
            assert len(backlog) == 1
            [spool] = [p for p in _spooled(tmp_path / "m") if p.suffix == ".jsonl"]
            assert "555 0199" not in spool.read_text() and "Miso" in spool.read_text()
            await asyncio.wait_for(backlog.drained(), 60)
            await memory.settle()
        finally:
            await bot.close()
        assert not await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))
        assert [r.text for r in await episodes(memory, tenant=str(GUILD_ID), user_id=str(BOB))] == [
            "I adopted a cat called Miso"
        ]
    assert _spooled(tmp_path / "m") == []


async def test_files_that_are_not_a_stopped_backlogs_are_left_as_they_are(tmp_path: Path) -> None:
    """A file of the user's at a name the backlog uses, and a live process's file, are neither
    read nor deleted."""
    folder = tmp_path / "m" / spool_module.FOLDER
    folder.mkdir(parents=True)
    theirs = folder / f"{'a' * 32}.jsonl"
    theirs.write_text('{"my": "notes"}\n')
    live = folder / f"{'b' * 32}.jsonl"
    live.write_text(json.dumps(spool_module.HEADER) + "\n" + json.dumps(msg_record("live")) + "\n")
    held = os.open(folder / f"{'b' * 32}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # the live process's lock
    try:
        async with open_memory(tmp_path / "m") as memory:
            backlog = backlog_of(memory)
            await backlog.taken_over()
            assert len(backlog) == 0
        assert theirs.read_text() == '{"my": "notes"}\n' and live.exists()
    finally:
        os.close(held)


def msg_record(text: str) -> dict[str, Any]:
    from narrmem.doors.integrations.backlog import message_record
    from narrmem.models import Message

    return message_record("message", Message(**msg("1", text)))


async def test_a_message_made_and_then_forgotten_is_not_made_again_at_the_next_start(tmp_path: Path) -> None:
    """The file is written again every hundred calls made: a message made since then and then
    forgotten was still in it, and the next start stored it again."""
    from narrmem.models import Message

    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        backlog = backlog_of(memory)
        state = {"away": True}
        release = asyncio.Event()

        def call(message: Message, hold: bool = False) -> Any:
            async def once() -> Any:
                if state["away"]:
                    raise StoreUnavailableError("away")
                if hold:
                    await release.wait()
                return await memory.ingest(message)

            return once

        ann = Message(**msg("1", "I adopted a greyhound named Pixel", user="ann"))
        bob = Message(**msg("2", "I grow tomatoes", user="bob"))
        await backlog.run("message", call(ann), backlog_module.message_record("message", ann))
        await backlog.run("message", call(bob, hold=True), backlog_module.message_record("message", bob))
        state["away"] = False
        for _ in range(200):
            if len(backlog) == 1:
                break
            await asyncio.sleep(0.02)
        assert len(backlog) == 1  # ann's is made, bob's is being made
        await memory.forget(user_id="ann")
        assert backlog.spool is not None and "Pixel" not in backlog.spool.path.read_text()
    async with open_memory(folder) as memory:
        await backlog_of(memory).drained()
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'ann'") == [(0,)]
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(1,)]


async def test_a_line_cut_short_by_a_stop_leaves_the_others_and_the_bot_writing(tmp_path: Path) -> None:
    """A stop in the middle of an append leaves a line cut short: it is left out, the lines
    before it are made, and the bot's writes go on (an unreadable file stopped every one)."""
    folder = tmp_path / "m" / spool_module.FOLDER
    folder.mkdir(parents=True)
    stopped = folder / f"{'c' * 32}.jsonl"
    whole = json.dumps(msg_record("I sing in a choir on Tuesdays")) + "\n"
    stopped.write_bytes(
        (json.dumps(spool_module.HEADER) + "\n" + whole).encode() + b'{"kind": "message", "data": {"mess\xc3'
    )
    async with open_memory(tmp_path / "m") as memory:
        backlog = backlog_of(memory)
        await asyncio.wait_for(backlog.drained(), 30)
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'u1'") == [(1,)]
        assert not stopped.exists()
        calls = Calls()
        calls.away = False
        assert await backlog.run("message", calls.call("after")) == "after"


async def test_file_work_keeps_its_turn_until_its_thread_ends_however_often_it_is_cancelled(
    tmp_path: Path,
) -> None:
    """Cancelled twice (a timeout, then a shutdown) while its thread wrote, the first work gave
    its turn back and the next one wrote the same file beside it."""
    import threading
    import time

    spool = spool_module.Spool(tmp_path)
    order: list[str] = []
    lock = threading.Lock()

    def work(name: str, seconds: float) -> None:
        with lock:
            order.append(f"start {name}")
        time.sleep(seconds)
        with lock:
            order.append(f"end {name}")

    first = asyncio.ensure_future(spool._in_turn(work, "A", 0.4))
    await asyncio.sleep(0.1)
    first.cancel()
    await asyncio.sleep(0.05)
    first.cancel()
    second = asyncio.ensure_future(spool._in_turn(work, "B", 0.0))
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert order == ["start A", "end A", "start B", "end B"]


async def test_the_trigger_of_a_message_behind_a_full_backlog_is_still_said(tmp_path: Path) -> None:
    """A long outage holds as many messages as the backlog takes: each one's route to the chat it
    came from stays until it is made (at 4,096 routes, the first messages' went first, and the
    events they caused once made were said nowhere)."""
    told: list[tuple[str, str]] = []

    async def say(target: str, event: TriggerEvent) -> None:
        told.append((target, event.kind))

    clock = ManualClock(datetime(2026, 5, 4, 9, tzinfo=UTC))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        routes = TriggerRoutes(memory, say)
        mentions = [
            msg(f"m{n}", "the zqharbour7 roadmap review came up again", ts=clock.now().isoformat())
            for n in range(3)
        ]
        for said in mentions[:2]:
            await memory.ingest(said)
        third = Message(**mentions[2])
        assert routes.expect(third, "the chat")
        for n in range(MAX_WAITING + MAX_UNSETTLED - 1):  # the rest of a full backlog, unsettled too
            routes.expect(Message(**msg(f"w{n}", "waiting")), "another chat")
        result = await memory.ingest(third)
        routes.ingested(third, result, expected=True)
    assert told == [("the chat", "topic")]


@pytest.mark.parametrize("library", LIBRARIES)
async def test_the_suggestions_of_what_a_stopped_bot_left_waiting_are_said_at_its_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    """The bot stops while the message that brings a topic up a third time waits for the store.
    The next start makes it: its suggestion was said nowhere (the chat it was for belonged to the
    stopped process), and is now said in that chat."""
    chat = 7  # a Discord channel id is a positive snowflake
    clock = ManualClock(datetime.now(UTC))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        bot = await open_harness(library, memory)
        try:
            for n, text in enumerate(ROADMAP[:2], start=1):
                await bot.send(n, text, user=ANN, chat=chat, group=True)
            ingest = memory.ingest

            async def away(message: Any, *args: Any, **kwargs: Any) -> Any:
                raise StoreUnavailableError("the database went away")

            monkeypatch.setattr(memory, "ingest", away)
            await bot.send(3, ROADMAP[2], user=ANN, chat=chat, group=True)
            await bot.settle()
            assert len(backlog_of(memory)) == 1 and bot.replies == []
        finally:
            await bot.close()
        monkeypatch.setattr(memory, "ingest", ingest)
    async with open_memory(tmp_path / "m", clock=clock) as again:
        bot = await open_harness(library, again)
        try:
            if isinstance(bot, DiscordHarness):
                bot.know_channel(chat)
            await asyncio.wait_for(backlog_of(again).drained(), 30)
            await again.settle()
            await bot.settle()
        finally:
            await bot.close()
    [(said_in, suggestion)] = bot.replies
    assert said_in == str(chat) and "3rd time" in suggestion


@pytest.mark.parametrize("library", LIBRARIES)
async def test_a_message_the_platform_dated_past_a_clock_that_is_behind_is_stored_as_dated(
    tmp_path: Path, library: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A VM resumed three days late, its clock not set yet: every message the platform dated was
    refused as too far ahead of the clock, logged, and lost for good. A platform's time is right:
    the message is stored as dated, and the log says the clock is behind. A client's message so
    dated is still refused (its clock may be the wrong one)."""
    from test_integrations import T0, when

    from narrmem import ClockBehindError
    from narrmem.ingest import _clock_warned_at

    _clock_warned_at.clear()
    clock = ManualClock(T0 - timedelta(days=3))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        bot = await open_harness(library, memory)
        try:
            await bot.send(11, "I play the violin in an orchestra", user=ANN, chat=7, group=True)
            await bot.send(12, "I moved to Lisbon in March", user=ANN, chat=7, group=True)
            await bot.edit(12, "I moved to Porto in March", user=ANN, chat=7, group=True)
            await memory.settle()
            assert len(backlog_of(memory)) == 0
            tenant, chat = bot.where(7, True)
            stored = await memory.store.recent(
                Scope(tenant=tenant, chat_id=chat), kinds=["episode"], limit=10
            )
        finally:
            await bot.close()
        assert {r.text: r.created_at for r in stored} == {
            "I play the violin in an orchestra": when(11),
            "I moved to Porto in March": when(12),
        }
        assert "is the clock right" in caplog.text
        with pytest.raises(ClockBehindError) as refused:
            await memory.ingest(msg("c1", "I adopted a cat", ts=when(13).isoformat()))
        assert refused.value.field == "ts"
