"""A forget by one worker of a shared PostgreSQL store against the messages another worker is
writing at that moment: nothing the other worker's after-store hooks make outlives the forget, in
every acknowledge mode, and a message that worker begins during the forget is stored after it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _helpers import variants
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.workers_fence import GATE, UNITS
from test_forget_in_flight import SlowFacts, TriggerAfterAWhile, ann, everything, graph_of, said_by

from narrmem import StoreUnavailableError, TriggerEvent, hookimpl, trying_again
from narrmem.errors import ClosedError
from narrmem.forgetting import PURGE_OWED
from narrmem.memory import Memory
from narrmem.models import Message
from narrmem.testing import open_memory

MODES = ["after_hooks", "after_write", "on_receipt"]
WAIT = 20.0  # seconds: a hang fails the test instead of the run
GATE_ASKED = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' "
    "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1"
)


FENCE_LOCKS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
    "AND (classid, objid) IN (($1::bigint::oid, $2::bigint::oid), ($3::bigint::oid, $4::bigint::oid))"
)


async def fence_unlocked(memory: Memory) -> None:
    """Until no session holds or waits for either lock of the fence between workers."""
    keys = [part for key in (GATE, UNITS) for part in ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)]
    pool: Any = memory.store.pool  # type: ignore[attr-defined]
    while True:
        if not await pool.fetchval(FENCE_LOCKS, *keys):
            return
        await asyncio.sleep(0.01)


async def forgets_at_the_gate(memory: Memory, n: int) -> None:
    """Until ``n`` forgets hold the gate of the fence between workers or wait for it."""
    high, low = (GATE >> 32) & 0xFFFFFFFF, GATE & 0xFFFFFFFF
    pool: Any = memory.store.pool  # type: ignore[attr-defined]
    while True:
        if await pool.fetchval(GATE_ASKED, high, low) >= n:
            return
        await asyncio.sleep(0.01)


def worker(folder: Path, storage: dict[str, Any], *plugins: object) -> Any:
    """A worker of the shared store: a memory of its own, with the real model."""
    return open_memory(folder, real_model=True, plugins=plugins, storage=storage)


@contextlib.asynccontextmanager
async def writer_and_forgetter(
    tmp_path: Path, facts: SlowFacts, acknowledge: str = "after_hooks"
) -> AsyncIterator[tuple[Memory, Memory]]:
    """Two workers of a new database: one whose fact extractor takes its time, one that forgets."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    async with worker(tmp_path / "a", storage, facts) as writer, worker(tmp_path / "b", storage) as forgetter:
        yield writer, forgetter


class Hold:
    """Holds a message until released: before its write (``stage="before_store"``, a text that
    starts with "HOLD") or in its after-store hooks (``"after_store"``, a text that names Acme)."""

    narrmem_name = "hold"

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def _hold(self) -> None:
        self.entered.set()
        await self.release.wait()

    @hookimpl(tryfirst=True)
    async def narrmem_triage(self, message: Message) -> None:
        if self.stage == "triage" and message.text.startswith("HOLD"):
            await self._hold()

    @hookimpl
    async def narrmem_before_store(self, message: Message) -> None:
        if self.stage == "before_store" and message.text.startswith("HOLD"):
            await self._hold()

    @hookimpl
    async def narrmem_after_store(self, message: Message) -> None:
        if self.stage == "after_store" and "Acme" in message.text:
            await self._hold()


@contextlib.asynccontextmanager
async def hooks_held_in_b(tmp_path: Path) -> AsyncIterator[tuple[Memory, Memory, Hold]]:
    """Workers A and B of a new database; B (answering once written) has stored Bob's message and
    its after-store hooks are held."""
    dsn = await fresh_database("across")
    hold = Hold("after_store")
    storage = {"backend": "postgres", "dsn": dsn}
    later = {"backend": "postgres", "dsn": dsn, "acknowledge": "after_write"}
    async with (
        worker(tmp_path / "a", storage) as a,
        worker(tmp_path / "b", later, hold) as b,
    ):
        bob = dict(ann("1", "I work at Acme Bank."), user_id="bob", speaker="Bob")
        await asyncio.wait_for(b.ingest(bob), WAIT)  # its hooks follow, held
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        yield a, b, hold


async def gate_asked(memory: Memory) -> None:
    """Until a forget holds the gate of the fence between workers, or waits for it."""
    await forgets_at_the_gate(memory, 1)


async def forget_waiting(memory: Memory, forget: asyncio.Future[Any]) -> None:
    """Until ``memory``'s forget waits at the gate of the fence between workers (or has ended)."""
    asked = asyncio.ensure_future(gate_asked(memory))
    try:
        await asyncio.wait_for(asyncio.wait([asked, forget], return_when=asyncio.FIRST_COMPLETED), WAIT)
    finally:
        asked.cancel()
    await asyncio.sleep(0.2)


async def b_forgets_ann_during(
    a: Memory, b: Memory, ingest: asyncio.Future[Any], release: asyncio.Event
) -> Any:
    """Worker B forgets Ann while her message (``ingest``) is on its way in worker A, held until
    ``release``: B's forget waits for it, and once it is written it goes with the forget, from
    both workers' view. Returns the ingest's result."""
    forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
    await forget_waiting(b, forget)
    assert not forget.done()  # it waits for the message on its way in A
    release.set()
    result = await asyncio.wait_for(ingest, WAIT)
    await asyncio.wait_for(forget, WAIT)
    await asyncio.wait_for(a.settle(), WAIT)
    for memory in (a, b):
        assert await everything(memory) == []
    return result


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_forget_by_another_worker_during_the_hooks_leaves_nothing_they_made(
    tmp_path: Path, acknowledge: str
) -> None:
    facts = SlowFacts()
    async with writer_and_forgetter(tmp_path, facts, acknowledge) as (writer, forgetter):
        ingest = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        await asyncio.wait_for(forgetter.forget(user_id="ann", tenant="t"), WAIT)
        await asyncio.wait_for(ingest, WAIT)
        await asyncio.wait_for(writer.settle(), WAIT)
        for memory in (writer, forgetter):
            assert await graph_of(memory) == {"nodes": 0, "edges": {}, "purges": 0}
            assert await everything(memory) == []


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_message_a_worker_begins_during_another_workers_forget_is_stored_after_it(
    tmp_path: Path, acknowledge: str
) -> None:
    facts = SlowFacts()
    async with writer_and_forgetter(tmp_path, facts, acknowledge) as (writer, forgetter):
        first = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        forget = asyncio.ensure_future(forgetter.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(forgetter), WAIT)
        await asyncio.sleep(0.1)
        assert not forget.done()  # it waits for the other worker's hooks under way
        after = await asyncio.wait_for(writer.ingest(ann("2", "I adopted a greyhound named Pixel.")), WAIT)
        # The second message waited for the forget's deletion (its vacuum may still run).
        assert ["1"] not in [r.message_ids for r in await everything(forgetter)]
        await asyncio.wait_for(forget, WAIT)
        await asyncio.wait_for(first, WAIT)
        await asyncio.wait_for(writer.settle(), WAIT)
        assert after.stored
        assert [r.message_ids for r in await everything(forgetter)] == [["2"]]
        # The second message's own fact is the only one: the first's went with the forget.
        assert (await graph_of(forgetter))["edges"] == {"active": 1}


async def test_a_worker_whose_fence_connection_ended_takes_the_fence_again(tmp_path: Path) -> None:
    """The connection that holds the fence ends (a restart, an idle timeout): the next message
    opens another, and a forget by another worker still waits for its hooks."""
    facts = SlowFacts()
    async with writer_and_forgetter(tmp_path, facts) as (writer, forgetter):
        await asyncio.wait_for(writer.ingest(ann("0", "I live in Lisbon with my sister.")), WAIT)
        fence: Any = writer.store.workers_fence()  # type: ignore[attr-defined]
        pid = fence._conn.get_server_pid()
        assert await forgetter.store.pool.fetchval("SELECT pg_terminate_backend($1)", pid)  # type: ignore[attr-defined]
        facts.started.clear()
        ingest = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        await asyncio.wait_for(forgetter.forget(user_id="ann", tenant="t"), WAIT)
        await asyncio.wait_for(ingest, WAIT)
        assert await graph_of(forgetter) == {"nodes": 0, "edges": {}, "purges": 0}
        assert await everything(forgetter) == []


@pytest.mark.parametrize("acknowledge", MODES)
async def test_two_workers_forgetting_at_once_while_each_writes_do_not_wait_for_each_other(
    tmp_path: Path, acknowledge: str
) -> None:
    """Each worker has a message's slow hooks under way and forgets the other's user: both
    forgets end, and neither user's fact is left."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    facts_a, facts_b = SlowFacts(), SlowFacts()
    async with (
        worker(tmp_path / "a", storage, facts_a) as a,
        worker(tmp_path / "b", storage, facts_b) as b,
    ):
        bob = dict(ann("2", "I work at Acme Bank as an analyst."), user_id="bob", speaker="Bob")
        writes = [
            asyncio.ensure_future(a.ingest(ann("1", "I work at Acme Bank as an analyst."))),
            asyncio.ensure_future(b.ingest(bob)),
        ]
        await asyncio.wait_for(asyncio.gather(facts_a.started.wait(), facts_b.started.wait()), WAIT)
        forgets = asyncio.gather(a.forget(user_id="bob", tenant="t"), b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(forgets, WAIT)
        await asyncio.wait_for(asyncio.gather(*writes), WAIT)
        for memory in (a, b):
            await asyncio.wait_for(memory.settle(), WAIT)
        assert await graph_of(a) == {"nodes": 0, "edges": {}, "purges": 0}
        assert await everything(a) == []


async def test_trigger_callbacks_that_forget_in_two_workers_at_once_do_not_wait_for_each_other(
    tmp_path: Path,
) -> None:
    """A forget from hooks waits for no other worker's units: two of them, each inside a message's
    hooks in its own worker, would otherwise each wait for the other's message."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    async with (
        worker(tmp_path / "a", storage, TriggerAfterAWhile()) as a,
        worker(tmp_path / "b", storage, TriggerAfterAWhile()) as b,
    ):
        forgot: list[str] = []
        for memory in (a, b):

            async def on_trigger(event: TriggerEvent, memory: Memory = memory) -> None:
                await memory.forget(user_id=event.user_id, tenant=event.tenant)
                forgot.append(event.user_id)

            memory.on_trigger(on_trigger)
        both = asyncio.gather(a.ingest(said_by("ann", "1")), b.ingest(said_by("bob", "2")))
        await asyncio.wait_for(both, WAIT)
        assert sorted(forgot) == ["ann", "bob"]
        assert await everything(a) == []


@pytest.mark.parametrize(
    ("stage", "acknowledge"),
    [
        ("triage", "after_hooks"),
        ("triage", "on_receipt"),
        ("before_store", "after_hooks"),
        ("before_store", "after_write"),
    ],
)
async def test_a_message_on_its_way_in_another_worker_does_not_outlive_a_forget(
    tmp_path: Path, stage: str, acknowledge: str
) -> None:
    """Ann's message is still in triage or a before-store hook (as it would be while embedding)
    in worker A when worker B forgets her. B's forget waits for it, and deletes it once written;
    before, nothing of it was under way in A's fence, so B's forget returned at once and the
    message was written after it, recalled for her afterwards."""
    dsn = await fresh_database("across")
    hold = Hold(stage)
    writer_storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    async with (
        worker(tmp_path / "a", writer_storage, hold) as a,
        worker(tmp_path / "b", {"backend": "postgres", "dsn": dsn}) as b,
    ):
        ingest = asyncio.ensure_future(a.ingest(ann("1", "HOLD my password is hunter2")))
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(b), WAIT)
        await asyncio.sleep(0.2)
        assert not forget.done()  # it waits for the message on its way in A
        hold.release.set()
        result = await asyncio.wait_for(ingest, WAIT)
        await asyncio.wait_for(forget, WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert result.stored  # written before the forget, which deleted it
        for memory in (a, b):
            assert await everything(memory) == []
            assert await memory.recall("password", user_id="ann", tenant="t") == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


class Nesting:
    """A before-store hook that, for a text starting "NEST", ingests a note of its own once let go
    (a plugin that files a reminder as it sees the message)."""

    narrmem_name = "nesting"

    def __init__(self) -> None:
        self.entered, self.go = asyncio.Event(), asyncio.Event()
        self.results: list[Any] = []

    @hookimpl
    async def narrmem_before_store(self, memory: Any, message: Message) -> None:
        if message.text.startswith("NEST"):
            self.entered.set()
            await self.go.wait()
            note = dict(ann(f"note-{message.message_id}", "Reminder: the dentist is Friday."), user_id="bot")
            self.results.append(await memory.ingest(note))


async def test_an_ingest_from_a_before_store_hook_during_another_workers_forget_does_not_hang(
    tmp_path: Path,
) -> None:
    """The batch holds the fence between workers while its before-store hook ingests: the nested
    ingest is covered by that hold (waiting at the gate, it would wait for the forget, which
    waits for the batch, which waits for its hook). The forget then deletes Ann's message."""
    dsn = await fresh_database("across")
    nesting = Nesting()
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage, nesting) as a, worker(tmp_path / "b", storage) as b:
        outer = asyncio.ensure_future(a.ingest(ann("1", "NEST my dentist appointment moved to Friday")))
        await asyncio.wait_for(nesting.entered.wait(), WAIT)
        forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(b), WAIT)
        nesting.go.set()
        result = await asyncio.wait_for(outer, WAIT)
        await asyncio.wait_for(forget, WAIT)
        assert result.stored and [r.stored for r in nesting.results] == [True]
        assert [r.user_id for r in await everything(b)] == ["bot"]  # Ann's went with the forget
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_ingest_cancelled_at_the_gate_leaves_no_lock_held(tmp_path: Path) -> None:
    """A bot gives up on a message that waits at the gate of another worker's forget: the fence's
    locks are all let go once the forget and the writes under way end, and both workers go on."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    facts = SlowFacts()
    async with (
        worker(tmp_path / "a", storage, facts) as writer,
        worker(tmp_path / "b", storage) as forgetter,
        worker(tmp_path / "c", storage) as third,
    ):
        await asyncio.wait_for(third.ingest(ann("0", "I live in Lisbon with my sister.")), WAIT)
        first = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        forget = asyncio.ensure_future(forgetter.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(forgetter), WAIT)
        bob = dict(ann("2", "I adopted a greyhound named Pixel."), user_id="bob", speaker="Bob")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(third.ingest(bob), 0.1)  # it waits at the gate
        await asyncio.wait_for(asyncio.gather(first, forget), WAIT)
        await asyncio.wait_for(fence_unlocked(forgetter), WAIT)
        later = await asyncio.wait_for(third.ingest(dict(bob, message_id="3")), WAIT)
        assert later.stored
        assert (await asyncio.wait_for(forgetter.forget(user_id="bob", tenant="t"), WAIT))["memories"] >= 1
        await asyncio.wait_for(fence_unlocked(forgetter), WAIT)


async def test_a_worker_closed_while_a_message_waits_to_be_written_leaves_no_lock_held(
    tmp_path: Path,
) -> None:
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    hold = Hold("before_store")
    async with (
        worker(tmp_path / "a", storage, hold) as closing,
        worker(tmp_path / "b", storage) as forgetter,
    ):
        await asyncio.wait_for(closing.ingest(ann("0", "I live in Lisbon with my sister.")), WAIT)
        ingest = asyncio.ensure_future(closing.ingest(ann("1", "HOLD I work at Acme Bank.")))
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        await asyncio.wait_for(closing.close(), WAIT)
        hold.release.set()
        with pytest.raises(ClosedError):
            await asyncio.wait_for(ingest, WAIT)
        await asyncio.wait_for(forgetter.forget(user_id="ann", tenant="t"), WAIT)
        await asyncio.wait_for(fence_unlocked(forgetter), WAIT)


async def test_an_ingest_cancelled_while_it_checks_the_gate_leaves_the_others_fenced(tmp_path: Path) -> None:
    """A message of a worker with another message's hooks under way is given up during its look
    at the gate: the other message stays fenced against another worker's forget."""
    facts = SlowFacts()
    async with writer_and_forgetter(tmp_path, facts) as (writer, forgetter):
        fence: Any = writer.store.workers_fence()  # type: ignore[attr-defined]
        first = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        bob = dict(ann("2", "I adopted a greyhound named Pixel."), user_id="bob", speaker="Bob")
        second = asyncio.ensure_future(writer.ingest(bob))
        while True:
            if fence._lock.locked():  # its look at the gate is under way
                break
            await asyncio.sleep(0)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        await asyncio.wait_for(forgetter.forget(user_id="ann", tenant="t"), WAIT)
        assert first.done()  # the forget waited for the first message's hooks
        assert await graph_of(forgetter) == {"nodes": 0, "edges": {}, "purges": 0}


async def test_a_forget_waiting_at_the_gate_does_not_unfence_its_workers_received_messages(
    tmp_path: Path,
) -> None:
    """Worker A answers on receipt. B's forget of Ann holds the gate while C's hooks run; A's own
    forget (of Bob) waits at the gate; then A writes Ann's received message. It is fenced against
    B's forget: none of it outlives that forget."""
    dsn = await fresh_database("across")
    facts, hold = SlowFacts(), Hold("before_store")
    slow = SlowFacts()
    on_receipt = {"backend": "postgres", "dsn": dsn, "acknowledge": "on_receipt"}
    storage = {"backend": "postgres", "dsn": dsn}
    async with (
        worker(tmp_path / "a", on_receipt, facts, hold) as a,
        worker(tmp_path / "b", storage) as b,
        worker(tmp_path / "c", storage, slow) as c,
    ):
        await asyncio.wait_for(a.ingest(ann("1", "HOLD I work at Acme Bank as an analyst.")), WAIT)
        await asyncio.wait_for(hold.entered.wait(), WAIT)  # A's writer is before its write
        carol = dict(ann("c1", "I work at Kew Gardens."), user_id="carol", speaker="Carol")
        c_ingest = asyncio.ensure_future(c.ingest(carol))
        await asyncio.wait_for(slow.started.wait(), WAIT)
        b_forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(forgets_at_the_gate(b, 1), WAIT)
        a_forget = asyncio.ensure_future(a.forget(user_id="bob", tenant="t"))
        await asyncio.wait_for(forgets_at_the_gate(b, 2), WAIT)
        hold.release.set()
        await asyncio.wait_for(asyncio.gather(b_forget, a_forget, c_ingest), WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert [r.user_id for r in await everything(b)] == ["carol"]
        assert (await graph_of(b))["edges"] == {"active": 1}  # Carol's fact alone


DYING_WORKER = """
import asyncio, os, sys
from narrmem import hookimpl
from narrmem.testing import open_memory

class NeverDone:
    narrmem_name = "never_done"

    @hookimpl
    async def narrmem_after_store(self):
        await asyncio.Event().wait()

async def main():
    storage = {"backend": "postgres", "dsn": sys.argv[2], "acknowledge": "after_write"}
    memory = await open_memory(sys.argv[1], real_model=True, plugins=[NeverDone()], storage=storage)
    result = await memory.ingest({"message_id": "1", "text": "I work at Acme Bank as an analyst.",
        "user_id": "ann", "chat_id": "dm", "tenant": "t", "speaker": "Ann",
        "ts": "2026-05-04T09:12:00+01:00"})
    print(result.stored, flush=True)
    os._exit(0)  # gone before its after-store hooks ran

asyncio.run(main())
"""


async def test_hooks_a_gone_worker_left_are_fenced_in_the_worker_that_runs_them(tmp_path: Path) -> None:
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": "after_write"}
    facts = SlowFacts()
    # Open before the worker goes, so that the next worker to open is the one that runs its hooks.
    async with worker(tmp_path / "b", storage) as forgetter:
        dying = await asyncio.create_subprocess_exec(
            sys.executable, "-c", DYING_WORKER, str(tmp_path / "gone"), dsn, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await asyncio.wait_for(dying.communicate(), 300)
        assert out.decode().split() == ["True"]
        opening = asyncio.ensure_future(worker(tmp_path / "c", storage, facts).__aenter__())
        await asyncio.wait_for(facts.started.wait(), WAIT)  # the next worker runs the hooks left
        await asyncio.wait_for(forgetter.forget(user_id="ann", tenant="t"), WAIT)
        assert opening.done()  # the forget waited for them
        async with await opening:
            assert await graph_of(forgetter) == {"nodes": 0, "edges": {}, "purges": 0}
            assert await everything(forgetter) == []


async def test_a_worker_closed_while_its_message_waits_at_the_gate_holds_no_lock(tmp_path: Path) -> None:
    """Worker A's message waits at the gate of B's forget, which waits for B's own hooks: A's close
    does not wait for B, and once B's hooks end nothing of A stays locked."""
    async with hooks_held_in_b(tmp_path) as (a, b, hold):
        forget = asyncio.ensure_future(b.forget(user_id="cid", tenant="t"))
        await asyncio.wait_for(gate_asked(b), WAIT)
        waiting = asyncio.ensure_future(a.ingest(ann("2", "I like tea with lemon.")))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # at the gate
        await asyncio.wait_for(a.close(), WAIT)
        hold.release.set()
        await asyncio.wait_for(forget, WAIT)
        with pytest.raises(ClosedError):
            await asyncio.wait_for(waiting, WAIT)
        await asyncio.wait_for(fence_unlocked(b), WAIT)
        await asyncio.wait_for(b.forget(user_id="ann", tenant="t"), WAIT)


async def test_an_ingest_cancelled_as_its_write_ends_ends_its_unit(tmp_path: Path) -> None:
    """The caller gives up in the moment the write ends, before the task that runs the hooks has
    started: the unit ends all the same, and no worker's forget waits for it for ever."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    async with (
        worker(tmp_path / "a", storage) as a,
        worker(tmp_path / "b", storage) as b,
    ):
        pipeline: Any = a._ingest
        finish = pipeline._finish

        async def finish_then_give_up(*args: Any, **kwargs: Any) -> Any:
            written = await finish(*args, **kwargs)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # the caller's timeout, due in the same turn of the loop
            return written

        pipeline._finish = finish_then_give_up
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(a.ingest(ann("1", "I work at Acme Bank.")), WAIT)
        pipeline._finish = finish
        await asyncio.wait_for(fence_unlocked(b), WAIT)
        await asyncio.wait_for(b.forget(user_id="ann", tenant="t"), WAIT)
        await asyncio.wait_for(a.forget(user_id="ann", tenant="t"), WAIT)


async def test_a_worker_closed_while_its_forget_waits_at_the_gate_lets_the_gate_go(tmp_path: Path) -> None:
    """A's forget waits for B's hooks; A closes: its forget ends with a ClosedError and its
    session with it, so B's own units are not held at a gate nobody will open."""
    async with hooks_held_in_b(tmp_path) as (a, b, hold):
        forget = asyncio.ensure_future(a.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(b), WAIT)
        await asyncio.wait_for(a.close(), WAIT)
        with pytest.raises(ClosedError):
            await asyncio.wait_for(forget, WAIT)
        tea = await asyncio.wait_for(b.ingest(ann("2", "I like tea with lemon.")), WAIT)
        assert tea.stored  # not held at the closed worker's gate
        hold.release.set()
        await asyncio.wait_for(b.settle(), WAIT)
        await asyncio.wait_for(fence_unlocked(b), WAIT)


class HoldLater(Hold):
    """A second hold, for a text that starts with "LATER", in triage."""

    narrmem_name = "hold_later"

    @hookimpl(tryfirst=True)
    async def narrmem_triage(self, message: Message) -> None:
        if message.text.startswith("LATER"):
            await self._hold()

    @hookimpl
    async def narrmem_before_store(self, message: Message) -> None:
        return None

    @hookimpl
    async def narrmem_after_store(self, message: Message) -> None:
        return None


async def test_a_message_on_its_way_while_its_worker_forgets_another_does_not_outlive_a_later_forget(
    tmp_path: Path,
) -> None:
    """Ann's message is in triage in worker A when A forgets Zed, a forget that does not wait for
    it. B then forgets Ann while the message is still on its way. B's forget waits for it and
    deletes it once written; before, A's forget had let the message's hold go for good, so B's
    forget returned at once and the message was written after it."""
    dsn = await fresh_database("across")
    hold = Hold("triage")
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage, hold) as a, worker(tmp_path / "b", storage) as b:
        ingest = asyncio.ensure_future(a.ingest(ann("1", "HOLD my password is hunter2")))
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        await asyncio.wait_for(a.forget(user_id="zed", tenant="t"), WAIT)  # waits for no batch of A's
        result = await b_forgets_ann_during(a, b, ingest, hold.release)
        assert result.stored  # written before B's forget, which deleted it
        for memory in (a, b):
            assert await memory.recall("password", user_id="ann", tenant="t") == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_a_message_begun_while_its_worker_forgets_does_not_outlive_a_later_forget(
    tmp_path: Path,
) -> None:
    """Worker A's forget of Bob waits for the hooks of Bob's message; Ann's message comes in
    meanwhile and stays in triage after that forget has ended. B then forgets Ann: B's forget waits
    for her message and deletes it once written."""
    dsn = await fresh_database("across")
    hooks, triage = Hold("after_store"), HoldLater("triage")
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage, hooks, triage) as a, worker(tmp_path / "b", storage) as b:
        bob = dict(ann("b1", "I work at Acme Bank."), user_id="bob", speaker="Bob")
        bob_ingest = asyncio.ensure_future(a.ingest(bob))
        await asyncio.wait_for(hooks.entered.wait(), WAIT)
        a_forget = asyncio.ensure_future(a.forget(user_id="bob", tenant="t"))
        await asyncio.sleep(0.1)
        assert not a_forget.done()  # it waits for Bob's hooks
        ingest = asyncio.ensure_future(a.ingest(ann("1", "LATER my password is hunter2")))
        await asyncio.wait_for(triage.entered.wait(), WAIT)
        hooks.release.set()
        await asyncio.wait_for(asyncio.gather(bob_ingest, a_forget), WAIT)
        result = await b_forgets_ann_during(a, b, ingest, triage.release)
        assert result.stored
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_two_forgets_in_a_worker_and_one_in_another_around_a_message_on_its_way_do_not_hang(
    tmp_path: Path,
) -> None:
    """Worker A forgets Zed and Yan at once while Ann's message is in its triage, and worker B
    forgets Ann: whatever order the three take the gate in, none waits for another for ever, B's
    forget waits for Ann's message, and Bob's message stays."""
    dsn = await fresh_database("across")
    hold = Hold("triage")
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage, hold) as a, worker(tmp_path / "b", storage) as b:
        bob = dict(ann("b1", "I adopted a greyhound named Pixel."), user_id="bob", speaker="Bob")
        await asyncio.wait_for(a.ingest(bob), WAIT)
        ingest = asyncio.ensure_future(a.ingest(ann("1", "HOLD my password is hunter2")))
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        forgets = [
            asyncio.ensure_future(a.forget(user_id="zed", tenant="t")),
            asyncio.ensure_future(a.forget(user_id="yan", tenant="t")),
            asyncio.ensure_future(b.forget(user_id="ann", tenant="t")),
        ]
        await asyncio.sleep(0.3)
        assert not forgets[2].done()  # B's waits for Ann's message
        hold.release.set()
        result = await asyncio.wait_for(ingest, WAIT)
        await asyncio.wait_for(asyncio.gather(*forgets), WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert result.stored
        assert [r.user_id for r in await everything(b)] == ["bob"]
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_ingest_from_a_before_store_hook_after_its_workers_forget_does_not_hang(
    tmp_path: Path,
) -> None:
    """Ann's batch is in a before-store hook in worker A when A forgets Zed; then B forgets Ann,
    and the hook ingests a note. The batch's hold, taken up again as A's forget ended, covers the
    note (at B's gate it would wait for B, which waits for the batch); Ann's message goes with
    B's forget and the note stays."""
    dsn = await fresh_database("across")
    nesting = Nesting()
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage, nesting) as a, worker(tmp_path / "b", storage) as b:
        outer = asyncio.ensure_future(a.ingest(ann("1", "NEST my dentist appointment moved to Friday")))
        await asyncio.wait_for(nesting.entered.wait(), WAIT)
        await asyncio.wait_for(a.forget(user_id="zed", tenant="t"), WAIT)
        forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await forget_waiting(b, forget)
        assert not forget.done()
        nesting.go.set()
        result = await asyncio.wait_for(outer, WAIT)
        await asyncio.wait_for(forget, WAIT)
        assert result.stored and [r.stored for r in nesting.results] == [True]
        assert [r.user_id for r in await everything(b)] == ["bot"]
        await asyncio.wait_for(fence_unlocked(b), WAIT)


class Naps:
    """Hooks that take their time now and then (a slow fact extractor, a service), by a seed."""

    narrmem_name = "naps"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    async def _nap(self) -> None:
        if self.rng.random() < 0.3:
            await asyncio.sleep(self.rng.uniform(0.0, 0.12))

    @hookimpl(tryfirst=True)
    async def narrmem_triage(self, message: Message) -> None:
        await self._nap()

    @hookimpl
    async def narrmem_before_store(self, message: Message) -> None:
        await self._nap()

    @hookimpl
    async def narrmem_after_store(self, message: Message) -> None:
        await self._nap()


@contextlib.asynccontextmanager
async def napping_workers(tmp_path: Path, seed: int) -> AsyncIterator[list[Memory]]:
    """Three workers of one fresh database, one per acknowledge mode, their hooks napping at
    random by ``seed``."""
    dsn = await fresh_database("across")
    storage = [{"backend": "postgres", "dsn": dsn, "acknowledge": MODES[(seed + i) % 3]} for i in range(3)]
    async with (
        worker(tmp_path / "a", storage[0], Naps(seed * 10)) as a,
        worker(tmp_path / "b", storage[1], Naps(seed * 10 + 1)) as b,
        worker(tmp_path / "c", storage[2], Naps(seed * 10 + 2)) as c,
    ):
        yield [a, b, c]


# A message whose ingest began this long before a forget of its user was called is the forget's.
BEFORE_THE_FORGET_S = 0.05


@pytest.mark.parametrize("seed", variants(1, 2, 3))
async def test_random_messages_and_forgets_in_three_workers_keep_every_forget(
    tmp_path: Path, seed: int
) -> None:
    """Three workers (one per acknowledge mode) ingest 120 messages of 8 people over two seconds,
    their hooks napping at random, while 12 forgets of random people come in random workers. No
    call waits for ever; once all have ended, no message whose ingest began before a forget of its
    person was called is stored, and every message sent after the forgets of its person had
    returned is. Before, such a forget often did not wait for a message still on its way in a
    worker whose own forget, or whose units, held the gate, and the message outlived it."""
    rng = random.Random(seed)
    async with napping_workers(tmp_path, seed) as workers:
        a = workers[0]
        sent: dict[str, tuple[str, float, bool]] = {}  # message id: person, when begun, kept
        forgets: list[tuple[str, float, float]] = []  # person, called, returned

        async def send(n: int) -> None:
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            person, memory = f"p{rng.randrange(8)}", rng.choice(workers)
            text = f"I adopted a greyhound number {n} named Pixel{n} yesterday"
            begun = time.monotonic()
            result = await memory.ingest(
                dict(ann(f"m{n}", text), user_id=person, chat_id=f"dm-{person}", speaker=person)
            )
            sent[f"m{n}"] = (person, begun, result.stored)

        async def forget() -> None:
            await asyncio.sleep(rng.uniform(0.1, 2.0))
            person, memory = f"p{rng.randrange(8)}", rng.choice(workers)
            called = time.monotonic()
            await memory.forget(user_id=person, tenant="t")
            forgets.append((person, called, time.monotonic()))

        calls = [send(n) for n in range(120)] + [forget() for _ in range(12)]
        await asyncio.wait_for(asyncio.gather(*calls), 60)
        for memory in workers:
            await asyncio.wait_for(memory.settle(), WAIT)
        stored = {message_id for record in await everything(a) for message_id in record.message_ids}
        outlived, lost = [], []
        for message_id, (person, begun, kept) in sent.items():
            theirs = [f for f in forgets if f[0] == person]
            if message_id in stored and any(begun + BEFORE_THE_FORGET_S < called for _, called, _ in theirs):
                outlived.append(message_id)
            if kept and message_id not in stored and all(begun > returned for *_, returned in theirs):
                lost.append(message_id)
        assert (outlived, lost) == ([], [])
        assert stored  # the people not forgotten keep theirs
        await asyncio.wait_for(fence_unlocked(a), WAIT)


# The same for edits and deletes, wider: on a loaded machine (the whole suite on two cores) a
# call's first step can come tens of milliseconds after the call.
BEFORE_THE_REMOVAL_S = 0.2


@pytest.mark.parametrize("seed", variants(1, 2))
async def test_random_edits_deletes_forgets_and_recalls_in_three_workers(tmp_path: Path, seed: int) -> None:
    """Three workers (one per acknowledge mode) take 90 messages of 6 people over two seconds,
    with edits and deletes of some, 6 forgets of random people and 60 recalls, their hooks napping
    at random. No call waits for ever; no recall returns another person's memory; once all have
    ended, no message or edit that began before a delete of it or a forget of its person was
    called is stored, and every edit answered as stored of a message nothing removed is there.
    Before, an edit under way in one worker outlived a forget of its person in another, and an
    edit's new text was lost to the write of its original in another worker."""
    rng = random.Random(seed)
    async with napping_workers(tmp_path, seed) as workers:
        a = workers[0]
        sends: list[tuple[str, str, float, bool]] = []  # message id, person, when begun, kept
        edits: list[str] = []  # the messages whose edit was answered as stored
        removals: list[tuple[str | None, str | None, float]] = []  # person or message id, called
        strangers: list[str] = []

        def said(n: int, text: str) -> dict[str, Any]:
            person = f"p{n % 6}"
            return dict(ann(f"m{n}", text), user_id=person, chat_id=f"dm-{person}", speaker=person)

        async def send(n: int) -> None:
            await asyncio.sleep(rng.uniform(0.0, 2.0))
            begun = time.monotonic()
            result = await rng.choice(workers).ingest(said(n, f"My dog Rex{n} loves the beach at Porto{n}"))
            sends.append((f"m{n}", f"p{n % 6}", begun, result.stored))
            if rng.random() < 0.4:
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                begun = time.monotonic()
                edited = await rng.choice(workers).edit(said(n, f"My cat Tom{n} hates the rain in Lisbon{n}"))
                sends.append((f"m{n}", f"p{n % 6}", begun, edited.stored))
                if edited.stored:
                    edits.append(f"m{n}")
            if rng.random() < 0.2:
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                called = time.monotonic()
                await rng.choice(workers).forget_messages(
                    chat_id=f"dm-p{n % 6}", message_ids=[f"m{n}"], tenant="t"
                )
                removals.append((None, f"m{n}", called))

        async def forget() -> None:
            await asyncio.sleep(rng.uniform(0.1, 2.2))
            person, called = f"p{rng.randrange(6)}", time.monotonic()
            await rng.choice(workers).forget(user_id=person, tenant="t")
            removals.append((person, None, called))

        async def recall() -> None:
            await asyncio.sleep(rng.uniform(0.0, 2.4))
            person = f"p{rng.randrange(6)}"
            hits = await rng.choice(workers).recall("dog beach cat rain", user_id=person, tenant="t", k=10)
            strangers.extend(hit.user_id for hit in hits if hit.user_id != person)

        calls = [send(n) for n in range(90)] + [forget() for _ in range(6)] + [recall() for _ in range(60)]
        await asyncio.wait_for(asyncio.gather(*calls), 60)
        for memory in workers:
            await asyncio.wait_for(memory.settle(), WAIT)
        texts = {r.message_ids[0]: r.text for r in await everything(a) if r.kind == "episode"}
        assert strangers == []
        outlived, lost = [], []
        for message_id, person, begun, _ in sends:
            removers = [called for who, which, called in removals if person == who or message_id == which]
            # A later send of the same message (an edit) that began after the removal stands.
            sent_again = [when for mid, _, when, _ in sends if mid == message_id and when > begun]
            if message_id in texts and any(
                begun + BEFORE_THE_REMOVAL_S < called
                and not any(called < again + BEFORE_THE_REMOVAL_S for again in sent_again)
                for called in removers
            ):
                outlived.append(message_id)
        for message_id in edits:
            person = f"p{int(message_id[1:]) % 6}"
            if not any(person == who or message_id == which for who, which, _ in removals):
                if not texts.get(message_id, "").startswith("My cat"):
                    lost.append(message_id)
        assert (outlived, lost) == ([], [])
        assert await a.store.state_items("narrmem.edits") == []
        await asyncio.wait_for(fence_unlocked(a), WAIT)


@pytest.mark.parametrize("acknowledge", MODES)
async def test_an_edit_under_way_in_one_worker_does_not_outlive_another_workers_forget(
    tmp_path: Path, acknowledge: str
) -> None:
    """Ann edits a message in worker A while Bob's slow fact extractor there holds the edit's
    forget of the old text; then worker B forgets Ann. B's forget waits for the edit's new text
    and deletes it. Before, the new text's batch took its hold only after B's forget had taken the
    gate, which did not wait for it, and the new text was written after B's forget returned."""
    dsn = await fresh_database("across")
    release = asyncio.Event()
    facts = SlowFacts(about="Acme", release=release)
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    async with worker(tmp_path / "a", storage, facts) as a, worker(tmp_path / "b", storage) as b:
        await asyncio.wait_for(a.ingest(ann("1", "My dentist appointment is on Monday at ten.")), WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        bob = dict(
            ann("b1", "I work at Acme Bank as an analyst."), user_id="bob", speaker="Bob", chat_id="dm-bob"
        )
        first = asyncio.ensure_future(a.ingest(bob))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        edit = asyncio.ensure_future(a.edit(ann("1", "My dentist appointment moved to Tuesday at ten.")))
        await asyncio.wait_for(gate_asked(a), WAIT)  # the edit's forget of the old text
        forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(forgets_at_the_gate(b, 2), WAIT)
        release.set()
        result = await asyncio.wait_for(edit, WAIT)
        await asyncio.wait_for(asyncio.gather(first, forget), WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert result.stored  # written before B's forget, which deleted it
        assert [r.user_id for r in await everything(b)] == ["bob"]
        for memory in (a, b):
            assert await memory.recall("dentist Tuesday", user_id="ann", tenant="t") == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_edit_waiting_for_its_chats_received_messages_does_not_outlive_another_workers_forget(
    tmp_path: Path,
) -> None:
    """Worker A answers on receipt. Ann's "HOLD" message waits in a before-store hook there when
    she edits an earlier message, and the edit waits for that message's write; worker B forgets
    her meanwhile. Once the hook lets go, the edit finds its old text gone and stores nothing:
    before, it wrote the new text after B's forget had returned."""
    dsn = await fresh_database("across")
    hold = Hold("before_store")
    storage = {"backend": "postgres", "dsn": dsn}
    on_receipt = {**storage, "acknowledge": "on_receipt"}
    async with worker(tmp_path / "a", on_receipt, hold) as a, worker(tmp_path / "b", storage) as b:
        await asyncio.wait_for(a.ingest(ann("1", "My dentist appointment is on Monday at ten.")), WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        await asyncio.wait_for(a.ingest(ann("2", "HOLD the kids start school next week")), WAIT)
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        edit = asyncio.ensure_future(a.edit(ann("1", "My dentist appointment moved to Tuesday at ten.")))
        await asyncio.sleep(0.2)
        assert not edit.done()  # it waits for message 2's write
        await asyncio.wait_for(b.forget(user_id="ann", tenant="t"), WAIT)
        hold.release.set()
        result = await asyncio.wait_for(edit, WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert not result.stored and "forgotten" in result.reason
        assert await everything(b) == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_edit_of_a_message_still_on_its_way_elsewhere_does_not_outlive_another_workers_forget(
    tmp_path: Path,
) -> None:
    """Ann's original waits in a before-store hook in worker C (nothing of it stored anywhere)
    when worker A, whose own received message of hers waits in a hook too, takes her edit of it;
    worker B forgets her meanwhile, and its forget ends once C's write has. The edit then finds
    no old text, nor can it tell from the store that it was ever there: its mark, which B's forget
    deleted, says so, and it stores nothing. Before, it wrote the new text after B's forget had
    returned."""
    dsn = await fresh_database("across")
    hold_a, hold_c = Hold("before_store"), Hold("before_store")
    storage = {"backend": "postgres", "dsn": dsn}
    on_receipt = {**storage, "acknowledge": "on_receipt"}
    async with (
        worker(tmp_path / "a", on_receipt, hold_a) as a,
        worker(tmp_path / "b", storage) as b,
        worker(tmp_path / "c", storage, hold_c) as c,
    ):
        original = asyncio.ensure_future(c.ingest(ann("1", "HOLD my dentist appointment is on Monday")))
        await asyncio.wait_for(hold_c.entered.wait(), WAIT)
        await asyncio.wait_for(a.ingest(ann("2", "HOLD the kids start school next week")), WAIT)
        await asyncio.wait_for(hold_a.entered.wait(), WAIT)
        edit = asyncio.ensure_future(a.edit(ann("1", "My dentist appointment moved to Tuesday at ten.")))
        await asyncio.sleep(0.2)
        assert not edit.done()  # it waits for message 2's write
        forget = asyncio.ensure_future(b.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(gate_asked(b), WAIT)
        hold_c.release.set()
        await asyncio.wait_for(original, WAIT)
        await asyncio.wait_for(forget, WAIT)
        hold_a.release.set()
        result = await asyncio.wait_for(edit, WAIT)
        for memory in (a, c):
            await asyncio.wait_for(memory.settle(), WAIT)
        assert not result.stored and "forgotten" in result.reason
        assert await everything(b) == []
        assert await b.store.state_items("narrmem.edits") == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_two_edits_of_one_message_in_two_workers_leave_one_of_their_texts(tmp_path: Path) -> None:
    """Ann's message is edited twice at once, the edits taken by two workers (a platform that
    sends the update twice, or two quick edits). Each edit's forget of the old text voids no
    edit: one new text stays, whichever came last. Had an edit's forget voided the other edit's
    mark, the first would have stored its text, the second deleted it and stored nothing."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage) as a, worker(tmp_path / "b", storage) as b:
        await asyncio.wait_for(a.ingest(ann("1", "My dentist appointment is on Monday at ten.")), WAIT)
        texts = ["My dentist appointment moved to Tuesday at ten.", "My dentist appointment moved to Friday."]
        results = await asyncio.wait_for(
            asyncio.gather(a.edit(ann("1", texts[0])), b.edit(ann("1", texts[1]))), WAIT
        )
        for memory in (a, b):
            await asyncio.wait_for(memory.settle(), WAIT)
        kept = [r.text for r in await everything(b) if r.kind == "episode"]
        assert len(kept) == 1 and kept[0] in texts
        assert any(result.stored for result in results)
        assert await b.store.state_items("narrmem.edits") == []
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_edit_in_another_worker_survives_the_write_of_its_original_received_before(
    tmp_path: Path,
) -> None:
    """Worker A answers on receipt, and Ann's original waits in a before-store hook there; worker
    B takes her edit of it, forgets the received original and stores the new text. Once A's hook
    lets go, A finds the original taken and does not write it; before, it then forgot the message
    id again, and the edit's new text went with it."""
    dsn = await fresh_database("across")
    hold = Hold("before_store")
    storage = {"backend": "postgres", "dsn": dsn}
    on_receipt = {**storage, "acknowledge": "on_receipt"}
    async with worker(tmp_path / "a", on_receipt, hold) as a, worker(tmp_path / "b", storage) as b:
        await asyncio.wait_for(a.ingest(ann("1", "HOLD my dentist appointment is on Monday at ten")), WAIT)
        await asyncio.wait_for(hold.entered.wait(), WAIT)
        edit = b.edit(ann("1", "My dentist appointment moved to Tuesday at ten."))
        edited = await asyncio.wait_for(edit, WAIT)
        hold.release.set()
        await asyncio.wait_for(a.settle(), WAIT)
        assert edited.stored
        assert [r.text for r in await everything(b)] == ["My dentist appointment moved to Tuesday at ten."]
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_edit_in_another_worker_survives_its_original_written_as_the_edit_began(
    tmp_path: Path,
) -> None:
    """Worker A answers Ann's original on receipt and writes it; as A deletes its received entry,
    worker B takes her edit. The edit's forget waits for that deletion (part of A's write), then
    deletes the original, and the new text is stored. Before, the deletion came after A's write
    had ended: the edit's forget took the entry first, A found it gone and forgot the message id
    again, and the edit's new text went with it."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    on_receipt = {**storage, "acknowledge": "on_receipt"}
    async with worker(tmp_path / "a", on_receipt) as a, worker(tmp_path / "b", storage) as b:
        entry_written, go_on = asyncio.Event(), asyncio.Event()
        delete = a.store.state_delete

        async def delete_later(namespace: str, key: str) -> int:
            if namespace == "narrmem.inbox":
                entry_written.set()
                await go_on.wait()
            return await delete(namespace, key)

        a.store.state_delete = delete_later  # A's write is done; the deletion of its entry waits
        await asyncio.wait_for(a.ingest(ann("1", "My dentist appointment is on Monday at ten.")), WAIT)
        await asyncio.wait_for(entry_written.wait(), WAIT)
        edit = asyncio.ensure_future(b.edit(ann("1", "My dentist appointment moved to Tuesday at ten.")))
        try:
            await asyncio.sleep(0.3)
            assert not edit.done()  # its forget waits for A's write, the entry's deletion included
        finally:
            go_on.set()
        edited = await asyncio.wait_for(edit, WAIT)
        await asyncio.wait_for(a.settle(), WAIT)
        assert edited.stored
        assert [r.text for r in await everything(b)] == ["My dentist appointment moved to Tuesday at ten."]
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_an_edit_in_another_worker_survives_its_original_found_stored_by_the_write(
    tmp_path: Path,
) -> None:
    """Worker A answers Ann's original on receipt; before its write looks for the message in the
    store, worker B takes her edit, whose forget takes A's received entry, and stores the new
    text. A's write then finds the message stored (the new text) and writes nothing, and its entry
    gone: nothing of it to forget again. Before, it forgot the message id again, and the edit's
    new text went with it (found by a randomized run of three workers)."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    on_receipt = {**storage, "acknowledge": "on_receipt"}
    async with worker(tmp_path / "a", on_receipt) as a, worker(tmp_path / "b", storage) as b:
        looking, go_on = asyncio.Event(), asyncio.Event()
        stored_messages = a.store.stored_messages
        looks: list[Any] = []

        async def look_later(keys: Any) -> Any:
            looks.append(keys)
            if len(looks) > 1:  # the first is the ingest's own, as it receives the message
                looking.set()
                await go_on.wait()
            return await stored_messages(keys)

        a.store.stored_messages = look_later  # A's write waits before it looks for the message
        try:
            await asyncio.wait_for(a.ingest(ann("1", "My dentist appointment is on Monday at ten.")), WAIT)
            await asyncio.wait_for(looking.wait(), WAIT)
            edit = b.edit(ann("1", "My dentist appointment moved to Tuesday at ten."))
            edited = await asyncio.wait_for(edit, WAIT)
        finally:
            go_on.set()
        await asyncio.wait_for(a.settle(), WAIT)
        assert edited.stored
        assert [r.text for r in await everything(b)] == ["My dentist appointment moved to Tuesday at ten."]
        await asyncio.wait_for(fence_unlocked(b), WAIT)


async def test_the_vacuum_that_ends_a_forget_holds_no_other_workers_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's forget ends with a VACUUM of the tables (minutes on a large HNSW index). It ran
    with the gate closed, so every other worker's messages waited for it."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    async with worker(tmp_path / "a", storage) as writer, worker(tmp_path / "b", storage) as forgetter:
        await writer.ingest(ann("1", "I work at Acme Bank as an analyst."))
        vacuuming, vacuumed = asyncio.Event(), asyncio.Event()
        purge_deleted = forgetter.store.purge_deleted

        async def long_vacuum() -> None:
            vacuuming.set()
            await vacuumed.wait()
            await purge_deleted()

        monkeypatch.setattr(forgetter.store, "purge_deleted", long_vacuum)
        forget = asyncio.ensure_future(forgetter.forget(user_id="ann", tenant="t"))
        await asyncio.wait_for(vacuuming.wait(), WAIT)
        bob = dict(ann("2", "I adopted a greyhound named Pixel."), user_id="bob", speaker="Bob")
        written = await asyncio.wait_for(writer.ingest(bob), WAIT)  # not behind the vacuum
        assert written.stored and not forget.done()
        vacuumed.set()
        assert (await asyncio.wait_for(forget, WAIT))["memories"] == 1
        assert [r.message_ids for r in await everything(forgetter)] == [["2"]]


async def test_the_fence_ends_its_own_session_and_never_another_with_its_old_pid(tmp_path: Path) -> None:
    """A fence session is ended in the server by its pid and its own name: a pid outlives its
    session (a server that failed over numbers anew; a pooler hands the server's session to
    another client once ours is dropped), and ending it by pid alone ended someone else's."""
    dsn = await fresh_database("across")
    async with worker(tmp_path / "a", {"backend": "postgres", "dsn": dsn}) as memory:
        await memory.ingest(ann("1", "I work at Acme Bank as an analyst."))
        fence = memory.store.workers_fence()
        other, admin = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
        alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
        try:
            pid = other.get_server_pid()
            await fence._terminate_backend(pid, "narrmem-fence-not-this-one")
            assert await admin.fetchval(alive, pid) == 1  # the pid was another session's: kept
            await other.execute("SET application_name = 'narrmem-fence-this-one'")
            await fence._terminate_backend(pid, "narrmem-fence-this-one")
            for _ in range(100):
                if not await admin.fetchval(alive, pid):
                    break
                await asyncio.sleep(0.05)
            assert await admin.fetchval(alive, pid) == 0
        finally:
            other.terminate()
            await admin.close()


async def test_a_vacuum_that_fails_after_a_forget_is_owed_until_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forget's VACUUM runs after its record went, once the gate is open: a failing one (or a
    stop before it) is noted in the store, tried again, and run by the next open."""
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.05,))
    monkeypatch.setattr(trying_again, "RETRY_EVERY", 0.1)
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    vacuums: list[str] = []
    async with worker(tmp_path / "a", storage) as memory:
        await memory.ingest(ann("1", "I work at Acme Bank as an analyst."))
        purge_deleted = memory.store.purge_deleted

        async def failing_once() -> None:
            vacuums.append("tried")
            if len(vacuums) == 1:
                raise StoreUnavailableError("the server went away")
            await purge_deleted()

        monkeypatch.setattr(memory.store, "purge_deleted", failing_once)
        assert (await memory.forget(user_id="ann", tenant="t"))["memories"] == 1
        assert await memory.store.state_get(*PURGE_OWED) is not None
        for _ in range(100):
            if await memory.store.state_get(*PURGE_OWED) is None:
                break
            await asyncio.sleep(0.05)
        assert vacuums == ["tried", "tried"] and await memory.store.state_get(*PURGE_OWED) is None

        async def away() -> None:
            raise StoreUnavailableError("the server went away")

        monkeypatch.setattr(memory.store, "purge_deleted", away)
        await memory.ingest(dict(ann("2", "I adopted a greyhound named Pixel."), user_id="bob"))
        await memory.forget(user_id="bob", tenant="t")
    monkeypatch.undo()
    async with worker(tmp_path / "b", storage) as again:  # the next open purges
        assert await again.store.state_get(*PURGE_OWED) is None
