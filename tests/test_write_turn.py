"""The turn to write: one writer at a time, and on a store that can stall a bounded wait for the
turn (a 503 to try again, nothing written), never a wait that outlasts the callers."""

from __future__ import annotations

import asyncio

import pytest

from narrmem import StoreUnavailableError
from narrmem.write_turn import WriteTurn


async def test_a_turn_not_given_within_the_limit_is_unavailable_and_the_next_one_is_given() -> None:
    turn = WriteTurn(0.2)
    order: list[str] = []

    async def writer(name: str, hold: float) -> None:
        async with turn:
            order.append(name)
            await asyncio.sleep(hold)

    first = asyncio.ensure_future(writer("first", 0.5))
    await asyncio.sleep(0.01)
    with pytest.raises(StoreUnavailableError, match=r"no turn to write within 0\.2 s"):
        await writer("second", 0)
    await first
    await writer("third", 0)
    assert order == ["first", "third"] and not turn.locked()


async def test_without_a_limit_the_turn_waits_as_long_as_the_one_before() -> None:
    turn = WriteTurn()
    order: list[str] = []

    async def writer(name: str, hold: float) -> None:
        async with turn:
            order.append(name)
            await asyncio.sleep(hold)

    await asyncio.gather(writer("long", 0.3), writer("after", 0))
    assert order == ["long", "after"]
