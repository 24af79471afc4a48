"""A reply's words in the keyword context of the turns before it (``recall_hybrid``'s
``replies_in_context``): the earlier message is found by them, on FTS5 and on tantivy, within the
conversation window only, and a forget of the reply takes them out again."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, sql
from narrmem_plugins.recall_hybrid import HybridRecall

from narrmem import Memory, Message, hookimpl
from narrmem.clock import ManualClock
from narrmem.models import ContextLine, MemoryRecord, Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only


def at(minute: int) -> str:
    return f"2026-05-04T09:{minute:02d}:00+00:00"


# The memory's clock in the tests that record the context window: before the messages' dates.
BEFORE = datetime(2026, 4, 1, tzinfo=UTC)
NEWS = msg("m1", "I got it!! Starting in two weeks", user="u1", chat="g", ts=at(0))
REPLY = msg("m2", "Congrats on the new job at the observatory!", user="u2", chat="g", ts=at(1))


async def context_of(mem: Memory, message_id: str) -> str:
    [memory_id] = await mem.store.from_messages("default", "g", [message_id])
    return (await mem.store.get([memory_id], None))[memory_id].context_text or ""


async def keyword_ids(mem: Memory, scope: Scope, query: str) -> list[int]:
    return [i for i, _ in await mem.store.search_keywords(scope, query, 10)]


@pytest.mark.parametrize("engine", ["fts5", "tantivy"])
async def test_the_message_before_a_reply_is_found_by_the_replys_words(tmp_path: Path, engine: str) -> None:
    # No relevance floor: this test's embedder hashes words, so "I got it!!" is near nothing.
    settings: dict[str, Any] = {"storage": {"keyword_index": engine}, "recall": {"min_similarity": 0.0}}
    async with open_memory(tmp_path / "m", **settings) as mem:
        [news_id] = (await mem.ingest(NEWS)).memory_ids[:1]
        assert await keyword_ids(mem, Scope(user_id="u1"), "observatory job") == []
        await mem.ingest(REPLY)
        assert "observatory" in await context_of(mem, "m1")
        # u1's own memory, found in u1's scope by the words u2 used about it.
        assert await keyword_ids(mem, Scope(user_id="u1"), "observatory job") == [news_id]
        hits = await mem.recall("observatory job", user_id="u1", k=5)
        assert [h.message_ids for h in hits][:1] == [["m1"]]
        assert hits[0].text == NEWS["text"]  # the context costs no prompt tokens
        [meta] = sql(tmp_path / "m", "SELECT meta FROM memories WHERE id = ?", (news_id,))
        assert json.loads(meta[0])["context_message_ids"] == ["m2"]


async def test_off_and_outside_the_conversation_window_the_earlier_turn_is_left_as_it_is(
    tmp_path: Path,
) -> None:
    off: dict[str, Any] = {"recall_hybrid": {"replies_in_context": False}}
    async with open_memory(tmp_path / "off", plugin=off) as mem:
        await mem.ingest_many([NEWS, REPLY])
        assert "observatory" not in await context_of(mem, "m1")
    async with open_memory(tmp_path / "late") as mem:
        await mem.ingest(NEWS)
        later = "2026-05-04T11:00:00+00:00"  # two hours on: another talk
        await mem.ingest(
            msg("m2", "Congrats on the new job at the observatory!", user="u2", chat="g", ts=later)
        )
        assert "observatory" not in await context_of(mem, "m1")


async def test_a_batch_gives_each_turn_the_replies_after_it(tmp_path: Path) -> None:
    third = msg(
        "m3", "Thanks! I still can't believe the telescope is mine to run", user="u1", chat="g", ts=at(2)
    )
    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest_many([NEWS, REPLY, third])
        first = await context_of(mem, "m1")
        assert "observatory" in first and "telescope" in first
        assert "telescope" in await context_of(mem, "m2")
        # Ingesting the batch again changes nothing (duplicates), nor does a hook run twice.
        await mem.ingest_many([NEWS, REPLY, third])
        assert await context_of(mem, "m1") == first


async def test_forgetting_the_replier_takes_the_words_out_of_the_turn_before(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, storage={"keyword_index": "tantivy"}) as mem:
        await mem.ingest_many([NEWS, REPLY])
        assert "observatory" in await context_of(mem, "m1")
        await mem.forget(user_id="u2")
        assert "observatory" not in await context_of(mem, "m1")
        assert await keyword_ids(mem, Scope(chat_id="g"), "observatory") == []
        assert sql(folder, "SELECT COUNT(*) FROM memories_fts WHERE memories_fts MATCH 'observatory'") == [
            (0,)
        ]
        metas = [json.loads(m) for (m,) in sql(folder, "SELECT meta FROM memories")]
        assert not any("m2" in m.get("context_message_ids", []) for m in metas)
    # Nothing of the reply in any file narrmem wrote.
    for path in folder.rglob("*"):
        if path.is_file():
            assert b"observatory" not in path.read_bytes(), path


class ForgetTheReplierFirst:
    """Forgets the replier once the reply is written, before any other after-store hook (the
    reply's words went in with it, so the forget must find them there)."""

    narrmem_name = "forget_the_replier_first"

    def __init__(self) -> None:
        self.memory: Memory | None = None

    @hookimpl(tryfirst=True)
    async def narrmem_after_store(self, message: Message) -> None:
        if message.message_id == "m2" and self.memory is not None:
            await self.memory.forget(user_id="u2")


async def test_a_forget_between_the_write_and_the_hook_leaves_no_word(tmp_path: Path) -> None:
    forgetter = ForgetTheReplierFirst()
    async with open_memory(tmp_path / "m", plugins=[forgetter]) as mem:
        forgetter.memory = mem
        await mem.ingest(NEWS)
        await mem.ingest(REPLY)
        assert await mem.store.stored_message_ids("default", "g", ["m1", "m2"]) == {"m1"}
        assert "observatory" not in await context_of(mem, "m1")
        assert await keyword_ids(mem, Scope(chat_id="g"), "observatory") == []


class QuotesEachMessage:
    """A third-party plugin with context lines of its own: each message's words, under its own key,
    for the first message of the chat; and one answer that is not a list of lines."""

    narrmem_name = "quotes_each_message"

    @hookimpl
    def narrmem_context_lines(self, records: list[MemoryRecord]) -> Any:
        if records[0].message_ids == ["m3"]:
            return "not a list"
        if records[0].message_ids == ["m1"]:
            return None
        return [ContextLine(message_ids=["m1"], text=f"quoted: {records[0].text}", key="quoted_by")]


async def test_a_plugins_context_lines_go_in_with_the_message_and_a_bad_answer_is_noted(
    tmp_path: Path,
) -> None:
    settings = {"plugin": {"recall_hybrid": {"replies_in_context": False}}}
    async with open_memory(tmp_path / "m", plugins=[QuotesEachMessage()], **settings) as mem:
        await mem.ingest(NEWS)
        await mem.ingest(REPLY)
        bad = await mem.ingest(msg("m3", "The telescope there is huge", user="u2", chat="g", ts=at(2)))
        assert bad.stored and any("narrmem_context_lines" in note for note in bad.notes)
        [memory_id] = await mem.store.from_messages("default", "g", ["m1"])
        [first] = (await mem.store.get([memory_id], None)).values()
        assert first.context_text is not None and "quoted: Congrats" in first.context_text
        assert "telescope" not in first.context_text
        assert first.meta["quoted_by"] == ["m2"]
        assert await keyword_ids(mem, Scope(chat_id="g"), "observatory") != []


@pytest.mark.parametrize("deleted", [1, 6], ids=["looked up by id", "more than are looked up by id"])
async def test_deleted_messages_leave_the_context_of_the_turns_around_them(
    tmp_path: Path, deleted: int
) -> None:
    """A deleted message's words go from the turns before it (replies) and after it (context),
    whether the turns holding them are looked up by the deleted message's id or read with the
    chat; the other turns keep theirs."""
    topics = ["observatory", "telescope", "lighthouse", "orchard", "glacier", "volcano", "harbour", "canyon"]
    talk = [
        msg(f"t{n}", f"We talked about the {topic} again today", user=f"u{n % 3}", chat="g", ts=at(n))
        for n, topic in enumerate(topics)
    ]
    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest_many(talk)
        await mem.settle()
        gone = [f"t{n}" for n in range(1, 1 + deleted)]
        await mem.forget_messages(chat_id="g", message_ids=gone)
        kept = [f"t{n}" for n in range(len(topics)) if f"t{n}" not in gone]
        contexts = {mid: await context_of(mem, mid) for mid in kept}
    for n in range(1, 1 + deleted):
        assert not any(topics[n] in text for text in contexts.values()), topics[n]
    if deleted == 1:  # the turns whose context held none of it keep theirs
        assert topics[6] in contexts["t7"] and topics[5] in contexts["t6"]


def greyhound_chat(day: str = "2026-05-04") -> list[dict[str, Any]]:
    """Ann's six messages about her greyhounds in chat g, each answered by u2, from 09:00 of
    ``day``, a minute apart."""
    turns = []
    for n in range(6):
        turns.append(
            msg(
                f"a{n}",
                f"I adopted greyhound number {n}",
                user="u1",
                chat="g",
                ts=f"{day}T09:{2 * n:02d}:00+00:00",
            )
        )
        reply = "that is lovely news, I want to meet the dog at the park soon"
        turns.append(msg(f"r{n}", reply, user="u2", chat="g", ts=f"{day}T09:{2 * n + 1:02d}:00+00:00"))
    return turns


async def test_a_forget_reads_the_turns_around_what_it_forgets_not_the_whole_channel(tmp_path: Path) -> None:
    """Forgetting a person who wrote a few times in a busy channel read every episode of the
    channel into memory (more than four messages: "forget me" in a server of months). Now only
    the turns within the context window of each forgotten message are read, and the words are
    scrubbed all the same, on either side of them. A window set wider before is still covered."""
    days = [f"2026-05-{day:02d}T{hour:02d}:00:00+00:00" for day in range(1, 11) for hour in (8, 14, 20)]
    chatter = [
        msg(
            f"o{n}",
            f"I cooked a big pot of lentil soup for my neighbours on day {n}",
            user="u9",
            chat="g",
            ts=ts,
        )
        for n, ts in enumerate(days)
    ]
    late = msg(
        "late",
        "we should all go hiking together next weekend at the lake",
        user="u2",
        chat="g",
        ts="2026-05-11T14:00:00+00:00",
    )
    wide: dict[str, Any] = {"recall_hybrid": {"context_minutes": 600}}
    clock = ManualClock(BEFORE)
    async with open_memory(tmp_path / "m", plugin=wide, clock=clock) as mem:
        # The first message written records the window, from the day after (the clock's).
        await mem.ingest(
            msg("w", "I started a new job at the bakery", user="u5", chat="w", ts=BEFORE.isoformat())
        )
        clock.set(datetime(2026, 5, 12, tzinfo=UTC))
        await mem.ingest_many([*chatter, *greyhound_chat("2026-05-11"), late])
        assert "greyhound" in await context_of(mem, "late")  # five hours on, within ten
        assert len(await mem.store.recent(Scope(chat_id="g"), kinds=["episode"], limit=100)) == 43
    read: list[int] = []
    async with open_memory(tmp_path / "m", clock=clock) as mem:  # the default window, 60 minutes
        recent = mem.store.recent

        async def counted(*args: Any, **options: Any) -> list[MemoryRecord]:
            records = await recent(*args, **options)
            read.append(len(records))
            return records

        mem.store.recent = counted  # type: ignore[method-assign]
        assert (await mem.forget(user_id="u1"))["memories"] >= 6
        for turn in ["r0", "r5", "late"]:
            assert "greyhound" not in await context_of(mem, turn)
    # The forget's own reads: the person's records, then the turns around theirs (the chatter of
    # the ten days before is never read).
    assert sum(read) < 6 + len(chatter), read


async def test_turns_written_before_the_window_was_recorded_are_scrubbed_over_the_widest_window(
    tmp_path: Path,
) -> None:
    """A store written by an earlier version records no window: its turns may have been written
    with any, so a forget reads the widest the setting allows around them, not this process's."""
    wide: dict[str, Any] = {"recall_hybrid": {"context_minutes": 600}}
    late = msg(
        "late",
        "we should all go hiking together next weekend at the lake",
        user="u2",
        chat="g",
        ts="2026-05-04T14:00:00+00:00",
    )
    async with open_memory(tmp_path / "m", plugin=wide) as mem:
        await mem.ingest_many([*greyhound_chat(), late])
        assert "greyhound" in await context_of(mem, "late")
        await mem.store.state_delete(
            "recall_hybrid", "widest_context_minutes"
        )  # as an earlier version left it
    async with open_memory(tmp_path / "m") as mem:  # 60 minutes now
        recall_hybrid = mem.host.plugin(HybridRecall)
        recall_hybrid._window_recorded = True  # this process writes nothing: the record stays absent
        await mem.forget(user_id="u1")
        assert "greyhound" not in await context_of(mem, "late")


async def test_a_scrub_that_cannot_date_the_forgotten_messages_reads_the_chat_a_page_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget finished at an open, or after a crash, has no record of what it deleted to date
    the messages by: the chat is read a page at a time (pages of two here, with turns of one
    instant across a page's end), and every turn holding their words is scrubbed."""
    import narrmem_plugins.recall_hybrid as recall_hybrid_module

    monkeypatch.setattr(recall_hybrid_module, "CHAT_PAGE", 2)
    same = "2026-05-04T09:30:00+00:00"
    echoes = [
        msg(f"e{n}", f"still thinking about those dogs, story {n}", user="u3", chat="g", ts=same)
        for n in range(3)
    ]
    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest_many([*greyhound_chat(), *echoes])
        ann = [f"a{n}" for n in range(6)]
        [*ids] = await mem.store.from_messages("default", "g", ann)
        episodes = [
            r.id
            for r in (await mem.store.get(ids, None)).values()
            if r.kind == "episode" and r.id is not None
        ]
        await mem.store.delete(episodes, Scope(user_id="u1"))  # gone before the scrub, as after a crash
        recall_hybrid = mem.host.plugin(HybridRecall)
        await recall_hybrid.narrmem_after_forget(memory=mem, tenant="default", sources={"g": ann}, removed=[])
        for n in range(6):
            assert "greyhound" not in await context_of(mem, f"r{n}")
