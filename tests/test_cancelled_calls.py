"""Calls a bot cancels: a handler under ``asyncio.timeout``, a library cancelling its tasks at
shutdown, an HTTP client that hangs up. What was begun is finished or not begun: a write whose
rows are committed has its vectors in the index, and a close closes."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import msg

from narrmem import Memory, Message, Scope, hookimpl
from narrmem.testing import open_memory
from narrmem.to_the_end import to_the_end


async def test_to_the_end_finishes_the_work_then_raises_the_cancel() -> None:
    steps: list[str] = []

    async def work() -> str:
        steps.append("begun")
        await asyncio.sleep(0.05)
        steps.append("ended")
        return "done"

    task = asyncio.ensure_future(to_the_end(work()))
    await asyncio.sleep(0.01)
    task.cancel()
    results = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert steps == ["begun", "ended"]
    assert await to_the_end(work()) == "done"


@pytest.mark.sqlite_only("the SQLite store's vector index beside its rows")
async def test_an_ingest_cancelled_as_its_vectors_go_into_the_index_leaves_them_there(tmp_path: Path) -> None:
    """Cancelled after the commit, at the index's add, the memory kept its row and lost its
    vector: no vector search found it, and the next open did not notice (the change counts
    matched)."""
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(msg("m0", "my sister Lena lives in Porto", user="ann"))
        await _cancelled_at_the_index(memory, msg("m1", "my favourite bakery is called Crumb", user="ann"))
        retry = await memory.ingest(msg("m1", "my favourite bakery is called Crumb", user="ann"))
        assert retry.duplicate
        await memory.settle()
        [(row_id,)] = await _rows(memory, "SELECT id FROM memories WHERE text LIKE '%Crumb%'")
        vector = await memory.embedder.embed(["my favourite bakery is called Crumb"])
        found = await memory.store.search_vectors(Scope(user_id="ann"), np.asarray(vector[0]), 5)
        assert row_id in [memory_id for memory_id, _ in found]


async def _cancelled_at_the_index(memory: Memory, message: dict[str, Any]) -> None:
    """Ingest ``message``, its caller cancelled as its vectors go into the SQLite store's index
    (after its rows are committed)."""
    index = memory.store.index
    original = index.add
    reached = asyncio.Event()

    def add(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        return original(*args, **kwargs)

    index.add = add
    try:
        task = asyncio.ensure_future(memory.ingest(message))
        await reached.wait()
        task.cancel()
        [outcome] = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome, asyncio.CancelledError)
    finally:
        index.add = original


async def _forget_whose_caller_gives_up(memory: Memory) -> None:
    """Ann's six memories, and a forget of her whose caller is cancelled as it begins."""
    for n in range(6):
        await memory.ingest(msg(f"a{n}", f"my sister Lena lives in Porto, {n}", user="ann"))
    await memory.settle()
    forgetting = asyncio.ensure_future(memory.forget(user_id="ann"))
    for _ in range(2):
        await asyncio.sleep(0)
    forgetting.cancel()
    await asyncio.gather(forgetting, return_exceptions=True)


async def _rows(memory: Memory, query: str) -> list[tuple[Any, ...]]:
    async with memory.store.sql() as db:
        rows: list[tuple[Any, ...]] = await db.fetchall(query, ())
    return rows


async def test_a_close_cancelled_part_way_still_closes(tmp_path: Path) -> None:
    """The close stopped at its first step: the store stayed open (the folder locked to a new
    open, even in this process), its threads kept the process from exiting, and a second close
    returned at once."""
    before = set(threading.enumerate())
    memory = await open_memory(tmp_path / "m", storage={"acknowledge": "on_receipt"})
    for n in range(3):
        await memory.ingest(msg(f"m{n}", f"a message about gardening, number {n}", user="ann"))
    closing = asyncio.ensure_future(memory.close())
    for _ in range(3):
        await asyncio.sleep(0)
    closing.cancel()
    await asyncio.gather(closing, return_exceptions=True)
    await memory.close()
    async with open_memory(tmp_path / "m") as reopened:
        assert len(await _rows(reopened, "SELECT id FROM memories WHERE kind = 'episode'")) == 3
    for _ in range(50):
        # The event loop's own executor thread (asyncio_0) ends with the loop, not with a memory.
        new = set(threading.enumerate()) - before
        left = [t for t in new if t.is_alive() and not t.daemon and not t.name.startswith("asyncio_")]
        if not left:
            break
        await asyncio.sleep(0.02)
    assert left == []


async def test_settle_waits_for_a_forget_whose_caller_gave_up(tmp_path: Path) -> None:
    """The forget runs on to its end, but settle() returned before it: the person was still
    recalled right after."""
    async with open_memory(tmp_path / "m") as memory:
        await _forget_whose_caller_gives_up(memory)
        await memory.settle()
        assert await _rows(memory, "SELECT id FROM memories WHERE user_id = 'ann'") == []
        assert await memory.recall("where does my sister live", user_id="ann", reinforce=False) == []


class AfterStoreSeen:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    async def narrmem_after_store(self, message: Message) -> None:
        self.seen.append(message.message_id)


@pytest.mark.sqlite_only("the SQLite store's vector index beside its rows")
@pytest.mark.parametrize("acknowledge", ["after_hooks", "after_write"])
async def test_the_hooks_of_an_ingest_cancelled_as_it_is_written_run_by_settle(
    tmp_path: Path, acknowledge: str
) -> None:
    """Cancelled as its write ended, the message was stored and its after-store hooks (counts,
    facts, triggers) were left for the next open: months later for a bot that runs for months.
    They run once, by ``settle()``, and the next open does not run them again."""
    seen = AfterStoreSeen()
    async with open_memory(tmp_path / "m", plugins=[seen], storage={"acknowledge": acknowledge}) as memory:
        await memory.ingest(msg("m0", "my sister Lena lives in Porto", user="ann"))
        await memory.settle()
        await _cancelled_at_the_index(memory, msg("m1", "I moved to Lisbon for my new job", user="ann"))
        await memory.settle()
        assert seen.seen == ["m0", "m1"]
        assert await _rows(memory, "SELECT key FROM plugin_state WHERE namespace = 'narrmem.settling'") == []
    again = AfterStoreSeen()
    async with open_memory(tmp_path / "m", plugins=[again]) as memory:
        await memory.settle()
    assert again.seen == []


async def test_settle_waits_for_an_edit_whose_caller_gave_up(tmp_path: Path) -> None:
    """The edit runs on to its end, but settle() returned before it: the old text was still
    recalled right after, and the new one not yet."""
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(msg("e1", "my sister Lena lives in Porto", user="ann"))
        await memory.settle()
        editing = asyncio.ensure_future(memory.edit(msg("e1", "my sister Lena lives in Madrid", user="ann")))
        for _ in range(2):
            await asyncio.sleep(0)
        editing.cancel()
        await asyncio.gather(editing, return_exceptions=True)
        await memory.settle()
        texts = [
            hit.text
            for hit in await memory.recall("where does my sister live", user_id="ann", reinforce=False)
        ]
        assert any("Madrid" in text for text in texts)
        assert not any("Porto" in text for text in texts)


async def test_a_close_right_after_an_edit_whose_caller_gave_up_lets_it_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The close shut the store under the edit still under way: it failed half way (the store
    closed), and the next open had to make it again."""
    caplog.set_level(logging.WARNING, logger="narrmem")
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(msg("e1", "my sister Lena lives in Porto", user="ann"))
        editing = asyncio.ensure_future(memory.edit(msg("e1", "my sister Lena lives in Madrid", user="ann")))
        for _ in range(2):
            await asyncio.sleep(0)
        editing.cancel()
        await asyncio.gather(editing, return_exceptions=True)
    async with open_memory(tmp_path / "m") as memory:
        assert [r.getMessage() for r in caplog.records] == []
        assert await _rows(memory, "SELECT key FROM plugin_state WHERE namespace LIKE '%edit%'") == []
        texts = [
            hit.text
            for hit in await memory.recall("where does my sister live", user_id="ann", reinforce=False)
        ]
        assert any("Madrid" in text for text in texts)


async def test_a_settle_cancelled_while_it_waits_leaves_the_forget_running(tmp_path: Path) -> None:
    """settle() waited for the forgets whose callers gave up with asyncio.gather, which cancels
    what it waits for when it is itself cancelled: an export whose client hung up (it settles
    first) cancelled the forget half way, its job left recorded, and every later export refused
    with 409 until a restart."""
    async with open_memory(tmp_path / "m") as memory:
        await _forget_whose_caller_gives_up(memory)
        settling = asyncio.ensure_future(memory.settle())
        await asyncio.sleep(0)
        assert not settling.done()
        settling.cancel()
        await asyncio.gather(settling, return_exceptions=True)
        await memory.settle()
        assert await _rows(memory, "SELECT id FROM forget_jobs") == []
        assert await _rows(memory, "SELECT id FROM memories WHERE user_id = 'ann'") == []


@pytest.mark.sqlite_only("the SQLite store's vector index beside its rows")
async def test_a_delete_cancelled_after_its_commit_takes_the_vectors_out_too(tmp_path: Path) -> None:
    """A scene's forget (``soul_narrative``, over MCP) cancelled once its rows were deleted left
    their vectors in the index and in its file at close: a forgotten scene's vector kept."""
    async with open_memory(tmp_path / "m") as memory:
        added = await memory.call_tool(
            "soul_narrative", {"action": "add", "user_id": "ann", "event": "moved to Porto"}
        )
        scene = added["scenes"][0]["id"]
        index = memory.store.index
        original = index.remove
        reached = asyncio.Event()

        async def remove(*args: Any, **kwargs: Any) -> Any:
            reached.set()
            await asyncio.sleep(0)  # where the caller's cancel lands
            return await original(*args, **kwargs)

        index.remove = remove
        try:
            forgetting = asyncio.ensure_future(
                memory.call_tool("soul_narrative", {"action": "forget", "user_id": "ann", "id": scene})
            )
            await reached.wait()
            forgetting.cancel()
            await asyncio.gather(forgetting, return_exceptions=True)
        finally:
            index.remove = original
        # The forget runs on to its end though its caller gave up: settled, it has.
        await memory.settle()
        stats = await memory.stats()
        assert stats["vectors_indexed"] == stats["memories"]
        assert not await memory.store.get([scene], None)
