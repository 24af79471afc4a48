"""The proactive plugin's memory of what it fired: it keeps no words of the user, it tells a
pattern by the memories it counted (not by its label, whose words change from mention to
mention), and a state it did not write reads as no firing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _helpers import PluginErrors, msg, store_sql
from narrmem_plugins.proactive import NAME, firings_key

from narrmem import IngestResult, ManualClock, Memory, Message, PatternCount
from narrmem.testing import open_memory

START = datetime(2026, 5, 4, 9, tzinfo=UTC)
# One garden, told in other words every three days: the topic's label follows the words of the
# latest mentions ("basil garden", "tomatoes garden", "garden tomatoes").
GARDEN = [
    "planted tomatoes and basil in the garden beds this morning",
    "the garden tomatoes are finally turning red",
    "weeding the garden beds took all afternoon, basil looks great",
    "garden: the basil bolted and tomatoes need staking",
]
FAMILY_FIRST = [
    "I think family time is more important than a promotion",
    "I think being with my family matters more than my career",
    "I think family dinners are more important than working late",
    "I think time with my kids is more important than a bigger salary",
    "I think family is more important than any job title",
]


def _mention(day: int, marker: str) -> Message:
    return Message(
        text=f"the {marker} roadmap review came up again",
        user_id="u1",
        chat_id="c1",
        ts=START + timedelta(days=day),
        message_id=f"m{day}",
    )


async def _topic_events(mem: Memory, day: int, marker: str) -> list[Any]:
    result = await mem.ingest(_mention(day, marker))
    return [t for t in result.triggers if t.kind == "topic"]


async def _fired_on_days(
    mem: Memory, clock: ManualClock, texts: list[str], days: list[int]
) -> list[tuple[int, str, str, int]]:
    fired = []
    for n, day in enumerate(days):
        clock.set(START + timedelta(days=day))
        result = await mem.ingest(msg(f"d{day}", texts[n % len(texts)], ts=clock.now().isoformat()))
        fired += [(day, t.kind, t.label, t.count) for t in result.triggers]
    return fired


async def test_a_fired_topic_is_remembered_without_its_words(tmp_path: Path) -> None:
    marker = "zqharbour7"
    async with open_memory(tmp_path / "m") as mem:
        fired = [await _topic_events(mem, day, marker) for day in range(3)]
        assert [len(f) for f in fired] == [0, 0, 1]
        assert marker in fired[2][0].label
        # Within the cooldown the same topic does not fire again: the state is found.
        assert await _topic_events(mem, 3, marker) == []
        rows = await store_sql(mem, "SELECT key, value FROM plugin_state WHERE namespace = ?", [NAME])
        kept = await mem.store.state_items(NAME)
        assert [key for key, _ in kept] == [firings_key("default", "u1", "topic")]
        assert not any(marker in key or marker in value for key, value in rows)
        [firing] = (await mem.store.state_get(NAME, firings_key("default", "u1", "topic")))["firings"]
        assert firing["count"] == 3 and len(firing["memories"]) == 3


async def test_a_topic_told_in_other_words_is_the_same_trigger(tmp_path: Path) -> None:
    """Its firing was kept under a digest of its label: three days on, the same garden named
    "tomatoes garden" was a trigger never fired, and it fired again inside the cooldown, three
    times in six days."""
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        days = [0, 3, 6, 9, 12, 15]
        fired = await _fired_on_days(mem, clock, [GARDEN[day % len(GARDEN)] for day in days], days)
        labels = {label for _, _, label, _ in fired}
        # Once at three mentions, then not before seven days have passed and the count doubled.
        assert [(day, kind, count) for day, kind, _, count in fired] == [(6, "topic", 3), (15, "topic", 6)]
        assert len(labels) == 2  # the label did change: the firings are told apart by memories
        patterns = await mem.patterns(user_id="u1")
        assert {t["count"] for t in patterns["triggers"] if t["kind"] == "topic"} == {6}


async def test_a_value_stated_again_each_day_fires_once_in_its_cooldown(tmp_path: Path) -> None:
    """A value's label is the newest statement's own words: every statement fired anew."""
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        fired = await _fired_on_days(mem, clock, FAMILY_FIRST, [0, 1, 2, 3, 4])
        assert [day for day, kind, _, _ in fired if kind == "value"] == [1]


async def test_a_mood_said_again_next_week_fires_again(tmp_path: Path) -> None:
    """A mood's count is of one week: it never doubles, and a firing kept by its label held it
    back for good (tired three times a week, every week for a year, fired once)."""
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock) as mem:
        days = [0, 1, 2, 14, 15, 16]
        fired = await _fired_on_days(mem, clock, [f"so tired today, {n}" for n in range(6)], days)
        assert [(day, count) for day, kind, _, count in fired if kind == "emotion"] == [(2, 3), (16, 3)]


async def test_two_patterns_of_one_person_counted_at_once_both_fire(tmp_path: Path) -> None:
    """A person's firings of a kind are one piece of state: of two patterns counted at once, the
    one whose compare-and-set lost decides again on what the other wrote."""
    async with open_memory(tmp_path / "m") as mem:
        proactive = mem.host.pm.get_plugin("proactive")
        message = _mention(0, "zqkite")

        def counted(label: str, ids: list[int]) -> IngestResult:
            times = [START] * len(ids)
            count = PatternCount(kind="value", label=label, count=2, times=times, memory_ids=ids)
            return IngestResult(message_id="m0", layer="scene", stored=True, counts=[count])

        results = [counted("family first", [1, 2]), counted("honesty", [3, 4])]
        await asyncio.gather(*(proactive.narrmem_after_store(mem, message, r) for r in results))
        assert [[t.label for t in r.triggers] for r in results] == [["family first"], ["honesty"]]
        # The same two patterns again: both are cooling.
        again = [counted("family first, again", [2, 5]), counted("honesty", [4, 6])]
        await asyncio.gather(*(proactive.narrmem_after_store(mem, message, r) for r in again))
        assert [r.triggers for r in again] == [[], []]


async def test_a_state_not_as_the_plugin_writes_it_counts_as_never_fired(tmp_path: Path) -> None:
    """Plugin state can come from an imported file: a count that is not a number or a time that is
    not one is read as no firing (and replaced by the next), never an error of the plugin's."""
    marker = "zqbeacon3"
    spoiled: list[Any] = [
        {"firings": "yesterday"},
        {"firings": [5, None]},
        {"fired_at": (START + timedelta(days=1)).isoformat(), "count": 2},  # the old form
        {"firings": [{"fired_at": "yesterday", "count": "1e400", "memories": [1, 2]}]},
        {"firings": [{"fired_at": "2026-05-05T09:00:00", "count": 1, "memories": [1, 2]}]},  # no offset
        {"firings": [{"fired_at": 5, "count": True, "memories": "12"}]},
        {"firings": [{"count": -(2**70), "memories": [1]}]},
    ]
    for n, state in enumerate(spoiled):
        errors = PluginErrors()
        async with open_memory(tmp_path / f"m{n}", plugins=[errors]) as mem:
            for day in range(2):
                assert await _topic_events(mem, day, marker) == []
            key = firings_key("default", "u1", "topic")
            await mem.store.state_put(NAME, key, state)
            fired = await _topic_events(mem, 2, marker)
            assert len(fired) == 1, state
            assert (await mem.store.state_get(NAME, key))["firings"][-1]["count"] == 3
        assert errors.seen == []


async def test_an_edit_of_the_message_that_brought_a_topic_back_does_not_tell_it_again(
    tmp_path: Path,
) -> None:
    """A return's firing keeps the one memory it counted; the edit gives that mention a new
    episode, whose return was a trigger never fired: the bot was told twice."""
    clock = ManualClock(START)
    told: list[str] = []
    async with open_memory(tmp_path / "m", clock=clock) as mem:
        mem.on_trigger(lambda event: _append(told, event.kind))
        for day in (0, 1, 301):
            clock.set(START + timedelta(days=day))
            await mem.ingest(_mention(day, "zqharbour7"))
        assert told == ["topic_return"]
        clock.advance(minutes=5)
        edited = _mention(301, "zqharbour7").model_copy(
            update={"text": "the zqharbour7 roadmap review is back"}
        )
        assert (await mem.edit(edited)).stored
        await mem.settle()
    assert told == ["topic_return"]


async def _append(told: list[str], kind: str) -> None:
    told.append(kind)
