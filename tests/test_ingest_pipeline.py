"""``ingest_many`` in batches: each batch's before-store hooks run with the batches before it
written, the next batch is triaged and embedded while one is written, results keep their order,
and a batch whose embedding fails leaves nothing of itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.ingest import batch_bounds
from narrmem.models import Message, Scope
from narrmem.testing import HashEmbedder, open_memory

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)


class SlowEmbedder(HashEmbedder):
    """Embeds on a thread, slowly; ``fail_on`` makes a call that holds that text fail."""

    def __init__(self, seconds: float = 0.2, fail_on: str | None = None) -> None:
        self.seconds = seconds
        self.fail_on = fail_on

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail_on is not None and any(self.fail_on in text for text in texts):
            raise RuntimeError("the model failed")

        def work() -> np.ndarray:
            time.sleep(self.seconds)
            return np.vstack([self.vector(t) for t in texts])

        return await asyncio.to_thread(work)


class Plugins:
    """Registers the slow embedder."""

    def __init__(self, embedder: SlowEmbedder) -> None:
        self.embedder = embedder

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register("slow", lambda settings: self.embedder)


def messages(n: int) -> list[dict[str, Any]]:
    return [
        {
            "text": f"I planted tomato number {i} in the garden of the house on Elm street today.",
            "user_id": "ann",
            "chat_id": "garden",
            "ts": T0 + timedelta(minutes=i),
            "message_id": f"g{i}",
        }
        for i in range(n)
    ]


class RecentReader:
    """Notes how many of the chat's episodes the store holds when each message's records are built."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    @hookimpl
    async def narrmem_before_store(self, memory: Any, message: Message) -> None:
        chat = Scope(tenant=message.tenant, chat_id=message.chat_id)
        self.seen[message.message_id] = len(await memory.store.recent(chat, kinds=["episode"], limit=100))


@pytest.mark.asyncio
async def test_a_batch_is_built_on_the_batches_before_it_written(tmp_path: Path) -> None:
    """The before-store hooks of a batch see every earlier batch in the store (a scene's window of
    earlier messages reads it): a batch's records are not built ahead of the write before it."""
    reader = RecentReader()
    embedder = SlowEmbedder(seconds=0.05)
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder), reader], **settings) as mem:
        results = await mem.ingest_many(messages(12))
    assert [r.message_id for r in results] == [f"g{i}" for i in range(12)]
    assert all(r.stored for r in results)
    assert [reader.seen[f"g{i}"] for i in range(12)] == [0] * 4 + [4] * 4 + [8] * 4


@pytest.mark.asyncio
async def test_a_failed_embedding_leaves_nothing_of_the_batches_after_it(tmp_path: Path) -> None:
    texts = messages(12)
    embedder = SlowEmbedder(seconds=0.05)
    plugins = Plugins(embedder)
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    async with open_memory(tmp_path / "m", plugins=[plugins], **settings) as mem:
        first = await mem.ingest_many(texts[:4])
        assert all(r.stored for r in first)
        embedder.fail_on = "tomato number 8 "
        with pytest.raises(RuntimeError, match="the model failed"):
            await mem.ingest_many(texts)
        stats = await mem.stats()
        await asyncio.sleep(0.2)  # nothing of the failed call goes on writing after it returns
        assert (await mem.stats())["memories"] == stats["memories"]
        hits = await mem.recall("tomato", user_id="ann", k=20, reinforce=False)
    kept = {mid for hit in hits for mid in hit.message_ids}
    # The first batch was stored before (a duplicate now), the second is stored; the third
    # failed, and nothing of it was written.
    assert {"g8", "g9", "g10", "g11"}.isdisjoint(kept)
    assert {"g0", "g4"} <= kept


class Rewriter:
    """A before-store hook that changes what the episode embeds and adds a record of its own,
    slowly (it waits on I/O), noting when it ran."""

    def __init__(self) -> None:
        self.ran: list[float] = []

    @hookimpl
    async def narrmem_before_store(self, message: Message, records: list[Any]) -> None:
        self.ran.append(time.perf_counter())
        await asyncio.sleep(0.1)
        episode = records[0]
        if "rewrite" in message.text:
            episode.embed_text = f"rewritten: {message.text}"
        records.append(episode.model_copy(update={"kind": "note", "embed_text": f"note on {message.text}"}))
        self.ran.append(time.perf_counter())


class TimedEmbedder(SlowEmbedder):
    def __init__(self) -> None:
        super().__init__(seconds=0.1)
        self.calls: list[tuple[float, list[str]]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append((time.perf_counter(), list(texts)))
        return await super().embed(texts)


@pytest.mark.asyncio
async def test_episodes_embed_while_the_before_store_hooks_run_and_every_record_gets_its_own_vector(
    tmp_path: Path,
) -> None:
    """The model starts on the episodes' texts before the hooks finish; a text a hook changed or
    added is embedded afterwards, so no record keeps a vector of a text it does not hold."""
    embedder = TimedEmbedder()
    rewriter = Rewriter()
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 8}}
    batch = messages(2)
    batch[1]["text"] = "Please rewrite the garden plan: tomatoes go by the fence on Elm street."
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder), rewriter], **settings) as mem:
        results = await mem.ingest_many(batch)
        assert all(r.stored for r in results)
        first_start, first_texts = embedder.calls[0]
        assert first_start < rewriter.ran[-1]  # the model was at work while the hooks ran
        assert len(first_texts) == 2 and all(" said, " in t for t in first_texts)
        records = [r for result in results for r in result.records]
        assert len(records) == 4
        vectors = await mem.store.vectors([r.id for r in records if r.id is not None], Scope(user_id="ann"))
        for record in records:
            assert record.id is not None
            assert np.allclose(vectors[record.id], embedder.vector(record.index_text))
        assert records[2].index_text.startswith("rewritten: ")


@pytest.mark.asyncio
async def test_the_next_batch_is_embedded_while_a_batch_is_written(tmp_path: Path) -> None:
    """The model does not wait for a batch's write: the next batch's texts reach it first, and the
    results and records are the ones a batch at a time gives."""
    events: list[tuple[str, tuple[str, ...]]] = []
    embedder = SlowEmbedder(seconds=0.05)
    embed = embedder.embed

    async def logged_embed(texts: Sequence[str]) -> np.ndarray:
        events.append(("embed", tuple(texts)))
        return await embed(texts)

    embedder.embed = logged_embed  # type: ignore[method-assign]
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    batch = messages(12)
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder)], **settings) as mem:

        def logged(add: Any) -> Any:
            async def logged_add(records: Any, vectors: Any, *args: Any, **kwargs: Any) -> Any:
                await asyncio.sleep(0.05)  # a slow disk: the next batch's texts arrive meanwhile
                events.append(("write", tuple(m for r in records for m in r.message_ids)))
                return await add(records, vectors, *args, **kwargs)

            return logged_add

        # Batches of four are written while their own texts embed (add_while_embedding), larger
        # ones once embedded (add), with the replies' context lines when there are any
        # (add_with_context): either way the next batch's texts are with the model first.
        mem.store.add = logged(mem.store.add)  # type: ignore[method-assign]
        mem.store.add_while_embedding = logged(mem.store.add_while_embedding)  # type: ignore[attr-defined]
        mem.store.add_with_context = logged(mem.store.add_with_context)  # type: ignore[attr-defined]
        results = await mem.ingest_many(batch)
        assert [r.message_id for r in results] == [f"g{i}" for i in range(12)]
        assert all(r.stored and r.memory_ids for r in results)
        writes = [ids for kind, ids in events if kind == "write"]
        assert writes == [tuple(f"g{i}" for i in range(j, j + 4)) for j in (0, 4, 8)]
        order = [kind + ("" if kind == "write" else str(_batch_of(ids))) for kind, ids in events]
        # Batch 1's texts are with the model before batch 0 is written, batch 2's before batch 1.
        assert order.index("embed1") < order.index("write")
        assert order.index("embed2") < [n for n, kind in enumerate(order) if kind == "write"][1]
        stored = await mem.store.get([mid for r in results for mid in r.memory_ids], Scope(user_id="ann"))
        assert sorted(m for r in stored.values() for m in r.message_ids) == sorted(f"g{i}" for i in range(12))


def _batch_of(texts: tuple[str, ...]) -> int:
    numbers = {int(t.split("tomato number ")[1].split()[0]) // 4 for t in texts if "tomato number " in t}
    assert len(numbers) == 1, texts
    return numbers.pop()


@pytest.mark.parametrize(
    ("n", "size", "sizes"),
    [
        (1, 256, [1]),
        (12, 256, [12]),
        (40, 256, [8, 16, 8, 8]),
        (512, 256, [8, 16, 32, 64, 128, 132, 66, 33, 17, 8, 8]),
        (2048, 256, [8, 16, 32, 64, 128] + [256] * 6 + [132, 66, 33, 17, 8, 8]),
        (12, 4, [4, 4, 4]),
        (10, 4, [4, 4, 2]),
        (5, 2, [2, 2, 1]),
    ],
)
def test_the_first_and_last_batches_are_short(n: int, size: int, sizes: list[int]) -> None:
    """Doubling up to full batches, then halving what is left: the model starts after a short
    triage, and the after-store hooks at the very end are few."""
    bounds = batch_bounds(n, size)
    assert [end - start for start, end in bounds] == sizes
    assert [start for start, _ in bounds] == [0, *(end for _, end in bounds[:-1])]
    assert bounds[-1][1] == n
    assert all(0 < end - start <= size for start, end in bounds)


class Written:
    """Sets ``first`` when the after-store hooks of the first written message run."""

    def __init__(self) -> None:
        self.first = asyncio.Event()

    @hookimpl
    async def narrmem_after_store(self) -> None:
        self.first.set()


@pytest.mark.asyncio
async def test_a_cancelled_import_stops_and_leaves_whole_batches(tmp_path: Path) -> None:
    """Cancelling ``ingest_many`` midway (a bot shutting down) stops it: nothing goes on writing
    after the cancellation, each message is stored whole or not at all, and the store stays usable."""
    embedder = SlowEmbedder(seconds=0.05)
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    batch = messages(200)
    written = Written()
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder), written], **settings) as mem:
        importing = asyncio.ensure_future(mem.ingest_many(batch))
        await written.first.wait()  # cancelled once the first batch is committed
        importing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await importing
        stored = (await mem.stats())["memories"]
        await asyncio.sleep(0.5)  # a batch still running after the cancellation would land here
        assert (await mem.stats())["memories"] == stored
        assert 0 < stored < 200
        again = await mem.ingest_many(batch)  # the rest goes in; what was stored is a duplicate
        assert sum(r.stored for r in again) == 200 - stored
        assert sum(r.duplicate for r in again) == stored


class GatedEmbedder(HashEmbedder):
    """Holds each embedding until ``release`` is set, then returns it, or fails with ``fail``."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.fail = False

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.entered.set()
        await self.release.wait()
        if self.fail:
            raise RuntimeError("the model failed")
        return np.vstack([self.vector(t) for t in texts])


async def write_is_open(mem: Any) -> bool:
    """Whether a write transaction is open now: a plugin's write has to wait for it."""

    async def write() -> None:
        async with mem.store.sql(write=True):
            pass

    try:
        await asyncio.wait_for(write(), timeout=0.3)
    except TimeoutError:
        return True
    return False


async def write_opens(mem: Any, within: float = 10.0) -> bool:
    """Whether a write transaction opens within ``within`` seconds (the model is held meanwhile,
    so the ingest has only its duplicate check and hooks to run before it writes)."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        if await write_is_open(mem):
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.asyncio
@pytest.mark.sqlite_only
@pytest.mark.parametrize("fails", [False, True])
async def test_a_message_is_written_while_it_embeds_and_only_if_its_embedding_succeeds(
    tmp_path: Path, fails: bool
) -> None:
    """A bot's message as it comes: its rows go in while the model embeds it, so only the commit
    waits for the vector; a failed embedding rolls the rows back, and readers never saw them."""
    embedder = GatedEmbedder()
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}}
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder)], **settings) as mem:  # type: ignore[arg-type]
        [message] = messages(1)
        ingest = asyncio.ensure_future(mem.ingest(message))
        await embedder.entered.wait()
        # Once the before-store hooks ran, the rows go in: the transaction is open while the
        # model works.
        assert await write_opens(mem)
        assert (await mem.store.stats())["memories"] == 0  # and nothing of it is visible
        embedder.fail = fails
        embedder.release.set()
        if fails:
            with pytest.raises(RuntimeError, match="the model failed"):
                await ingest
            assert (await mem.store.stats())["memories"] == 0
        else:
            result = await ingest
            [record] = result.records
            assert record.id is not None
            vectors = await mem.store.vectors([record.id], Scope(user_id="ann"))
            assert np.allclose(vectors[record.id], embedder.vector(record.index_text))
        assert not await write_is_open(mem)


@pytest.mark.asyncio
@pytest.mark.parametrize(("n", "embedded_first"), [(1, True), (8, True), (12, False)])
async def test_a_few_messages_reach_the_model_before_the_duplicate_check(
    tmp_path: Path, n: int, embedded_first: bool
) -> None:
    """Up to eight messages are handed to the model once triaged, while the store is asked which
    are stored already; a larger batch is checked first, so a re-import embeds no duplicate. A
    duplicate is reported as one either way, and stored once."""
    events: list[str] = []
    embedder = SlowEmbedder(seconds=0.01)
    embed = embedder.embed

    async def logged_embed(texts: Sequence[str]) -> np.ndarray:
        events.append("embed")
        return await embed(texts)

    embedder.embed = logged_embed  # type: ignore[method-assign]
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}}
    async with open_memory(tmp_path / "m", plugins=[Plugins(embedder)], **settings) as mem:
        check = mem.store.stored_messages  # type: ignore[attr-defined]

        async def logged_check(*args: Any) -> Any:
            events.append("check")
            return await check(*args)

        mem.store.stored_messages = logged_check  # type: ignore[attr-defined]
        batch = messages(n)
        assert all(r.stored for r in await mem.ingest_many(batch))
        assert (events[0] == "embed") is embedded_first
        again = await mem.ingest_many(batch)
        assert [r.stored for r in again] == [False] * n
        assert all("already stored" in (r.reason or "") for r in again)
        assert (await mem.store.stats())["memories"] == n
