"""A forget made in one process reaches the writes another process holds for later.

A bot's backlog keeps the writes its store could not take and makes them once it answers. A
forget made meanwhile by another worker, or by any process while the bot was stopped (the CLI, a
script, the HTTP API of another server), could not reach that backlog: once the store answered,
the backlog stored the person's messages again, after their forget, for good. Each forget now
leaves a keyed mark of its scope in the store, and a waiting write of a scope forgotten since it
was first tried is dropped."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from _pgproxy import behind_proxy
from test_integrations import ANN, BOB, GUILD_ID, DiscordHarness, episodes, open_harness

from narrmem import InputError, StoreUnavailableError, hookimpl
from narrmem.clock import ManualClock
from narrmem.doors.importing import import_jsonl
from narrmem.doors.integrations import backlog as backlog_module
from narrmem.doors.integrations import spool as spool_module
from narrmem.doors.integrations.backlog import backlog_of, forget_person, forget_person_record, message_record
from narrmem.doors.transfer import export_store
from narrmem.forget_marks import NAMESPACE
from narrmem.models import Message, Scope
from narrmem.testing import open_memory

NOON = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
EPISODES = "SELECT text FROM memories WHERE kind = 'episode' ORDER BY id"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog_module, "RETRY_DELAYS", (0.05, 0.1))
    monkeypatch.setattr(backlog_module, "RETRY_EVERY", 0.2)


async def test_a_forget_made_by_another_worker_drops_what_a_bots_backlog_holds_of_the_person(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of one PostgreSQL: the bot's worker is cut off and holds Ann's message; the
    store answers again and, before the backlog's next try, Ann is forgotten through the other
    worker. Her message was then stored after her forget; now it is dropped, while Bob's message,
    and what Ann says after her forget, are stored."""
    monkeypatch.setattr(backlog_module, "RETRY_DELAYS", (4.0, 0.1))
    async with behind_proxy(tmp_path, timeout_s=2.0) as (memory, proxy):
        bot = await open_harness("discord.py", memory, guild_as="tenant")
        assert isinstance(bot, DiscordHarness)
        try:
            proxy.cut()
            await bot.send(41, "My new phone number is 555 0199", user=ANN, chat=7, group=True)
            await bot.send(42, "I adopted a cat called Miso", user=BOB, chat=7, group=True)
            backlog = backlog_of(memory)
            assert len(backlog) == 2
            proxy.mode = "pass"
            storage = memory.settings.storage.model_dump()
            storage["dsn"] = storage["dsn"].get_secret_value()
            async with open_memory(tmp_path / "other-worker", storage=storage) as other:
                assert (await other.forget(user_id=str(ANN), tenant=str(GUILD_ID)))["memories"] == 0
            assert len(backlog) == 2  # the other worker's forget did not reach this process
            await bot.send(43, "I started learning Portuguese", user=ANN, chat=7, group=True)
            assert len(backlog) == 3  # behind the others, first tried after the forget
            await asyncio.wait_for(backlog.drained(), 60)
            await memory.settle()
        finally:
            await bot.close()
        ann = [r.text for r in await episodes(memory, tenant=str(GUILD_ID), user_id=str(ANN))]
        bob = [r.text for r in await episodes(memory, tenant=str(GUILD_ID), user_id=str(BOB))]
    assert ann == ["I started learning Portuguese"]
    assert bob == ["I adopted a cat called Miso"]


def _record(message_id: str, text: str, user: str, since: dt.datetime | None) -> dict[str, Any]:
    record = message_record("message", Message(**msg(message_id, text, user=user)))
    if since is not None:
        record["since"] = since.isoformat()
    return record


async def test_a_forget_made_while_the_bot_was_stopped_drops_what_its_file_holds(tmp_path: Path) -> None:
    """The bot stopped during an outage with its backlog on disk; before its next start Ann was
    forgotten (the CLI, a script). What the file held of her from before the forget is dropped,
    a line from a file that does not say when it was first tried included; what she said after
    it is made; a write that waited longer than forgets are remembered is dropped."""
    folder = tmp_path / "m" / spool_module.FOLDER
    folder.mkdir(parents=True)
    records = [
        _record("1", "My bank card PIN is on a note in my wallet", "ann", NOON - dt.timedelta(hours=1)),
        _record("2", "I grow tomatoes on my balcony", "bob", NOON - dt.timedelta(hours=1)),
        _record("3", "My new phone number is 555 0199", "ann", None),
        _record("4", "I started learning Portuguese", "ann", NOON + dt.timedelta(minutes=5)),
        _record("5", "I sing in a choir on Tuesdays", "bob", NOON - dt.timedelta(days=8)),
    ]
    lines = [json.dumps(spool_module.HEADER), *(json.dumps(r) for r in records)]
    (folder / f"{'d' * 32}.jsonl").write_text("\n".join(lines) + "\n")
    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.forget(user_id="ann")  # by another process, as far as the file goes
        clock.advance(minutes=30)
        await asyncio.wait_for(backlog_of(memory).drained(), 30)
        await memory.settle()
        texts = sorted(text for (text,) in await store_sql(memory, EPISODES))
    assert texts == ["I grow tomatoes on my balcony", "I started learning Portuguese"]


async def test_a_waiting_forget_is_dated_when_it_was_asked(tmp_path: Path) -> None:
    """A ``forgetme`` waits for the store, and the person's next message waits behind it. Made
    late, the forget is dated when it was asked: dated when made, its mark would be later than
    the message, which would be dropped as if said before the forget."""
    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        backlog = backlog_of(memory)
        state = {"away": True}

        def while_back(make: Any) -> Any:
            async def once() -> Any:
                if state["away"]:
                    raise StoreUnavailableError("away")
                return await make()

            return once

        async def every() -> list[str]:
            return ["default"]

        forget = while_back(lambda: forget_person(memory, every, "ann", []))
        await backlog.run("forget of a person", forget, forget_person_record("ann", [], ["default"], None))
        clock.advance(minutes=1)
        later = Message(**msg("7", "I started learning Portuguese", user="ann"))
        said = while_back(lambda: memory.ingest(later))
        await backlog.run("message", said, message_record("message", later))
        clock.advance(minutes=10)
        state["away"] = False
        await asyncio.wait_for(backlog.drained(), 30)
        await memory.settle()
        assert await store_sql(memory, EPISODES) == [("I started learning Portuguese",)]
        assert await memory.forgotten_after(later, NOON - dt.timedelta(seconds=1))
        assert not await memory.forgotten_after(later, NOON + dt.timedelta(seconds=1))


async def test_marks_cover_each_forgets_scope_and_no_edit_leaves_one(tmp_path: Path) -> None:
    clock = ManualClock(NOON)
    before = NOON - dt.timedelta(seconds=1)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        ann = Message(**msg("1", "I adopted a greyhound named Pixel", user="ann-5f3c9e"))
        bob = Message(**msg("2", "I grow tomatoes", user="bob"))
        in_c2 = Message(**msg("9", "See you at the rehearsal", user="bob", chat="c2"))
        other_in_c2 = Message(**msg("8", "The rehearsal moved to six", user="bob", chat="c2"))
        in_c3 = Message(**msg("5", "The party is on Friday", user="bob", chat="c3"))
        for message in (ann, bob, in_c2, other_in_c2, in_c3):
            await memory.ingest(message)
        await memory.settle()
        await memory.edit(Message(**msg("2", "I grow tomatoes and basil", user="bob")))
        assert not await memory.forgotten_after(bob, before)  # an edit is not a forget
        assert await memory.store.state_items(NAMESPACE) == []

        await memory.forget(user_id="ann-5f3c9e")
        await memory.forget_messages(chat_id="c2", message_ids=["9"])
        await memory.forget(chat_id="c3")
        assert await memory.forgotten_after(ann, before)
        assert not await memory.forgotten_after(ann, NOON)  # what is said after the forget stays
        assert not await memory.forgotten_after(bob, before)
        assert await memory.forgotten_after(in_c2, before)
        assert not await memory.forgotten_after(other_in_c2, before)
        assert await memory.forgotten_after(in_c3, before)
        assert await memory.forgotten_after(Message(**msg("6", "Anything", user="zoe", chat="c3")), before)

        with pytest.raises(InputError) as raised:
            await memory.forget(user_id="bob", asked_at=dt.datetime(2026, 12, 6, 11, 0))
        assert raised.value.field == "asked_at"
        with pytest.raises(InputError) as raised:
            await memory.forgotten_after(bob, dt.datetime(2026, 12, 6, 11, 0))
        assert raised.value.field == "since"
        assert not await memory.forgotten_after(bob, before)  # the refused forget did nothing

        entries = dict(await memory.store.state_items(NAMESPACE))
        # The key, one mark per scope, and the note that each forget of a person or a chat ran
        # to its end (what a retry with asked_at is measured against).
        assert len(entries) == 6
        assert "ann-5f3c9e" not in json.dumps(entries)
        await export_store(memory, tmp_path / "backup.jsonl")
        assert NAMESPACE not in (tmp_path / "backup.jsonl").read_text()
    assert b"ann-5f3c9e" not in (tmp_path / "m" / "narrmem.sqlite3").read_bytes()

    clock.advance(days=7, minutes=1)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        # Expired: found so at this open, and kept a day more (a clock a year ahead, once, took
        # them all), yet still answering for the forget.
        assert len(await memory.store.state_items(NAMESPACE)) == 6
        assert await memory.forgotten_after(ann, before)
    clock.advance(days=1)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        assert [key for key, _ in await memory.store.state_items(NAMESPACE)] == ["key"]  # marks expired
        assert not await memory.forgotten_after(ann, before)


async def test_a_mark_renewed_by_another_worker_as_it_expires_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The purge deletes an expired mark as it read it: a worker's forget of the same scope
    landing between the purge's read and its delete (its renewed mark) stays."""
    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        ann = Message(**msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.ingest(ann)
        await memory.forget(user_id="ann")
        clock.advance(days=7, minutes=1)
        assert await memory.forget_marks.purge_expired() == 0  # found expired: gone a day later
        clock.advance(days=1)
        store = memory.store
        renewed: list[str] = []

        def renewing_first(delete: Any) -> Any:
            async def deleting(namespace: str, key: str, *args: Any) -> Any:
                if namespace == NAMESPACE and not renewed:
                    renewed.append(key)
                    await memory.forget_marks.leave(Scope(user_id="ann"), None, None)  # the other worker
                return await delete(namespace, key, *args)

            return deleting

        for name in ("state_delete", "state_delete_if"):
            monkeypatch.setattr(store, name, renewing_first(getattr(store, name)))
        # The forget's note that it finished goes; its mark, renewed meanwhile, stays.
        assert await memory.forget_marks.purge_expired() == 1
        assert renewed
        assert await memory.forgotten_after(ann, NOON + dt.timedelta(days=7))
        monkeypatch.undo()
        clock.advance(days=7, minutes=1)
        assert await memory.forget_marks.purge_expired() == 0
        clock.advance(days=1)
        assert await memory.forget_marks.purge_expired() == 1  # expired in its turn, it goes


async def test_a_clock_a_year_ahead_once_does_not_take_the_marks_with_it(tmp_path: Path) -> None:
    """A process opened once with its clock a year ahead deleted every mark (expired by its
    clock); the clock put right, an old export imported brought the forgotten person back."""
    clock = ManualClock(NOON)
    ann = Message(**msg("1", "I adopted a greyhound named Pixel", user="ann"))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest(ann)
        await export_store(memory, tmp_path / "backup.jsonl")
        clock.advance(minutes=1)
        await memory.forget(user_id="ann")
    clock.advance(days=1)
    marks = 0
    for hours in (0, 12):  # opened twice on the wrong clock, half a day apart: within the day's grace
        clock.set(NOON + dt.timedelta(days=365, hours=hours))
        async with open_memory(tmp_path / "m", clock=clock) as memory:
            marks = len(await memory.store.state_items(NAMESPACE))
    assert marks > 1
    clock.set(NOON + dt.timedelta(days=2))  # put right
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        assert await memory.forgotten_after(ann, NOON - dt.timedelta(hours=1))
        noted = [v for k, v in await memory.store.state_items(NAMESPACE) if k.startswith("m:")]
        assert noted and all("expired_seen" not in v for v in noted)  # the note taken away
        with pytest.raises(InputError):
            await import_jsonl(memory, tmp_path / "backup.jsonl")  # it would bring ann back
        assert not await memory.store.recent(Scope(user_id="ann"), limit=10)


async def test_no_marks_when_they_are_kept_for_no_time(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", storage={"forget_marks_kept_s": 0}) as memory:
        message = Message(**msg("1", "I adopted a greyhound named Pixel", user="ann"))
        await memory.ingest(message)
        await memory.forget(user_id="ann")
        assert await memory.store.state_items(NAMESPACE) == []
        assert not await memory.forgotten_after(message, NOON - dt.timedelta(days=365))


async def test_a_forget_that_comes_while_a_held_write_is_made_is_made_again_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's forget of Ann comes between the backlog's check and its write of her
    held message: the check after the write finds it and forgets the message, though that check
    first finds the store away (the write's next try, finding the forget, forgets what the first
    stored, rather than only dropping it). What Ann said after her forget stays: the message she
    sent through the other process, and the one waiting behind (a forget of her again, as the
    repair, took both)."""
    from narrmem.models import Scope

    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        backlog = backlog_of(memory)
        state = {"away": True}
        held = Message(**msg("1", "My bank card PIN is on a note in my wallet", user="ann"))

        async def once() -> Any:
            if state["away"]:
                raise StoreUnavailableError("away")
            # The other process's forget (asked before Ann's next message below was) begins: its
            # mark is written, its deletion finds nothing.
            await memory.forget_marks.leave(Scope(user_id="ann"), None, NOON + dt.timedelta(seconds=30))
            await memory.ingest(Message(**msg("3", "I started learning Portuguese", user="ann")))
            return await memory.ingest(held)

        checks = {"n": 0}
        forgotten_by = memory.forget_marks.forgotten_by

        async def away_once_after_the_write(message: Message, since: dt.datetime, **scopes: Any) -> Any:
            checks["n"] += 1
            if checks["n"] == 2:
                raise StoreUnavailableError("away again")
            return await forgotten_by(message, since, **scopes)

        monkeypatch.setattr(memory.forget_marks, "forgotten_by", away_once_after_the_write)
        await backlog.run("message", once, message_record("message", held))
        clock.advance(minutes=1)
        behind = Message(**msg("2", "I adopted a cat called Miso", user="ann"))

        async def next_one() -> Any:
            if state["away"]:
                raise StoreUnavailableError("away")
            return await memory.ingest(behind)

        await backlog.run("message", next_one, message_record("message", behind))
        state["away"] = False
        await asyncio.wait_for(backlog.drained(), 30)
        await memory.settle()
        assert checks["n"] >= 3
        assert await store_sql(memory, EPISODES) == [
            ("I started learning Portuguese",),
            ("I adopted a cat called Miso",),
        ]


async def test_a_write_a_stopped_process_made_and_did_not_check_is_forgotten_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The stopped process made the write after a forget that missed it and stopped before its
    check: the next start finds the forget and forgets what the write left, not only drops it."""
    from narrmem.models import Scope

    clock = ManualClock(NOON)
    held = Message(**msg("1", "My bank card PIN is on a note in my wallet", user="ann"))
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest(held)  # the stopped process's write
        await memory.settle()
        clock.advance(seconds=1)
        await memory.forget_marks.leave(Scope(user_id="ann"), None, None)  # a forget that missed it
    folder = tmp_path / "m" / spool_module.FOLDER
    folder.mkdir(parents=True)
    record = _record("1", held.text, "ann", NOON - dt.timedelta(minutes=5))
    lines = [json.dumps(spool_module.HEADER), json.dumps(record)]
    (folder / f"{'e' * 32}.jsonl").write_text("\n".join(lines) + "\n")
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        assert await store_sql(memory, EPISODES) == [(held.text,)]
        await asyncio.wait_for(backlog_of(memory).drained(), 30)
        await memory.settle()
        assert await store_sql(memory, EPISODES) == []


async def test_a_client_that_held_a_message_says_since_when_and_a_forget_made_since_keeps_it_out(
    tmp_path: Path,
) -> None:
    """Over HTTP, a bot in another language holds its writes while the server answers 503 and
    sends them again later: ``held_since`` says since when, and a message of someone forgotten
    since then (by any worker) is not stored. A send written after the forget by an earlier try
    is taken out at the next; a bad ``held_since`` is a 422 naming it and stores nothing."""
    import httpx

    from narrmem.doors.server import create_app

    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        app = create_app(memory)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            await memory.forget(user_id="ann")
            clock.advance(minutes=5)
            before = (NOON - dt.timedelta(minutes=10)).isoformat()
            after = (NOON + dt.timedelta(minutes=1)).isoformat()

            pin = msg("1", "My bank card PIN is on a note in my wallet", user="ann", held_since=before)
            answer = await client.post("/v1/ingest", json=pin)
            assert answer.status_code == 200, answer.text
            assert answer.json()["stored"] is False and "forgotten since" in answer.json()["reason"]
            said_later = msg("2", "I started learning Portuguese", user="ann", held_since=after)
            bob = msg("3", "I grow tomatoes on my balcony", user="bob", held_since=before)
            batch = await client.post("/v1/ingest/batch", json={"messages": [pin, said_later, bob]})
            assert [r["stored"] for r in batch.json()] == [False, True, True]
            assert await store_sql(memory, EPISODES) == [
                ("I started learning Portuguese",),
                ("I grow tomatoes on my balcony",),
            ]

            # An earlier send, written after the forget (its check after the write then failed).
            await memory.ingest(Message(**msg("4", "My new phone number is 555 0199", user="ann")))
            resent = msg("4", "My new phone number is 555 0199", user="ann", held_since=before)
            assert (await client.post("/v1/ingest", json=resent)).json()["stored"] is False
            assert ("My new phone number is 555 0199",) not in await store_sql(memory, EPISODES)
            edit = msg("2", "I started learning Italian", user="ann", held_since=before)
            assert (await client.post("/v1/edit", json=edit)).json()["stored"] is False

            rows = await store_sql(memory, EPISODES)
            # One bad message of a batch with a held one stores nothing, and is named by its index.
            ahead = msg("5", "I will move to Lisbon", user="bob", ts="2027-06-01T00:00:00+00:00")
            new = msg("6", "I started a pottery class", user="bob", held_since=after)
            refused = await client.post("/v1/ingest/batch", json={"messages": [new, bob, ahead]})
            assert refused.status_code == 422 and refused.json()["field"] == "messages[2].ts", refused.text
            assert await store_sql(memory, EPISODES) == rows
            # Held longer than forget marks are kept: a forget made since may have left none.
            old = msg(
                "7", "I live in Porto", user="zoe", held_since=(NOON - dt.timedelta(days=8)).isoformat()
            )
            kept_out = (await client.post("/v1/ingest", json=old)).json()
            assert kept_out["stored"] is False and "held longer" in kept_out["reason"]
            assert await store_sql(memory, EPISODES) == rows
            for bad in ("2026-12-06T11:00:00", "soon", 1765000000):
                refused = await client.post("/v1/ingest", json={**pin, "message_id": "9", "held_since": bad})
                assert refused.status_code == 422 and "held_since" in refused.text, refused.text
            assert await store_sql(memory, EPISODES) == rows


async def test_a_client_that_held_a_forget_says_when_it_was_asked(tmp_path: Path) -> None:
    """A bot over HTTP held a "forget me" and the person's next message through an outage, and
    sends them late: the forget's ``asked_at`` dates its mark, so the message said after it is
    stored and one said before it is not. A bad ``asked_at`` is a 422 naming it, forgetting nothing."""
    import httpx

    from narrmem.doors.server import create_app

    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        transport = httpx.ASGITransport(create_app(memory))
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            await memory.ingest(Message(**msg("1", "I grow tomatoes on my balcony", user="ann")))
            clock.advance(minutes=30)
            asked = (NOON + dt.timedelta(minutes=10)).isoformat()
            for bad in ("2026-12-06T12:10:00", 1765000000):
                refused = await client.post("/v1/forget", json={"user_id": "ann", "asked_at": bad})
                assert refused.status_code == 422 and "asked_at" in refused.text, refused.text
            assert await store_sql(memory, EPISODES) == [("I grow tomatoes on my balcony",)]
            forgot = await client.post("/v1/forget", json={"user_id": "ann", "asked_at": asked})
            assert forgot.status_code == 200, forgot.text
            before = (NOON + dt.timedelta(minutes=5)).isoformat()
            after = (NOON + dt.timedelta(minutes=15)).isoformat()
            said_before = msg("2", "My bank card PIN is on a note", user="ann", held_since=before)
            said_after = msg("3", "I started learning Portuguese", user="ann", held_since=after)
            answers = await client.post("/v1/ingest/batch", json={"messages": [said_before, said_after]})
            assert [a["stored"] for a in answers.json()] == [False, True]
            assert await store_sql(memory, EPISODES) == [("I started learning Portuguese",)]


async def test_an_update_of_a_message_forgotten_since_it_was_said_stores_nothing(tmp_path: Path) -> None:
    """A platform sends an update of an old message (a pin, a link preview taken off, an edit)
    after its person asked to be forgotten: nothing of it was stored any more, so the edit stored
    the words again, as new, after the person was told they were gone."""
    clock = ManualClock(NOON)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        said = msg("1", "My new phone number is 555 0199", user="ann", ts=NOON.isoformat())
        other = msg("2", "I grow tomatoes on my balcony", user="bob", ts=NOON.isoformat())
        await memory.ingest(said)
        await memory.ingest(other)
        clock.advance(minutes=5)
        await memory.forget(user_id="ann")
        clock.advance(minutes=5)
        result = await memory.edit({**said, "text": "My new phone number is 555 0199 (call after six)"})
        assert not result.stored and "forgotten since" in (result.reason or "")
        assert [text for (text,) in await store_sql(memory, EPISODES)] == ["I grow tomatoes on my balcony"]
        # Another person's message edited is made as ever.
        assert (await memory.edit({**other, "text": "I grow tomatoes and basil on my balcony"})).stored


async def test_a_forget_sent_again_keeps_what_the_person_said_after_asking(tmp_path: Path) -> None:
    """A client's forget timed out after it ran, and the person went on talking (stored, as a
    message sent after a forget is) before the client sent it again with the same ``asked_at``:
    the second run deleted those messages too. A forget asked at or before the last finished
    forget of its scope now deletes nothing; a later one, one without ``asked_at``, and one whose
    scope has a forget unfinished (under way, or failed midway) run as always."""
    clock = ManualClock(NOON)
    async with open_memory(tmp_path, clock=clock) as memory:
        asked = NOON - dt.timedelta(seconds=30)
        await memory.ingest(msg("m1", "I adopted a greyhound named Pixel", ts=asked.isoformat()))
        # A first try that failed once its mark was written, before its job was: nothing was
        # deleted, and the retry runs (the mark alone took it for done).
        begin = memory.store.begin_forget

        async def unreachable(**what: Any) -> Any:
            memory.store.begin_forget = begin
            raise StoreUnavailableError("the store did not answer")

        memory.store.begin_forget = unreachable
        with pytest.raises(StoreUnavailableError):
            await memory.forget(user_id="u1", asked_at=asked)
        first = await memory.forget(user_id="u1", asked_at=asked)
        assert first["memories"] == 1
        clock.advance(seconds=60)
        after = NOON + dt.timedelta(seconds=40)
        await memory.ingest(msg("m2", "I moved to Lisbon in March", ts=after.isoformat()))
        again = await memory.forget(user_id="u1", asked_at=asked)
        assert again["memories"] == 0
        assert await store_sql(memory, EPISODES) == [("I moved to Lisbon in March",)]
        # Another scope's forget (the chat) is not the person's: it runs.
        assert (await memory.forget(chat_id="c1", asked_at=asked))["memories"] == 1
        await memory.ingest(msg("m3", "my sister is called Ana", ts=after.isoformat()))
        # A forget of the person left unfinished is run again, whatever its mark says.
        await memory.store.begin_forget(tenant="default", user_id="u1", chat_id=None)
        assert (await memory.forget(user_id="u1", asked_at=asked))["memories"] == 1
        await memory.ingest(msg("m4", "I play the cello", ts=after.isoformat()))
        # Asked later than the last forget: a new forget.
        later = await memory.forget(user_id="u1", asked_at=NOON + dt.timedelta(seconds=50))
        assert later["memories"] == 1
        await memory.ingest(msg("m5", "I run on Sundays", ts=after.isoformat()))
        assert (await memory.forget(user_id="u1"))["memories"] == 1
        assert await store_sql(memory, EPISODES) == []


class SlowScrub:
    """A plugin whose scrub takes a minute of the memory's clock (a VACUUM of a large store)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    @hookimpl
    async def narrmem_after_forget(self) -> None:
        self.clock.advance(seconds=60)


async def test_a_forget_asked_while_an_earlier_one_ran_is_not_taken_for_it(tmp_path: Path) -> None:
    """A forget's note that it finished was dated when it ended: a forget of the person asked
    while it ran (what they said meanwhile was held and written after it) was taken for done."""
    clock = ManualClock(NOON)
    async with open_memory(tmp_path, clock=clock, plugins=[SlowScrub(clock)]) as memory:
        await memory.ingest(msg("m1", "I adopted a greyhound named Pixel", ts=NOON.isoformat()))
        assert (await memory.forget(user_id="u1"))["memories"] == 1  # from noon to a minute past
        meanwhile = NOON + dt.timedelta(seconds=30)
        await memory.ingest(msg("m2", "I moved to Lisbon in March", ts=meanwhile.isoformat()))
        assert (await memory.forget(user_id="u1", asked_at=meanwhile))["memories"] == 1
        assert await store_sql(memory, EPISODES) == []


class SeesTriage:
    """A plugin's triage that notes every text it is asked about."""

    narrmem_name = "sees_triage"

    def __init__(self) -> None:
        self.texts: list[str] = []

    @hookimpl(tryfirst=True)
    def narrmem_triage(self, memory: Any, message: Message) -> None:
        self.texts.append(message.text)


async def test_a_held_message_of_someone_forgotten_since_is_not_triaged(tmp_path: Path) -> None:
    """Its refusal ran triage to name a layer: the message's text embedded (kept in the embedder's
    recent texts) and every plugin's triage run, one that counts what it refuses writing state
    about the forgotten person that no forget would take away."""
    import httpx

    from narrmem.doors.server import create_app

    clock = ManualClock(NOON)
    spy = SeesTriage()
    async with open_memory(tmp_path / "m", clock=clock, plugins=[spy]) as memory:
        transport = httpx.ASGITransport(create_app(memory))
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            await memory.forget(user_id="ann")
            clock.advance(minutes=5)
            before = (NOON - dt.timedelta(minutes=10)).isoformat()
            held = msg("1", "My bank card PIN is on a note in my wallet", user="ann", held_since=before)
            result = (await client.post("/v1/ingest", json=held)).json()
    assert not result["stored"] and result["layer"] == "ignore" and "forgotten since" in result["reason"]
    assert spy.texts == []
