"""A closed memory refuses every public call with a ``ClosedError`` (a ``StoreError``) instead of
answering as if it knew nothing; reopening the folder gives everything back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import ClosedError, Memory, Scope, StoreError, hookimpl
from narrmem.testing import open_memory

CALLS: dict[str, Callable[[Memory], Awaitable[Any]]] = {
    "ingest": lambda m: m.ingest(msg("ann-2", "I drink green tea every morning", user="ann", chat="dm-ann")),
    "ingest on receipt": lambda m: m.ingest(
        msg("ann-3", "I drink black tea at night", user="ann", chat="dm-ann"), acknowledge="on_receipt"
    ),
    "ingest_many": lambda m: m.ingest_many([msg("ann-4", "I bake bread", user="ann", chat="dm-ann")]),
    "recall": lambda m: m.recall("where do I live", user_id="ann"),
    "context": lambda m: m.context("where do I live", user_id="ann"),
    "forget": lambda m: m.forget(user_id="ann"),
    "stats": lambda m: m.stats(),
    "call_tool": lambda m: m.call_tool("recall", {"query": "Lisbon", "user_id": "ann"}),
}


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_closed_memory_refuses_calls_and_keeps_what_it_had(tmp_path: Path, name: str) -> None:
    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
    with pytest.raises(ClosedError, match="closed") as refused:
        await CALLS[name](memory)
    assert isinstance(refused.value, StoreError)
    await memory.settle()  # nothing waits: a no-op, not an error
    await memory.close()  # closing twice is fine
    async with open_memory(tmp_path) as again:
        assert (await again.stats())["memories"] == 1
        hits = await again.recall("where do I live", user_id="ann")
        assert [h.message_ids for h in hits] == [["ann-1"]]


async def test_an_mcp_resource_of_a_closed_memory_is_an_internal_error_not_a_bad_request(
    tmp_path: Path,
) -> None:
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    from narrmem.doors.mcp_server import _Resources, resource_uri

    async with open_memory(tmp_path) as memory:
        await memory.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
        resources = _Resources(memory, "default")
        request = types.ReadResourceRequestParams(uri=resource_uri("ann", "summary"))
        assert (await resources.read(None, request)).contents  # open: read
    with pytest.raises(MCPError) as refused:
        await resources.read(None, request)
    assert refused.value.error.code == types.INTERNAL_ERROR and "closed" in refused.value.error.message


class Slow:
    """Keeps each call under way for a moment, so that a close lands in the middle of it."""

    narrmem_name = "slow"

    @hookimpl
    async def narrmem_before_store(self) -> None:
        await asyncio.sleep(0.3)

    @hookimpl
    async def narrmem_recall_candidates(self) -> list[Any]:
        await asyncio.sleep(0.3)
        return []

    @hookimpl
    async def narrmem_after_store(self) -> None:
        await asyncio.sleep(0.3)

    @hookimpl
    async def narrmem_weigh(self) -> None:
        await asyncio.sleep(0.3)


async def test_a_close_in_the_middle_of_calls_ends_them_typed_and_keeps_what_they_took(
    tmp_path: Path,
) -> None:
    """A bot stopping (a signal, a redeploy) closes its memory while messages are still being
    handled: those calls ended in errors of the closed store's connection (``ValueError: no active
    connection``), naming nothing of narrmem, and a message acknowledged as taken could be lost.
    Each call now ends as it would have, or with a ``ClosedError`` once the store is gone (a call
    may be waiting on another worker's forget, which a close does not wait for), and what was
    acknowledged is kept."""
    memory = await open_memory(tmp_path, plugins=[Slow()])
    await memory.ingest(msg("ann-1", "I live in Lisbon now", user="ann", chat="dm-ann"))
    started = {
        name: asyncio.ensure_future(call(memory))
        for name, call in CALLS.items()
        if name not in ("forget", "call_tool")
    }
    await asyncio.sleep(0.01)  # every call has begun and is waiting in a hook
    await memory.close()
    await asyncio.wait(started.values(), timeout=30)
    outcomes = {name: task.exception() for name, task in started.items()}
    assert all(error is None or isinstance(error, ClosedError) for error in outcomes.values()), outcomes
    with pytest.raises(ClosedError):
        await memory.recall("Lisbon", user_id="ann")
    answered = [
        result
        for name in ("ingest", "ingest on receipt", "ingest_many")
        if outcomes[name] is None
        for result in (started[name].result() if name == "ingest_many" else [started[name].result()])
    ]
    stored = {r.message_id for r in answered if r.stored}
    assert stored  # a message was taken while the memory closed
    async with open_memory(tmp_path) as again:
        kept = {m for r in await again.store.recent(Scope(user_id="ann"), limit=50) for m in r.message_ids}
    assert stored <= kept
