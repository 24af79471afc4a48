"""The SQLite store reads on a connection of its own, which sees only what is committed: a read
made while another task's write transaction is open sees none of its rows (they may still roll
back), the task that writes sees its own, and the read connection refuses to write. Real SQLite
file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _helpers import msg

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
