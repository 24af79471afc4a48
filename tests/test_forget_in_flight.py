"""A forget against the messages being written at that moment in the same process: nothing their
after-store hooks make outlives the forget, a message begun during the forget is stored after
it, and hooks that forget or ingest themselves do not wait for themselves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _helpers import forget_begun, msg

from narrmem import TriggerEvent, hookimpl, settling
from narrmem.fence import Fence
from narrmem.memory import Memory
from narrmem.models import MemoryRecord, Message
from narrmem.testing import open_memory

MODES = ["after_hooks", "after_write", "on_receipt"]
WAIT = 10.0  # seconds: a hang fails the test instead of the run


class SlowFacts:
    """A fact extractor that takes its time (an LLM would), and says when it has started; given
    ``about``, only over messages that hold that word."""

    narrmem_name = "slow_facts"

    def __init__(self, about: str | None = None, release: asyncio.Event | None = None) -> None:
        self.started = asyncio.Event()
        self.about = about
        self.release = release  # given, it ends when told to rather than after its 0.3 s

    @hookimpl
    async def narrmem_extract_facts(self, message: Message) -> list[dict[str, str]]:
        if self.about is not None and self.about not in message.text:
            return []
        self.started.set()
        if self.release is None:
            await asyncio.sleep(0.3)
        else:
            await asyncio.wait_for(self.release.wait(), WAIT)
        return [{"relation": "works_at", "object": "Acme Bank"}]


def ann(message_id: str, text: str) -> dict[str, Any]:
    return msg(message_id, text, user="ann", chat="dm", tenant="t", speaker="Ann")


def forget_me(message_id: str, chat: str = "other") -> dict[str, Any]:
    """Ann asking to be forgotten (what ``ForgetMeCommand`` answers), in ``chat``."""
    return msg(message_id, "Please forget me, all of it.", user="ann", chat=chat, tenant="t", speaker="Ann")


async def extracted_then_gone(memory: Memory, facts: Any) -> None:
    """Once everything has settled: the slow fact extractor did run, and nothing of Ann is left."""
    await asyncio.wait_for(memory.settle(), WAIT)
    assert facts.started.is_set()
    await nothing_left(memory)


async def only_left(memory: Memory, message_id: str, *, without: str) -> None:
    """Only the memory of ``message_id`` is left, and neither its text nor its keyword context
    holds ``without`` (Ann's words, a reply of Bob's held them)."""
    records = await everything(memory)
    assert [r.message_ids for r in records] == [[message_id]]
    assert all(without not in (r.context_text or "") + r.text for r in records)


async def forgotten_while_extracting(memory: Memory, facts: Any) -> asyncio.Future[Any]:
    """Ann's first message in the slow fact extractor while she asks, in another chat, to be
    forgotten; returns the first message's ingest, still under way."""
    first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
    await asyncio.wait_for(facts.started.wait(), WAIT)
    await asyncio.wait_for(memory.ingest(forget_me("2")), WAIT)
    return first


async def graph_of(memory: Memory) -> dict[str, Any]:
    graph: dict[str, Any] = (await memory.stats())["graph"]
    return graph


async def nothing_left(memory: Memory) -> None:
    """No memory and no graph fact is left (of anyone: the tests that use it had Ann alone)."""
    assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}
    assert await everything(memory) == []


def slow_embedding(memory: Memory, words: str, seconds: float) -> asyncio.Event:
    """Texts holding ``words`` take ``seconds`` more to embed (a real model on a long batch);
    the event is set when one starts."""
    embed = memory.embedder.embed
    started = asyncio.Event()

    async def slow(texts: Any, *args: Any, **kwargs: Any) -> Any:
        if any(words in text for text in texts):
            started.set()
            await asyncio.sleep(seconds)
        return await embed(texts, *args, **kwargs)

    memory.embedder.embed = slow  # type: ignore[method-assign]
    return started


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_forget_during_the_after_store_hooks_leaves_nothing_they_made(
    tmp_path: Path, acknowledge: str
) -> None:
    facts = SlowFacts()
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[facts]) as memory:
        ingest = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        counts = await asyncio.wait_for(memory.forget(user_id="ann", tenant="t"), WAIT)
        await ingest
        await memory.settle()
        assert counts["memories"] >= 1
        assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}
        context = await memory.turn_context("where do I work?", user_id="ann", chat_id="dm", tenant="t")
        assert context["facts"] == []


async def test_a_forget_while_a_message_is_written_waits_for_its_hooks(tmp_path: Path) -> None:
    """Answered once written, the message's write is under way when the forget comes: the forget
    waits for the write and the hooks it schedules, then removes all of it."""
    facts = SlowFacts()
    async with open_memory(tmp_path / "m", storage={"acknowledge": "after_write"}, plugins=[facts]) as memory:
        store: Any = memory.store
        entered, release = asyncio.Event(), asyncio.Event()
        for name in ("add", "add_while_embedding", "add_with_context"):
            original = getattr(store, name, None)
            if original is None:
                continue  # a store that cannot write that way

            async def held(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                entered.set()
                await release.wait()
                return await _original(*args, **kwargs)

            setattr(store, name, held)
        ingest = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(entered.wait(), WAIT)
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        await asyncio.sleep(0.05)
        assert not forget.done()  # it waits for the write under way
        release.set()
        await asyncio.wait_for(ingest, WAIT)
        await asyncio.wait_for(forget, WAIT)
        await memory.settle()
        await nothing_left(memory)


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_message_begun_during_a_forget_is_stored_after_it(tmp_path: Path, acknowledge: str) -> None:
    facts = SlowFacts()
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[facts]) as memory:
        first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(forget_begun(memory), WAIT)
        after = await asyncio.wait_for(memory.ingest(ann("2", "I adopted a greyhound named Pixel.")), WAIT)
        await asyncio.wait_for(asyncio.gather(first, forget), WAIT)
        await memory.settle()
        assert after.stored
        assert [r.message_ids for r in await everything(memory)] == [["2"]]


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_trigger_callback_that_forgets_or_ingests_does_not_wait_for_itself(
    tmp_path: Path, acknowledge: str
) -> None:
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}) as memory:
        done: list[str] = []

        async def on_trigger(event: TriggerEvent) -> None:
            await memory.ingest(msg("bot-1", "a note the bot keeps", user="bot", chat="notes", tenant="t"))
            await memory.forget(user_id=event.user_id, tenant=event.tenant)
            done.append(event.label)

        memory.on_trigger(on_trigger)
        texts = ["so tired today", "so tired again today", "still so tired today"]
        for n, text in enumerate(texts, start=1):
            await asyncio.wait_for(memory.ingest(ann(str(n), text)), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert done == ["tired"]
        assert [r.message_ids for r in await everything(memory)] == [["bot-1"]]


async def everything(memory: Memory) -> list[MemoryRecord]:
    """Every stored record, from the store's export (the one way to list across scopes)."""
    return [record async for record, _ in memory.store.export()]


async def test_a_trigger_callback_that_recalls_during_a_burst_does_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On receipt, more messages unsettled than the bound: the oldest batch's callback recalls in a
    chat whose messages are still on their way. The writer of those messages does not wait for
    that batch (it waited, and the batch waited for the recall, for ever)."""
    monkeypatch.setattr(settling, "MAX_UNSETTLED", 16)
    async with open_memory(tmp_path / "m", storage={"acknowledge": "on_receipt"}) as memory:
        recalled: list[int] = []

        async def on_trigger(event: TriggerEvent) -> None:
            hits = await memory.recall("roadmap", chat_id=event.chat_id, tenant=event.tenant)
            recalled.append(len(hits))

        memory.on_trigger(on_trigger)

        async def send(n: int) -> None:
            text = f"product roadmap worry number {n}"
            await memory.ingest(msg(str(n), text, user=f"u{n % 10}", chat="g", tenant="t"))

        await asyncio.wait_for(asyncio.gather(*(send(n) for n in range(200))), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert recalled and all(recalled)


async def test_an_edit_while_a_failed_write_is_tried_again_keeps_the_new_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On receipt, the first write fails; the edit comes while the next try is under way. The
    edit waits for that try and then replaces what it wrote (the try found its entry gone after
    the edit's forget, and forgot the message again: the new text with it)."""
    import narrmem.inbox as inbox
    from narrmem.ingest import IngestPipeline

    monkeypatch.setattr(inbox, "RETRY_DELAYS", (0.05, 0.05))
    original = IngestPipeline.store_received
    tries: list[int] = []

    async def fails_once(self: IngestPipeline, items: list[Any], *rest: Any, **options: Any) -> None:
        tries.append(len(items))
        if len(tries) == 1:
            raise RuntimeError("database is locked")
        await original(self, items, *rest, **options)

    monkeypatch.setattr(IngestPipeline, "store_received", fails_once)

    class HoldTheTry:
        narrmem_name = "hold_the_try"

        def __init__(self) -> None:
            self.arrived, self.release = asyncio.Event(), asyncio.Event()

        @hookimpl
        async def narrmem_before_store(self, message: Message) -> None:
            if message.text.startswith("old") and len(tries) >= 2:
                self.arrived.set()
                await self.release.wait()

    hold = HoldTheTry()
    async with open_memory(tmp_path / "m", storage={"acknowledge": "on_receipt"}, plugins=[hold]) as memory:
        assert (await memory.ingest(ann("1", "old text about the bank"))).stored
        await asyncio.wait_for(hold.arrived.wait(), WAIT)
        edit = asyncio.ensure_future(memory.edit(ann("1", "new text about the bank")))
        await asyncio.sleep(0.1)
        assert not edit.done()  # it waits for the try under way
        hold.release.set()
        assert (await asyncio.wait_for(edit, WAIT)).stored
        await asyncio.wait_for(memory.settle(), WAIT)
        assert [r.text for r in await everything(memory) if r.kind == "episode"] == [
            "new text about the bank"
        ]


class TriggerAfterAWhile:
    """After-store hooks that take their time (an LLM), then a trigger for texts that start "T"."""

    narrmem_name = "trigger_after_a_while"

    @hookimpl
    async def narrmem_after_store(self, message: Message, result: Any) -> None:
        if message.text.startswith("T"):
            await asyncio.sleep(0.2)
            result.triggers.append(
                TriggerEvent(
                    kind="topic",
                    label="x",
                    count=1,
                    tenant=message.tenant,
                    user_id=message.user_id,
                    chat_id=message.chat_id,
                )
            )


def said_by(user: str, message_id: str) -> dict[str, Any]:
    return msg(message_id, f"T a note from {user}", user=user, chat=f"c-{user}", tenant="t")


async def test_two_messages_whose_callbacks_forget_at_once_do_not_wait_for_each_other(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", plugins=[TriggerAfterAWhile()]) as memory:
        forgot: list[str] = []

        async def on_trigger(event: TriggerEvent) -> None:
            await memory.forget(user_id=event.user_id, tenant=event.tenant)
            forgot.append(event.user_id)

        memory.on_trigger(on_trigger)
        both = asyncio.gather(memory.ingest(said_by("ann", "1")), memory.ingest(said_by("bob", "2")))
        await asyncio.wait_for(both, WAIT)
        assert sorted(forgot) == ["ann", "bob"]
        assert await everything(memory) == []


async def test_a_later_batch_that_forgets_and_a_message_that_settles_do_not_wait_for_each_other(
    tmp_path: Path,
) -> None:
    """Ann's hooks run after her answer (a batch) and her callback forgets; Bob's run before his
    answer and his callback settles, which waits for Ann's batch."""
    async with open_memory(tmp_path / "m", plugins=[TriggerAfterAWhile()]) as memory:

        async def on_trigger(event: TriggerEvent) -> None:
            if event.user_id == "ann":
                await memory.forget(user_id="ann", tenant="t")
            else:
                await memory.settle()

        memory.on_trigger(on_trigger)
        ann_answer = memory.ingest(said_by("ann", "1"), acknowledge="after_write")
        bob_answer = memory.ingest(said_by("bob", "2"))
        await asyncio.wait_for(asyncio.gather(ann_answer, bob_answer), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert [r.message_ids for r in await everything(memory) if r.kind == "episode"] == [["2"]]


class ForgetMeCommand:
    """A plugin that forgets its speaker from its after-store hook when asked to."""

    narrmem_name = "forget_me_command"

    @hookimpl
    async def narrmem_after_store(self, memory: Any, message: Message) -> None:
        if "forget me" in message.text:
            await memory.forget(user_id=message.user_id, tenant=message.tenant)


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_forget_from_hooks_leaves_nothing_that_earlier_messages_hooks_make(
    tmp_path: Path, acknowledge: str
) -> None:
    """Ann's first message is still in its hooks (the fact extractor) when her second one, in
    another chat, asks its hooks to forget her. Answered before their hooks, the two messages'
    hooks run one after the other, in order. With the default acknowledgement the hooks run in
    each message's own call, side by side: the forget cannot wait for the first message's hooks
    (they could be waiting for the second's), so it is finished once they end."""
    facts = SlowFacts(about="Acme")
    plugins = [facts, ForgetMeCommand()]
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=plugins) as memory:
        first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        asking = forget_me("2")
        await asyncio.wait_for(asyncio.gather(first, memory.ingest(asking)), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        await nothing_left(memory)


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_forget_from_hooks_leaves_nothing_that_later_messages_of_its_batch_make(
    tmp_path: Path, acknowledge: str
) -> None:
    """One call, one batch: Ann asks to be forgotten, then says where she works. The second
    message's hooks run after the forget, in the same unit (or batch of hooks run later)."""
    facts = SlowFacts(about="Acme")
    async with open_memory(
        tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[facts, ForgetMeCommand()]
    ) as memory:
        batch = [
            forget_me("1"),
            ann("2", "I work at Acme Bank as an analyst."),
        ]
        await asyncio.wait_for(memory.ingest_many(batch), WAIT)
        await extracted_then_gone(memory, facts)


async def test_a_forget_from_hooks_stays_recorded_until_finished_and_a_later_message_stays(
    tmp_path: Path,
) -> None:
    """With the default acknowledgement, the forget from hooks returns while Ann's first message is
    in its hooks: its job stays recorded (a crash would leave it to the next open) until it is
    finished. A message Ann sends after that is kept."""
    facts = SlowFacts(about="Acme")
    async with open_memory(tmp_path / "m", plugins=[facts, ForgetMeCommand()]) as memory:
        first = await forgotten_while_extracting(memory, facts)
        assert not first.done()
        [recorded] = await memory.store.pending_forgets()
        assert (recorded.tenant, recorded.user_id, recorded.chat_id) == ("t", "ann", None)
        await asyncio.wait_for(first, WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert await memory.store.pending_forgets() == []
        await nothing_left(memory)
        later = await memory.ingest(ann("3", "I adopted a greyhound named Pixel."))
        await memory.settle()
        assert later.stored
        assert [r.message_ids for r in await everything(memory)] == [["3"]]


async def test_a_forget_from_hooks_does_not_wait_for_other_users_messages_in_other_chats(
    tmp_path: Path,
) -> None:
    facts = SlowFacts(about="Acme")
    async with open_memory(tmp_path / "m", plugins=[facts, ForgetMeCommand()]) as memory:
        text = "I work at Acme Bank as an analyst."
        bob = msg("1", text, user="bob", chat="dm-bob", tenant="t", speaker="Bob")
        first = asyncio.ensure_future(memory.ingest(bob))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        asking = forget_me("2")
        await asyncio.wait_for(memory.ingest(asking), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert not first.done()  # finished without waiting for Bob's slow hooks
        assert await memory.store.pending_forgets() == []
        await asyncio.wait_for(first, WAIT)
        await memory.settle()
        assert [r.message_ids for r in await everything(memory)] == [["1"]]
        assert (await graph_of(memory))["nodes"] > 0


async def test_a_reply_written_after_a_forget_from_hooks_keeps_none_of_the_forgotten_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's reply in the group has its keyword context (with Ann's words) made and is about to be
    written when Ann's forget runs from hooks; the forget is finished after the reply is written."""
    entered, release = asyncio.Event(), asyncio.Event()
    enter = Fence.enter

    async def held_for_bob(self: Fence, **kwargs: Any) -> int:
        number = await enter(self, **kwargs)
        if any(user == "bob" for _, user, _ in kwargs.get("scopes") or ()):
            entered.set()
            await release.wait()
        return number

    monkeypatch.setattr(Fence, "enter", held_for_bob)
    async with open_memory(tmp_path / "m", plugins=[ForgetMeCommand()]) as memory:
        said = msg("a1", "my zqsecret99 plan is to move to Oslo", user="ann", chat="g", tenant="t")
        await memory.ingest(said)
        reply = msg("b1", "sounds like a great plan, go for it", user="bob", chat="g", tenant="t")
        bob = asyncio.ensure_future(memory.ingest(reply))
        await asyncio.wait_for(entered.wait(), WAIT)
        asking = forget_me("a2", chat="dm")
        await asyncio.wait_for(memory.ingest(asking), WAIT)
        release.set()
        await asyncio.wait_for(bob, WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        await only_left(memory, "b1", without="zqsecret99")


async def test_a_forget_from_hooks_waits_for_hooks_scheduled_after_it_by_messages_under_way(
    tmp_path: Path,
) -> None:
    """Answered before their hooks: a batch of Ann's is still being embedded (its unit under way)
    when her forget runs from hooks, and schedules its hooks after the forget's own."""
    facts = SlowFacts(about="Acme")
    async with open_memory(
        tmp_path / "m", storage={"acknowledge": "after_write"}, plugins=[facts, ForgetMeCommand()]
    ) as memory:
        slow_embedding(memory, "Acme", 0.2)
        notes = [ann(f"x{i}", f"note number {i} about my week in town") for i in range(11)]
        first = asyncio.ensure_future(
            memory.ingest_many([ann("1", "I work at Acme Bank as an analyst."), *notes])
        )
        await asyncio.sleep(0.02)
        asking = forget_me("2")
        await asyncio.wait_for(memory.ingest(asking), WAIT)
        await asyncio.wait_for(first, WAIT)
        await extracted_then_gone(memory, facts)


async def test_a_message_of_the_scope_written_before_the_forget_is_finished_goes_with_its_facts(
    tmp_path: Path,
) -> None:
    """Ann writes again while her forget from hooks waits to be finished: that message is deleted
    when it is (the documented cost), and only once its own hooks have ended, so its fact goes
    too; Bob's reply to it keeps none of its words, nor does Bob's next message."""
    facts = SlowFacts(about="Acme")
    async with open_memory(tmp_path / "m", plugins=[facts, ForgetMeCommand()]) as memory:
        first = await forgotten_while_extracting(memory, facts)
        assert not first.done()
        facts.started.clear()
        again = msg(
            "a3", "my zqsecret77 plan: Acme Bank Oslo", user="ann", chat="g", tenant="t", speaker="Ann"
        )
        later = asyncio.ensure_future(memory.ingest(again))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        await memory.ingest(
            msg("b4", "sounds like a great plan", user="bob", chat="g", tenant="t", speaker="Bob")
        )
        await asyncio.wait_for(asyncio.gather(first, later), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert await memory.store.pending_forgets() == []
        await memory.ingest(
            msg("b5", "I am planning a trip to Lisbon next month", user="bob", chat="g", tenant="t")
        )
        records = await everything(memory)
        assert sorted(r.message_ids[0] for r in records) == ["b4", "b5"]
        assert all("zqsecret77" not in (r.context_text or "") + r.text for r in records)
        assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}


async def test_asking_twice_to_be_forgotten_on_receipt_does_not_hang(tmp_path: Path) -> None:
    """On receipt: Ann asks to be forgotten while her first message's hooks run, writes again,
    and once the forget waits to be finished asks again, a request slow to embed. The forget is
    finished while that request is being written: its entry stays (it came after the forget), so
    its write does not forget it again and wait for the hooks that forget, which wait for that
    write."""
    facts = SlowFacts(about="Acme")
    async with open_memory(
        tmp_path / "m", storage={"acknowledge": "on_receipt"}, plugins=[facts, ForgetMeCommand()]
    ) as memory:
        embedding = slow_embedding(memory, "now please", 0.4)
        await memory.ingest(ann("1", "I work at Acme Bank as an analyst."))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        await memory.ingest(msg("2", "Please forget me, all of it.", user="ann", chat="other", tenant="t"))
        await memory.ingest(msg("2b", "Acme Bank gave me a raise.", user="ann", chat="dm2", tenant="t"))
        # The forget waits to be finished once its job is recorded (a state of the store, no event).
        while not await memory.store.pending_forgets():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        await memory.ingest(msg("3", "forget me now please", user="ann", chat="again", tenant="t"))
        await asyncio.wait_for(embedding.wait(), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        await nothing_left(memory)


async def test_a_forget_from_hooks_cut_short_is_finished_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops before the forget from hooks is finished: its recorded job is finished
    by the next open, what the scope wrote meanwhile included."""
    from narrmem.forgetting import Forgetting

    async def stopped(self: Forgetting, job: Any, ends: Any) -> None:
        await asyncio.gather(*(asyncio.shield(end) for end in ends))

    with monkeypatch.context() as patched:
        patched.setattr(Forgetting, "_finish_after", stopped)
        # The facts come after the forget however slow the machine (a fixed 0.3 s was not always).
        facts = SlowFacts(about="Acme", release=asyncio.Event())
        async with open_memory(tmp_path / "m", plugins=[facts, ForgetMeCommand()]) as memory:
            first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
            await asyncio.wait_for(facts.started.wait(), WAIT)
            await memory.ingest(msg("2", "Please forget me.", user="ann", chat="other", tenant="t"))
            assert facts.release is not None
            facts.release.set()
            await memory.ingest(
                msg("a3", "my zqsecret77 plan is Oslo", user="ann", chat="g", tenant="t", speaker="Ann")
            )
            await memory.ingest(
                msg("b4", "sounds like a great plan", user="bob", chat="g", tenant="t", speaker="Bob")
            )
            await asyncio.wait_for(first, WAIT)
            await memory.settle()
            assert len(await memory.store.pending_forgets()) == 1
            assert (await graph_of(memory))["nodes"] > 0
    async with open_memory(tmp_path / "m", plugins=[SlowFacts(about="Acme"), ForgetMeCommand()]) as memory:
        assert await memory.store.pending_forgets() == []
        assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}
        await only_left(memory, "b4", without="zqsecret77")


async def test_settling_does_not_wait_for_a_forget_waiting_for_a_message_whose_hooks_wait_for_it(
    tmp_path: Path,
) -> None:
    """Bob's hooks, in a group Ann wrote in, wait for code that settles first; Ann's forget from
    hooks waits for Bob's message. Settling skips a forget that waits for messages under way, as
    it skips the calls not yet answered."""
    waiting = WaitsForANote("bob")
    async with open_memory(tmp_path / "m", plugins=[waiting, ForgetMeCommand()]) as memory:
        await memory.ingest(msg("a1", "I love the harbour at dawn", user="ann", chat="g", tenant="t"))
        reply = msg("b1", "me too, so calm", user="bob", chat="g", tenant="t")
        bob = asyncio.ensure_future(memory.ingest(reply))
        await asyncio.wait_for(waiting.started.wait(), WAIT)
        await memory.ingest(msg("a2", "Please forget me, all of it.", user="ann", chat="dm", tenant="t"))
        try:
            await asyncio.wait_for(memory.settle(), WAIT)
            assert len(await memory.store.pending_forgets()) == 1  # still waiting for Bob's message
        finally:
            waiting.note_written.set()
        await asyncio.wait_for(bob, WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert await memory.store.pending_forgets() == []
        assert [r.message_ids for r in await everything(memory)] == [["b1"]]


class ForgetHoldingItsOwnLock(ForgetMeCommand):
    """A plugin that holds a lock of its own around its after-store work and forgets inside it:
    the forgetting message takes the lock first, and another message's hooks wait for it."""

    narrmem_name = "forget_holding_its_own_lock"

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.holding, self.go, self.waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @hookimpl
    async def narrmem_after_store(self, memory: Any, message: Message) -> None:
        if "forget me" not in message.text:
            self.waiting.set()  # and waits for the lock at once
        async with self.lock:
            if "forget me" in message.text:
                self.holding.set()
                await self.go.wait()
                await memory.forget(user_id=message.user_id, tenant=message.tenant)


async def test_a_forget_from_hooks_under_a_plugins_own_lock_does_not_hang(tmp_path: Path) -> None:
    """A forget that waited for the messages begun before it would wait for the first message,
    whose hooks wait for the lock the forgetting hooks hold."""
    plugin = ForgetHoldingItsOwnLock()
    async with open_memory(tmp_path / "m", plugins=[plugin]) as memory:
        asking = forget_me("2")
        forgetting = asyncio.ensure_future(memory.ingest(asking))
        await asyncio.wait_for(plugin.holding.wait(), WAIT)
        first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(plugin.waiting.wait(), WAIT)
        assert plugin.lock.locked() and not first.done()
        plugin.go.set()
        await asyncio.wait_for(asyncio.gather(forgetting, first), WAIT)
        await asyncio.wait_for(memory.settle(), WAIT)
        assert await everything(memory) == []


class WaitsForANote:
    """After-store hooks that, for messages of ``user``, wait until the bot's note is written."""

    narrmem_name = "waits_for_a_note"

    def __init__(self, user: str) -> None:
        self.user = user
        self.started, self.forgetting, self.note_written = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @hookimpl
    async def narrmem_after_store(self, message: Message) -> None:
        if message.user_id == self.user:
            self.started.set()
            await self.note_written.wait()

    @hookimpl
    def narrmem_after_forget(self) -> None:
        self.forgetting.set()


async def test_hooks_waiting_for_an_ingest_begun_during_a_forget_from_hooks_dont_hang(tmp_path: Path) -> None:
    """Ann's first message's hooks wait for a message ingested from outside every message, which
    begins while her second message's hooks forget her: that ingest waits for the forget, and the
    forget does not wait for the first message."""
    waiting = WaitsForANote("ann")
    async with open_memory(tmp_path / "m", plugins=[waiting, ForgetMeCommand()]) as memory:
        first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(waiting.started.wait(), WAIT)

        async def from_outside() -> None:
            await waiting.forgetting.wait()
            await memory.ingest(msg("3", "a note the bot keeps", user="bot", chat="notes", tenant="t"))
            waiting.note_written.set()

        outside = asyncio.ensure_future(from_outside())
        asking = forget_me("2")
        try:
            await asyncio.wait_for(asyncio.gather(first, memory.ingest(asking), outside), WAIT)
        finally:
            waiting.note_written.set()
        await asyncio.wait_for(memory.settle(), WAIT)
        assert [r.message_ids for r in await everything(memory)] == [["3"]]


async def test_a_forget_from_hooks_finished_later_holds_no_other_message_back(tmp_path: Path) -> None:
    """Bob's hooks wait for a note the bot ingests from outside once Ann's first message has
    ended, while Ann's forget from hooks waits to be finished. The finishing does not wait for
    Bob's message nor hold the note back (an ordinary forget would do both, and hang)."""
    facts, waiting = SlowFacts(about="Acme"), WaitsForANote("bob")
    async with open_memory(tmp_path / "m", plugins=[facts, waiting, ForgetMeCommand()]) as memory:
        first = asyncio.ensure_future(memory.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        bob = msg("b", "I am planning a trip to Lisbon next month.", user="bob", chat="dm-bob", tenant="t")
        bobs = asyncio.ensure_future(memory.ingest(bob))
        await asyncio.wait_for(waiting.started.wait(), WAIT)
        asking = forget_me("2")
        await asyncio.wait_for(memory.ingest(asking), WAIT)

        async def from_outside() -> None:
            await first
            await asyncio.sleep(0.05)
            await memory.ingest(msg("3", "a note the bot keeps", user="bot", chat="notes", tenant="t"))
            waiting.note_written.set()

        outside = asyncio.ensure_future(from_outside())
        try:
            await asyncio.wait_for(asyncio.gather(bobs, outside), WAIT)
        finally:
            waiting.note_written.set()
        await asyncio.wait_for(memory.settle(), WAIT)
        assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}
        assert sorted(r.message_ids[0] for r in await everything(memory)) == ["3", "b"]


class LeavesATaskRunning:
    """After-store hooks that start a task and return without waiting for it (a plugin's work
    for later): once ``go`` is set, the task ingests a message of Ann's, or settles."""

    narrmem_name = "leaves_a_task_running"

    def __init__(self, work: str) -> None:
        self.work = work
        self.go = asyncio.Event()
        self.order: list[str] = []
        self.task: asyncio.Task[None] | None = None

    @hookimpl
    async def narrmem_after_store(self, memory: Any, message: Message) -> None:
        if message.text.startswith("start"):
            self.task = asyncio.get_running_loop().create_task(self.later(memory))

    async def later(self, memory: Any) -> None:
        await self.go.wait()
        if self.work == "ingest":
            await memory.ingest(ann("2", "I adopted a greyhound named Pixel."))
        else:
            await memory.settle()
        self.order.append(self.work)


async def test_a_task_that_hooks_left_running_is_fenced_once_they_have_ended(tmp_path: Path) -> None:
    """The task ingests while a forget waits for a message under way (Bob's slow hooks): it no
    longer passes the fence as the hooks that started it did, so its message is stored after the
    forget, and kept."""
    facts = SlowFacts(about="Acme")
    later = LeavesATaskRunning("ingest")
    async with open_memory(tmp_path / "m", plugins=[facts, later]) as memory:
        await memory.ingest(ann("1", "start of a long story"))
        bob = msg("b1", "I work at Acme Bank as an analyst.", user="bob", chat="dm-bob", tenant="t")
        first = asyncio.ensure_future(memory.ingest(bob))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        forget.add_done_callback(lambda _: later.order.append("forget"))
        await asyncio.sleep(0.05)
        later.go.set()
        assert later.task is not None
        await asyncio.wait_for(asyncio.gather(first, forget, later.task), WAIT)
        await memory.settle()
        # Ann's "2" is kept: stored after her forget (before it, the forget took it). Which call
        # returns first says nothing: on a store shared by processes the forget's purge runs once
        # the fence is open again, and under load the ingest it let in returned before it.
        assert sorted(later.order) == ["forget", "ingest"]
        assert sorted(r.message_ids[0] for r in await everything(memory) if r.kind == "episode") == [
            "2",
            "b1",
        ]


async def test_a_task_that_a_batchs_hooks_left_running_settles_as_any_caller(tmp_path: Path) -> None:
    """Answered before their hooks: the task settles after the batch that started it has ended,
    while a later message's slow hooks run; it waits for them (inside the batch's hooks settling
    returns at once, and before, the task kept that)."""
    facts = SlowFacts(about="Acme")
    later = LeavesATaskRunning("settle")
    async with open_memory(
        tmp_path / "m", storage={"acknowledge": "after_write"}, plugins=[facts, later]
    ) as memory:
        await memory.ingest(ann("1", "start of a long story"))
        await memory.settle()
        await memory.ingest(ann("3", "I work at Acme Bank as an analyst."))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        later.go.set()
        assert later.task is not None
        await asyncio.wait_for(later.task, WAIT)
        assert (await graph_of(memory))["edges"] == {"active": 1}  # the slow fact is in


class SlowScrubber:
    """A plugin whose copies take a moment to scrub (a remote index, say), registered so that it
    scrubs before the graph does."""

    narrmem_name = "slow_scrubber"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    @hookimpl(tryfirst=True)
    async def narrmem_after_forget(self) -> None:
        self.started.set()
        await asyncio.sleep(0.2)


async def test_a_forget_whose_caller_gives_up_still_scrubs_every_plugin(tmp_path: Path) -> None:
    """A bot's handler wraps the forget in a timeout. Cancelled in the middle of the plugins'
    scrubbing, the forget left Ann's facts in the graph, recalled for her, until the next open."""
    scrubber = SlowScrubber()
    async with open_memory(tmp_path / "m", plugins=[scrubber]) as memory:
        await memory.ingest(ann("1", "I work at Acme Bank as an analyst."))
        await memory.call_tool(
            "memory_commit",
            {
                "triplets": [{"subject": "user", "relation": "works_at", "object": "Acme Bank"}],
                "user_id": "ann",
                "chat_id": "dm",
                "tenant": "t",
            },
        )
        assert (await graph_of(memory))["nodes"] > 0
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(scrubber.started.wait(), WAIT)
        forget.cancel()  # the caller gives up while the scrubbing is under way
        with pytest.raises(asyncio.CancelledError):
            await forget
        await asyncio.sleep(0.4)  # no open, no settle: the forget ends on its own
        assert await memory.store.pending_forgets() == []
        await nothing_left(memory)


@pytest.mark.parametrize("acknowledge", MODES)
async def test_an_edit_under_way_when_its_person_is_forgotten_leaves_nothing(
    tmp_path: Path, acknowledge: str
) -> None:
    """Ann edits a message while Bob's slow fact extractor holds the edit's forget of the old text
    (it waits for the writes begun before it); then she asks to be forgotten. The new text, sent
    before her forget, is not written after it. Before, the edit's ingest of the new text began
    once its own forget had ended, after hers had begun, and the new text outlived her forget."""
    release = asyncio.Event()
    facts = SlowFacts(about="Acme", release=release)
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[facts]) as memory:
        await memory.ingest(ann("1", "My dentist appointment is on Monday at ten."))
        bob = msg("b1", "I work at Acme Bank as an analyst.", user="bob", chat="dm-bob", tenant="t")
        first = asyncio.ensure_future(memory.ingest(bob))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        edit = asyncio.ensure_future(memory.edit(ann("1", "My dentist appointment moved to Tuesday at ten.")))
        await asyncio.sleep(0.05)
        forget = asyncio.ensure_future(memory.forget(user_id="ann", tenant="t"))
        # Time for the forget to reach the fence (on PostgreSQL, to wait at the gate between
        # workers the edit's own forget holds): 0.05 s was too short once with a whole suite
        # beside it, and the edit was written before the forget was asked.
        await asyncio.sleep(0.3)
        release.set()
        result = await asyncio.wait_for(edit, WAIT)
        await asyncio.wait_for(asyncio.gather(first, forget), WAIT)
        await memory.settle()
        assert not result.stored
        assert [r.user_id for r in await everything(memory)] == ["bob"]
        assert await memory.recall("dentist Tuesday", user_id="ann", tenant="t") == []


@pytest.mark.parametrize("acknowledge", MODES[1:])
async def test_a_forget_whose_caller_gave_up_is_done_though_the_memory_closes_at_once(
    tmp_path: Path, acknowledge: str
) -> None:
    """A bot's shutdown: the forget's caller is cancelled (its timeout, Ctrl-C) while the forget
    waits for a message's hooks, and the memory is closed next. The close shut the store under the
    forget before its job was recorded: nothing was owed, and the person's words were all kept."""
    release = asyncio.Event()
    facts = SlowFacts(release=release)
    async with open_memory(tmp_path / "m", storage={"acknowledge": acknowledge}, plugins=[facts]) as memory:
        await memory.ingest(ann("1", "I work at a bank downtown and I love it"))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(memory.forget(user_id="ann", tenant="t"), 0.05)
        asyncio.get_running_loop().call_later(0.3, release.set)
    async with open_memory(tmp_path / "m", plugins=[SlowFacts()]) as memory:
        await nothing_left(memory)
        assert await memory.store.pending_forgets() == []


class HangsOn:
    """A plugin whose before-store hook never returns for a text that says so."""

    narrmem_name = "hangs_on"

    def __init__(self) -> None:
        self.never = asyncio.Event()

    @hookimpl
    async def narrmem_before_store(self, message: Message) -> None:
        if "HANG" in message.text:
            await self.never.wait()


async def test_a_close_behind_an_edit_a_plugin_holds_ends_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An edit whose caller gave up, held by a plugin that never returns: the close waited for it
    for ever, silently, and no cancel could end it."""
    from narrmem import lifecycle

    monkeypatch.setattr(lifecycle, "PURGE_WAIT_S", 0.3)
    async with open_memory(tmp_path / "m", plugins=[HangsOn()]) as memory:
        await memory.ingest(ann("1", "I adopted a greyhound named Rex"))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(memory.edit(ann("1", "HANG I adopted a whippet")), 0.3)
        with caplog.at_level("WARNING", logger="narrmem"):
            await asyncio.wait_for(memory.close(), WAIT)
    assert any("edit(s) whose callers gave up" in r.getMessage() for r in caplog.records)
