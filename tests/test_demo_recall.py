"""``narrmem demo`` answers each of its questions with the right memory first: the demo's own sample
chat and questions, the default plugins and the real embedding model, asked the day after the
sample's last message and half a year later (decay changes importance, not the answers)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from narrmem.clock import ManualClock
from narrmem.doors.demo import QUESTIONS, sample_path
from narrmem.doors.transfer import read_messages
from narrmem.testing import open_memory

pytestmark = [pytest.mark.slow]

# The message that answers each demo question.
ANSWERS = {
    "What did Alice decide about her job?": "dm-alice-3",  # quit the bank
    "Where does Alice live now?": "dm-alice-1",  # moved to Lisbon
    "What is Bob's injury and what did he do about the marathon?": "dm-bob-31",  # knee, gave up the full
    "伟喜欢什么音乐？": "dm-wei-16",  # rock, Cui Jian
    "伟在做什么项目？": "dm-wei-7",  # the weather-forecast project in Rust
    "Which book does the club read next?": "guild-books-19",  # Piranesi
}


def test_every_demo_question_has_an_answer() -> None:
    assert {question for question, _ in QUESTIONS} == set(ANSWERS)


@pytest.mark.asyncio
@pytest.mark.parametrize("now", [datetime(2026, 5, 30, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)])
async def test_demo_answers_each_question_first(tmp_path: Path, now: datetime) -> None:
    async with open_memory(tmp_path, real_model=True, clock=ManualClock(now)) as mem:
        await mem.ingest_many(read_messages(sample_path()))
        first: dict[str, list[str]] = {}
        for question, scope in QUESTIONS:
            hits = await mem.recall(question, k=2, reinforce=False, **scope)
            first[question] = hits[0].message_ids if hits else []
    assert first == {question: [message_id] for question, message_id in ANSWERS.items()}
