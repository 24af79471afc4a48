"""Group commit: single ingests from concurrent chats that arrive while a store is in progress are
stored together (one embedding call, one transaction); ignored messages never wait; a cancelled
caller's message is not stored; a failure reaches every caller of its group; an ingest made from
an after-store hook goes straight through."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import msg

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.errors import StoreError
from narrmem.models import IngestResult, Message
from narrmem.testing import HashEmbedder, open_memory

# Plain statements: triage keeps them without a scene check (no embedding of their own).
TEXTS = [
    "my sister Ana moved to Porto last spring",
    "our dog Biscuit loves the beach near Aveiro",
    "the old piano in the hall belonged to my grandfather",
    "Marta from work grows tomatoes on her balcony",
    "the bakery on Rua Nova sells the best custard tarts",
    "my cousin Tiago plays bass in a jazz trio",
    "the library closes early on Saturdays in winter",
    "Rui collects vintage postcards from the Azores",
]


class GatedEmbedder(HashEmbedder):
    """The hash embedder, with every call's texts recorded and a gate that can hold calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if not self.gate.is_set():
            self.held += 1
            await self.gate.wait()
        return await super().embed(texts)

    def stored_batches(self) -> list[int]:
        """The sizes of the calls that embedded messages to store (their attributed text)."""
        return [len(call) for call in self.calls if all(' said, "' in text for text in call)]


class Lender:
    narrmem_name = "gated_embedder"

    def __init__(self, embedder: GatedEmbedder) -> None:
        self.embedder = embedder

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register("gated", lambda settings: self.embedder)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def opened(folder: Path, embedder: GatedEmbedder, *plugins: object, **storage: Any) -> Any:
    return open_memory(
        folder, plugins=[Lender(embedder), *plugins], embedder={"backend": "gated"}, storage=storage
    )


async def store_while_one_is_held(memory: Any, embedder: GatedEmbedder, n: int) -> list[IngestResult]:
    """The first message's store is held in its embedding while the other n - 1 arrive."""
    embedder.gate.clear()
    first = asyncio.create_task(memory.ingest(msg("m0", TEXTS[0], chat="c0")))
    await until(lambda: embedder.held == 1)
    rest = [asyncio.create_task(memory.ingest(msg(f"m{i}", TEXTS[i], chat=f"c{i}"))) for i in range(1, n)]
    await asyncio.sleep(0.05)
    embedder.gate.set()
    return list(await asyncio.gather(first, *rest))


async def test_concurrent_ingests_share_one_embedding_call_and_one_write(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder) as memory:
        writes: list[int] = []
        add = memory.store.add

        async def counted_add(records: Any, vectors: Any) -> list[int]:
            writes.append(len(records))
            ids: list[int] = await add(records, vectors)
            return ids

        memory.store.add = counted_add
        results = await store_while_one_is_held(memory, embedder, 8)
        assert [r.message_id for r in results] == [f"m{i}" for i in range(8)]
        assert all(r.stored for r in results)
        assert len({i for r in results for i in r.memory_ids}) == 8
        assert embedder.stored_batches() == [1, 7]
        assert writes == [1, 7]
        # Each message was stored in its own chat and user, and comes back there.
        for i in range(8):
            [hit] = await memory.recall(TEXTS[i], user_id="u1", chat_id=f"c{i}", k=1, reinforce=False)
            assert hit.message_ids == [f"m{i}"]


async def test_without_group_commit_each_ingest_is_stored_alone(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder, group_commit=False) as memory:
        results = await store_while_one_is_held(memory, embedder, 4)
    assert all(r.stored for r in results)
    assert embedder.stored_batches() == [1, 1, 1, 1]


async def test_an_ignored_message_returns_while_a_store_is_in_progress(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder) as memory:
        embedder.gate.clear()
        kept = asyncio.create_task(memory.ingest(msg("m0", TEXTS[0])))
        await until(lambda: embedder.held == 1)
        ignored = await asyncio.wait_for(memory.ingest(msg("m1", "ok", chat="c9")), timeout=2)
        assert (ignored.layer, ignored.stored) == ("ignore", False)
        assert not kept.done()
        embedder.gate.set()
        assert (await kept).stored


async def test_a_caller_cancelled_while_waiting_leaves_nothing_stored(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder) as memory:
        embedder.gate.clear()
        first = asyncio.create_task(memory.ingest(msg("m0", TEXTS[0])))
        await until(lambda: embedder.held == 1)
        waiting = asyncio.create_task(memory.ingest(msg("m1", TEXTS[1], chat="c1")))
        await asyncio.sleep(0.05)
        waiting.cancel()
        embedder.gate.set()
        assert (await first).stored
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await memory.store.stored_message_ids("default", "c1", ["m1"]) == set()
        assert (await memory.stats())["memories"] == 1


async def test_a_failed_write_reaches_every_caller_of_its_group_and_stores_none_of_it(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder) as memory:
        add = memory.store.add

        async def failing_add(records: Any, vectors: Any) -> list[int]:
            if len(records) > 1:
                raise StoreError("disk full (simulated)")
            ids: list[int] = await add(records, vectors)
            return ids

        memory.store.add = failing_add
        embedder.gate.clear()
        first = asyncio.create_task(memory.ingest(msg("m0", TEXTS[0], chat="c0")))
        await until(lambda: embedder.held == 1)
        group = [asyncio.create_task(memory.ingest(msg(f"m{i}", TEXTS[i], chat=f"c{i}"))) for i in (1, 2)]
        await asyncio.sleep(0.05)
        embedder.gate.set()
        assert (await first).stored
        for task in group:
            with pytest.raises(StoreError, match="disk full"):
                await task
        assert (await memory.stats())["memories"] == 1
        # The committer is free again: the next message is stored.
        memory.store.add = add
        assert (await memory.ingest(msg("m3", TEXTS[3], chat="c3"))).stored


class EchoPlugin:
    """Stores a note about every message it sees stored, from its after-store hook."""

    narrmem_name = "echo"

    @hookimpl
    async def narrmem_after_store(self, memory: Any, message: Message, **_: Any) -> None:
        if not message.message_id.startswith("echo-"):
            await memory.ingest(
                msg(f"echo-{message.message_id}", f"noted: {message.text}", chat=message.chat_id)
            )


async def test_an_ingest_from_an_after_store_hook_goes_straight_through(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    async with opened(tmp_path / "m", embedder, EchoPlugin()) as memory:
        results = await asyncio.wait_for(store_while_one_is_held(memory, embedder, 3), timeout=10)
        assert all(r.stored for r in results)
        stored = await memory.store.stored_message_ids("default", "c1", ["m1", "echo-m1"])
        assert stored == {"m1", "echo-m1"}


async def test_close_waits_for_the_messages_still_waiting(tmp_path: Path) -> None:
    embedder = GatedEmbedder()
    memory = await opened(tmp_path / "m", embedder)
    embedder.gate.clear()
    first = asyncio.create_task(memory.ingest(msg("m0", TEXTS[0], chat="c0")))
    await until(lambda: embedder.held == 1)
    second = asyncio.create_task(memory.ingest(msg("m1", TEXTS[1], chat="c1")))
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(memory.close())
    await asyncio.sleep(0.05)
    embedder.gate.set()
    await closing
    assert (await first).stored and (await second).stored
    async with opened(tmp_path / "m", GatedEmbedder()) as reopened:
        assert (await reopened.stats())["memories"] == 2


@pytest.mark.slow
async def test_concurrent_chats_with_the_real_model(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        results = await asyncio.gather(
            *(memory.ingest(msg(f"m{i}", text, chat=f"c{i}", user=f"u{i}")) for i, text in enumerate(TEXTS))
        )
        assert all(r.stored for r in results)
        questions = ["where did Ana move?", "what does Rui collect?", "what does Tiago play?"]
        for question, index in zip(questions, (0, 7, 5), strict=True):
            hits = await memory.recall(question, user_id=f"u{index}", k=1, reinforce=False)
            assert hits[0].message_ids == [f"m{index}"]
        stats = await memory.stats()
        assert stats["memories"] == len(TEXTS) == stats["vectors_indexed"]
