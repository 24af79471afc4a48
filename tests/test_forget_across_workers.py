"""A forget by one worker of a shared PostgreSQL store against the messages another worker is
writing at that moment: nothing the other worker's after-store hooks make outlives the forget, in
every acknowledge mode, and a message that worker begins during the forget is stored after it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _postgres import fresh_database
from test_forget_in_flight import SlowFacts, ann, everything, graph_of

from narrmem.testing import open_memory

MODES = ["after_hooks", "after_write", "on_receipt"]
WAIT = 20.0  # seconds: a hang fails the test instead of the run


@pytest.mark.parametrize("acknowledge", MODES)
async def test_a_forget_by_another_worker_during_the_hooks_leaves_nothing_they_made(
    tmp_path: Path, acknowledge: str
) -> None:
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    facts = SlowFacts()
    async with (
        open_memory(tmp_path / "a", real_model=True, plugins=[facts], storage=storage) as writer,
        open_memory(tmp_path / "b", real_model=True, storage=storage) as forgetter,
    ):
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
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": acknowledge}
    facts = SlowFacts()
    async with (
        open_memory(tmp_path / "a", real_model=True, plugins=[facts], storage=storage) as writer,
        open_memory(tmp_path / "b", real_model=True, storage=storage) as forgetter,
    ):
        first = asyncio.ensure_future(writer.ingest(ann("1", "I work at Acme Bank as an analyst.")))
        await asyncio.wait_for(facts.started.wait(), WAIT)
        forget = asyncio.ensure_future(forgetter.forget(user_id="ann", tenant="t"))
        await asyncio.sleep(0.1)
        assert not forget.done()  # it waits for the other worker's hooks under way
        after = await asyncio.wait_for(writer.ingest(ann("2", "I adopted a greyhound named Pixel.")), WAIT)
        assert forget.done()  # the second message waited for the forget
        await asyncio.wait_for(first, WAIT)
        await asyncio.wait_for(writer.settle(), WAIT)
        assert after.stored
        assert [r.message_ids for r in await everything(forgetter)] == [["2"]]
        # The second message's own fact is the only one: the first's went with the forget.
        assert (await graph_of(forgetter))["edges"] == {"active": 1}


async def test_a_worker_whose_fence_connection_ended_takes_the_fence_again(tmp_path: Path) -> None:
    """The connection that holds the fence ends (a restart, an idle timeout): the next message
    opens another, and a forget by another worker still waits for its hooks."""
    dsn = await fresh_database("across")
    storage = {"backend": "postgres", "dsn": dsn}
    facts = SlowFacts()
    async with (
        open_memory(tmp_path / "a", real_model=True, plugins=[facts], storage=storage) as writer,
        open_memory(tmp_path / "b", real_model=True, storage=storage) as forgetter,
    ):
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
