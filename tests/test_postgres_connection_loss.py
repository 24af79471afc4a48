"""PostgreSQL ends every connection of the store (a restart, a failover, an idle timeout): the
worker goes on, its settling claim is taken again on a new connection (a claim lost for good would
let another worker take this one's unsettled entries while it writes them), what it receives is
written, and it closes without an error. A real server; the connections ended by
``pg_terminate_backend``, the lock's holder read from ``pg_locks`` (taking the lock to see
whether it is free would race the worker's own retake)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _helpers import msg
from _pgproxy import behind_proxy
from _postgres import dsn_for, fresh_database
from narrmem_plugins.storage_postgres import advisory
from narrmem_plugins.storage_postgres import store as store_module
from narrmem_plugins.storage_postgres.advisory import HOLDER, AdvisoryLock, lock_key

from narrmem import StoreError, StoreUnavailableError
from narrmem.inbox import NAMESPACE
from narrmem.models import Message, TriageDecision
from narrmem.settling import claim_name
from narrmem.testing import open_memory


async def end_connections(database: str) -> int:
    admin = await asyncpg.connect(dsn_for("postgres"))
    try:
        ended: int = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await admin.close()
    return ended


async def holder(dsn: str, key: int) -> int | None:
    other = await asyncpg.connect(dsn)
    try:
        pid: int | None = await other.fetchval(HOLDER, (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)
        return pid
    finally:
        await other.close()


async def held_anew(dsn: str, key: int, before: int, seconds: float = 5.0) -> int:
    for _ in range(int(seconds / 0.02)):
        now = await holder(dsn, key)
        if now is not None and now != before:
            return now
        await asyncio.sleep(0.02)
    raise AssertionError("the lock was not taken again")


async def test_a_worker_whose_connections_end_keeps_its_claim_writes_and_closes(tmp_path: Path) -> None:
    dsn = await fresh_database("connection_loss")
    database = dsn.partition("?")[0].rsplit("/", 1)[-1]
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": "on_receipt"}
    async with open_memory(tmp_path, storage=storage) as memory:
        await memory.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
        await memory.settle()
        key = lock_key(claim_name(memory._settling.token))
        first = await holder(dsn, key)
        assert first is not None  # the claim, taken by the first message
        assert await end_connections(database) >= 1
        await held_anew(dsn, key, first)
        for i in range(3):
            message = msg(f"ann-{i + 2}", f"I drink tea number {i}", user="ann", chat="dm-ann")
            assert (await memory.ingest(message)).stored
        await memory.settle()
        assert await memory.store.state_items(NAMESPACE) == []
        hits = await memory.recall("tea", user_id="ann", k=5)
        assert sorted(h.message_ids[0] for h in hits) == ["ann-2", "ann-3", "ann-4"]
    # Closed without an error, and the claim let go.
    assert await holder(dsn, key) is None


async def test_a_lock_still_held_by_our_own_lost_session_is_taken_back(tmp_path: Path) -> None:
    """The client saw its connection end, but the server's session lives on (a network cut) and
    holds the lock: that session is ended and the lock taken on a new connection."""
    # Stage the cut: the lock moves to a session the worker no longer reaches, which the worker
    # knows as its own (its pid is the one the lock was taken with).
    async with lock_moved("zombie") as (dsn, lock, own, zombie):
        lost_pid = zombie.get_server_pid()
        lock.server_pid = lost_pid
        lock._ended(own)  # what the termination listener calls
        await held_anew(dsn, lock.key, lost_pid)
        assert not await _alive(dsn, lost_pid)  # that session was ended
        assert lock.retaken == 1
        await lock.release()
        assert await holder(dsn, lock.key) is None


@contextlib.asynccontextmanager
async def lock_moved(name: str) -> AsyncIterator[tuple[str, AdvisoryLock, Any, asyncpg.Connection]]:
    """A fresh database and a lock of its pool, taken and then held by another session instead:
    the database's DSN, the lock, the connection it was taken on (whose end the test then reports
    to the lock) and the other session's connection."""
    dsn = await fresh_database(name)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3)
    other = await asyncpg.connect(dsn)
    try:
        lock = AdvisoryLock(pool, lock_key("job"), "job")
        assert await lock.take()
        own = lock._conn
        await own.execute("SELECT pg_advisory_unlock($1)", lock.key)
        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", lock.key)
        yield dsn, lock, own, other
    finally:
        if not other.is_closed():
            other.terminate()
        await pool.close()


async def _alive(dsn: str, pid: int) -> bool:
    other = await asyncpg.connect(dsn)
    try:
        return bool(await other.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid))
    finally:
        await other.close()


async def test_a_worker_that_opens_while_anothers_claim_is_lost_leaves_that_workers_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A's connections end; B opens before A holds its claim again (A's first retake waits a
    second here) and finds the claim free. B must not take A's entries: A is alive, and holds its
    claim again within B's grace. Once A is gone, the next open takes them."""
    monkeypatch.setattr(advisory, "RETAKE_DELAYS", (1.0, 0.2, 0.5, 30.0))
    dsn = await fresh_database("takeover")
    database = dsn.partition("?")[0].rsplit("/", 1)[-1]
    storage = {"backend": "postgres", "dsn": dsn, "acknowledge": "on_receipt"}
    async with open_memory(tmp_path / "a", storage=storage) as a:
        await a.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
        await a.written()
        # What A received and has not written yet, as its entry in the store says.
        waiting = msg("ann-2", "I adopted a cat called Miso", user="ann", chat="dm-ann")
        entry = {
            "message": Message.model_validate(waiting).model_dump(mode="json"),
            "decision": TriageDecision(layer="accumulate").model_dump(mode="json"),
        }
        key = f"{a._settling.token}:{0:012d}"
        await a.store.state_put(NAMESPACE, key, entry)
        claim = lock_key(claim_name(a._settling.token))
        first = await holder(dsn, claim)
        assert first is not None
        assert await end_connections(database) >= 1
        assert await holder(dsn, claim) is None  # the window: A's claim is free for a second
        caplog.set_level(logging.INFO, logger="narrmem")
        async with open_memory(tmp_path / "b", storage=storage) as b:
            assert "taken if still free" in caplog.text  # B found the claim free, and waited
            assert await b.store.state_items(NAMESPACE) == [(key, entry)]
            assert await b.recall("cat", user_id="ann", k=5) == []
        assert await holder(dsn, claim) not in (None, first)  # A holds its claim again
    async with open_memory(tmp_path / "c", storage=storage) as c:
        assert await c.store.state_items(NAMESPACE) == []
        hits = await c.recall("cat", user_id="ann", k=5)
        assert [h.message_ids for h in hits] == [["ann-2"]]


async def test_a_lost_lock_held_by_another_worker_for_a_moment_is_taken_again(tmp_path: Path) -> None:
    """Another worker checking whether this one is gone holds the lock a moment: the retake does
    not give up on it, and holds the lock once it is let go."""
    async with lock_moved("probe") as (dsn, lock, own, prober):
        lock._ended(own)  # what the termination listener calls
        await asyncio.sleep(0.5)  # the first two tries found the prober holding it
        assert await holder(dsn, lock.key) == prober.get_server_pid()
        await prober.execute("SELECT pg_advisory_unlock($1)", lock.key)
        await held_anew(dsn, lock.key, prober.get_server_pid())
        assert lock.retaken == 1
        await lock.release()
        assert await holder(dsn, lock.key) is None


async def test_a_claim_whose_session_went_without_a_word_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failover (or a network cut) that sends the client no reset: the session holding the
    worker's claim is gone in the server, and the client, which uses that connection for nothing
    else, never heard. Nothing took the claim again, and the next worker to open took this one's
    unsettled entries while it went on writing them. The connection is now asked every
    ``PROBE_EVERY_S`` whether it still holds the lock."""
    monkeypatch.setattr(advisory, "PROBE_EVERY_S", 0.3)
    async with behind_proxy(tmp_path, timeout_s=1.0) as (memory, proxy):
        dsn = memory.settings.storage.dsn
        assert dsn is not None
        database = dsn.get_secret_value().rsplit("/", 1)[1]
        direct = dsn_for(database)
        key = lock_key(claim_name(memory._settling.token))
        first = await holder(direct, key)
        assert first is not None
        proxy.silence()  # every connection open now: the client hears nothing more on it
        admin = await asyncpg.connect(direct)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1, 5000)", first)
        finally:
            await admin.close()
        await held_anew(direct, key, first, seconds=20.0)  # two probes unanswered: about 3 s
        # The other silent connections (the fence's, the pool's) each fail one call, then are new.
        for _ in range(4):
            with contextlib.suppress(StoreUnavailableError):
                assert (await memory.ingest(msg("3", "I started learning the cello", user="ann"))).stored
                break
        else:
            raise AssertionError("the worker did not write again")
        assert await holder(direct, key) not in (None, first)


async def test_a_snapshot_left_idle_by_its_reader_is_ended_by_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export reads a table's pages in one snapshot while its client reads the file: a client
    that stops reading kept the transaction open, holding back every table's vacuum (the decay
    pass rewrites importance hourly) for as long as it kept its connection."""
    monkeypatch.setattr(store_module, "SNAPSHOT_IDLE_S", 0.5)
    dsn = await fresh_database("snapshot_idle")
    async with open_memory(tmp_path, storage={"backend": "postgres", "dsn": dsn}) as memory:
        await memory.ingest(msg("1", "I live in Lisbon now", user="ann"))
        with pytest.raises(StoreError):
            async with memory.store.snapshot() as db:
                assert await db.fetchall("SELECT count(*) FROM memories") == [(1,)]
                await asyncio.sleep(1.5)  # the reader went quiet
                await db.fetchall("SELECT count(*) FROM memories")
        admin = await asyncpg.connect(dsn)
        try:
            idle = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'"
            )
        finally:
            await admin.close()
        assert idle == 0
        assert (await memory.ingest(msg("2", "I started learning the cello", user="ann"))).stored
