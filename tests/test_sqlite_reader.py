"""The SQLite store reads on a connection of its own, which sees only what is committed: a read
made while another task's write transaction is open sees none of its rows (they may still roll
back), the task that writes sees its own, and the read connection refuses to write. Real SQLite
file. A small lookup by id is read on the event loop's thread, on a third connection that sees the
same."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from narrmem_plugins.storage_sqlite.store import INLINE_IDS

from narrmem import Scope
from narrmem.errors import StoreError
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only

TABLE = "CREATE TABLE IF NOT EXISTS reader_probe (n INTEGER)"
COUNT = "SELECT COUNT(*) FROM reader_probe"


async def test_an_open_write_is_unseen_by_other_readers_and_gone_after_a_rollback(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        store = memory.store
        async with store.sql(write=True) as db:
            await db.execute(TABLE)
        inside, release = asyncio.Event(), asyncio.Event()
        seen_by_writer: list[tuple[object, ...] | None] = []

        async def write_then_fail() -> None:
            async with store.sql(write=True) as db:
                await db.execute("INSERT INTO reader_probe (n) VALUES (1)")
                async with store.sql() as own:  # the writing task reads what it wrote
                    seen_by_writer.append(await own.fetchone(COUNT))
                inside.set()
                await release.wait()
                raise RuntimeError("the write fails after its rows were inserted")

        writer = asyncio.ensure_future(write_then_fail())
        await inside.wait()
        async with store.sql() as db:
            assert await db.fetchone(COUNT) == (0,)  # not committed: not there for anyone else
        release.set()
        with pytest.raises(RuntimeError):
            await writer
        assert seen_by_writer == [(1,)]
        async with store.sql() as db:
            assert await db.fetchone(COUNT) == (0,)


async def test_recall_during_an_open_write_sees_only_what_is_committed(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("a1", "I adopted a greyhound called Comet", user="ann"))
        inside, release = asyncio.Event(), asyncio.Event()

        async def hold_a_write() -> None:
            async with memory.store.sql(write=True) as db:
                await db.execute(TABLE)
                inside.set()
                await release.wait()

        writer = asyncio.ensure_future(hold_a_write())
        await inside.wait()
        # Reads do not wait for the write to end, and find what was committed before it began.
        hits = await asyncio.wait_for(memory.recall("greyhound Comet", user_id="ann"), timeout=30)
        assert [h.text for h in hits] == ["I adopted a greyhound called Comet"]
        release.set()
        await writer


async def test_the_read_connection_refuses_to_write(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        async with memory.store.sql() as db:
            with pytest.raises(StoreError, match=r"readonly|read-only"):
                await db.execute(TABLE)
        async with memory.store.sql(write=True) as db:  # the way to write
            await db.execute(TABLE)


def reads_through_thread(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements the store sends to a connection's thread from now on."""
    sent: list[str] = []
    fetchall = store._fetchall

    async def spy(sql: str, params: Any = ()) -> Any:
        sent.append(sql)
        return await fetchall(sql, params)

    monkeypatch.setattr(store, "_fetchall", spy)
    return sent


async def test_a_small_lookup_by_id_is_read_where_it_is_asked_and_sees_only_what_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("a1", "I adopted a greyhound called Comet", user="ann"))
        store: Any = memory.store
        scope = Scope(user_id="ann")
        [memory_id] = await store.from_messages("default", "c1", ["a1"])
        through_thread = reads_through_thread(store, monkeypatch)
        inside, release = asyncio.Event(), asyncio.Event()
        seen_by_writer: list[str] = []

        async def change_then_fail() -> None:
            async with store.sql(write=True) as db:
                await db.execute("UPDATE memories SET text = 'a whippet' WHERE id = ?", (memory_id,))
                seen_by_writer.append((await store.get([memory_id], scope))[memory_id].text)
                inside.set()
                await release.wait()
                raise RuntimeError("the write fails after its change")

        writer = asyncio.ensure_future(change_then_fail())
        await inside.wait()
        assert len(through_thread) == 1  # the writing task reads its own change on its connection
        assert seen_by_writer == ["a whippet"]
        got = await store.get([memory_id], scope)
        assert got[memory_id].text == "I adopted a greyhound called Comet"  # not committed
        records, vectors = await store.get_with_vectors([memory_id], scope)
        assert records[memory_id].text == got[memory_id].text and vectors[memory_id].shape == (store.dim,)
        assert len(through_thread) == 1  # read where they were asked
        assert await store.get([memory_id], Scope(user_id="bob")) == {}  # the scope is in the statement
        release.set()
        with pytest.raises(RuntimeError):
            await writer
        # More ids than a small lookup holds go to the reader's thread, and find the same.
        many = [memory_id, *range(10**6, 10**6 + INLINE_IDS)]
        assert (await store.get(many, scope)).keys() == {memory_id}
        assert len(through_thread) == 2


async def test_a_lookup_the_database_lock_stops_is_read_by_the_reader_instead(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("a1", "I adopted a greyhound called Comet", user="ann"))
        store: Any = memory.store
        [memory_id] = await store.from_messages("default", "c1", ["a1"])

        class Locked:
            def execute(self, *_: Any) -> Any:
                raise sqlite3.OperationalError("database is locked")

            def close(self) -> None:
                pass

        lookups, store._lookups = store._lookups, Locked()
        try:
            got = await store.vectors([memory_id], Scope(user_id="ann"))
            assert list(got) == [memory_id]
        finally:
            store._lookups = lookups


async def test_a_plugins_state_the_duplicate_check_and_a_chats_last_turns_are_small_lookups_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("a1", "I adopted a greyhound called Comet", user="ann"))
        store: Any = memory.store
        await store.state_put("probe", "k", {"n": 1})
        through_thread = reads_through_thread(store, monkeypatch)
        inside, release = asyncio.Event(), asyncio.Event()
        seen_by_writer: list[Any] = []

        async def change_then_fail() -> None:
            async with store.sql(write=True) as db:
                await db.execute("UPDATE plugin_state SET value = '{\"n\": 2}' WHERE namespace = 'probe'")
                seen_by_writer.append(await store.state_get("probe", "k"))
                inside.set()
                await release.wait()
                raise RuntimeError("the write fails after its change")

        writer = asyncio.ensure_future(change_then_fail())
        await inside.wait()
        assert seen_by_writer == [{"n": 2}] and len(through_thread) == 1
        assert await store.state_get("probe", "k") == {"n": 1}  # not committed
        assert await store.state_get("probe", "missing") is None
        keys = [("default", "c1", "a1"), ("default", "c1", "a2"), ("default", "c2", "a1")]
        assert await store.stored_messages(keys) == {("default", "c1", "a1")}
        assert await store.stored_message_ids("default", "c1", ["a1", "a2"]) == {"a1"}
        [turn] = await store.recent(Scope(user_id="ann", chat_id="c1"), kinds=["episode"], limit=12)
        assert turn.text == "I adopted a greyhound called Comet"
        assert len(through_thread) == 1  # all read where they were asked
        # A filter on the rows' JSON may read many rows: it goes to the reader's thread.
        assert await store.recent(Scope(user_id="ann"), limit=12, meta_has=("emotions", "tired")) == []
        assert len(through_thread) == 2
        release.set()
        with pytest.raises(RuntimeError):
            await writer


async def test_a_write_cancelled_while_it_waits_to_begin_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A cancelled ``await`` does not stop the statement on the connection's thread: a BEGIN that
    was waiting for another connection's lock begins once it is free, and the store rolls it back
    instead of leaving every later write "within a transaction"."""
    async with open_memory(tmp_path) as memory:
        store: Any = memory.store
        other = sqlite3.connect(store.db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writing

        async def write() -> None:
            async with store.sql(write=True) as db:
                await db.execute(TABLE)

        waiting = asyncio.ensure_future(write())
        await asyncio.sleep(0.3)  # its BEGIN IMMEDIATE waits on the connection's thread
        waiting.cancel()
        await asyncio.sleep(0.1)
        other.execute("ROLLBACK")  # the BEGIN goes through now, after its caller was cancelled
        other.close()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        result = await memory.ingest(msg("a1", "I adopted a greyhound called Comet", user="ann"))
        assert result.stored
        async with store.sql() as db:
            assert await db.fetchone("SELECT COUNT(*) FROM sqlite_master WHERE name = 'reader_probe'") == (0,)


def _companions(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(("-wal", "-shm", "-journal")))


async def test_a_read_only_open_leaves_no_file_behind_and_writes_nothing(tmp_path: Path) -> None:
    """Opened read-only (``narrmem stats``, an export, the inspector), a folder no process was
    using was left with a -wal and a -shm file: SQLite's read-only connection made them and could
    not remove them. Nothing is written either: the database's bytes are as they were."""
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
    assert _companions(tmp_path) == []
    before = (tmp_path / "narrmem.sqlite3").read_bytes()
    async with open_memory(tmp_path, read_only=True) as memory:
        assert await memory.recall("greyhound", user_id="ann", reinforce=False)
        assert (await memory.stats())["memories"] == 1
        with pytest.raises(StoreError, match="read-only"):
            await memory.ingest(msg("2", "I moved to Porto last spring", user="ann"))
    assert _companions(tmp_path) == []
    assert (tmp_path / "narrmem.sqlite3").read_bytes() == before


async def test_a_read_only_open_beside_a_writer_sees_its_commits_and_leaves_its_files(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as writer:
        await writer.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
        assert _companions(tmp_path)  # the writer's own
        async with open_memory(tmp_path, read_only=True) as reader:
            await writer.ingest(msg("2", "my sister Lena lives in Porto", user="ann"))
            await writer.settle()
            assert (await reader.stats())["memories"] == 2
        await writer.ingest(msg("3", "I started learning the cello", user="ann"))
        await writer.settle()
        assert (await writer.stats())["memories"] == 3
    async with open_memory(tmp_path, read_only=True) as reader:
        assert (await reader.stats())["memories"] == 3
    assert _companions(tmp_path) == []
    with sqlite3.connect(tmp_path / "narrmem.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
