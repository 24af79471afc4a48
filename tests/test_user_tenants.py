"""Which tenants hold a person, read by the scope index (a Discord ``forgetme`` read every
(tenant, user)'s counts of the whole store for it), on both stores; and a forgetme in a bot of
many servers reaches each server that holds the person."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.store import PostgresStore
from narrmem_plugins.storage_sqlite.store import SQLiteStore

from narrmem.models import MemoryRecord
from narrmem.testing import open_memory

DIM = 8
T0 = datetime(2026, 5, 1, tzinfo=UTC)
PLACES = [
    ("100", "ann"),
    ("100", "bob"),
    ("200", "bob"),
    ("300", "cat"),
    ("default", "ann"),
    ("discord:400", "ann"),
]


def records() -> list[MemoryRecord]:
    return [
        MemoryRecord(
            tenant=tenant,
            user_id=user,
            chat_id="c",
            text=f"{user} in {tenant}",
            created_at=T0,
            stored_at=T0,
            message_ids=[f"{tenant}-{user}"],
        )
        for tenant, user in PLACES
    ]


async def check(store: SQLiteStore | PostgresStore, dim: int = DIM) -> None:
    rows = records()
    vectors = np.random.default_rng(1).standard_normal((len(rows), dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    await store.add(rows, vectors)
    assert await store.user_tenants(["ann"]) == ["100", "default", "discord:400"]
    assert await store.user_tenants(["bob"]) == ["100", "200"]
    assert await store.user_tenants(["cat", "ann"]) == ["100", "300", "default", "discord:400"]
    assert await store.user_tenants(["nobody"]) == []
    assert await store.user_tenants([]) == []


async def test_sqlite(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        await check(memory.store, memory.store.dim)


async def test_postgres() -> None:
    store = PostgresStore(await fresh_database("tenants"), pool_size=1)
    await store.open(dim=DIM, model="tenants-test")
    try:
        await check(store)
    finally:
        await store.close()
