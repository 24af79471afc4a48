"""The sharded vector index: exact search for small users, HNSW for large ones, tombstones,
background rebuilds, files that never keep a deleted vector, and searches that only read the shards
of their scope."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import index_file_ids, index_file_vectors, msg
from narrmem_plugins.storage_sqlite import vector_index
from narrmem_plugins.storage_sqlite.vector_index import Consistency, IndexOptions, Owner, Shard, VectorIndex

from narrmem import Scope
from narrmem.testing import open_memory

DIM = 32
SMALL = IndexOptions(hnsw_threshold=400, hnsw_m=16, ef_construction=64, ef_search=64, rebuild_ratio=0.2)


def clustered(n: int, seed: int, dim: int = DIM) -> np.ndarray:
    """Unit vectors around 20 centres: near neighbours exist, as with real text embeddings."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((20, dim))
    vectors = centres[rng.integers(0, 20, n)] + 0.35 * rng.standard_normal((n, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def owners(user: str, n: int, chats: tuple[str, ...] = ("dm", "group")) -> list[Owner]:
    return [Owner("t", user, chats[i % len(chats)]) for i in range(n)]


def exact_top(vectors: np.ndarray, ids: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    scores = vectors @ query
    return [int(ids[i]) for i in np.argsort(-scores, kind="stable")[:k]]


async def filled(tmp_path: Path, n: int = 1500, options: IndexOptions = SMALL) -> tuple[VectorIndex, Any]:
    index = VectorIndex(tmp_path / "vectors", DIM, options)
    vectors = clustered(n, seed=1)
    ids = np.arange(1, n + 1, dtype=np.int64)
    await index.add(ids, vectors, owners("big", n))
    await index.add(ids[:50] + 100_000, clustered(50, seed=2), owners("small", 50))
    await index.settle()
    return index, (ids, vectors)


async def test_a_large_user_gets_a_graph_with_the_recall_of_exact_search(tmp_path: Path) -> None:
    index, (ids, vectors) = await filled(tmp_path)
    try:
        assert index.describe()["hnsw_shards"] == 1 and index.describe()["vector_shards"] == 2
        queries = clustered(100, seed=3)
        overlap = []
        for query in queries:
            got = [i for i, _ in await index.search(query, 10, tenant="t", user_id="big", chat_id=None)]
            overlap.append(len(set(got) & set(exact_top(vectors, ids, query, 10))) / 10)
        assert np.mean(overlap) >= 0.95
        # Below the threshold a chat's rows are searched exactly: the same answer as brute force.
        in_dm = np.arange(0, len(ids), 2)
        got = [i for i, _ in await index.search(queries[0], 10, tenant="t", user_id="big", chat_id="dm")]
        assert got == exact_top(vectors[in_dm], ids[in_dm], queries[0], 10)
    finally:
        await index.close()


async def test_a_search_reads_only_the_shards_of_its_scope(tmp_path: Path, monkeypatch: Any) -> None:
    index, (ids, _) = await filled(tmp_path)
    await index.add(np.array([900_001]), clustered(1, seed=9), [Owner("t", "third", "group")])
    await index.add(np.array([900_002]), clustered(1, seed=9), [Owner("other-tenant", "big", "group")])
    searched: list[tuple[str, str]] = []
    original = Shard.search

    def spy(self: Shard, *args: Any) -> Any:
        searched.append(self.key)
        return original(self, *args)

    monkeypatch.setattr(Shard, "search", spy)
    try:
        query = clustered(1, seed=9)[0]
        mine = await index.search(query, 2000, tenant="t", user_id="small", chat_id=None)
        assert searched == [("t", "small")]
        assert {i for i, _ in mine} == set(range(100_001, 100_051))
        searched.clear()
        group = await index.search(query, 5000, tenant="t", user_id=None, chat_id="group")
        assert sorted(searched) == [("t", "big"), ("t", "small"), ("t", "third")]
        found = {i for i, _ in group}
        assert 900_002 not in found and 900_001 in found
        assert found <= {int(i) for i in ids[1::2]} | set(range(100_002, 100_051, 2)) | {900_001}
        searched.clear()
        assert await index.search(query, 5, tenant="t", user_id=None, chat_id="nowhere") == []
        assert searched == []
    finally:
        await index.close()


async def test_deletes_are_tombstones_until_a_background_rebuild(tmp_path: Path) -> None:
    index, (ids, vectors) = await filled(tmp_path)
    try:
        query = vectors[10]
        [(first, _)] = await index.search(query, 1, tenant="t", user_id="big", chat_id=None)
        assert first == ids[10]
        await index.remove(ids[10:11], [("t", "big")])
        assert index.describe()["tombstones"] == 1  # below the ratio: no rebuild yet
        hits = await index.search(query, 50, tenant="t", user_id="big", chat_id=None)
        assert int(ids[10]) not in {i for i, _ in hits} and len(hits) == 50
        await index.remove(ids[:400], [("t", "big")])  # past 20 % of the shard
        await index.settle()
        assert index.describe()["tombstones"] == 0 and index.describe()["hnsw_shards"] == 1
        assert index.size == len(ids) - 400 + 50
        hits = await index.search(query, 50, tenant="t", user_id="big", chat_id=None)
        assert not {i for i, _ in hits} & {int(i) for i in ids[:400]}
    finally:
        await index.close()


async def test_writes_during_a_build_survive_the_swap(tmp_path: Path) -> None:
    index = VectorIndex(tmp_path / "vectors", DIM, SMALL)
    vectors = clustered(1200, seed=4)
    ids = np.arange(1, 1201, dtype=np.int64)
    try:
        await index.add(ids[:1000], vectors[:1000], owners("big", 1000))
        assert index.describe()["hnsw_builds_running"] == 1
        await index.add(ids[1000:], vectors[1000:], owners("big", 200))  # while the graph builds
        await index.remove(ids[:5], [("t", "big")])
        await index.settle()
        assert index.describe()["hnsw_shards"] == 1
        assert np.array_equal(index.ids(), ids[5:])
        for row in (0, 3, 1100, 1199):
            hits = await index.search(vectors[row], 1, tenant="t", user_id="big", chat_id=None)
            assert (hits[0][0] == ids[row]) == (row >= 5)
    finally:
        await index.close()


async def test_ids_written_again_during_a_build_keep_their_new_chat_and_vector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat is forgotten while a graph builds, and the same ids are written again in another
    chat with other vectors (an import keeps ids): the swap keeps the new rows, the forgotten
    chat's name is gone, and the rows can be searched and removed."""
    gate, building = threading.Event(), threading.Event()
    new_graph = VectorIndex._new_graph

    def held(self: VectorIndex, vectors: np.ndarray) -> Any:
        building.set()
        gate.wait(10)
        return new_graph(self, vectors)

    monkeypatch.setattr(VectorIndex, "_new_graph", held)
    index = VectorIndex(tmp_path / "vectors", DIM, SMALL)
    vectors = clustered(1200, seed=6)
    ids = np.arange(1, 1001, dtype=np.int64)
    try:
        await index.add(ids, vectors[:1000], [Owner("t", "big", "old-chat")] * 1000)
        await asyncio.wait_for(asyncio.to_thread(building.wait, 10), 15)
        await index.remove(ids[:200], [("t", "big")])  # all of "old-chat" but 800 rows
        await index.remove(ids[200:], [("t", "big")])  # and the rest: the chat is gone
        again = vectors[1000:1200]
        await index.add(ids[:200], again, [Owner("t", "big", "new-chat")] * 200)
        gate.set()
        await index.settle()
        assert index.describe()["hnsw_shards"] == 1
        assert np.array_equal(index.ids(), ids[:200])
        for row in (0, 57, 199):
            hits = await index.search(again[row], 1, tenant="t", user_id=None, chat_id="new-chat")
            assert hits[0][0] == ids[row]
        assert await index.search(vectors[0], 1, tenant="t", user_id=None, chat_id="old-chat") == []
        await index.save()
        assert b"old-chat" not in (tmp_path / "vectors" / "manifest.json").read_bytes()
        assert await index.remove(ids[:200], [("t", "big")]) == 200
    finally:
        gate.set()
        await index.close()


async def test_a_saved_graph_loads_as_is_and_a_deleted_vector_leaves_no_file(tmp_path: Path) -> None:
    index, (ids, vectors) = await filled(tmp_path)
    queries = clustered(20, seed=5)
    before = [await index.search(q, 10, tenant="t", user_id="big", chat_id=None) for q in queries]
    await index.save()
    await index.close()
    assert (tmp_path / "vectors").is_dir() and list((tmp_path / "vectors").glob("graph-*.faiss"))

    again = VectorIndex(tmp_path / "vectors", DIM, SMALL)
    expected = np.sort(np.concatenate([ids, ids[:50] + 100_000]))
    assert await again.load(Consistency.known(expected, {int(ids[7]): (vectors[7], ("t", "big"))}))
    try:
        assert again.describe()["hnsw_shards"] == 1 and not again.describe()["hnsw_builds_running"]
        after = [await again.search(q, 10, tenant="t", user_id="big", chat_id=None) for q in queries]
        assert after == before
        await again.remove(ids[7:8], [("t", "big")])
        await again.save()
    finally:
        await again.close()
    # The shard has a tombstone now: its graph (which still holds the vector) is not kept on disk.
    assert not list((tmp_path / "vectors").glob("graph-*.faiss"))
    assert int(ids[7]) not in index_file_ids(tmp_path)
    assert not np.any(np.all(np.isclose(index_file_vectors(tmp_path), vectors[7]), axis=1))


async def test_an_index_filed_under_other_users_is_rebuilt(tmp_path: Path) -> None:
    index, (ids, vectors) = await filled(tmp_path, n=100)
    await index.save()
    await index.close()
    again = VectorIndex(tmp_path / "vectors", DIM, SMALL)
    expected = np.sort(np.concatenate([ids, ids[:50] + 100_000]))
    assert not await again.load(Consistency.known(expected, {int(ids[7]): (vectors[7], ("t", "small"))}))
    assert "another user" in (again.rebuilt_reason or "") and again.size == 0
    await again.close()


async def test_closing_does_not_wait_for_a_large_build(tmp_path: Path) -> None:
    index = VectorIndex(tmp_path / "vectors", DIM, IndexOptions(hnsw_threshold=1000, ef_construction=400))
    n = 60_000
    await index.add(np.arange(1, n + 1, dtype=np.int64), clustered(n, seed=6), owners("big", n))
    assert index.describe()["hnsw_builds_running"] == 1
    loop = asyncio.get_running_loop()
    start = loop.time()
    await index.close()
    assert loop.time() - start < 5.0  # the build stops within one chunk; a full one takes far longer


@pytest.mark.slow
async def test_recall_through_hnsw_matches_exact_with_the_real_model(tmp_path: Path) -> None:
    """The same Memory traffic under an exact-only index and under HNSW (real embeddings)."""
    topics = ["dog", "ramen", "marathon", "chess", "guitar", "tax forms", "rain", "Lisbon", "python"]
    messages = [
        msg(f"m{i}", f"note {i}: thinking about {topics[i % len(topics)]} and {topics[(i * 7) % 9]} today")
        for i in range(300)
    ]
    queries = [f"what did I say about {t}?" for t in topics]
    found: dict[str, list[list[int]]] = {}
    for name, threshold in (("exact", 100_000), ("hnsw", 100)):
        async with open_memory(
            tmp_path / name, real_model=True, storage={"hnsw_threshold": threshold}
        ) as memory:
            await memory.ingest_many(messages)
            await memory.store.index.settle()
            assert memory.store.index.describe()["hnsw_shards"] == (name == "hnsw")
            vectors = await memory.embedder.embed(queries)
            found[name] = [
                [i for i, _ in await memory.store.search_vectors(Scope(user_id="u1"), v, 10)] for v in vectors
            ]
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(found["exact"], found["hnsw"], strict=True)]
    assert np.mean(overlap) >= 0.95


async def test_a_cheap_search_of_an_idle_index_runs_without_the_thread(
    tmp_path: Path, monkeypatch: Any
) -> None:
    index, (ids, _) = await filled(tmp_path)
    threads: list[str] = []
    original = Shard.search

    def spy(self: Shard, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(Shard, "search", spy)
    try:
        query = clustered(1, seed=4)[0]
        here = await index.search(query, 10, tenant="t", user_id="big", chat_id=None)
        assert threads == [threading.current_thread().name]
        # The same search while a write holds the index waits for it, on the index's thread.
        threads.clear()
        index._busy.acquire()
        waiting = asyncio.ensure_future(index.search(query, 10, tenant="t", user_id="big", chat_id=None))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        index._busy.release()
        assert await waiting == here
        assert threads and threads[0].startswith("narrmem-vectors")
        # Too many rows to score exactly (a filter of ids reads every row): on the thread.
        threads.clear()
        monkeypatch.setattr(vector_index, "INLINE_EXACT_ROWS", 1000)
        allowed = ids[::3]
        found = await index.search(query, 10, tenant="t", user_id="big", chat_id=None, allowed=allowed)
        assert threads[0].startswith("narrmem-vectors")
        assert {i for i, _ in found} <= {int(i) for i in allowed}
        monkeypatch.undo()
        assert (
            await index.search(query, 10, tenant="t", user_id="big", chat_id=None, allowed=allowed) == found
        )
    finally:
        await index.close()


async def test_searches_racing_writes_see_each_write_whole(tmp_path: Path) -> None:
    """Searches on the event loop and writes on the index's thread take turns: every search sees
    a batch of the user's rows entirely or not at all, and finds what it saw in exact order."""
    index = VectorIndex(tmp_path / "vectors", DIM, SMALL)
    batches = [clustered(40, seed=100 + b) for b in range(30)]
    query = batches[0][0]
    try:

        async def write() -> None:
            for b, batch in enumerate(batches):
                await index.add(np.arange(b * 40 + 1, b * 40 + 41, dtype=np.int64), batch, owners("u", 40))

        writing = asyncio.ensure_future(write())
        seen = []
        while not writing.done():
            found = await index.search(query, 2000, tenant="t", user_id="u", chat_id=None)
            seen.append(len(found))
            assert len(found) % 40 == 0
            assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
            await asyncio.sleep(0)
        await writing
        assert seen == sorted(seen)
        assert len(await index.search(query, 2000, tenant="t", user_id="u", chat_id=None)) == 1200
    finally:
        await index.close()


async def test_after_a_reopen_the_chats_met_leave_no_names_behind(tmp_path: Path) -> None:
    """The index kept the id of every chat touched since the open (a recall of a chat with
    nothing stored too, and chats forgotten since): a set that grew with each chat a bot met.
    Now it holds the codes of the files' chats not taken yet, and lets the table go once all are."""
    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        for i in range(3):
            await memory.ingest(
                msg(f"s{i}", f"I love hiking with my dog number {i}", user=f"u{i}", chat=f"seed{i}")
            )
    async with open_memory(folder) as memory:
        index = memory.store.index
        assert len(index._codes_not_taken) == 3
        for i in range(50):
            await memory.recall("hiking", chat_id=f"nochat{i}", k=3)
            await memory.ingest(
                msg(f"n{i}", f"I'm worried about my exam, friend {i}", user=f"x{i}", chat=f"new{i}")
            )
            await memory.forget(chat_id=f"new{i}")
        assert len(index._codes_not_taken) == 3
        for i in range(3):  # each of the files' chats is still found, its members taken once
            hits = await memory.recall("hiking dog", chat_id=f"seed{i}", k=3)
            assert [h.message_ids for h in hits] == [[f"s{i}"]]
        assert index._codes_not_taken == set() and index._chats_at_open is None
