"""A full disk is a StoreUnavailableError (503 with Retry-After over HTTP), not SQLite's own
error (an "internal error", 500), and loses nothing: what was acknowledged before is there, the
database is whole, and the same calls succeed once there is room. SQLite's real SQLITE_FULL,
reached by capping the database's pages (``PRAGMA max_page_count``) on the store's own writer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from _helpers import msg

from narrmem import StoreUnavailableError
from narrmem.doors.server import create_app
from narrmem.models import Scope
from narrmem.testing import open_memory


async def test_a_full_disk_is_unavailable_and_loses_nothing(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", storage={"backend": "sqlite"}) as memory:
        for n in range(5):
            await memory.ingest(msg(str(n), f"Day {n}: I went climbing at crag number {n}", user="ann"))
        async with memory.store.sql(write=True) as db:  # type: ignore[attr-defined]
            [(pages,)] = await db.fetchall("PRAGMA page_count")
            await db.fetchall(f"PRAGMA max_page_count = {int(pages)}")
        texts = [
            f"Day {n}: I learned a new song on the ukulele, number {n}, " + "la " * 400 for n in range(5, 40)
        ]
        with pytest.raises(StoreUnavailableError, match="is full"):
            for n, text in enumerate(texts, start=5):
                await memory.ingest(msg(str(n), text, user="ann"))
        transport = httpx.ASGITransport(create_app(memory))
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            answer = await client.post("/v1/ingest", json=msg("99", texts[-1], user="ann"))
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
        assert "is full" in answer.json()["detail"]

        async with memory.store.sql(write=True) as db:  # type: ignore[attr-defined]
            await db.fetchall("PRAGMA max_page_count = 1073741823")
        assert (await memory.ingest(msg("99", texts[-1], user="ann"))).stored
        ann = Scope(tenant="default", user_id="ann")
        stored = {r.message_ids[0] for r in await memory.store.recent(ann, limit=100)}
    assert {str(n) for n in range(5)} | {"99"} <= stored
    with sqlite3.connect(tmp_path / "m" / "narrmem.sqlite3") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
