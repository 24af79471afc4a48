"""Importance is written in place on PostgreSQL: the decay pass (every hour, for nearly every
memory older than a week) and reinforcement update a memory's importance columns, which no index
holds, so each update can be a HOT update, its new version on the row's own page and no index
written. For that the page needs room for the version (the table's fillfactor) and a transaction
must not put two versions on one page (the store writes a page's rows in separate rounds). Without
both, every update moved its row and put its vector into the HNSW graph again: 2.2 ms a row on a
100k store, an hour's pass over a million memories taking longer than the hour."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from _postgres import flush_counts, fresh_database
from narrmem_plugins.storage_postgres.store import PostgresStore

from narrmem.models import ImportanceChange, MemoryRecord

DIM = 384  # rows of the size a real store has (about 2 kB): three to a page
T0 = datetime(2025, 3, 1, tzinfo=UTC)


async def updates(store: PostgresStore, at_least: int = 0) -> tuple[int, int]:
    """Row updates of ``memories`` and how many of them were HOT, as the server counts them, once
    it counts ``at_least`` updates (a backend reports its counts a moment after its transactions)."""
    for _ in range(100):
        await flush_counts(store)
        row = await store.pool.fetchrow(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'memories'"
        )
        if int(row[0]) >= at_least:
            break
    return int(row[0]), int(row[1])


async def pages(store: PostgresStore) -> dict[int, int]:
    """The heap page each memory is on."""
    rows = await store.pool.fetch("SELECT id, (ctid::text::point)[0]::bigint FROM memories")
    return {int(r[0]): int(r[1]) for r in rows}


async def filled_store(rows: int) -> tuple[PostgresStore, list[int]]:
    store = PostgresStore(await fresh_database("importance"), pool_size=1)
    await store.open(dim=DIM, model="importance-test")
    vectors = np.random.default_rng(3).standard_normal((rows, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    records = [
        MemoryRecord(
            user_id=f"u{i % 7}",
            chat_id="c1",
            speaker="Ann",
            text=f"message {i} about the garden, the bakery on the corner and the trip in May",
            importance=0.3,
            created_at=T0 + timedelta(minutes=i),
            message_ids=[f"m{i}"],
            meta={"layer": "accumulate"},
        )
        for i in range(rows)
    ]
    ids = await store.add(records, vectors)
    return store, ids


async def test_a_decay_pass_and_reinforcement_rewrite_rows_on_their_own_pages() -> None:
    store, ids = await filled_store(300)
    try:
        per_page = await store.pool.fetchval(
            "SELECT max(n) FROM (SELECT COUNT(*) AS n FROM memories GROUP BY (ctid::text::point)[0]) AS p"
        )
        assert per_page >= 3  # several rows share each page: one transaction would crowd it
        before, where = await updates(store), await pages(store)
        # One page of the decay pass: every memory's value, a history row for some.
        values = [(memory_id, 0.25) for memory_id in ids]
        history = [(memory_id, "hippocampus", "faded below 0.1", None, 0.25) for memory_id in ids[:5]]
        await store.set_current_importance(values, history, T0 + timedelta(days=30))
        after = await updates(store, before[0] + len(ids))
        assert after[0] - before[0] == len(ids)
        # Every one HOT, no row moved: but for the odd page the server had not pruned of an old
        # version yet (another session's snapshot holding it a moment; 299 of 300 once, with the
        # whole suite's sessions beside it).
        assert after[1] - before[1] >= len(ids) - 3
        moved = [i for i, page in (await pages(store)).items() if page != where[i]]
        assert len(moved) <= len(ids) - (after[1] - before[1])
        states = await store.importance_states(0, len(ids))
        assert {current for _, _, _, current in states} == {0.25}
        assert len(await store.history(ids[0])) == 1 and await store.history(ids[5]) == []
        # Reinforcement of ten memories written one after the other (neighbours on their pages).
        at = T0 + timedelta(days=31)
        changes = [
            ImportanceChange(
                memory_id=i, importance=0.35, reinforced_at=at, old=0.3, who="recall", why="reinforced"
            )
            for i in ids[100:110]
        ]
        await store.set_importance(changes, at)
        final = await updates(store, after[0] + 10)
        # Each needs its page pruned of the decay pass's old versions first, which the server does
        # when it can (another session's snapshot may hold them a moment): most, not always all.
        assert final[0] - after[0] == 10 and final[1] - after[1] >= 5
        assert [h["new"] for h in await store.history(ids[100])] == [0.35]
    finally:
        await store.close()
