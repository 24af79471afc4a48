"""A NUL character (which PostgreSQL's text cannot hold) wherever a caller can put one: refused
naming the field where nothing is stored under it, and stored without harm where it is. On both
stores; each case broke PostgreSQL before 2026-12-06 (one made the store unopenable)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from _helpers import msg, store_fingerprint
from _postgres import fresh_database

from narrmem import InputError, Memory
from narrmem.doors.server import create_app
from narrmem.testing import open_memory

NOW = datetime.now(UTC) - timedelta(hours=1)


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Memory]:
    storage: dict[str, Any] = {}
    if request.param == "postgres":
        storage = {"backend": "postgres", "dsn": await fresh_database("nul")}
    async with open_memory(tmp_path / "m", storage=storage) as opened:
        yield opened


def _at(minutes: int) -> str:
    return (NOW + timedelta(minutes=minutes)).isoformat()


async def test_a_nul_in_a_deleted_message_id_is_refused_and_records_no_forget(
    memory: Memory, tmp_path: Path
) -> None:
    """On PostgreSQL the forget job was recorded, its delete failed, and every later open failed
    finishing it (no worker could start, no export could be made)."""
    await memory.ingest(msg("m1", "I decided to learn the cello", chat="dm"))
    before = await store_fingerprint(memory)
    with pytest.raises(InputError) as caught:
        await memory.forget_messages(chat_id="dm", message_ids=["x\x00y"])
    assert caught.value.field == "message_ids[0]"
    assert await memory.store.pending_forgets() == []
    assert await store_fingerprint(memory) == before
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(memory)), base_url="http://t"
    ) as client:
        answer = await client.post("/v1/messages/delete", json={"chat_id": "dm", "message_ids": ["a\x00b"]})
        assert answer.status_code == 422, answer.text
        for route in ("/v1/users?tenant=a%00", "/v1/export?tenant=a%00", "/v1/patterns?user_id=u%00"):
            answer = await client.get(route)
            assert answer.status_code == 422, (route, answer.text)
    with pytest.raises(InputError) as caught:
        await memory.users("a\x00")
    assert caught.value.field == "tenant"


async def test_a_nul_in_a_messages_meta_leaves_its_users_counts_and_triggers(memory: Memory) -> None:
    """Stored as JSON's escape, which PostgreSQL's jsonb refuses: every later mood count of the
    user failed, and no trigger fired."""
    note = {"note": "a\x00b"}
    await memory.ingest(msg("m0", "I feel so stressed about work today.", chat="dm", ts=_at(0), meta=note))
    counts, fired = [], []
    for i in range(1, 4):
        result = await memory.ingest(msg(f"m{i}", "I feel stressed about work again.", chat="dm", ts=_at(i)))
        counts += [c.count for c in result.counts if c.label == "stressed"]
        fired += [t.kind for t in result.triggers]
    assert counts == [2, 3, 4]
    assert "emotion" in fired


async def test_a_nul_in_a_text_keeps_the_facts_a_node_can_name(
    memory: Memory, caplog: pytest.LogCaptureFixture
) -> None:
    """The text is stored (escaped on PostgreSQL); a fact whose name would hold the NUL is left
    out, and the message's other facts are written (before, the graph's whole write failed)."""
    with caplog.at_level(logging.ERROR):
        await memory.ingest(msg("m1", "I work at Acme\x00 Bank. I live in Lisbon.", chat="dm"))
        await memory.settle()
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    context = await memory.turn_context("where do I live?", user_id="u1", chat_id="dm")
    facts = {(f["relation"], f["object"]) for f in context["facts"]}
    assert ("lives_in", "Lisbon") in facts
    assert not any("\x00" in obj for _, obj in facts)
