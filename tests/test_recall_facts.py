"""Stated facts as a recall source (plugins/recall_facts.py): a question about the present state gets
the message that stated the fact holding now first, not the one a later statement superseded.
Real embedding model, real SQLite file and FAISS index, the default plugins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from narrmem_plugins.recall_facts import relations_asked

from narrmem.clock import ManualClock
from narrmem.testing import open_memory

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
CHAT = [
    "I live in Lisbon, in a small flat near the river.",
    "Lisbon has the best custard tarts, I had three today.",
    "Big news: I moved to Porto last week for the new job.",
    "My sister still lives in Lisbon and visits on weekends.",
]


def test_a_question_about_what_held_before_is_read_from_its_verb() -> None:
    from narrmem_plugins.recall_facts import PAST

    assert PAST.search("Where did Kim work before Meta?") and PAST.search("Who was I dating before Jordan?")
    assert not PAST.search("Where does she work now that she was promoted?")
    assert not PAST.search("Where does Kim live now? I was wondering")


def test_only_present_state_questions_ask_for_facts() -> None:
    # Where someone lives, not where they are this minute (a trip's "located_at" came first).
    assert relations_asked("Where does Alice live now?") == ["lives_in"]
    assert relations_asked("Where is Alice now?") == ["located_at"]
    assert relations_asked("Where does Kim work now?") == ["works_at"]
    assert relations_asked("Who is Kim dating now?") == ["partner"]
    assert relations_asked("How old is Ann?") == ["age"]
    assert relations_asked("Where does Alice live?") == ["lives_in"]  # one place at a time: always now
    assert relations_asked("What is Bob working on?") == ["works_on"]
    assert relations_asked("伟在做什么项目？") == ["works_on"]
    assert relations_asked("What music does Alice like?") == []  # a preference, not asked about now
    assert relations_asked("Does Alice still like jazz?") == ["likes"]
    assert relations_asked("What did Alice eat?") == []


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("disabled", [[], ["recall_facts"]])
async def test_the_newest_superseding_fact_comes_first(tmp_path: Path, disabled: list[str]) -> None:
    clock = ManualClock(START + timedelta(days=40))
    async with open_memory(tmp_path, real_model=True, clock=clock, plugins={"disabled": disabled}) as mem:
        for day, text in enumerate(CHAT):
            await mem.ingest(
                {
                    "text": text,
                    "user_id": "alice",
                    "chat_id": "dm-alice",
                    "speaker": "Alice",
                    "ts": START + timedelta(days=10 * day),
                    "message_id": f"m{day}",
                }
            )
        hits = await mem.recall("Where does Alice live now?", user_id="alice", k=3, reinforce=False)
    first = hits[0]
    if disabled:
        # Without the facts the words decide: "still lives in Lisbon" (the sister's) comes first.
        assert first.message_ids != ["m2"]
    else:
        assert first.message_ids == ["m2"]
        assert first.sources.get("facts") == 0
        assert all("facts" not in h.sources for h in hits if h.message_ids == ["m0"])  # superseded
