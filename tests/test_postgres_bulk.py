"""Batch writes of the PostgreSQL store: ``add`` writes a batch set-wise and keeps the contract
(one episode per message, across the call and across workers); an import into an empty store
builds the memories' indexes after loading; migrated side-table rows are counted as written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from _postgres import fresh_database
from narrmem_plugins.storage_postgres import store as pg
from narrmem_plugins.storage_postgres.store import PostgresStore

from narrmem.errors import StoreError
from narrmem.models import MemoryRecord, Scope

DIM = 8
MODEL = "bulk-test-model"
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def rec(text: str, *mids: str, kind: str = "episode", user: str = "u1", chat: str = "c1") -> MemoryRecord:
    return MemoryRecord(
        kind=kind,
        user_id=user,
        chat_id=chat,
        text=text,
        created_at=T0 + timedelta(seconds=len(text)),
        message_ids=list(mids),
        meta={"n": len(text)},
    )


def vectors(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def opened(dsn: str) -> PostgresStore:
    store = PostgresStore(dsn)
    await store.open(dim=DIM, model=MODEL)
    return store


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    store = await opened(await fresh_database("bulk"))
    try:
        yield store
    finally:
        await store.close()


async def index_definitions(store: PostgresStore) -> list[str]:
    rows = await store.pool.fetch(
        "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'memories'::regclass ORDER BY 1"
    )
    return [r[0] for r in rows]


async def test_add_drops_what_was_made_from_a_stored_message_whatever_the_order(
    store: PostgresStore,
) -> None:
    [first] = await store.add([rec("first", "m1")], vectors(1))
    batch = [
        rec("scene before its episode", "m1", "m2", kind="scene"),
        rec("again", "m1"),
        rec("both", "m2", "m3"),  # m2 is free: stored
        rec("partly taken", "m3", "m4"),  # m3 went to "both": dropped, m4 stays free
        rec("m4 alone", "m4"),
        rec("fact of m4", "m4", kind="fact"),  # made from a dropped episode's message: dropped
        rec("fact of m2", "m2", kind="fact"),
        rec("in another chat", "m1", chat="c2"),
    ]
    ids = await store.add(batch, vectors(len(batch), seed=1))
    assert [r.id is not None for r in batch] == [False, False, True, False, True, False, True, True]
    assert ids == [r.id for r in batch if r.id is not None] and ids == sorted(ids) and min(ids) > first
    assert await store.stored_message_ids("default", "c1", ["m1", "m2", "m3", "m4"]) == {
        "m1",
        "m2",
        "m3",
        "m4",
    }
    texts = {r.text for r in (await store.get(ids, None)).values()}
    assert texts == {"both", "m4 alone", "fact of m2", "in another chat"}
    hits = await store.search_keywords(Scope(user_id="u1"), "alone", 5)
    assert [i for i, _ in hits] == [batch[4].id]
    assert await store.add([], np.zeros((0, DIM), dtype=np.float32)) == []


async def test_two_workers_adding_the_same_messages_store_each_once() -> None:
    dsn = await fresh_database("bulk")
    one, two = await opened(dsn), await opened(dsn)
    try:
        batches = [
            [rec(f"text {n}", f"m{n}") for n in range(start, start + 300)]
            + [rec(f"scene {n}", f"m{n}", kind="scene") for n in range(start, start + 300, 50)]
            for start in (0, 150)
        ]
        results = await asyncio.gather(
            *(
                s.add(b, vectors(len(b), seed=i))
                for i, (s, b) in enumerate(zip((one, two), batches, strict=True))
            )
        )
        stored = [r for batch in batches for r in batch if r.id is not None]
        assert sum(map(len, results)) == len(stored)
        episodes = sorted(m for r in stored if r.kind == "episode" for m in r.message_ids)
        assert episodes == sorted(f"m{n}" for n in range(450))
        # A scene stays only beside the episode its own call stored.
        for batch in batches:
            mine = {m for r in batch if r.kind == "episode" and r.id is not None for m in r.message_ids}
            assert all(r.message_ids[0] in mine for r in batch if r.kind == "scene" and r.id is not None)
        assert (await one.stats())["memories"] == len(stored)
    finally:
        await one.close()
        await two.close()


async def test_import_into_an_empty_store_builds_the_indexes_after_loading(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "BULK_BUILD_MIN", 3)
    before = await index_definitions(store)
    items = [(rec(f"memory {n}", f"m{n}"), v) for n, v in enumerate(vectors(20))]
    for n, (record, _) in enumerate(items):
        record.id = 100 + n
    statements: list[str] = []
    real = pg._lock_for_import

    async def spy(conn: object, n: int) -> list[str]:
        statements.extend(await real(conn, n))
        return statements

    monkeypatch.setattr(pg, "_lock_for_import", spy)
    assert await store.import_records(items[:10]) == {"imported": 10, "skipped": 0}
    assert any("hnsw" in s for s in statements)  # dropped and built again
    assert await index_definitions(store) == before
    [(best, _)] = await store.search_vectors(Scope(user_id="u1"), items[4][1], 1)
    assert best == 104
    statements.clear()
    # Not empty any more: the rows go in beside the indexes.
    assert await store.import_records(items) == {"imported": 10, "skipped": 10}
    assert statements == [] and await index_definitions(store) == before
    new = rec("after the import", "n1")
    await store.add([new], vectors(1))
    assert new.id == 120


async def test_a_failed_bulk_import_leaves_the_store_as_it_was(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "BULK_BUILD_MIN", 3)
    before = await index_definitions(store)
    items = [(rec(f"memory {n}", "same"), v) for n, v in enumerate(vectors(5))]
    with pytest.raises(StoreError, match="already stored"):
        await store.import_records(items)
    assert await index_definitions(store) == before
    assert (await store.stats())["memories"] == 0
    assert await store.import_records(items[:1]) == {"imported": 1, "skipped": 0}


async def test_ids_handed_out_are_never_handed_out_again(store: PostgresStore) -> None:
    async with store.transaction() as conn:
        ahead = await pg._new_ids(conn, 5)
    await store.import_records([(rec("kept id", "k"), vectors(1)[0])])
    new = rec("new", "n")
    await store.add([new], vectors(1))
    assert new.id is not None and new.id > max(ahead)


async def test_load_rows_counts_what_it_wrote(store: PostgresStore) -> None:
    rows = [{"namespace": "ns\x00", "key": f"k{n}", "value": "{}"} for n in range(3)]
    assert await store.load_rows("plugin_state", rows) == 3
    assert await store.load_rows("plugin_state", [*rows, {**rows[0], "key": "k9"}]) == 1
    assert await store.state_get("ns\x00", "k9") == {}
    [memory_id] = await store.add([rec("with history", "h")], vectors(1))
    history = [
        {
            "id": 7,
            "memory_id": memory_id,
            "at": "2025-01-01",
            "who": "decay",
            "why": "w",
            "old": 1,
            "new": 0.5,
        }
    ]
    assert await store.load_rows("memory_history", history) == 1
    assert await store.load_rows("memory_history", history) == 0
    await store.set_importance([], T0)
    assert [h["new"] for h in await store.history(memory_id)] == [0.5]
    with pytest.raises(StoreError):
        await store.load_rows("memories", history)


async def test_a_bulk_import_leaves_the_planner_its_row_counts(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg, "BULK_BUILD_MIN", 3)
    items = [(rec(f"memory {n}", f"m{n}", user=f"u{n % 2}"), v) for n, v in enumerate(vectors(40))]
    assert await store.import_records(items) == {"imported": 40, "skipped": 0}
    # Analyzed with the import, not left to autovacuum: the planner knows the rows are there.
    assert await store.pool.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass") == 40
    assert await store.pool.fetchval(
        "SELECT COUNT(*) FROM pg_stats WHERE tablename = 'memories' AND attname = 'user_id'"
    )
    # A small import into a store that holds rows leaves the statistics to autovacuum.
    monkeypatch.setattr(pg, "BULK_BUILD_MIN", 1_000)
    await store.import_records([(rec("one more", "x"), vectors(1)[0])])
    assert await store.pool.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass") == 40


async def test_lookups_by_id_take_the_primary_key_whatever_the_statistics(store: PostgresStore) -> None:
    records = [rec(f"memory {n}", f"m{n}", user="heavy" if n % 10 else "light") for n in range(300)]
    await store.add(records, vectors(300))
    # Statistics that say the store is empty: the planner would walk a user's index for a lookup.
    await store.pool.execute("ALTER TABLE memories SET (autovacuum_enabled = false)")
    await store.pool.execute("DELETE FROM pg_statistic WHERE starelid = 'memories'::regclass")
    await store.pool.execute(
        "UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'memories'::regclass"
    )
    ids = [r.id for r in records[:50]]
    where, params = pg._scope_clause(Scope(user_id="heavy"), start=2)
    async with store.pool.acquire() as conn:
        await conn.execute("SET enable_seqscan = off")  # the table is small; a large one has no seq scan
        try:
            naive = f"SELECT id FROM memories WHERE id = ANY($1::bigint[]) AND {where}"
            scope_indexes = ("memories_user", "memories_chat")
            # What by_id prevents: the scope's index drives the plan.
            plan = await _plan(conn, naive, ids, *params)
            assert any(name in plan for name in scope_indexes), plan
            for columns in (pg.COLUMNS, f"{pg.COLUMNS}, vector", "id, vector"):
                plan = await _plan(conn, pg.by_id(columns, where), ids, *params)
                assert "memories_pkey" in plan and not any(name in plan for name in scope_indexes), plan
        finally:
            await conn.execute("RESET enable_seqscan")
    scope = Scope(user_id="heavy")
    heavy = {r.id for r in records[:50] if r.user_id == "heavy"}
    assert set(await store.get(ids, scope)) == heavy
    assert set(await store.vectors(ids, scope)) == heavy
    found, found_vectors = await store.get_with_vectors(ids, scope)
    assert set(found) == set(found_vectors) == heavy


async def _plan(conn: Any, sql: str, *params: Any) -> str:
    return "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + sql, *params))
