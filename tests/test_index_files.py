"""The vector index opens without reading itself: vectors and graphs are mapped from their files,
SQLite's watermark stands in for comparing every id, and what is written after the open (rows, a
graph's new points, a forget) behaves as before. An index of the previous format loads as it is
and is rewritten in the new one."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import MANIFEST, msg
from narrmem_plugins.storage_sqlite import vector_index
from narrmem_plugins.storage_sqlite.store import SQLiteStore
from narrmem_plugins.storage_sqlite.vector_index import (
    Consistency,
    IndexOptions,
    Owner,
    VectorIndex,
    _bucket,
)

from narrmem import Scope
from narrmem.testing import open_memory

DIM = 16
SMALL = IndexOptions(hnsw_threshold=300, hnsw_m=16, ef_construction=64, ef_search=64, rebuild_ratio=0.5)


def unit(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


async def saved_index(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Two users, "big" past the graph threshold and "small" under it, saved and closed."""
    index = VectorIndex(path, DIM, SMALL)
    ids = np.arange(1, 501, dtype=np.int64)
    vectors = unit(500, seed=1)
    await index.add(ids[:400], vectors[:400], [Owner("t", "big", "dm")] * 400)
    await index.add(ids[400:], vectors[400:], [Owner("t", "small", "dm")] * 100)
    await index.settle()
    await index.save()
    await index.close()
    return ids, vectors


async def reopen(path: Path, ids: np.ndarray, vectors: np.ndarray) -> VectorIndex:
    index = VectorIndex(path, DIM, SMALL)
    samples = {int(ids[0]): (vectors[0], ("t", "big")), int(ids[450]): (vectors[450], ("t", "small"))}
    assert await index.load(Consistency.known(ids, samples)), index.rebuilt_reason
    return index


async def test_vectors_and_graphs_are_mapped_and_take_writes(tmp_path: Path) -> None:
    ids, vectors = await saved_index(tmp_path / "index")
    index = await reopen(tmp_path / "index", ids, vectors)
    try:
        big, small = index._shards[("t", "big")], index._shards[("t", "small")]
        assert big.vectors.mapped == 400 and small.vectors.mapped == 100
        assert big.graph is not None and big.graph_mapped_from is not None
        [(first, _)] = await index.search(vectors[3], 1, tenant="t", user_id="big", chat_id=None)
        assert first == ids[3]
        # A row written after the open stays outside the mapped graph (FAISS cannot grow it) and
        # is searched exactly beside it.
        extra = unit(1, seed=9)
        await index.add(np.array([9001]), extra, [Owner("t", "big", "dm")])
        assert big.graph_mapped_from is not None and big.graph.ntotal == 400 and big.outside_graph == 1
        [(found, _)] = await index.search(extra[0], 1, tenant="t", user_id="big", chat_id=None)
        assert found == 9001
        in_dm = await index.search(extra[0], 1, tenant="t", user_id="big", chat_id="dm")
        assert in_dm[0][0] == 9001
        await index.add(np.array([9002]), unit(1, seed=10), [Owner("t", "small", "dm")])
        got = await index.search(vectors[450], 2, tenant="t", user_id="small", chat_id=None)
        assert got[0][0] == ids[450] and small.vectors.mapped == 100
        # Deleting from a mapped shard without a graph keeps the file untouched until the save.
        await index.remove(ids[450:451], [("t", "small")])
        got = await index.search(vectors[450], 1, tenant="t", user_id="small", chat_id=None)
        assert got[0][0] != ids[450]
        await index.save()
        # The saved bucket is mapped again: the shards read the new file.
        assert small.vectors.mapped == small.n == 100
    finally:
        await index.close()
    again = await reopen_after(tmp_path / "index")
    try:
        assert again.size == 500 + 2 - 1
        # The saved graph still covers the first 400 rows; the row written after it stays outside.
        assert again._shards[("t", "big")].outside_graph == 1
        [(found, _)] = await again.search(extra[0], 1, tenant="t", user_id="big", chat_id=None)
        assert found == 9001
        got = await again.search(vectors[450], 100, tenant="t", user_id="small", chat_id=None)
        assert int(ids[450]) not in {i for i, _ in got} and 9002 in {i for i, _ in got}
    finally:
        await again.close()


async def test_rows_outside_a_mapped_graph_are_searched_exactly_by_chat_and_without_the_dead(
    tmp_path: Path,
) -> None:
    """The rows written after the open are scored where they lie, beside the graph: the same hits as
    an exact search of the live rows, whatever the chat and with some of them forgotten."""
    ids, vectors = await saved_index(tmp_path / "index")
    index = await reopen(tmp_path / "index", ids, vectors)
    try:
        extra_ids = np.arange(9001, 9061, dtype=np.int64)
        extra = unit(60, seed=11)
        chats = ["dm" if n % 3 else "group" for n in range(60)]
        await index.add(extra_ids, extra, [Owner("t", "big", chat) for chat in chats])
        big = index._shards[("t", "big")]
        assert big.graph_mapped_from is not None and big.outside_graph == 60
        gone = extra_ids[[0, 5, 30, 59]]
        await index.remove(gone, [("t", "big")])
        live = ~np.isin(extra_ids, gone)
        for query in unit(5, seed=12):
            for chat in (None, "dm", "group"):
                inside = live & (np.array(chats) == chat if chat else True)
                expected = extra_ids[inside][np.argsort(-(extra[inside] @ query), kind="stable")][:5]
                got = await index.search(query, 600, tenant="t", user_id="big", chat_id=chat)
                outside = [i for i, _ in got if i > 9000]
                assert outside[:5] == [int(i) for i in expected]
                assert not set(outside) & {int(i) for i in gone}
                assert len(outside) == int(np.count_nonzero(inside))
    finally:
        await index.close()


async def reopen_after(path: Path) -> VectorIndex:
    index = VectorIndex(path, DIM, SMALL)
    manifest = json.loads((path / "manifest.json").read_text())
    held = np.sort(
        np.concatenate(
            [
                np.load(path / bucket["ids"])[offset : offset + count, 0]
                for bucket in manifest["buckets"]
                for offset, count in zip(bucket["offset"], bucket["count"], strict=True)
            ]
        )
    )
    assert await index.load(Consistency.known(held, {})), index.rebuilt_reason
    return index


async def test_a_forgotten_vector_leaves_the_mapped_files(tmp_path: Path) -> None:
    ids, vectors = await saved_index(tmp_path / "index")
    index = await reopen(tmp_path / "index", ids, vectors)
    try:
        await index.remove(ids[:5], [("t", "big")])  # tombstones under a mapped graph
        await index.remove(ids[400:405], [("t", "small")])
        await index.save()
        # The graph's file is gone now (it held the tombstoned points); the mapped graph still
        # takes a write.
        assert not list((tmp_path / "index").glob("graph-*.faiss"))
        assert index._shards[("t", "big")].graph_mapped_from is not None
        await index.add(np.array([9003]), unit(1, seed=11), [Owner("t", "big", "dm")])
        [(found, _)] = await index.search(unit(1, seed=11)[0], 1, tenant="t", user_id="big", chat_id=None)
        assert found == 9003
        await index.remove(np.array([9003]), [("t", "big")])
        await index.save()
    finally:
        await index.close()
    files = [np.load(p) for p in sorted((tmp_path / "index").glob("vectors-*.npy"))]
    stored = np.vstack([f for f in files if len(f)])
    for gone in (*range(5), *range(400, 405)):
        assert not np.any(np.all(np.isclose(stored, vectors[gone]), axis=1))
    assert not list((tmp_path / "index").glob("graph-*.faiss"))  # it held the tombstoned points


async def test_an_index_of_the_previous_format_loads_and_is_rewritten(tmp_path: Path) -> None:
    """Format 1 kept the vectors in the rows files; it loads as it is (no rebuild from SQLite), and
    the next save writes the vector files."""
    path = tmp_path / "index"
    path.mkdir()
    (path / ".narrmem-index").write_text(json.dumps({"narrmem": "vector index", "format": 1}) + "\n")
    ids = np.arange(1, 41, dtype=np.int64)
    vectors = unit(40, seed=3)
    key = ("t", "u")
    name = f"rows-{_bucket(key):02d}.npz"
    np.savez(path / name, s0_ids=ids, s0_chats=np.zeros(40, dtype=np.int32), s0_vectors=vectors)
    manifest = {
        "format": 1,
        "dim": DIM,
        "chats": {"dm": 0},
        "shards": [{"tenant": "t", "user_id": "u", "rows": name, "prefix": "s0_"}],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    index = VectorIndex(path, DIM, SMALL)
    assert await index.load(Consistency.known(ids, {7: (vectors[6], key)}))
    try:
        assert index.dirty
        [(first, _)] = await index.search(vectors[6], 1, tenant="t", user_id="u", chat_id=None)
        assert first == 7
        await index.save()
    finally:
        await index.close()
    written = json.loads((path / "manifest.json").read_text())
    [listed] = [bucket for bucket in written["buckets"] if bucket["user"]]
    assert written["format"] == 3 and listed["user"] == ["u"] and listed["vectors"].startswith("vectors-")
    again = await reopen_after(path)
    try:
        assert again._shards[key].vectors.mapped == 40
    finally:
        await again.close()


CORPUS = [
    msg(str(i), f"note {i} about the garden and the roses", user=f"u{i % 3}", chat="c") for i in range(12)
]


async def test_an_equal_watermark_opens_without_reading_every_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
    saved = json.loads((folder / MANIFEST).read_text())["watermark"]
    assert saved["changes"] == saved["last_id"] == len(CORPUS)

    read_ids: list[bool] = []
    original = SQLiteStore._vector_ids

    async def spy(self: SQLiteStore) -> Any:
        read_ids.append(True)
        return await original(self)

    monkeypatch.setattr(SQLiteStore, "_vector_ids", spy)
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is None and not read_ids
        assert len(await mem.recall("roses in the garden", user_id="u1", k=10)) == 4

    # A row written while the index was not saved (a crash): the watermark differs, so every id is
    # compared, and the index catches up with the row (the rest of its files kept).
    with sqlite3.connect(folder / "narrmem.sqlite3") as con:
        row = con.execute("SELECT * FROM memories WHERE id = 1").fetchone()
        columns = [d[0] for d in con.execute("SELECT * FROM memories LIMIT 0").description]
        values = dict(zip(columns, row, strict=True))
        values.pop("id")
        values["text"] = "a row the index never saw"
        marks = ", ".join("?" * len(values))
        con.execute(f"INSERT INTO memories ({', '.join(values)}) VALUES ({marks})", list(values.values()))
    async with open_memory(folder) as mem:
        assert read_ids and mem.store.index.rebuilt_reason is None
        assert mem.store.index.caught_up == {"added": 1, "removed": 0}
        assert mem.store.index.size == len(CORPUS) + 1
        [vector] = await mem.embedder.embed([values["embed_text"] or values["text"]])
        found = await mem.store.search_vectors(Scope(user_id=values["user_id"]), vector, 50)
        assert len(CORPUS) + 1 in {i for i, _ in found}


def test_a_mapped_file_is_advised_random(tmp_path: Path) -> None:
    """Where the OS allows it (Linux), a graph file's mapping is marked random, so a search maps
    in what it touches and not the pages around it."""
    import mmap
    import sys

    from narrmem_plugins.storage_sqlite.mapped import advise_random

    path = tmp_path / "graph.bin"
    path.write_bytes(b"\0" * (1 << 20))
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ):
        advised = advise_random(path)
    assert advised >= 1 if sys.platform == "linux" else advised == 0
    assert advise_random(tmp_path / "not-mapped.bin") == 0


async def test_rows_outside_a_mapped_graph_are_taken_in_by_a_background_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vector_index, "OUTSIDE_GRAPH_LIMIT", 30)
    ids, vectors = await saved_index(tmp_path / "index")
    index = await reopen(tmp_path / "index", ids, vectors)
    try:
        big = index._shards[("t", "big")]
        more = unit(40, seed=12)
        await index.add(np.arange(7001, 7041), more, [Owner("t", "big", "dm")] * 40)
        await index.remove(np.array([7005]), [("t", "big")])
        await index.settle()
        assert big.graph_mapped_from is None and big.outside_graph == 0 and big.graph.ntotal == 440
        for row in (0, 4, 39):
            [(found, _)] = await index.search(more[row], 1, tenant="t", user_id="big", chat_id=None)
            assert (found == 7001 + row) == (row != 4)
        await index.add(np.array([7100]), unit(1, seed=13), [Owner("t", "big", "dm")])
        assert big.graph.ntotal == 441  # in memory again: the graph takes writes itself
        await index.save()
    finally:
        await index.close()
    again = await reopen_after(tmp_path / "index")
    try:
        assert again._shards[("t", "big")].graph is None or again._shards[("t", "big")].outside_graph == 0
    finally:
        await again.close()


async def test_an_index_folder_renamed_in_the_settings_leaves_no_copy_behind(tmp_path: Path) -> None:
    """``[storage] index`` renamed on a store: the old folder, narrmem's, stayed beside the new
    one with every vector and chat id, those of the people forgotten since too. Someone else's
    folder of the old name is left as it is."""
    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="alice", chat="chat-alice"))
        await memory.ingest(msg("2", "we moved to Lisbon last spring", user="bob", chat="chat-bob"))
    assert b"chat-alice" in (folder / "vectors" / "manifest.json").read_bytes()
    async with open_memory(folder, storage={"index": "vec2"}) as memory:
        assert not (folder / "vectors").exists()
        await memory.forget(user_id="alice")
        assert len(await memory.recall("greyhound Lisbon", user_id="bob")) == 1
    holding = [p for p in folder.rglob("*") if p.is_file() and b"chat-alice" in p.read_bytes()]
    assert holding == []
    # Back to the first name: the renamed folder goes in its turn; a stranger's folder stays.
    (folder / "notes").mkdir()
    (folder / "notes" / "mine.txt").write_text("mine")
    async with open_memory(folder, storage={"index": "vectors"}) as memory:
        assert not (folder / "vec2").exists()
        assert len(await memory.recall("Lisbon", user_id="bob")) == 1
    assert (folder / "notes" / "mine.txt").read_text() == "mine"


async def test_a_copy_of_the_database_under_another_name_leaves_the_first_stores_index(
    tmp_path: Path,
) -> None:
    """The database copied beside itself and opened under its own name with its own index: the
    name its meta recorded travelled with it, and the first store's index was deleted."""
    import shutil

    folder = tmp_path / "m"
    async with open_memory(folder) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="alice", chat="chat-alice"))
    shutil.copy(folder / "narrmem.sqlite3", folder / "staging.sqlite3")
    async with open_memory(
        folder, storage={"database": "staging.sqlite3", "index": "staging-vectors"}
    ) as staging:
        assert len(await staging.recall("greyhound", user_id="alice")) == 1
    assert (folder / "vectors" / "manifest.json").is_file()
    async with open_memory(folder) as memory:
        assert len(await memory.recall("greyhound", user_id="alice")) == 1
