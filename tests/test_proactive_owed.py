"""The proactive plugin's hook finds the store away after the write (a moment's outage).

It replaces the triage plugin's raw threshold crossings with the events its policy lets through
(heat, cooldown, a return after a quiet month). Before, a failure halfway left the raw crossings
in the result, and they reached the bot unfiltered; its hook, run again alone once the store
answered, found no counts to decide on, so what it would have told was lost for good. Now the raw
crossings never pass, and a hook run again for a message runs with the ones whose results it
reads (``narrmem_after_store_with``)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from narrmem_plugins.proactive import NAME

from narrmem import ManualClock, Memory, Message, StoreUnavailableError, hookimpl, trying_again
from narrmem.testing import open_memory

START = datetime(2026, 5, 4, 9, tzinfo=UTC)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trying_again, "RETRY_DELAYS", (0.05, 0.1))
    monkeypatch.setattr(trying_again, "RETRY_EVERY", 0.2)


class Told:
    narrmem_name = "told"

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str | None]] = []

    @hookimpl
    def narrmem_on_trigger(self, event: Any) -> None:
        self.events.append((event.kind, event.count, event.cause_message_id))


def _away_once_in_proactive(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    store, failed = memory.store, []
    state_get = store.state_get

    async def flaky(namespace: str, key: str) -> Any:
        if namespace == NAME and not failed:
            failed.append(key)
            raise StoreUnavailableError("the database went away after the write")
        return await state_get(namespace, key)

    monkeypatch.setattr(store, "state_get", flaky)
    return failed


async def _say(memory: Memory, clock: ManualClock, day: int, away: bool, patch: Any) -> list[str]:
    clock.set(START + timedelta(days=day))
    failed = _away_once_in_proactive(memory, patch) if away else []
    await memory.ingest(
        Message(
            text="the zqharbour7 roadmap review came up again",
            user_id="u1",
            chat_id="c1",
            ts=clock.now(),
            message_id=f"m{day}",
        )
    )
    return failed


async def _settled(memory: Memory) -> None:
    for _ in range(200):
        await memory.settle()
        if not memory.hooks_owed:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the owed hooks did not run again")


@pytest.mark.parametrize("away", [False, True])
async def test_a_topic_too_spread_out_to_fire_fires_nothing_when_the_store_was_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, away: bool
) -> None:
    told, clock = Told(), ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[told]) as memory:
        for day in (0, 20):
            await _say(memory, clock, day, False, monkeypatch)
        assert await _say(memory, clock, 40, away, monkeypatch) == (["default\0u1\0topic"] if away else [])
        monkeypatch.undo()
        await _settled(memory)
    assert told.events == []  # three mentions in forty days: not hot enough to tell


@pytest.mark.parametrize("away", [False, True])
async def test_a_topic_back_after_a_quiet_time_is_told_once_the_store_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, away: bool
) -> None:
    told, clock = Told(), ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock, plugins=[told]) as memory:
        for day in (0, 1):
            await _say(memory, clock, day, False, monkeypatch)
        failed = await _say(memory, clock, 301, away, monkeypatch)
        monkeypatch.undo()
        await _settled(memory)
        assert len(failed) == int(away)
        assert told.events == [("topic_return", 1, "m301")]
        await _say(memory, clock, 302, False, monkeypatch)  # recorded as told: not told again
        await _settled(memory)
    assert [kind for kind, _, _ in told.events] == ["topic_return"]
