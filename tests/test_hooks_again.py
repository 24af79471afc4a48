"""After-store hooks run a second time change nothing twice. A process that stops after a
message's hooks ran and before their record went (a kill, a container stopped) has them run again
at the next open: the mood pattern's scene was written twice, an earlier scene's Impact quoted the
later one twice."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from narrmem import Message, Scope, hookimpl
from narrmem.settling import NAMESPACE
from narrmem.testing import open_memory
from narrmem.view import MemoryView

CET = timezone(timedelta(hours=2))
pytestmark = pytest.mark.slow


class EntriesSeen:
    """Keeps the record of the after-store work still to run, as it stands while the hooks of
    ``message_id`` run (what a process stopped at that moment leaves)."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self.entries: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    async def narrmem_after_store(self, memory: MemoryView, message: Message) -> None:
        if message.message_id == self.message_id:
            self.entries = await memory.store.state_items(NAMESPACE)


async def _stopped_during_hooks(folder: Path, messages: list[Message]) -> None:
    """Ingest ``messages``, then put back the record of the last one's hooks, as a process
    stopped after they ran and before it was deleted leaves it; the next open runs them again."""
    seen = EntriesSeen(messages[-1].message_id)
    async with open_memory(folder, real_model=True, plugins=[seen]) as memory:
        for message in messages:
            await memory.ingest(message)
    assert seen.entries
    async with open_memory(folder, real_model=True) as memory:
        for key, value in seen.entries:
            await memory.store.state_put(NAMESPACE, key, value)


def _said(message_id: str, when: datetime, text: str, user: str = "tom", chat: str = "dm") -> Message:
    return Message(text=text, user_id=user, chat_id=chat, ts=when, message_id=message_id)


async def test_a_mood_pattern_is_written_once_when_its_hooks_run_again(tmp_path: Path) -> None:
    start = datetime(2026, 5, 4, 21, tzinfo=CET)
    texts = ["so tired after the harbour shift", "so tired, the boiler broke again", "so tired today"]
    tired = [_said(f"t{n}", start + timedelta(days=2 * n), text) for n, text in enumerate(texts)]
    await _stopped_during_hooks(tmp_path / "m", tired)
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        await memory.settle()
        assert await memory.store.state_items(NAMESPACE) == []  # they ran again at the open
        scenes = await memory.store.recent(Scope(user_id="tom"), kinds=["scene"])
        patterns = [s for s in scenes if s.meta.get("type") == "pattern"]
        assert [p.message_ids for p in patterns] == [["t0", "t1", "t2"]]


async def test_an_impact_quotes_the_later_scene_once_when_its_hooks_run_again(tmp_path: Path) -> None:
    value = _said(
        "v1",
        datetime(2026, 8, 1, 20, tzinfo=CET),
        "I think time with friends matters more than a bigger salary.",
        user="val",
    )
    decision = _said(
        "v2",
        datetime(2026, 8, 20, 20, tzinfo=CET),
        "I decided to turn down the promotion so I can see my friends more.",
        user="val",
    )
    await _stopped_during_hooks(tmp_path / "m", [value, decision])
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        await memory.settle()
        scenes = {
            s.message_ids[0]: s for s in await memory.store.recent(Scope(user_id="val"), kinds=["scene"])
        }
        earlier = scenes["v1"]
        assert earlier.text.count("turn down the promotion") == 1, earlier.text
        assert earlier.meta["impacts"] == [scenes["v2"].id]
        assert scenes["v2"].meta["builds_on"] == earlier.id


async def test_a_fact_is_counted_once_when_its_hooks_run_again(tmp_path: Path) -> None:
    moved = _said("m1", datetime(2026, 8, 1, 20, tzinfo=CET), "I decided to quit my job and move to Lisbon.")
    await _stopped_during_hooks(tmp_path / "m", [moved])
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        await memory.settle()
        facts = (await memory.turn_context("Lisbon job", user_id="tom", chat_id="dm"))["facts"]
        assert facts and all(f["count"] == 1 and f["provenance"] == ["m1"] for f in facts), facts
