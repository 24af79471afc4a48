"""A recall whose every source of candidates failed is an error, not an empty answer: with its
PostgreSQL gone, recall, context and a bot's turn answered 200 with no hits, which a bot could not
tell from "nothing is remembered of this person". One source failing still leaves the others'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import msg
from _postgres import fresh_database

from narrmem import Memory, StoreError
from narrmem.doors.server import create_app
from narrmem.testing import open_memory


def _failing(*args: Any, **kwargs: Any) -> Any:
    raise ConnectionResetError("the database went away")


async def _filled(memory: Memory) -> None:
    await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="ann"))
    await memory.settle()


async def test_a_recall_whose_sources_all_fail_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_memory(tmp_path / "m") as memory:
        await _filled(memory)
        monkeypatch.setattr(memory.store, "search_keywords", _failing)
        assert await memory.recall("greyhound", user_id="ann", reinforce=False)  # vectors still answer
        monkeypatch.setattr(memory.store, "search_vectors", _failing)
        with pytest.raises(StoreError, match="could not read its sources"):
            await memory.recall("greyhound", user_id="ann", reinforce=False)
        transport = httpx.ASGITransport(create_app(memory))
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            answer = await client.post("/v1/recall", json={"query": "greyhound", "scope": {"user_id": "ann"}})
    assert answer.status_code == 409 and "could not read its sources" in answer.json()["detail"]


async def test_a_recall_on_a_postgresql_gone_away_is_an_error(tmp_path: Path) -> None:
    storage = {"backend": "postgres", "dsn": await fresh_database("down")}
    async with open_memory(tmp_path / "m", storage=storage) as memory:
        await _filled(memory)
        assert await memory.recall("greyhound", user_id="ann", reinforce=False)
        memory.store.pool.terminate()  # type: ignore[attr-defined]
        with pytest.raises(StoreError):
            await memory.recall("greyhound", user_id="ann", reinforce=False)
