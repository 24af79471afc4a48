"""A scene belongs to the chat it was said in: what counters and links write into a scene (its Impact,
a mood pattern's quotes) comes from that chat only, never from the same user's other chats."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import pytest_asyncio

from narrmem import Memory, Message, Scope
from narrmem.testing import open_memory

CET = timezone(timedelta(hours=2))
pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def real(tmp_path: Path) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "memory", real_model=True) as mem:
        yield mem


def _val_says(message_id: str, day: int, text: str, chat: str) -> Message:
    """What Val said in ``chat`` at 20:00 on ``day`` August."""
    ts = datetime(2026, 8, day, 20, tzinfo=CET)
    return Message(text=text, user_id="val", chat_id=chat, ts=ts, message_id=message_id)


def _value(chat: str) -> Message:
    return _val_says("v1", 1, "I think time with friends matters more than a bigger salary.", chat)


def _decision(chat: str) -> Message:
    return _val_says("v2", 20, "I decided to turn down the promotion so I can see my friends more.", chat)


async def test_a_decision_in_another_chat_leaves_the_earlier_scene_alone(real: Memory) -> None:
    value = await real.ingest(_value("group"))
    decision = await real.ingest(_decision("dm-val"))
    assert value.scene is not None and decision.scene is not None
    stored = await real.store.get([value.scene.id or 0, decision.scene.id or 0], None)
    earlier, later = stored[value.scene.id or 0], stored[decision.scene.id or 0]
    assert "builds_on" not in later.meta
    assert "promotion" not in earlier.text and "Impact: not yet known" in earlier.text
    # What the group's readers get back holds nothing said in the direct chat.
    hits = await real.recall("salary friends promotion", chat_id="group", k=10, snippet_tokens=None)
    assert hits and not any("promotion" in (h.detail or "") + h.text for h in hits)


async def test_in_one_chat_the_decision_still_fills_the_impact(real: Memory) -> None:
    value = await real.ingest(_value("dm-val"))
    decision = await real.ingest(_decision("dm-val"))
    assert value.scene is not None and decision.scene is not None
    stored = await real.store.get([value.scene.id or 0, decision.scene.id or 0], None)
    assert stored[decision.scene.id or 0].meta["builds_on"] == value.scene.id
    assert "turn down the promotion" in stored[value.scene.id or 0].text


async def test_a_mood_pattern_quotes_only_its_own_chat(real: Memory) -> None:
    days = [0, 2, 4]
    chats = ["dm-tom", "dm-tom", "group"]
    texts = ["so tired after the harbour shift", "so tired, the boiler broke again", "so tired today"]
    results = []
    for number, (day, chat, text) in enumerate(zip(days, chats, texts, strict=True)):
        results.append(
            await real.ingest(
                Message(
                    text=text,
                    user_id="tom",
                    chat_id=chat,
                    ts=datetime(2026, 5, 4, 21, tzinfo=CET) + timedelta(days=day),
                    message_id=f"tired-{number}",
                )
            )
        )
    # The count is the user's (three times this week, in two chats)...
    counts = [c.count for c in results[2].counts if c.kind == "emotion" and c.label == "tired"]
    assert counts == [3]
    # ...but the pattern scene, written in the group, quotes and cites the group's message only.
    scenes = await real.store.recent(Scope(user_id="tom", chat_id="group"), kinds=["scene"])
    [pattern] = [s for s in scenes if s.meta.get("type") == "pattern"]
    assert "said 'tired' 3 times this week" in pattern.text
    assert "harbour" not in pattern.text and "boiler" not in pattern.text
    assert "so tired today" in pattern.text
    assert pattern.message_ids == ["tired-2"]
