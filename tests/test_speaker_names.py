"""A chat's context names people by who they are, not by the display name they used: someone
renamed ("Bob", months later "Robert") is one person under their current name, and two people of
one name ("Alice", and another user who took the name) are told apart. Before, the prompt printed
each memory's name as given (the impersonator's "I'm not allergic to anything" read as Alice's),
and a question about Robert lowered what he had said as Bob as another speaker's."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from narrmem.clock import ManualClock
from narrmem.models import Hit, Message, speaker_labels
from narrmem.testing import open_memory

T0 = datetime(2026, 9, 1, 9, 0, tzinfo=UTC)


def _hit(user_id: str, speaker: str, minutes: int) -> Hit:
    return Hit(
        id=minutes,
        kind="episode",
        text="...",
        score=1.0,
        importance=0.5,
        created_at=T0 + timedelta(minutes=minutes),
        user_id=user_id,
        chat_id="general",
        tenant="guild1",
        message_ids=[],
        speaker=speaker,
    )


def test_labels_follow_the_person() -> None:
    hits = [
        _hit("999", "Alice", 3),
        _hit("222", "Bob", 10),
        _hit("111", "Alice", 0),
        _hit("222", "Robert", 90),
    ]
    labels = speaker_labels(hits)
    assert labels[1] == "Robert (then Bob)" and labels[3] == "Robert"
    assert re.fullmatch(r"Alice \(#[0-9a-f]{4,}\)", labels[0]) and re.fullmatch(
        r"Alice \(#[0-9a-f]{4,}\)", labels[2]
    )
    assert labels[0] != labels[2] and speaker_labels(hits) == labels  # the same each time
    # Told apart by a tag made from the id, which no one chooses and which shows nothing of it.
    emails = [_hit("alice@example.com", "Alice", 1), _hit("mallory@example.com", "Alice", 2)]
    assert not any("example" in str(label) or "com" in str(label) for label in speaker_labels(emails))
    # One person, one name: as before.
    assert speaker_labels([_hit("1", "Ann", 1), _hit("1", "Ann", 2)]) == ["Ann", "Ann"]
    assert speaker_labels([Hit(**{**_hit("1", "Ann", 1).model_dump(), "speaker": None})]) == [None]


@pytest.mark.slow
async def test_a_chats_context_knows_a_renamed_person_and_tells_two_alices_apart(tmp_path: Path) -> None:
    said = [
        ("111", "Alice", 0, "I'm allergic to peanuts, seriously, keep them away from me"),
        ("999", "Alice", 3, "I'm not allergic to anything, I eat peanuts every day"),
        ("222", "Bob", 10, "I live in Lisbon and I love surfing"),
        ("222", "Robert", 60 * 24 * 60, "I started working at Spotify this week"),
        ("333", "Carol", 60 * 24 * 60 + 5, "I like cheese"),
    ]
    clock = ManualClock(T0 + timedelta(days=70))
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        for number, (user_id, speaker, minutes, text) in enumerate(said):
            ts = T0 + timedelta(minutes=minutes)
            await mem.ingest(
                Message(
                    text=text, user_id=user_id, chat_id="general", tenant="guild1", ts=ts,
                    message_id=f"m{number}", speaker=speaker,
                )
            )  # fmt: skip
        allergic = await mem.context("is Alice allergic to peanuts?", chat_id="general", tenant="guild1")
        rendered = allergic.render()
        [real, other] = [f"Alice (#{hashlib.sha256(who.encode()).hexdigest()[:4]})" for who in ("111", "999")]
        assert f"{real}: I'm allergic to peanuts" in rendered
        assert f"{other}: I'm not allergic to anything" in rendered
        lives = await mem.context(
            "where does Robert live?", chat_id="general", tenant="guild1", reinforce=False
        )
        assert lives.hits[0].text == "I live in Lisbon and I love surfing"
        assert "Robert (then Bob): I live in Lisbon" in lives.render()
        bob = lives.hits[0]
        assert bob.why is not None and bob.why.importance_factor > 0.8  # not lowered as another speaker's
