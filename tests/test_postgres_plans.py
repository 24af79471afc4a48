"""The PostgreSQL store's statements are planned for the scope they are run with: a plan PostgreSQL
caches for a prepared statement is made for an average user, and a user holding most of the store
then got an exact scan of every one of their rows instead of the HNSW index (35 ms against 4 ms for
a fifth of a 100k store; a second and more at 1M)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from _postgres import flush_counts, fresh_database
from narrmem_plugins.storage_postgres.store import PostgresStore

from narrmem.models import MemoryRecord, Scope

DIM = 64
ROWS = 20_000  # below this the planner prefers an exact scan for every user, index or not
T0 = datetime(2025, 3, 1, tzinfo=UTC)


async def index_scans(store: PostgresStore) -> dict[str, int]:
    """How often each index of ``memories`` was scanned, as the server counts it (the store's
    single connection flushes its counts first)."""
    await flush_counts(store)
    rows = await store.pool.fetch(
        "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes WHERE relname = 'memories'"
    )
    return {str(r[0]): int(r[1]) for r in rows}


async def test_a_large_scope_keeps_the_vector_index_however_often_it_is_searched() -> None:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # A heavy user holds four fifths of the store; fifty light users share the rest.
    items = [
        (
            MemoryRecord(
                user_id="heavy" if n % 5 else f"light{n % 50}",
                chat_id="c",
                text=f"memory {n}",
                created_at=T0 + timedelta(seconds=n),
                message_ids=[f"m{n}"],
            ),
            vectors[n],
        )
        for n in range(ROWS)
    ]
    dsn = await fresh_database("plans")
    # The default graph degree (its cost estimate decides the plans); a quicker build than the default.
    store = PostgresStore(dsn, pool_size=1, hnsw_ef_construction=64)
    await store.open(dim=DIM, model="plans-test-model")
    try:
        assert await store.import_records(items) == {"imported": ROWS, "skipped": 0}
        before = await index_scans(store)
        heavy = Scope(user_id="heavy")
        # Past the five runs after which PostgreSQL may switch a prepared statement to the plan
        # it caches for any value (made for the average user: the user's btree and a sort).
        searches = 8
        for n in range(searches):
            found = await store.search_vectors(heavy, vectors[n], 50)
            assert len(found) == 50
        after = await index_scans(store)
        used = {name: after[name] - before.get(name, 0) for name in after}
        assert used.get("memories_vector") == searches, used
        assert not used.get("memories_user"), used
        # A light user's search is planned for its own few rows: their nearest, exactly.
        rows = await store.pool.fetch("SELECT id, text FROM memories WHERE user_id = 'light5'")
        place = {int(r[0]): int(str(r[1]).split()[1]) for r in rows}
        ids = list(place)
        exact = sorted(ids, key=lambda i: -float(vectors[place[i]] @ vectors[7]))[:10]
        light = await store.search_vectors(Scope(user_id="light5"), vectors[7], 10)
        assert [i for i, _ in light] == exact
    finally:
        await store.close()
