"""A forget whose finishing fails (a plugin's service down, the store unreachable halfway) is
finished again in the same process once it can be, not only at the next open: before, what it
had not deleted or scrubbed stayed until a restart, weeks later for a bot that runs for weeks.
The caller still hears of the failure."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql
from _pgproxy import behind_proxy

from narrmem import Memory, StoreUnavailableError, hookimpl, trying_again
from narrmem.errors import PluginError
from narrmem.testing import open_memory


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.05, 0.1))
    monkeypatch.setattr(trying_again, "RETRY_EVERY", 0.2)


class ScrubService:
    """A plugin that keeps copies elsewhere: its scrub fails while its service is down."""

    narrmem_name = "scrub_service"

    def __init__(self) -> None:
        self.down = False
        self.scrubbed: list[tuple[str | None, list[str] | None]] = []

    @hookimpl
    def narrmem_after_forget(self, user_id: str | None, messages: list[str] | None) -> None:
        if self.down:
            raise RuntimeError("the scrub service is down")
        self.scrubbed.append((user_id, messages))


async def _no_pending_forget(memory: Memory) -> None:
    for _ in range(500):
        if not await memory.store.pending_forgets():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the failed forget was not finished in this process")


async def test_a_user_forget_that_failed_is_finished_in_the_same_process(tmp_path: Path) -> None:
    service = ScrubService()
    async with open_memory(tmp_path / "m", plugins=[service]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="bob"))
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="ann"))
        service.down = True
        with pytest.raises(PluginError, match="finished again later"):
            await memory.forget(user_id="bob")
        assert len(await memory.store.pending_forgets()) == 1
        await asyncio.sleep(0.3)
        assert len(await memory.store.pending_forgets()) == 1  # still down: still owed
        service.down = False
        await _no_pending_forget(memory)
        assert service.scrubbed == [("bob", None)]
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(0,)]
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'ann'") == [(1,)]


async def test_a_message_forget_that_failed_is_finished_in_the_same_process(tmp_path: Path) -> None:
    service = ScrubService()
    async with open_memory(tmp_path / "m", plugins=[service]) as memory:
        await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="bob", chat="c"))
        await memory.ingest(msg("2", "I grow tomatoes on my balcony", user="bob", chat="c"))
        service.down = True
        with pytest.raises(PluginError):
            await memory.forget_messages(chat_id="c", message_ids=["1"])
        service.down = False
        await _no_pending_forget(memory)
        assert service.scrubbed == [(None, ["1"])]
        assert [r.text for r in await memory.store.recent(_bob(), limit=10)] == [
            "I grow tomatoes on my balcony"
        ]


def _bob() -> Any:
    from narrmem.models import Scope

    return Scope(tenant="default", user_id="bob")


class CutsTheDatabase:
    """Ends every connection to PostgreSQL as the forget's plugins scrub: the store deleted the
    rows, and what the forget still writes (its record's end) finds the server gone."""

    narrmem_name = "cuts_the_database"

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.armed = False

    @hookimpl
    def narrmem_after_forget(self) -> None:
        if self.armed:
            self.armed = False
            self.proxy.cut()


async def test_a_forget_cut_off_from_postgresql_halfway_is_finished_once_it_is_back(tmp_path: Path) -> None:
    async with behind_proxy(tmp_path, timeout_s=5.0) as (memory, proxy):
        cutter = CutsTheDatabase(proxy)
        memory.host.pm.register(cutter, name=cutter.narrmem_name)
        await memory.ingest(msg("7", "I adopted a greyhound named Pixel", user="bob"))
        cutter.armed = True
        with pytest.raises(StoreUnavailableError):
            await memory.forget(user_id="bob")
        await asyncio.sleep(0.3)  # tries while the server is away fail and keep the job
        proxy.mode = "pass"
        await _no_pending_forget(memory)
        assert not await memory.recall("greyhound", user_id="bob", reinforce=False)
        assert await store_sql(memory, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(0,)]
