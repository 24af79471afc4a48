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
    # The count's own message ids are the group's too: the result and its trigger go there.
    [tired] = [c for c in results[2].counts if c.kind == "emotion" and c.label == "tired"]
    assert tired.message_ids == ["tired-2"]


async def test_a_topic_counted_across_chats_is_named_in_the_words_of_the_chat_it_fires_in(
    tmp_path: Path,
) -> None:
    """The topic is the user's (three mentions in two chats), but its label, the note and the
    trigger that go to the group hold only what was said in the group."""
    start = datetime(2026, 5, 4, 9, tzinfo=CET)

    def said(day: int, chat: str, text: str) -> Message:
        return Message(
            text=text, user_id="u1", chat_id=chat, ts=start + timedelta(days=day), message_id=f"{chat}-{day}"
        )

    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest(said(0, "private", "seeing the zqdivorce lawyer tomorrow"))
        await mem.ingest(said(1, "private", "the zqdivorce lawyer was expensive"))
        result = await mem.ingest(said(2, "group", "the lawyer was expensive"))
    [topic] = [c for c in result.counts if c.kind == "topic"]
    assert topic.count == 3
    assert "zqdivorce" not in topic.label and topic.message_ids == ["group-2"]
    [event] = [t for t in result.triggers if t.kind == "topic"]
    assert event.chat_id == "group" and event.message_ids == ["group-2"]
    assert "zqdivorce" not in event.label + event.suggestion
    assert not any("zqdivorce" in note for note in result.notes)


async def test_a_deleted_decision_leaves_nothing_of_it_in_the_impact_it_filled(
    real: Memory, tmp_path: Path
) -> None:
    value = await real.ingest(_value("dm-val"))
    await real.ingest(_decision("dm-val"))
    assert value.scene is not None and value.scene.id is not None
    await real.forget_messages(chat_id="dm-val", message_ids=["v2"])
    earlier = (await real.store.get([value.scene.id], None))[value.scene.id]
    assert "promotion" not in earlier.text and "Impact: not yet known" in earlier.text
    assert "promotion" not in str(earlier.meta) and earlier.meta["impact_sources"] == []
    assert await real.store.state_items("triage.impacts") == []
    hits = await real.recall("salary friends promotion", user_id="val", k=10, snippet_tokens=None)
    assert hits and not any("promotion" in (h.detail or "") + h.text for h in hits)
    await real.close()
    for path in (tmp_path / "memory").rglob("*"):
        assert not path.is_file() or b"turn down the promotion" not in path.read_bytes(), path


async def test_an_edited_decision_is_quoted_in_its_new_words_only(real: Memory) -> None:
    value = await real.ingest(_value("dm-val"))
    await real.ingest(_decision("dm-val"))
    assert value.scene is not None and value.scene.id is not None
    await real.edit(
        _val_says("v2", 20, "I decided to decline the new role so I can see my friends more.", "dm-val")
    )
    earlier = (await real.store.get([value.scene.id], None))[value.scene.id]
    assert "promotion" not in earlier.text and "promotion" not in str(earlier.meta)


async def test_a_quote_written_before_quotes_named_their_messages_goes_too(real: Memory) -> None:
    """A scene linked by an earlier version holds the quote without the ids of its message: the
    deleted scene that it quotes names it."""
    value = await real.ingest(_value("dm-val"))
    await real.ingest(_decision("dm-val"))
    assert value.scene is not None and value.scene.id is not None
    earlier = (await real.store.get([value.scene.id], None))[value.scene.id]
    earlier.meta = {k: v for k, v in earlier.meta.items() if k != "impact_sources"}
    await real.store.update(earlier)
    await real.store.state_delete("triage.impacts", "")
    await real.forget_messages(chat_id="dm-val", message_ids=["v2"])
    earlier = (await real.store.get([value.scene.id], None))[value.scene.id]
    assert "promotion" not in earlier.text and "Impact: not yet known" in earlier.text


async def test_a_delete_cut_short_before_the_quote_went_takes_it_at_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops after the store deleted the decision and before the triage plugin took
    its quote out: the next open finishes the forget, and the quote goes though the deleted
    scene is no longer there to say which scene it built on."""
    import narrmem_plugins.triage as triage

    from narrmem.errors import PluginError

    async def stopped(*args: object) -> int:
        raise RuntimeError("stopped before the quote went")

    folder = tmp_path / "memory"
    async with open_memory(folder, real_model=True) as mem:
        value = await mem.ingest(_value("dm-val"))
        await mem.ingest(_decision("dm-val"))
        assert value.scene is not None and value.scene.id is not None
        with monkeypatch.context() as patched:
            patched.setattr(triage, "drop_impacts", stopped)
            with pytest.raises(PluginError, match="stopped before"):
                await mem.forget_messages(chat_id="dm-val", message_ids=["v2"])
        earlier = (await mem.store.get([value.scene.id], None))[value.scene.id]
        assert "turn down the promotion" in earlier.text  # what the stop left
    async with open_memory(folder, real_model=True) as mem:
        earlier = (await mem.store.get([value.scene.id], None))[value.scene.id]
        assert "promotion" not in earlier.text and "Impact: not yet known" in earlier.text
        assert await mem.store.state_items("triage.impacts") == []


async def test_a_persons_forget_leaves_no_state_of_their_quotes(real: Memory) -> None:
    await real.ingest(_value("dm-val"))
    await real.ingest(_decision("dm-val"))
    assert len(await real.store.state_items("triage.impacts")) == 1
    await real.forget(user_id="val")
    assert await real.store.state_items("triage.impacts") == []
