"""What a question asks for, read without a model (plugins/recall_intent.py): whose memory, a name for
an answer, what comes next, a pattern for feelings; each reading only lowers the memories that do
not fit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _helpers import msg
from narrmem_plugins.recall_intent import (
    asks_about_feelings,
    asks_for_a_name,
    intent_factors,
    named_speakers,
    names_something,
)

from narrmem import Memory
from narrmem.clock import ManualClock
from narrmem.models import MemoryRecord, RecallRequest, Scope

AT = datetime(2026, 5, 1, tzinfo=UTC)


def record(text: str, speaker: str) -> MemoryRecord:
    return MemoryRecord(text=text, user_id=speaker.lower(), chat_id="c", speaker=speaker, created_at=AT)


def factors(query: str, records: dict[int, MemoryRecord]) -> dict[int, float]:
    return intent_factors(
        query,
        records,
        unnamed_speaker_factor=0.8,
        nameless_answer_factor=0.7,
        future_factor=0.9,
        pattern_factor=0.5,
    )


def test_a_named_speaker_keeps_their_memories_and_lowers_the_others() -> None:
    records = {1: record("I paint sunsets.", "Melanie"), 2: record("I paint too.", "Caroline")}
    assert named_speakers("What did Melanie paint?", ["Melanie", "Caroline"]) == {"Melanie"}
    assert factors("What did Melanie paint?", records) == {2: 0.8}
    # Naming every speaker, or none, changes nothing.
    assert factors("What did Melanie and Caroline paint?", records) == {}
    assert factors("What was painted?", records) == {}


def test_speaker_names_match_whole_words_and_cjk_names_as_substrings() -> None:
    assert named_speakers("What did Melanies paint?", ["Melanie"]) == set()
    assert named_speakers("What does Ann Lee like?", ["Ann Lee", "Ann"]) == {"Ann Lee", "Ann"}
    assert named_speakers("伟喜欢什么音乐？", ["伟", "Bob"]) == {"伟"}


def test_where_who_which_questions_ask_for_a_name() -> None:
    assert asks_for_a_name("Where does Alice live now?")
    assert asks_for_a_name("So which book is next?")
    assert not asks_for_a_name("What did Alice decide about her job?")
    assert not asks_for_a_name("Did she say where she went?")  # the question word comes too late


def test_a_name_is_a_capitalised_word_inside_a_sentence_not_already_known() -> None:
    known = {"alice", "live"}
    assert names_something("Morning! I just moved to Lisbon last week.", known)
    assert not names_something("So tired today. The movers broke my lamp.", known)
    assert not names_something("I told Alice on Sunday, in May.", known)  # known name, calendar words
    assert not names_something("I'm home. I'll stay.", known)


def test_a_where_question_lowers_memories_that_name_nothing() -> None:
    records = {
        1: record("I just moved to Lisbon last week.", "Alice"),
        2: record("The movers broke my lamp.", "Alice"),
    }
    assert factors("Where does Alice live now?", records) == {2: 0.7}


def test_a_question_about_what_comes_next_lowers_memories_without_a_future() -> None:
    records = {
        1: record("Next month's pick should be Piranesi.", "Alice"),
        2: record("I read on the treadmill.", "Bob"),
        3: record("我打算明年去云南。", "伟"),
    }
    assert factors("What do they read next?", records) == {2: 0.9}
    assert factors("What do they read?", records) == {}


def test_going_to_a_place_is_a_trip_not_the_future() -> None:
    records = {1: record("I'm going to start a book club.", "Bob"), 2: record("We went camping.", "Bob")}
    assert factors("What is Bob going to do?", records) == {2: 0.9}
    assert factors("Would Bob enjoy going to a national park?", records) == {}
    assert factors("Is Bob going to the beach with his kids?", records) == {}


def test_readings_multiply() -> None:
    records = {1: record("I read on the treadmill.", "Bob"), 2: record("I will read Piranesi.", "Alice")}
    assert factors("Which book will Alice read?", records) == {1: 0.8 * 0.7 * 0.9}


def test_a_pattern_scene_is_lowered_unless_the_question_speaks_of_feelings() -> None:
    pattern = record("【Scene】 A pattern across the week: so tired / tired again", "Ann")
    pattern.meta["type"] = "pattern"
    records = {1: pattern, 2: record("I cooked lasagna for the team.", "Ann")}
    assert factors("What did Ann cook?", records) == {1: 0.5}
    assert factors("How has Ann been feeling lately?", records) == {}
    assert factors("Is Ann tired?", records) == {}  # a mood triage counts
    assert asks_about_feelings("她最近心情怎么样？")
    assert not asks_about_feelings("What did Ann cook?")


@pytest.mark.asyncio
async def test_the_pattern_triage_writes_is_weighed_by_the_question_in_a_real_store(tmp_path: Path) -> None:
    """Triage promotes a repeated mood to a pattern scene (real model, SQLite); recall's weighing
    lowers it for a question about something else and leaves it for a question about feelings."""
    start = datetime(2026, 7, 1, 9, tzinfo=UTC)
    texts = ["so tired today", "so tired again today", "still so tired today", "I cooked lasagna"]
    messages = [
        msg(f"m{i}", text, user="ann", chat="dm", ts=(start + timedelta(hours=i)).isoformat(), speaker="Ann")
        for i, text in enumerate(texts)
    ]
    async with Memory.open(tmp_path, clock=ManualClock(start + timedelta(days=1))) as memory:
        await memory.ingest_many(messages)
        scope = Scope(user_id="ann")
        stored = await memory.store.recent(scope, limit=50)
        records = {r.id: r for r in stored if r.id is not None}
        [pattern_id] = [mid for mid, r in records.items() if r.meta.get("type") == "pattern"]

        async def weight(query: str) -> float:
            request = RecallRequest(query=query, scope=scope, k=10)
            tables = await memory.host.call("narrmem_weigh", memory=memory, request=request, records=records)
            factor = 1.0
            for table in tables:
                factor *= table.get(pattern_id, 1.0)
            return factor

        other, feelings = await weight("What did Ann cook?"), await weight("How has Ann been feeling?")
    assert other == pytest.approx(0.5 * feelings)
