"""The keyword context of an episode (the chat's earlier turns) with two workers on one PostgreSQL:
a user forgotten in one worker leaves no word in what the other stores next, and a turn stored by
one worker is context for the other's next message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _helpers import msg
from _postgres import fresh_database
from narrmem_plugins.recall_hybrid import HybridRecall

from narrmem import Memory, Message, hookimpl
from narrmem.models import MemoryRecord, Scope
from narrmem.testing import open_memory


async def context_of(mem: Memory, message_id: str, chat: str = "g") -> str:
    [memory_id] = await mem.store.from_messages("default", chat, [message_id])
    record = (await mem.store.get([memory_id], None))[memory_id]
    return record.context_text or ""


def at(minute: int) -> str:
    return f"2026-05-04T09:{minute:02d}:00+00:00"


async def test_a_forget_in_one_worker_reaches_the_others_context(tmp_path: Path) -> None:
    storage: dict[str, Any] = {"backend": "postgres", "dsn": await fresh_database("hybrid")}
    async with (
        open_memory(tmp_path / "a", storage=storage) as one,
        open_memory(tmp_path / "b", storage=storage) as two,
    ):
        # Worker two handles u1's message (it is in its cache of the chat's last turns), and both
        # workers receive u3's (one stores it, the other is told it is a duplicate).
        stored = await two.ingest(
            msg(
                "m1",
                "My locker code at the gym is zanzibar, do not tell anyone",
                user="u1",
                chat="g",
                ts=at(0),
            )
        )
        assert stored.stored
        both = [
            await mem.ingest(
                msg(
                    "m2", "I keep my spare key under the blue quokka flowerpot", user="u3", chat="g", ts=at(1)
                )
            )
            for mem in (one, two)
        ]
        assert sorted(r.stored for r in both) == [False, True]
        assert "zanzibar" in await context_of(one, "m2")
        await one.forget(user_id="u1")
        await one.forget(user_id="u3")

        # Worker two's next message in the chat: neither forgotten user's words come with it.
        await two.ingest(
            msg("m3", "Has anyone tried the new climbing wall at the gym", user="u2", chat="g", ts=at(2))
        )
        context = await context_of(two, "m3")
        assert "zanzibar" not in context and "quokka" not in context
        for word in ("zanzibar", "quokka"):
            assert await two.store.search_keywords(Scope(chat_id="g"), word, 10) == []
            assert await one.store.search_keywords(Scope(chat_id="g"), word, 10) == []

        # A turn stored by worker one is context for worker two's next message.
        await one.ingest(
            msg("m4", "We should go hiking at Mount Tamalpais on Saturday", user="u2", chat="g", ts=at(3))
        )
        await two.ingest(
            msg("m5", "Count me in, I will bring sandwiches for the hike", user="u4", chat="g", ts=at(4))
        )
        assert "tamalpais" in (await context_of(two, "m5")).lower()


class ForgetWhileStoring:
    """Runs a forget in the other worker after this worker read a message's context (the hybrid
    plugin's ``narrmem_before_store`` ran) and before the message is written."""

    narrmem_name = "forget_while_storing"

    def __init__(self) -> None:
        self.other: Memory | None = None

    @hookimpl(trylast=True)
    async def narrmem_before_store(self, message: Message) -> None:
        if message.message_id == "m2" and self.other is not None:
            await self.other.forget(user_id="u1")


async def test_a_forget_between_reading_context_and_writing_is_caught(tmp_path: Path) -> None:
    storage: dict[str, Any] = {"backend": "postgres", "dsn": await fresh_database("hybrid")}
    race = ForgetWhileStoring()
    async with (
        open_memory(tmp_path / "a", storage=storage) as one,
        open_memory(tmp_path / "b", storage=storage, plugins=[race]) as two,
    ):
        await one.ingest(
            msg("m1", "My locker code at the gym is zanzibar, keep it secret", user="u1", chat="g", ts=at(0))
        )
        race.other = one
        await two.ingest(
            msg("m2", "Did anyone see the new climbing wall at the gym", user="u2", chat="g", ts=at(1))
        )
        assert "zanzibar" not in await context_of(two, "m2")
        assert await two.store.search_keywords(Scope(chat_id="g"), "zanzibar", 10) == []


async def test_a_reply_stored_by_one_worker_reaches_the_others_turn_and_its_forget_too(
    tmp_path: Path,
) -> None:
    storage: dict[str, Any] = {"backend": "postgres", "dsn": await fresh_database("replies")}
    async with (
        open_memory(tmp_path / "a", storage=storage) as one,
        open_memory(tmp_path / "b", storage=storage) as two,
    ):
        await two.ingest(msg("m1", "I got it!! Starting in two weeks", user="u1", chat="g", ts=at(0)))
        await one.ingest(
            msg("m2", "Congrats on the new job at the observatory!", user="u2", chat="g", ts=at(1))
        )
        assert "observatory" in await context_of(two, "m1")
        [news_id] = await two.store.from_messages("default", "g", ["m1"])
        found = await two.store.search_keywords(Scope(user_id="u1"), "observatory job", 10)
        assert [i for i, _ in found] == [news_id]
        await two.forget(user_id="u2")
        assert "observatory" not in await context_of(one, "m1")
        assert await one.store.search_keywords(Scope(chat_id="g"), "observatory", 10) == []


class StoresElsewhereWhileStoring:
    """Has the other worker store a message after this worker read ``m3``'s context and before
    it is written."""

    narrmem_name = "stores_elsewhere_while_storing"

    def __init__(self) -> None:
        self.other: Memory | None = None
        self.message: dict[str, Any] | None = None

    @hookimpl(trylast=True)
    async def narrmem_before_store(self, message: Message) -> None:
        if message.message_id == "m3" and self.other is not None and self.message is not None:
            await self.other.ingest(self.message)


async def _held_unwritten(mem: Memory, said: dict[str, Any]) -> None:
    """This worker read ``said`` and its write never came (a forget took it on its way: an edit
    of it made in another worker): its words are in the hybrid plugin's cache of the chat."""
    message = Message(**said)
    episode = MemoryRecord(
        user_id=message.user_id,
        chat_id=message.chat_id,
        text=message.text,
        created_at=message.ts,
        message_ids=[message.message_id],
    )
    await mem.host.plugin(HybridRecall).narrmem_before_store(mem, message, [episode])


async def test_words_this_worker_held_of_a_message_another_stored_edited_stay_out(tmp_path: Path) -> None:
    """Worker two held a message's first words (read, never written: the other worker's edit
    took it on its way) and worker one stored its new words. The next turns' keyword context took
    the held words over the stored ones, and kept them once written, for good."""
    storage: dict[str, Any] = {"backend": "postgres", "dsn": await fresh_database("hybrid")}
    race = StoresElsewhereWhileStoring()
    old = msg("m1", "My bank PIN is 4711, do not share it", user="u1", chat="g", ts=at(0))
    async with (
        open_memory(tmp_path / "a", storage=storage) as one,
        open_memory(tmp_path / "b", storage=storage, plugins=[race]) as two,
    ):
        await _held_unwritten(two, old)
        await one.ingest({**old, "text": "My bank PIN is something I keep to myself"})
        await two.ingest(
            msg(
                "m2",
                "I am going bouldering at the new gym on Friday with my sister",
                user="u2",
                chat="g",
                ts=at(1),
            )
        )
        assert "4711" not in await context_of(two, "m2")
        assert "keep to myself" in await context_of(two, "m2")

        # The held words read before the other worker stored the message: caught once written.
        held = msg("m9", "My locker code is zanzibar", user="u1", chat="g", ts=at(2))
        await _held_unwritten(two, held)
        race.other, race.message = one, {**held, "text": "My locker code changed, ask me"}
        await two.ingest(
            msg(
                "m3",
                "I finally climbed the overhang wall at the gym today, so proud",
                user="u2",
                chat="g",
                ts=at(3),
            )
        )
        assert "zanzibar" not in await context_of(two, "m3")
        for word in ("4711", "zanzibar"):
            assert await one.store.search_keywords(Scope(chat_id="g"), word, 10) == []
