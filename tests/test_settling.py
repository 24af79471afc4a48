"""``[storage] acknowledge = "after_write"``: ingest returns once a message is written and its
after-store hooks run afterwards, in order; what they need is written with the message, so a
process that stops first has them run at the next open (and not while their process runs, on a
shared PostgreSQL store); a forget drops them. Real model, real SQLite file, real PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _helpers import msg, run_python
from _postgres import fresh_database

from narrmem import hookimpl
from narrmem.clock import ManualClock
from narrmem.models import IngestResult, Message, TriageDecision, TriggerEvent
from narrmem.settling import NAMESPACE, _entry
from narrmem.testing import open_memory

START = datetime(2026, 7, 1, 9, tzinfo=UTC)
TIRED = ["so tired today", "so tired again today", "still so tired today"]
AFTER_WRITE = {"acknowledge": "after_write"}


def tired(user: str = "ann", first: int = 0) -> list[dict[str, Any]]:
    return [
        msg(f"{user}-{i}", text, user=user, chat=f"dm-{user}", ts=(START + timedelta(hours=i)).isoformat())
        for i, text in enumerate(TIRED, start=first)
    ]


class Recorder:
    """Writes down each after-store call it sees; waits for ``gate`` first when given one."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.seen: list[tuple[str, str, str]] = []

    @hookimpl
    async def narrmem_after_store(
        self, message: Message, decision: TriageDecision, result: IngestResult
    ) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.seen.append((message.message_id, message.text, decision.layer))


async def test_ingest_answers_once_written_and_the_hooks_follow_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    fired: list[TriggerEvent] = []
    clock = ManualClock(START + timedelta(days=1))
    async with open_memory(
        tmp_path, real_model=True, plugins=[recorder], storage=AFTER_WRITE, clock=clock
    ) as memory:

        async def callback(event: TriggerEvent) -> None:
            fired.append(event)

        memory.on_trigger(callback)
        results = [await memory.ingest(m) for m in tired()]
        assert all(r.stored and not r.settled and r.memory_ids for r in results)
        assert all(r.counts == [] and r.triggers == [] for r in results)  # the hooks' part comes later
        await memory.settle()
        assert [mid for mid, _, _ in recorder.seen] == ["ann-0", "ann-1", "ann-2"]  # in write order
        assert [(e.kind, e.label, e.count) for e in fired] == [("emotion", "tired", 3)]
        assert await memory.store.state_items(NAMESPACE) == []  # settled: nothing left to run
        # What the hooks wrote is there as with the default: the readout and the mood's scene.
        counts = (await memory.patterns(user_id="ann"))["counts"]
        assert ("emotion", "tired", 3) in {(c["kind"], c["label"], c["count"]) for c in counts}


async def test_the_default_answers_after_the_hooks(tmp_path: Path) -> None:
    async with open_memory(tmp_path, real_model=True) as memory:
        results = await memory.ingest_many(tired())
    assert all(r.settled for r in results)
    assert any(t.kind == "emotion" for t in results[-1].triggers)


STOPPING_WORKER = textwrap.dedent(
    """
    import asyncio, os, sys
    from narrmem import hookimpl
    from narrmem.testing import open_memory

    class Stuck:
        @hookimpl
        async def narrmem_after_store(self):
            await asyncio.Event().wait()  # never returns: the process stops first

    async def main():
        memory = await open_memory(sys.argv[1], real_model=True, plugins=[Stuck()],
                                   storage={"acknowledge": "after_write"}).__aenter__()
        result = await memory.ingest({"text": "so tired today, the move wore me out", "user_id": "ann",
                                      "chat_id": "dm-ann", "ts": "2026-07-01T09:00:00+00:00",
                                      "message_id": "ann-9", "meta": {"display_name": "Ann"}})
        print(result.stored, result.settled, flush=True)
        os._exit(0)  # a crash: no close, the hooks never ran

    asyncio.run(main())
    """
)


async def test_hooks_a_stopped_process_left_run_at_the_next_open(tmp_path: Path) -> None:
    out = await run_python(STOPPING_WORKER, str(tmp_path))
    assert out.split() == ["True", "False"]
    with sqlite3.connect(tmp_path / "narrmem.sqlite3") as db:
        left = db.execute("SELECT key, value FROM plugin_state WHERE namespace = ?", (NAMESPACE,)).fetchall()
    assert len(left) == 1
    # No text of the message in it (the mood label "tired" is triage's, not a quote).
    assert "move" not in left[0][1] and "wore" not in left[0][1] and "today" not in left[0][1]

    recorder = Recorder()
    async with open_memory(tmp_path, real_model=True, plugins=[recorder]) as memory:
        assert recorder.seen == [("ann-9", "so tired today, the move wore me out", "accumulate")]
        assert await memory.store.state_items(NAMESPACE) == []
    # Run once: the next open finds nothing to do.
    again = Recorder()
    async with open_memory(tmp_path, real_model=True, plugins=[again]):
        assert again.seen == []


KILLED_IN_ITS_HOOKS = textwrap.dedent(
    """
    import asyncio, os, sys
    from narrmem import hookimpl
    from narrmem.testing import open_memory

    class Killed:
        @hookimpl(tryfirst=True)
        async def narrmem_after_store(self):
            os._exit(0)  # killed as the hooks begin: before the graph's facts, the counts...

    async def main():
        memory = await open_memory(sys.argv[1], plugins=[Killed()]).__aenter__()
        await memory.ingest({"text": "I live in Porto now.", "user_id": "ann", "chat_id": "dm-ann",
                             "ts": "2026-07-01T09:00:00+00:00", "message_id": "ann-9"})

    asyncio.run(main())
    """
)


async def test_with_the_default_acknowledgement_hooks_a_killed_process_left_run_at_the_next_open(
    tmp_path: Path,
) -> None:
    """The default answers after the hooks; a process killed while they run answered nothing, but
    the message is written: the next open runs its hooks (the graph's fact is there), once. Before,
    they never ran, and the message sent again was a duplicate."""
    await run_python(KILLED_IN_ITS_HOOKS, str(tmp_path))
    recorder = Recorder()
    async with open_memory(tmp_path, plugins=[recorder]) as memory:
        assert recorder.seen == [("ann-9", "I live in Porto now.", "accumulate")]
        assert await memory.store.state_items(NAMESPACE) == []
        facts = await memory.call_tool("memory_recall", {"user_id": "ann", "query_intent": "Porto"})
        assert "lives_in Porto" in facts["rendered"]
        again = await memory.ingest(msg("ann-9", "I live in Porto now.", user="ann", chat="dm-ann"))
        assert again.duplicate
    rerun = Recorder()
    async with open_memory(tmp_path, plugins=[rerun]):
        assert rerun.seen == []


async def test_a_forget_drops_the_entries_of_what_it_forgets(tmp_path: Path) -> None:
    async with open_memory(tmp_path, real_model=True) as memory:
        await memory.ingest_many([*tired("ann"), *tired("bob")])
        # As a process that stopped before its hooks ran would have left them:
        for user in ("ann", "bob"):
            message = Message.model_validate(tired(user)[0])
            decision = TriageDecision(layer="accumulate")
            await memory.store.state_put(NAMESPACE, f"gone:000000000000:{user}", _entry(message, decision))
        await memory.forget(user_id="ann")
        left = await memory.store.state_items(NAMESPACE)
    assert [value["user_id"] for _, value in left] == ["bob"]


async def test_on_a_shared_store_a_running_workers_hooks_are_not_run_by_another(tmp_path: Path) -> None:
    """PostgreSQL, two workers: A's hooks are held back; B opens meanwhile and must leave A's
    entries to A (A is alive). Once A's hooks run, the entries are gone."""
    dsn = await fresh_database("settling")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": "after_write"}
    gate = asyncio.Event()
    held = Recorder(gate)
    async with open_memory(tmp_path / "a", real_model=True, plugins=[held], storage=storage) as a:
        result = await a.ingest(tired()[0])
        assert result.stored and not result.settled
        assert len(await a.store.state_items(NAMESPACE)) == 1
        other = Recorder()
        async with open_memory(tmp_path / "b", real_model=True, plugins=[other], storage=storage) as b:
            assert other.seen == []
            assert len(await b.store.state_items(NAMESPACE)) == 1
        gate.set()
        await a.settle()
        assert held.seen == [("ann-0", "so tired today", "accumulate")]
        assert await a.store.state_items(NAMESPACE) == []


async def test_an_import_runs_ahead_of_its_hooks_by_a_bounded_number_of_messages(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """With the hooks held back, ``ingest_many`` stops once more than ``MAX_UNSETTLED`` messages
    wait for theirs, and goes on as they run."""
    import narrmem.settling as settling

    monkeypatch.setattr(settling, "MAX_UNSETTLED", 2)
    gate = asyncio.Event()
    recorder = Recorder(gate)
    storage = {**AFTER_WRITE, "batch_size": 1}
    messages = [*tired("ann"), *tired("bob")]
    async with open_memory(tmp_path, real_model=True, plugins=[recorder], storage=storage) as memory:
        importing = asyncio.ensure_future(memory.ingest_many(messages))
        for _ in range(600):  # the first three written, their hooks held: the import waits
            if len(await memory.store.state_items(NAMESPACE)) >= 3:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert not importing.done()
        assert len(await memory.store.state_items(NAMESPACE)) == 3
        gate.set()
        results = await importing
        await memory.settle()
    assert all(r.stored and not r.settled for r in results)
    assert [mid for mid, _, _ in recorder.seen] == [m["message_id"] for m in messages]


async def test_concurrent_ingests_each_settle_once(tmp_path: Path) -> None:
    """Thirty messages of three chats at once, answered once written: every one's hooks run, once,
    and an edit in between waits for none of them to be lost."""
    recorder = Recorder()
    messages = [
        msg(f"{user}-{i}", f"{user} finished chapter {i} of the novel today", user=user, chat=f"dm-{user}")
        for user in ("ann", "bob", "cid")
        for i in range(10)
    ]
    async with open_memory(tmp_path, real_model=True, plugins=[recorder], storage=AFTER_WRITE) as memory:
        results = await asyncio.gather(*(memory.ingest(m) for m in messages))
        edited = await memory.edit(
            msg("ann-3", "ann abandoned the novel at chapter 3", user="ann", chat="dm-ann")
        )
        await memory.settle()
        assert await memory.store.state_items(NAMESPACE) == []
    assert all(r.stored and not r.settled for r in results) and edited.stored
    seen = [mid for mid, _, _ in recorder.seen]
    assert sorted(seen) == sorted([m["message_id"] for m in messages] + ["ann-3"])
