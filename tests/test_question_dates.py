"""The days a question names (plugins/question_dates.py), and recall that prefers what was said
then: a pure reading first, then a real store with the real model."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path

import pytest
from _helpers import msg
from narrmem_plugins.question_dates import named_span, within
from narrmem_plugins.recall_intent import intent_factors

from narrmem import Memory, load_settings
from narrmem.clock import ManualClock
from narrmem.models import MemoryRecord

TODAY = date(2026, 12, 2)


@pytest.mark.parametrize(
    ("question", "span"),
    [
        ("What painting did Melanie show on October 13, 2023?", (date(2023, 10, 13), date(2023, 10, 13))),
        ("What did Gina find on 1 February, 2023?", (date(2023, 2, 1), date(2023, 2, 1))),
        ("What did we do on the 13th of March?", (date(2026, 3, 13), date(2026, 3, 13))),
        ("What setback did Melanie face in October 2023?", (date(2023, 10, 1), date(2023, 10, 31))),
        ("Where was John between August 11 and August 15 2023?", (date(2023, 8, 11), date(2023, 8, 15))),
        ("What did I say on May 3?", (date(2026, 5, 3), date(2026, 5, 3))),
        ("What did I plan for December 25?", (date(2025, 12, 25), date(2025, 12, 25))),  # the last one
        ("What happened on 2023-05-03?", (date(2023, 5, 3), date(2023, 5, 3))),
        ("我2023年5月3日说了什么？", (date(2023, 5, 3), date(2023, 5, 3))),
        ("我5月做了什么？", (date(2026, 5, 1), date(2026, 5, 31))),
        # Relative to today, Wednesday 2 December 2026 (weeks run from Monday).
        ("What did I say yesterday?", (date(2026, 12, 1), date(2026, 12, 1))),
        ("what did I tell you the day before yesterday", (date(2026, 11, 30), date(2026, 11, 30))),
        ("What did I do 3 days ago?", (date(2026, 11, 29), date(2026, 11, 29))),
        ("What did we talk about last week?", (date(2026, 11, 23), date(2026, 11, 29))),
        ("What happened two weeks ago?", (date(2026, 11, 16), date(2026, 11, 22))),
        ("What did I plan this month?", (date(2026, 12, 1), date(2026, 12, 2))),
        ("What did I say last month?", (date(2026, 11, 1), date(2026, 11, 30))),
        ("What did I eat on Monday?", (date(2026, 11, 30), date(2026, 11, 30))),
        ("What did I say last Wednesday?", (date(2026, 11, 25), date(2026, 11, 25))),  # not today
        ("我昨天说了什么？", (date(2026, 12, 1), date(2026, 12, 1))),
        ("我上周做了什么", (date(2026, 11, 23), date(2026, 11, 29))),
        ("三天前我说了什么？", (date(2026, 11, 29), date(2026, 11, 29))),
        ("上个月我去了哪里？", (date(2026, 11, 1), date(2026, 11, 30))),
    ],
)
def test_a_question_names_a_day_a_month_or_the_days_between(question: str, span: tuple[date, date]) -> None:
    assert named_span(question, TODAY) == span


@pytest.mark.parametrize(
    "question",
    [
        "What did Ann cook?",
        "may 2 of us come along?",  # a year-less date is capitalised: "may" is a verb here
        "Who won the cup in 2023?",  # a year alone is too wide a span to weigh by
        "What did she do in May?",  # a month alone, in English, too
        "What happened on February 30, 2023?",  # no such day
        "How many of the 3 kids went?",
        "How are you today?",  # "today" asks about now
        "你今天怎么样？",
        # Not questions: a bot's query is often the user's own message.
        "I'm seeing Tom on Friday",
        "I was born on May 3, 1990",
        "昨天我去了公园",
    ],
)
def test_a_question_without_a_date_names_none(question: str) -> None:
    assert named_span(question, TODAY) is None


def test_the_window_after_a_day_holds_what_was_told_of_it_later() -> None:
    span = (date(2023, 5, 3), date(2023, 5, 3))
    assert within(date(2023, 5, 3), span, timedelta(days=31))
    assert within(date(2023, 6, 3), span, timedelta(days=31))
    assert not within(date(2023, 6, 4), span, timedelta(days=31))
    assert not within(date(2023, 5, 2), span, timedelta(days=31))  # before it, it had not happened


def test_memories_from_outside_the_named_date_are_lowered_and_none_without_a_clock_day() -> None:
    def record(day: date) -> MemoryRecord:
        when = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
        return MemoryRecord(
            text="I cooked lasagna.", user_id="ann", chat_id="c", speaker="Ann", created_at=when
        )

    records = {1: record(date(2026, 5, 3)), 2: record(date(2026, 8, 9)), 3: record(date(2026, 5, 20))}
    options = {"unnamed_speaker_factor": 1.0, "nameless_answer_factor": 1.0, "dated_factor": 0.8}
    assert intent_factors("What did Ann cook on May 3?", records, **options, today=TODAY) == {2: 0.8}
    assert intent_factors("What did Ann cook?", records, **options, today=TODAY) == {}
    assert intent_factors("What did Ann cook on May 3?", records, **options) == {}  # no day to place it


@pytest.mark.asyncio
async def test_a_question_naming_a_day_finds_what_was_said_that_day_first(tmp_path: Path) -> None:
    """Real model, SQLite: two soups months apart, the later one closer to the question's words.
    The earlier day's comes first. Without the date in the keyword index the closer words win
    unless the reading is on, and the reading is what lowers the other day's."""
    said = [
        (
            "m1",
            "2026-05-03T19:00:00+00:00",
            "Made a huge pot of soup tonight with my sister, lentils and all",
        ),
        ("m2", "2026-08-09T19:00:00+00:00", "Cooked lentil soup with my brother for dinner"),
    ]
    messages = [msg(mid, text, user="ann", chat="dm", ts=ts, speaker="Ann") for mid, ts, text in said]
    clock = ManualClock(datetime(2026, 12, 2, 9, tzinfo=UTC))
    question = "Who did Ann cook lentil soup with on May 3?"

    async def ranked(folder: Path, factor: float, dated_keywords: bool = True) -> dict[str, float]:
        plugin = {
            "recall_intent": {"dated_factor": factor},
            "recall_hybrid": {"dates_in_keywords": dated_keywords},
        }
        async with Memory.open(folder, clock=clock, settings=load_settings(plugin=plugin)) as memory:
            await memory.ingest_many(messages)
            hits = await memory.recall(question, user_id="ann", k=2, reinforce=False)
            return {hit.message_ids[0]: hit.score for hit in hits}

    assert next(iter(await ranked(tmp_path / "default", 0.8))) == "m1"
    off = await ranked(tmp_path / "off", 1.0, dated_keywords=False)
    on = await ranked(tmp_path / "on", 0.8, dated_keywords=False)
    assert next(iter(off)) == "m2"
    assert on["m2"] < off["m2"] and on["m1"] == pytest.approx(off["m1"])


@pytest.mark.asyncio
async def test_yesterday_is_the_clocks_yesterday_in_a_real_store(tmp_path: Path) -> None:
    """Two soups eleven days apart: "yesterday" is read by the memory's clock, and it is what puts
    yesterday's first (with the reading off, the other's closer words do)."""
    said = [
        ("y1", "2026-12-01T19:00:00+00:00", "My sister and I cooked lentil soup for dinner"),
        ("y2", "2026-11-20T19:00:00+00:00", "Cooked lentil soup with my brother for dinner"),
    ]
    messages = [msg(mid, text, user="ann", chat="dm", ts=ts, speaker="Ann") for mid, ts, text in said]
    clock = ManualClock(datetime(2026, 12, 2, 9, tzinfo=UTC))

    async def first(folder: Path, factor: float) -> str:
        settings = load_settings(plugin={"recall_intent": {"dated_factor": factor}})
        async with Memory.open(folder, clock=clock, settings=settings) as memory:
            await memory.ingest_many(messages)
            question = "Who did Ann cook lentil soup with yesterday?"
            [hit, *_] = await memory.recall(question, user_id="ann", k=2, reinforce=False)
            return hit.message_ids[0]

    assert await first(tmp_path / "off", 1.0) == "y2"
    assert await first(tmp_path / "on", 0.8) == "y1"


@pytest.mark.parametrize(
    ("offset", "asked", "meant"),
    [
        # Monday 20:00 at -07:00 is Tuesday 03:00 in UTC: "yesterday" is the asker's Sunday.
        (-7, datetime(2026, 3, 9, 20, 0), "park"),
        # Tuesday 00:30 at +08:00 is Monday 16:30 in UTC: "yesterday" is the asker's Monday.
        (8, datetime(2026, 3, 10, 0, 30), "club"),
    ],
)
async def test_yesterday_is_a_day_of_the_askers_calendar(
    tmp_path: Path, offset: int, asked: datetime, meant: str
) -> None:
    """The day was read on the clock's (UTC) calendar, and each memory dated in its own offset:
    for a person far from UTC, "yesterday" named the wrong day and its memory ranked second."""
    zone = timezone(timedelta(hours=offset))
    said = {
        "park": datetime(2026, 3, 8, 15, 0, tzinfo=zone),  # Sunday, the asker's
        "club": datetime(2026, 3, 9, 10, 0, tzinfo=zone),  # Monday
    }
    clock = ManualClock(said["park"].astimezone(UTC))
    settings = load_settings(None, data_dir=str(tmp_path))
    async with Memory.open(settings=settings, clock=clock) as memory:
        for where, ts in said.items():
            clock.set(ts.astimezone(UTC))
            await memory.ingest(msg(where, f"played tennis with Sam at the {where}", ts=ts.isoformat()))
        clock.set(asked.replace(tzinfo=zone).astimezone(UTC))
        question = "what did I play with Sam yesterday?"
        hits = await memory.recall(
            question, user_id="u1", reinforce=False, asked_at=asked.replace(tzinfo=zone)
        )
        assert meant in hits[0].text, [(h.text, h.why.importance_factor) for h in hits if h.why]
