"""The SQLite + FAISS store (hash embedder): the index is derived and rebuilt when it is missing,
corrupt or foreign; forget removes every trace; ingest is idempotent; keyword search handles CJK."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import aiosqlite
import faiss
import numpy as np
import pytest
from _helpers import INDEX_NAME, MANIFEST, count_rows, hit_keys, index_file_ids, msg, sql
from narrmem_plugins.storage_sqlite import schema
from narrmem_plugins.storage_sqlite.store import chat_token, user_token

import narrmem
from narrmem import Memory, Scope
from narrmem.config import load_settings
from narrmem.testing import open_memory

CORPUS = [
    msg("1", "I adopted a greyhound named Pixel from the shelter", user="u1", chat="c1"),
    msg("2", "Pixel sleeps on the sofa all afternoon", user="u1", chat="c1"),
    msg("3", "my favourite food is spicy ramen with extra egg", user="u1", chat="c2"),
    msg("4", "I am training for a half marathon in October", user="u2", chat="c1"),
    msg("5", "the marathon training plan says long runs on Sunday", user="u2", chat="c2"),
    msg("6", "ramen shop near the station closed down", user="u2", chat="c2"),
    msg("7", "I play chess online every evening", user="u3", chat="c3"),
    msg("8", "my greyhound hates the rain", user="u3", chat="c3"),
]
QUERIES: list[tuple[str, dict[str, str]]] = [
    ("greyhound Pixel sofa", {"user_id": "u1"}),
    ("ramen egg", {"user_id": "u1"}),
    ("marathon training", {"user_id": "u2"}),
    ("ramen station", {"chat_id": "c2"}),
    ("greyhound rain", {"chat_id": "c3"}),
    ("greyhound", {"chat_id": "c1", "user_id": "u1"}),
]


async def _results(mem: Memory) -> list[list[tuple[int, tuple[str, ...]]]]:
    return [hit_keys(await mem.recall(q, k=10, **scope)) for q, scope in QUERIES]


async def _scores(mem: Memory) -> list[tuple[int, float]]:
    """Raw vector search (ids and cosine scores): what a wrong index would change first."""
    out: list[tuple[int, float]] = []
    for query, scope in QUERIES:
        [vector] = await mem.embedder.embed([query])
        out.extend(await mem.store.search_vectors(Scope(**scope), vector, 10))
    return out


def _same_scores(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> bool:
    return [i for i, _ in got] == [i for i, _ in want] and [s for _, s in got] == pytest.approx(
        [s for _, s in want], abs=1e-6
    )


@pytest.fixture
async def built(tmp_path: Path) -> tuple[Path, list[Any], list[Any]]:
    """A closed store with CORPUS, and its recall results."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
        results = await _results(mem)
        scores = await _scores(mem)
    assert all(results), "every query must find something, or the comparisons below prove nothing"
    return folder, results, scores


# --- the derived FAISS index ---------------------------------------------------------------------


async def test_persisted_index_is_loaded_not_rebuilt(built: Any) -> None:
    folder, results, scores = built
    assert index_file_ids(folder) == [r[0] for r in sql(folder, "SELECT id FROM memories ORDER BY id")]
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is None
        assert await _results(mem) == results
        assert _same_scores(await _scores(mem), scores)


async def test_deleted_index_is_rebuilt_with_identical_results(built: Any) -> None:
    folder, results, scores = built
    shutil.rmtree(folder / INDEX_NAME)
    async with open_memory(folder) as mem:
        assert "missing" in (mem.store.index.rebuilt_reason or "")
        assert mem.store.index.size == len(CORPUS)
        assert await _results(mem) == results
        assert _same_scores(await _scores(mem), scores)
    # The rebuilt index was written back, so the next open loads it.
    assert (folder / INDEX_NAME).exists()
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is None
        assert await _results(mem) == results


@pytest.mark.parametrize(
    "garbage",
    [b"this is not a faiss index at all" * 10, b"", b"\x00" * 4096, bytes(range(256)) * 3],
    ids=["text", "empty", "zeros", "bytes"],
)
@pytest.mark.parametrize("target", ["manifest", "ids", "vectors"])
async def test_corrupt_index_is_rebuilt_with_identical_results(
    built: Any, garbage: bytes, target: str
) -> None:
    folder, results, _ = built
    victim = folder / MANIFEST if target == "manifest" else _index_file(folder, target)
    victim.write_bytes(garbage)
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is not None
        assert await _results(mem) == results
    assert index_file_ids(folder) == [r[0] for r in sql(folder, "SELECT id FROM memories ORDER BY id")]


@pytest.mark.parametrize("target", ["manifest", "ids", "vectors"])
async def test_truncated_index_is_rebuilt(built: Any, target: str) -> None:
    folder, results, _ = built
    victim = folder / MANIFEST if target == "manifest" else _index_file(folder, target)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is not None
        assert await _results(mem) == results


async def test_index_of_other_dimension_is_rebuilt(built: Any) -> None:
    folder, results, _ = built
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / MANIFEST).write_text(json.dumps({**manifest, "dim": 8}))
    async with open_memory(folder) as mem:
        assert "dimension" in (mem.store.index.rebuilt_reason or "")
        assert await _results(mem) == results


def _index_file(folder: Path, kind: str) -> Path:
    """The ids or the vectors file of the first user's shard, as the manifest names it."""
    manifest = json.loads((folder / MANIFEST).read_text())
    return folder / INDEX_NAME / next(bucket for bucket in manifest["buckets"] if bucket["user"])[kind]


async def test_index_from_another_store_with_other_ids_is_rebuilt(built: Any, tmp_path: Path) -> None:
    folder, results, _ = built
    other = tmp_path / "other"
    async with open_memory(other) as mem:
        await mem.ingest_many([msg(f"x{i}", f"unrelated words number {i} about tax forms") for i in range(3)])
    shutil.rmtree(folder / INDEX_NAME)
    shutil.copytree(other / INDEX_NAME, folder / INDEX_NAME)
    async with open_memory(folder) as mem:
        assert "other ids" in (mem.store.index.rebuilt_reason or "")
        assert await _results(mem) == results


async def test_index_from_another_store_with_the_same_ids_is_not_trusted(built: Any, tmp_path: Path) -> None:
    """A foreign index that happens to hold the same ids (another store with as many rows) has
    the wrong vectors: it must be rebuilt, not silently used."""
    folder, results, scores = built
    other = tmp_path / "other"
    async with open_memory(other) as mem:
        await mem.ingest_many(
            [msg(f"x{i}", f"unrelated words number {i} about tax forms") for i in range(len(CORPUS))]
        )
    assert index_file_ids(other) == index_file_ids(folder)
    shutil.rmtree(folder / INDEX_NAME)
    shutil.copytree(other / INDEX_NAME, folder / INDEX_NAME)
    async with open_memory(folder) as mem:
        assert await _results(mem) == results
        assert _same_scores(await _scores(mem), scores)


async def test_stale_index_after_a_crash_is_caught_up(tmp_path: Path) -> None:
    """Rows committed after the index file was last saved (a crash before close) are not lost:
    they are added from SQLite, the rest of the files kept (before, the whole index was rebuilt)."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS[:4])
    stale = tmp_path / "stale"
    shutil.copytree(folder / INDEX_NAME, stale)
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS[4:])
        expected = await _results(mem)
    shutil.rmtree(folder / INDEX_NAME)
    shutil.copytree(stale, folder / INDEX_NAME)  # as if the process died before saving the index
    async with open_memory(folder) as mem:
        index = mem.store.index
        assert index.rebuilt_reason is None
        assert index.caught_up == {"added": len(CORPUS) - 4, "removed": 0}
        assert index.size == len(CORPUS)
        assert await _results(mem) == expected
    async with open_memory(folder) as mem:  # saved at close: nothing to catch up any more
        assert mem.store.index.caught_up is None and mem.store.index.rebuilt_reason is None
        assert await _results(mem) == expected


async def test_an_index_that_still_holds_forgotten_rows_is_caught_up_and_saved_at_once(
    tmp_path: Path,
) -> None:
    """Files saved before a forget whose own save never happened (the process stopped in
    between) hold rows SQLite deleted: the open takes them out and saves the files before it
    returns, so no forgotten vector stays on disk."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
        await mem.ingest(msg("secret", "my locker code is 4417", user="gone"))
    stale = tmp_path / "stale"
    shutil.copytree(folder / INDEX_NAME, stale)
    async with open_memory(folder) as mem:
        gone = await mem.store.recent(Scope(user_id="gone"), limit=10)
        [gone_id] = [r.id for r in gone if r.kind == "episode"]
        await mem.forget(user_id="gone")
        expected = await _results(mem)
    assert gone_id not in index_file_ids(folder)
    shutil.rmtree(folder / INDEX_NAME)
    shutil.copytree(stale, folder / INDEX_NAME)  # the forget's save lost
    assert gone_id in index_file_ids(folder)
    async with open_memory(folder) as mem:
        assert mem.store.index.caught_up is not None and mem.store.index.caught_up["removed"] >= 1
        assert gone_id not in index_file_ids(folder)  # saved before the open returned
        assert await _results(mem) == expected


def _reap_half_open_connections() -> None:
    """Collect what a failed open left behind, while the loop still runs: an unclosed aiosqlite
    connection keeps a non-daemon thread alive, which would hang the test process at exit."""
    gc.collect()


async def test_store_refuses_vectors_of_another_model(built: Any) -> None:
    folder, _, _ = built
    settings = load_settings(data_dir=str(folder))  # the real sentence-transformers embedder
    try:
        with pytest.raises(narrmem.StoreError, match="hash-test"):
            await Memory.open(settings=settings, load_entrypoints=False, warm=False)
    finally:
        _reap_half_open_connections()
    assert count_rows(folder) == len(CORPUS)


async def test_failed_open_closes_the_database(built: Any) -> None:
    """When the store refuses to open, nothing it started may be left running (its SQLite
    connection thread in particular)."""
    folder, _, _ = built
    settings = load_settings(data_dir=str(folder))
    before = set(threading.enumerate())
    info = None
    try:
        # Holding the exception keeps the failed store object alive: only closing it ends its thread.
        with pytest.raises(narrmem.StoreError) as info:
            await Memory.open(settings=settings, load_entrypoints=False, warm=False)
        # The loop's default executor (threads named asyncio_N) is the loop's: it keeps idle
        # workers for later calls, and starts a second one when two calls overlap on a busy host.
        started = [t for t in threading.enumerate() if t not in before and not t.name.startswith("asyncio_")]
        for thread in started:
            thread.join(timeout=2)  # a closed connection's worker thread ends at once
        assert [t.name for t in started if t.is_alive()] == []
    finally:
        del info
        _reap_half_open_connections()


# --- forget --------------------------------------------------------------------------------------


async def test_forget_user_removes_every_trace(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(
            [
                *CORPUS,
                msg(
                    "t2-1",
                    "I adopted a greyhound named Pixel from the shelter",
                    user="u1",
                    chat="c1",
                    tenant="t2",
                ),
            ]
        )
        u1_ids = [
            r[0] for r in sql(folder, "SELECT id FROM memories WHERE tenant='default' AND user_id='u1'")
        ]
        kept_ids = [
            r[0] for r in sql(folder, "SELECT id FROM memories WHERE NOT (tenant='default' AND user_id='u1')")
        ]
        assert len(u1_ids) == 3 and len(kept_ids) == 6
        u2_before = set(hit_keys(await mem.recall("marathon ramen", user_id="u2", k=10)))
        # Every column but context_text and the context's provenance in meta: those are scrubbed of
        # u1's turns (checked below).
        others_sql = (
            "SELECT id, kind, tenant, user_id, chat_id, speaker, text, embed_text, importance, created_at, "
            "stored_at, message_ids, json_remove(meta, '$.context_message_ids'), vector FROM memories "
            "WHERE NOT (tenant='default' AND user_id='u1')"
        )
        others_before = sql(folder, others_sql)

        counts = await mem.forget(user_id="u1")

        assert counts["memories"] == 3
        assert counts["keyword_rows"] == 3
        assert counts["vectors"] == 3
        assert counts["episode"] == 3
        marks = ",".join("?" * len(u1_ids))
        assert sql(folder, "SELECT COUNT(*) FROM memories WHERE tenant='default' AND user_id='u1'") == [(0,)]
        assert sql(folder, f"SELECT COUNT(*) FROM memories WHERE id IN ({marks})", u1_ids) == [(0,)]
        assert sql(folder, f"SELECT COUNT(*) FROM memory_sources WHERE memory_id IN ({marks})", u1_ids) == [
            (0,)
        ]
        assert sql(folder, f"SELECT COUNT(*) FROM memories_fts WHERE rowid IN ({marks})", u1_ids) == [(0,)]
        assert sql(folder, "SELECT COUNT(*) FROM memories_fts WHERE memories_fts MATCH 'pixel'") == [
            (1,)
        ]  # t2's
        in_memory_ids = set(mem.store.index.ids().tolist())
        assert not in_memory_ids & set(u1_ids)
        assert in_memory_ids == set(kept_ids)
        # The persisted file was rewritten at forget time, not only at close.
        assert not set(index_file_ids(folder)) & set(u1_ids)

        # Nothing of u1 is recallable any more, in any scope of this tenant.
        for query in ("greyhound Pixel shelter", "spicy ramen egg"):
            assert await mem.recall(query, user_id="u1") == []
            assert all(h.user_id != "u1" for h in await mem.recall(query, chat_id="c1", k=50))
            assert all(h.user_id != "u1" for h in await mem.recall(query, chat_id="c2", k=50))
        # Other users and the other tenant are untouched.
        # (BM25 statistics are corpus-wide, so only the set of u2's hits is compared, not their order.)
        assert set(hit_keys(await mem.recall("marathon ramen", user_id="u2", k=10))) == u2_before
        assert sql(folder, others_sql) == others_before
        contexts = sql(folder, "SELECT context_text FROM memories WHERE context_text IS NOT NULL")
        assert not any("Pixel" in c or "ramen egg" in c for (c,) in contexts), contexts
        cited = sql(folder, "SELECT json_extract(meta, '$.context_message_ids') FROM memories")
        assert not any(c and set(json.loads(c)) & {"1", "2", "3"} for (c,) in cited), cited
        other_tenant = await mem.recall("greyhound Pixel", user_id="u1", tenant="t2")
        assert [h.message_ids for h in other_tenant] == [["t2-1"]]
        # Forgetting again finds nothing.
        assert (await mem.forget(user_id="u1"))["memories"] == 0
        stats = await mem.stats()
        assert stats["memories"] == 6 and stats["vectors_indexed"] == 6

    assert sorted(index_file_ids(folder)) == sorted(kept_ids)
    async with open_memory(folder) as mem:
        assert mem.store.index.rebuilt_reason is None  # the file agrees with SQLite
        assert not set(mem.store.index.ids().tolist()) & set(u1_ids)
        assert await mem.recall("greyhound Pixel shelter", user_id="u1") == []
        # A forgotten message can be ingested again (its message id is free).
        again = await mem.ingest(CORPUS[0])
        assert again.stored and not again.duplicate


async def test_forget_chat_removes_only_that_chat(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
        counts = await mem.forget(chat_id="c2")
        assert counts["memories"] == 3
        assert sql(folder, "SELECT COUNT(*) FROM memories WHERE chat_id='c2'") == [(0,)]
        assert sql(folder, "SELECT COUNT(*) FROM memory_sources WHERE chat_id='c2'") == [(0,)]
        assert count_rows(folder) == 5
        assert count_rows(folder, "memories_fts") == 5
        assert mem.store.index.size == 5
        assert await mem.recall("spicy ramen egg", chat_id="c2", k=10) == []
        hits = await mem.recall("spicy ramen egg greyhound", user_id="u1", k=10)
        assert [h.message_ids for h in hits] and all(h.chat_id == "c1" for h in hits)


async def test_forget_needs_a_scope(memory: Memory) -> None:
    await memory.ingest(msg("1", "something worth keeping"))
    with pytest.raises(narrmem.InputError):
        await memory.forget()
    assert (await memory.stats())["memories"] == 1


# --- idempotent ingest -------------------------------------------------------------------------


async def test_same_message_id_twice_is_a_duplicate(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        first = await mem.ingest(msg("m1", "I started learning the violin"))
        second = await mem.ingest(msg("m1", "I started learning the violin"))
        edited = await mem.ingest(msg("m1", "an edited text under the same id"))
        assert (first.stored, first.duplicate) == (True, False)
        # Nothing more stored; the answer names what the first call stored (for a retry's caller).
        assert (second.stored, second.duplicate, second.memory_ids) == (False, True, first.memory_ids)
        assert (edited.stored, edited.duplicate) == (False, True)
        assert count_rows(folder) == 1
        assert mem.store.index.size == 1
    # Still a duplicate after reopening: the check is against the store, not a cache.
    async with open_memory(folder) as mem:
        again = await mem.ingest(msg("m1", "I started learning the violin"))
        assert again.duplicate and not again.stored
    assert count_rows(folder) == 1
    assert count_rows(folder, "memory_sources") == 1


async def test_duplicates_inside_one_batch_and_per_chat_and_tenant(memory: Memory) -> None:
    results = await memory.ingest_many(
        [
            msg("m1", "the first copy of this message"),
            msg("m1", "the first copy of this message"),
            msg("m1", "same id, another chat", chat="c2"),
            msg("m1", "same id, another tenant", tenant="t2"),
        ]
    )
    assert [(r.stored, r.duplicate) for r in results] == [
        (True, False),
        (False, True),
        (True, False),
        (True, False),
    ]
    assert (await memory.stats())["memories"] == 3


async def test_ignored_message_is_not_stored_and_not_a_duplicate(memory: Memory) -> None:
    first = await memory.ingest(msg("m1", "ok"))
    second = await memory.ingest(msg("m1", "ok"))
    assert (first.layer, first.stored, first.duplicate) == ("ignore", False, False)
    assert (second.layer, second.stored, second.duplicate) == ("ignore", False, False)
    assert (await memory.stats())["memories"] == 0


async def test_concurrent_ingest_of_the_same_message_stores_it_once(tmp_path: Path) -> None:
    """Two bots (or two retries) hand in the same message at the same time."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        results = await asyncio.gather(
            mem.ingest(msg("m1", "I started learning the violin")),
            mem.ingest(msg("m1", "I started learning the violin")),
        )
    assert sorted((r.stored, r.duplicate) for r in results) == [(False, True), (True, False)]
    assert count_rows(folder) == 1


# --- keyword search ----------------------------------------------------------------------------


async def test_chinese_keyword_search_finds_two_character_word(memory: Memory) -> None:
    await memory.ingest_many(
        [
            msg("zh1", "我喜欢摇滚乐", user="wei", chat="dm-wei"),
            msg("zh2", "我最近在做一个开源的天气预报项目", user="wei", chat="dm-wei"),
            msg("en1", "I like rock music too", user="wei", chat="dm-wei"),
        ]
    )
    hits = await memory.recall("摇滚", user_id="wei")
    assert hits[0].text == "我喜欢摇滚乐"
    assert hits[0].message_ids == ["zh1"]
    assert "keyword" in hits[0].sources
    keyword = await memory.store.search_keywords(Scope(user_id="wei"), "摇滚", 10)
    assert keyword[0][0] == hits[0].id
    # Another user's scope never sees it, even by keyword.
    assert await memory.store.search_keywords(Scope(user_id="someone-else"), "摇滚", 10) == []
    # A two-character word from the middle of a longer run is found as well.
    assert await memory.store.search_keywords(Scope(user_id="wei"), "项目", 10) != []


async def test_keyword_search_ignores_stopwords_and_syntax(memory: Memory) -> None:
    await memory.ingest(msg("1", "The quick brown fox"))
    scope = Scope(user_id="u1")
    assert await memory.store.search_keywords(scope, "the and of", 10) == []
    for nasty in ['fox"', '"fox', "fox AND", "NEAR(fox", "fox*", "-fox", "fox:", "(fox", "^fox", "{fox}"]:
        found = await memory.store.search_keywords(scope, nasty, 10)
        assert len(found) == 1, nasty


async def test_edit_replaces_and_keeps_history_and_delete_forgets_the_message(memory: Memory) -> None:
    first = await memory.ingest(msg("e1", "my favourite band is Radiohead"))
    edited = await memory.edit(msg("e1", "my favourite band is Portishead"))
    assert edited.stored and not edited.duplicate
    assert edited.records[0].meta["edits"][0]["text"] == "my favourite band is Radiohead"
    stored = await memory.store.get(first.memory_ids + edited.memory_ids, None)
    assert set(stored) == set(edited.memory_ids)  # the old episode is gone, the new one is there
    assert [h.text for h in await memory.recall("Radiohead Portishead", user_id="u1")] == [
        "my favourite band is Portishead"
    ]
    assert await memory.forget_messages(chat_id="c1", message_ids=["e1"]) == {"memories": 1}
    assert await memory.recall("Portishead", user_id="u1") == []
    assert memory.store.index.size == 0


async def test_schema_3_gives_existing_keyword_rows_their_owners(tmp_path: Path) -> None:
    """A version-2 database keeps its keyword rows and gains the scope tokens it is searched by."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as old:
        for script in schema.MIGRATIONS[:2]:
            for statement in schema.split_statements(script):
                old.execute(statement)
        old.execute(
            "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, created_ts, "
            "message_ids, meta) VALUES ('episode', 'dëfault', '用户 1', 'c:9', 'x', 0.3, 'x', 0, '[]', '{}')"
        )
        old.execute("INSERT INTO memories_fts (rowid, body, context) VALUES (1, 'greyhound pixel', '')")
        old.execute("PRAGMA user_version = 2")
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        assert await schema.migrate(db) is not None
        async with db.execute("SELECT rowid, body, owner FROM memories_fts") as cursor:
            rows = list(await cursor.fetchall())
        owner = f"{user_token('dëfault', '用户 1')} {chat_token('dëfault', 'c:9')}"
        assert rows == [(1, "greyhound pixel", owner)]
        match = f'owner:"{user_token("dëfault", "用户 1")}" AND ("greyhound")'
        async with db.execute(
            "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ?", (match,)
        ) as cursor:
            assert list(await cursor.fetchall()) == [(1,)]
        other = f'owner:"{user_token("dëfault", "用户 2")}" AND ("greyhound")'
        async with db.execute(
            "SELECT rowid FROM memories_fts WHERE memories_fts MATCH ?", (other,)
        ) as cursor:
            assert list(await cursor.fetchall()) == []
    finally:
        await db.close()


async def test_an_index_file_of_the_older_format_is_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder):
        pass
    recorded = sql(folder, "SELECT key, value FROM meta")
    for path in folder.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    # A store of a narrmem that kept its index in one FAISS file (schema 2 at most): an
    # IndexIDMap2 over a flat index, which the database's schema version says is the store's own.
    with closing(sqlite3.connect(folder / "narrmem.sqlite3")) as db:
        for script in schema.MIGRATIONS[:2]:
            db.executescript(script)
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", recorded)
        db.execute("PRAGMA user_version = 2")
        db.commit()
    faiss.write_index(faiss.IndexIDMap2(faiss.IndexFlatIP(384)), str(folder / INDEX_NAME))
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
    assert (folder / MANIFEST).exists()
    assert index_file_ids(folder) == [r[0] for r in sql(folder, "SELECT id FROM memories ORDER BY id")]


def _older_store(folder: Path, recorded: list[Any], database: str = "narrmem.sqlite3") -> None:
    """A database of a narrmem that kept its index in one FAISS file (schema 2 at most)."""
    for path in folder.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    with closing(sqlite3.connect(folder / database)) as db:
        for script in schema.MIGRATIONS[:2]:
            db.executescript(script)
        db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", recorded)
        db.execute("PRAGMA user_version = 2")
        db.commit()


@pytest.mark.parametrize(
    ("left", "removed"),
    [("faiss", True), ("faiss of another size", False), ("someone else's file", False)],
)
async def test_the_index_file_an_older_narrmem_kept_by_default_goes_when_the_store_is_opened(
    tmp_path: Path, left: str, removed: bool
) -> None:
    """The index's default was the file ``vectors.faiss`` until it became the folder ``vectors``:
    an older store opened by this narrmem got a new folder, and the old file stayed beside it with
    every vector it held, a forgotten person's too, for good."""
    folder = tmp_path / "store"
    async with open_memory(folder):
        pass
    _older_store(folder, sql(folder, "SELECT key, value FROM meta"))
    old = folder / "vectors.faiss"
    if left == "someone else's file":
        old.write_bytes(b"the user's own file")
    else:
        dim = 384 if left == "faiss" else 16
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        index.add_with_ids(np.ones((3, dim), dtype=np.float32), np.array([1, 2, 3], dtype=np.int64))
        faiss.write_index(index, str(old))
    before = old.read_bytes()
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
    assert (folder / MANIFEST).exists()
    assert old.exists() is not removed
    if not removed:
        assert old.read_bytes() == before


async def test_an_older_store_of_a_database_of_its_own_name_leaves_the_default_index_file_be(
    tmp_path: Path,
) -> None:
    """``vectors.faiss`` was the index of the folder's default database, not of one named apart."""
    folder = tmp_path / "store"
    names = {"database": "a.sqlite3", "index": "a-index"}
    async with open_memory(folder, storage=names):
        pass
    with closing(sqlite3.connect(folder / "a.sqlite3")) as db:
        recorded = db.execute("SELECT key, value FROM meta").fetchall()
    _older_store(folder, recorded, database="a.sqlite3")
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(384))
    faiss.write_index(index, str(folder / "vectors.faiss"))
    async with open_memory(folder, storage=names) as mem:
        await mem.ingest_many(CORPUS)
    assert (folder / "vectors.faiss").exists()


async def test_an_index_path_that_is_someone_elses_file_is_refused_and_kept(built: Any) -> None:
    folder, _, _ = built
    shutil.rmtree(folder / INDEX_NAME)
    (folder / INDEX_NAME).write_bytes(b"the user's own file")
    with pytest.raises(narrmem.StoreError, match="did not write"):
        async with open_memory(folder):
            pass
    assert (folder / INDEX_NAME).read_bytes() == b"the user's own file"


async def test_an_index_folder_of_someone_elses_files_is_refused_and_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    theirs = folder / "vectors"
    theirs.mkdir(parents=True)
    for name in ("photos.npz", "model.faiss", "manifest.json"):
        (theirs / name).write_bytes(b"theirs " + name.encode())
    with pytest.raises(narrmem.StoreError, match="did not write"):
        async with open_memory(folder):
            pass
    assert sorted(p.name for p in theirs.iterdir()) == ["manifest.json", "model.faiss", "photos.npz"]
    assert (theirs / "model.faiss").read_bytes() == b"theirs model.faiss"


async def test_a_keyword_row_filed_under_the_wrong_owner_never_leaves_its_scope(tmp_path: Path) -> None:
    """The scope tokens only speed a keyword search up: a row whose keyword entry names another
    user (a damaged index) is still kept out of that user's results by the scope columns."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
    [(victim,)] = sql(folder, "SELECT id FROM memories WHERE text LIKE '%chess%'")
    with sqlite3.connect(folder / "narrmem.sqlite3") as con:
        con.execute(
            "UPDATE memories_fts SET owner = ? WHERE rowid = ?",
            (f"{user_token('default', 'u1')} {chat_token('default', 'c1')}", victim),
        )
    async with open_memory(folder) as mem:
        for scope in (Scope(user_id="u1"), Scope(chat_id="c1"), Scope(user_id="u1", chat_id="c1")):
            found = await mem.store.search_keywords(scope, "chess online evening", 10)
            assert victim not in {i for i, _ in found}
        mine = await mem.store.search_keywords(Scope(user_id="u3"), "chess online evening", 10)
        assert victim not in {i for i, _ in mine}  # its own owner token is gone: not found at all


async def test_the_decay_pass_reads_an_index_of_its_own_not_the_rows(tmp_path: Path) -> None:
    """The hourly decay pass read every memory's row whole (its vector and text: the whole
    database each hour); it reads the columns it needs from an index of their own, which a store
    of an older schema gets at its next open."""
    folder = tmp_path / "store"
    async with open_memory(folder) as memory:
        await memory.ingest(msg("m1", "I adopted a greyhound named Pixel"))
        before = await memory.store.importance_states(0, 10)
    con = sqlite3.connect(folder / "narrmem.sqlite3")
    try:
        con.execute("DROP INDEX memories_decay")
        con.execute("PRAGMA user_version = 6")
        con.commit()
    finally:
        con.close()
    async with open_memory(folder) as memory:
        assert await memory.store.importance_states(0, 10) == before
    plan = sql(
        folder,
        "EXPLAIN QUERY PLAN SELECT id, importance, COALESCE(reinforced_at, created_at), current_importance "
        "FROM memories WHERE id > ? ORDER BY id LIMIT ?",
        (0, 1000),
    )
    assert "COVERING INDEX memories_decay" in plan[0][-1]
    # The counts of stats read indexes too, not the rows.
    for query in (
        "SELECT kind, COUNT(*) FROM memories GROUP BY kind",
        "SELECT COUNT(*) FROM (SELECT DISTINCT tenant, user_id FROM memories)",
        "SELECT COUNT(*) FROM (SELECT DISTINCT tenant, chat_id FROM memories)",
    ):
        assert any("COVERING INDEX" in step[-1] for step in sql(folder, f"EXPLAIN QUERY PLAN {query}")), query


async def test_the_write_ahead_log_is_cut_back_after_a_burst(tmp_path: Path) -> None:
    """The log kept the size of its largest burst (an import) for as long as the process ran."""
    from narrmem_plugins.storage_sqlite.store import WAL_KEPT_BYTES

    async with open_memory(tmp_path / "store") as memory, memory.store.sql(write=True) as db:
        assert await db.fetchall("PRAGMA journal_size_limit") == [(WAL_KEPT_BYTES,)]


async def test_an_older_index_file_goes_even_when_the_open_that_migrated_the_store_failed(
    tmp_path: Path,
) -> None:
    """The open that migrates an older store can fail after the migration committed (a model the
    store refuses, a crash in the vacuum): the next open read the new schema version, no longer
    took ``vectors.faiss`` for the store's older index, and left it, with the vectors of people
    forgotten since, for good. The migrating open records the file as still to be cleared."""
    folder = tmp_path / "store"
    async with open_memory(folder):
        pass
    recorded = dict(sql(folder, "SELECT key, value FROM meta"))
    _older_store(folder, [*{**recorded, "model": "another-model"}.items()])
    old = folder / "vectors.faiss"
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(384))
    index.add_with_ids(np.ones((3, 384), dtype=np.float32), np.array([1, 2, 3], dtype=np.int64))
    faiss.write_index(index, str(old))
    with pytest.raises(narrmem.StoreError, match="another-model"):
        async with open_memory(folder):
            pass
    assert sql(folder, "PRAGMA user_version") == [(schema.SCHEMA_VERSION,)]  # migrated all the same
    with closing(sqlite3.connect(folder / "narrmem.sqlite3")) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'model'", (recorded["model"],))
        db.commit()
    async with open_memory(folder) as mem:
        await mem.ingest_many(CORPUS)
    assert not old.exists()
    assert [key for (key,) in sql(folder, "SELECT key FROM meta")] == sorted(recorded)
