"""PostgreSQL ends every connection of the store (a restart, a failover, an idle timeout): the
worker goes on, its settling claim is taken again on a new connection (a claim lost for good would
let another worker take this one's unsettled entries while it writes them), what it receives is
written, and it closes without an error. A real server; the connections ended by
``pg_terminate_backend``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
from _helpers import msg
from _postgres import dsn_for, fresh_database
from narrmem_plugins.storage_postgres.store import _lock_key

from narrmem.inbox import NAMESPACE
from narrmem.settling import claim_name
from narrmem.testing import open_memory


async def end_connections(database: str) -> int:
    admin = await asyncpg.connect(dsn_for("postgres"))
    try:
        ended: int = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await admin.close()
    return ended


async def held_elsewhere(dsn: str, key: int) -> bool:
    other = await asyncpg.connect(dsn)
    try:
        free = bool(await other.fetchval("SELECT pg_try_advisory_lock($1)", key))
        if free:
            await other.execute("SELECT pg_advisory_unlock($1)", key)
        return not free
    finally:
        await other.close()


async def test_a_worker_whose_connections_end_keeps_its_claim_writes_and_closes(tmp_path: Path) -> None:
    dsn = await fresh_database("connection_loss")
    database = dsn.partition("?")[0].rsplit("/", 1)[-1]
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": "on_receipt"}
    async with open_memory(tmp_path, storage=storage) as memory:
        await memory.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
        await memory.settle()
        key = _lock_key(claim_name(memory._settling.token))
        assert await held_elsewhere(dsn, key)  # the claim, taken by the first message
        assert await end_connections(database) >= 1
        for _ in range(200):  # taken again at once, on a new connection
            if await held_elsewhere(dsn, key):
                break
            await asyncio.sleep(0.02)
        assert await held_elsewhere(dsn, key)
        for i in range(3):
            assert (
                await memory.ingest(msg(f"ann-{i + 2}", f"I drink tea number {i}", user="ann", chat="dm-ann"))
            ).stored
        await memory.settle()
        assert await memory.store.state_items(NAMESPACE) == []
        hits = await memory.recall("tea", user_id="ann", k=5)
        assert sorted(h.message_ids[0] for h in hits) == ["ann-2", "ann-3", "ann-4"]
    # Closed without an error, and the claim let go.
    assert not await held_elsewhere(dsn, key)
